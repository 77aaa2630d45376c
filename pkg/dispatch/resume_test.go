package dispatch_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolrelay/toolrelay/internal/crashpoint"
	"github.com/toolrelay/toolrelay/internal/platformsim"
	"github.com/toolrelay/toolrelay/internal/provision"
	"github.com/toolrelay/toolrelay/internal/testutil"
	"github.com/toolrelay/toolrelay/pkg/dispatch"
	"github.com/toolrelay/toolrelay/pkg/dispatch/openaiplatform"
	"github.com/toolrelay/toolrelay/pkg/dispatch/watch"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// A replica that stops right after recording a turn (SIGTERM during
// intake, a crash) has not yet recorded the failures of the calls it
// rejected; the replica that resumes the turn records them, so the turn
// closes at once with the reason instead of waiting for its deadline and
// telling the model the call timed out.
func TestRejectedCallsFailAfterIntakeWasCutShort(t *testing.T) {
	t.Parallel()
	e := newEnv(t, platformsim.Scenario{Name: "unknown", Prompt: "unknown function",
		Steps: []platformsim.Step{{{Name: "no_such_function"}}}, Answer: `{{out "no_such_function"}}`})
	nc, js := e.srv.Connect(t)
	d1, err := dispatch.New(js, openaiplatform.New(e.client), dispatch.Options{Name: t.Name(), Logger: testutil.Logger(t),
		RunTTL: 10 * time.Minute, ShutdownTimeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	watch.New(d1, js)
	// The first replica loses NATS the moment the turn is recorded.
	recorded := make(chan struct{})
	var once sync.Once
	removeHook := crashpoint.Add(func(point, process, _ string) {
		if point == crashpoint.Intake && process == t.Name() {
			once.Do(func() { nc.Close(); close(recorded) })
		}
	})
	t.Cleanup(removeHook)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d1.Run(ctx) }()
	testutil.WaitForWhat(t, 10*time.Second, "the first replica to be ready", d1.Ready)
	e.redeclare()
	w, err := d1.Watch(context.Background(), e.response("unknown function"))
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-recorded:
	case <-time.After(10 * time.Second):
		t.Fatal("the turn was never recorded")
	}
	cancel()
	<-done // its error (the connection is closed) does not matter here
	removeHook()

	// The turn is held by the first replica, which could not release
	// it: the second takes it once the hold is sweepAfter (15 s) old.
	d2, _ := e.dispatcher(dispatch.Options{RunTTL: 10 * time.Minute})
	w = awaitWatch(t, d2, w.ID, 30*time.Second)
	if !strings.Contains(w.Answer, `"type":"unknown_function"`) || !strings.Contains(w.Answer, "no_such_function") {
		t.Fatalf("answer = %q, want the unknown_function failure decided at intake", w.Answer)
	}
	turn, err := d2.Turn(context.Background(), w.Turns[0])
	if err != nil || turn.Outcome().CutOff {
		t.Errorf("turn = %+v, %v; want it closed by its results, not cut off at the deadline", turn, err)
	}
}

// A replica that stops leaves the watches it drove to the others at once,
// not after the minute a silent driver is given: a rolling restart does not
// hold up the conversations in flight.
func TestAStoppingReplicaHandsItsWatchesOver(t *testing.T) {
	t.Parallel()
	e := newEnv(t, weatherScenario("handover", "handover weather", `{"location":"Oslo"}`))
	e.register("geo", "get_weather", weatherSchema)
	release := make(chan struct{})
	e.serve("geo", []string{"get_weather"}, func(c *protocol.Call) (string, bool) {
		<-release // the result comes only after the first replica is gone
		return "sunny", false
	})
	d2, _ := e.dispatcher(dispatch.Options{SweepInterval: 200 * time.Millisecond})
	d1, stop1 := e.dispatcher(dispatch.Options{})
	w, err := d1.Watch(context.Background(), e.response("handover weather"))
	if err != nil {
		t.Fatal(err)
	}
	testutil.WaitForWhat(t, 10*time.Second, "the watch to list its turn", func() bool {
		w, err = d1.WatchStatus(context.Background(), w.ID)
		return err == nil && len(w.Turns) == 1
	})
	stop1()
	close(release)
	w = awaitWatch(t, d2, w.ID, 15*time.Second)
	if w.State != dispatch.WatchCompleted || w.Answer != "weather: sunny" {
		t.Fatalf("after the handover: watch %s %q %s", w.State, w.Answer, w.Error)
	}
}

// A replica stopped between recording a turn and publishing its calls
// hands the watch over, and the replica that drives it next sends the
// calls out itself instead of leaving the turn to the sweep, which only
// touches turns old enough to look stuck. (Whether the stop beats the
// publication is a race: without the resumption this fails about half the
// time, never with it.)
func TestAWatchTakenOverMidIntakeSendsItsCalls(t *testing.T) {
	t.Parallel()
	e := newEnv(t, weatherScenario("midintake", "mid-intake weather", `{"location":"Oslo"}`))
	e.register("geo", "get_weather", weatherSchema)
	var ran atomic.Int32
	e.serve("geo", []string{"get_weather"}, func(c *protocol.Call) (string, bool) {
		ran.Add(1)
		return "sunny", false
	})
	d2, _ := e.dispatcher(dispatch.Options{SweepInterval: 200 * time.Millisecond})
	var logs testutil.Buffer
	d1, cancel, wait := runWith(t, e, func(p dispatch.Platform) dispatch.Platform { return p }, &logs, dispatch.Options{Name: t.Name()})
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("--- the stopped replica's log ---\n%s", logs.String())
		}
	})
	var once sync.Once
	removeHook := crashpoint.Add(func(point, process, _ string) {
		if point == crashpoint.Intake && process == t.Name() {
			once.Do(cancel) // stop with the turn recorded, its calls not yet out
		}
	})
	t.Cleanup(removeHook)
	w, err := d1.Watch(context.Background(), e.response("mid-intake weather"))
	if err != nil {
		t.Fatal(err)
	}
	if err := wait(); err != nil {
		t.Fatalf("Run = %v", err)
	}
	removeHook()
	w = awaitWatch(t, d2, w.ID, 10*time.Second) // well inside the sweep's stuck age
	if w.State != dispatch.WatchCompleted || w.Answer != "weather: sunny" {
		t.Fatalf("after the handover: watch %s %q %s", w.State, w.Answer, w.Error)
	}

	if n := ran.Load(); n != 1 {
		t.Errorf("the call ran %d times, want once", n)
	}
}

// stopOnAction is a platform whose required action, once a watch's driver
// polls it, stops the dispatcher: the poll returns it only once the
// driver's context has ended, as when SIGTERM arrives while a turn is being
// taken in. (Watch's own first poll, which checks the object exists, passes.)
type stopOnAction struct {
	dispatch.Platform
	stop  func()
	polls atomic.Int32
}

func (p *stopOnAction) Poll(ctx context.Context, ref dispatch.Ref) (*dispatch.Observation, error) {
	obs, err := p.Platform.Poll(ctx, ref)
	if err == nil && obs.State == dispatch.ObjectRequiresAction && p.polls.Add(1) == 2 {
		p.stop()
		<-ctx.Done()
	}
	return obs, err
}

// A dispatcher stopped while it takes a turn in logs no error and records
// no failure for a call it could not finish resolving: nothing failed, and
// the restart takes the turn in and runs its call.
func TestStoppingMidIntakeLogsNoError(t *testing.T) {
	t.Parallel()
	e := newEnv(t, weatherScenario("stop", "stop weather", `{"location":"Oslo"}`))
	e.register("geo", "get_weather", weatherSchema)
	e.serve("geo", []string{"get_weather"}, func(c *protocol.Call) (string, bool) { return "sunny", false })
	hook := &stopOnAction{}
	var logs testutil.Buffer
	d, cancel, wait := runWith(t, e, func(p dispatch.Platform) dispatch.Platform { hook.Platform = p; return hook },
		&logs, dispatch.Options{})
	hook.stop = cancel
	w, err := d.Watch(context.Background(), e.response("stop weather"))
	if err != nil {
		t.Fatal(err)
	}
	if err := wait(); err != nil {
		t.Fatalf("Run = %v", err)
	}
	if strings.Contains(logs.String(), "level=ERROR") {
		t.Errorf("stopping logged errors:\n%s", logs.String())
	}

	d2, _ := e.dispatcher(dispatch.Options{})
	w = awaitWatch(t, d2, w.ID, 15*time.Second)
	if w.State != dispatch.WatchCompleted || w.Answer != "weather: sunny" {
		t.Fatalf("after the restart: watch %s %q %s", w.State, w.Answer, w.Error)
	}
}

// blockSubmit is a platform whose submissions hang until their context
// ends, as a platform that stopped answering would.
type blockSubmit struct {
	dispatch.Platform
	started chan struct{}
	once    sync.Once
}

func (p *blockSubmit) Submit(ctx context.Context, turn *dispatch.Turn, outputs []dispatch.Output) (*dispatch.Submission, error) {
	p.once.Do(func() { close(p.started) })
	<-ctx.Done()
	return nil, ctx.Err()
}

// A submission still hanging when the shutdown timeout ends is cancelled
// without an error logged and without marking the turn failed: the turn
// stays in submitting, and the restart submits it again.
func TestSubmissionCutOffByShutdownIsRepeatedByTheRestart(t *testing.T) {
	t.Parallel()
	e := newEnv(t, weatherScenario("hang", "hang weather", `{"location":"Oslo"}`))
	e.register("geo", "get_weather", weatherSchema)
	e.serve("geo", []string{"get_weather"}, func(c *protocol.Call) (string, bool) { return "sunny", false })
	hang := &blockSubmit{started: make(chan struct{})}
	var logs testutil.Buffer
	d1, cancel, wait := runWith(t, e, func(p dispatch.Platform) dispatch.Platform { hang.Platform = p; return hang },
		&logs, dispatch.Options{ShutdownTimeout: 200 * time.Millisecond})
	w, err := d1.Watch(context.Background(), e.response("hang weather"))
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-hang.started:
	case <-time.After(10 * time.Second):
		t.Fatal("the turn was never submitted")
	}
	cancel()
	if err := wait(); err != nil {
		t.Fatalf("Run = %v", err)
	}
	if strings.Contains(logs.String(), "level=ERROR") {
		t.Errorf("a submission cut off by the shutdown logged errors:\n%s", logs.String())
	}

	d2, _ := e.dispatcher(dispatch.Options{})
	w = awaitWatch(t, d2, w.ID, 15*time.Second)
	if w.State != dispatch.WatchCompleted || w.Answer != "weather: sunny" {
		t.Fatalf("after the restart: watch %s %q %s", w.State, w.Answer, w.Error)
	}
}

// An intake whose context ends while it resolves its calls (the dispatcher
// is stopping) records nothing: a call it could not finish resolving must
// not be stored as rejected, or the restart would fail a call that can run.
func TestIntakeCancelledWhileResolvingRecordsNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.register("geo", "get_weather", weatherSchema)
	d, _ := e.dispatcher(dispatch.Options{})
	testutil.WaitForWhat(t, 10*time.Second, "get_weather to be served", func() bool { return dispatch.LiveSchemas(d, "get_weather") == 1 })
	req := &dispatch.TurnRequest{
		Ref: dispatch.Ref{Platform: protocol.PlatformResponses, ResponseID: "resp_cancelled"}, Scope: "resp_cancelled",
		Calls: []dispatch.CallRequest{{ID: "call_1", Name: "get_weather", Arguments: []byte(`{"location":"Oslo"}`)}},
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := d.Intake(ctx, req); err == nil {
		t.Fatal("Intake with an ended context succeeded")
	}
	// A turn taken in afterwards on the same connection is stored after
	// anything the cancelled intake sent.
	later := &dispatch.TurnRequest{
		Ref: dispatch.Ref{Platform: protocol.PlatformResponses, ResponseID: "resp_later"}, Scope: "resp_later",
		Calls: []dispatch.CallRequest{{ID: "call_1", Name: "no_such_function", Arguments: []byte(`{}`)}},
	}
	if _, err := d.Intake(context.Background(), later); err != nil {
		t.Fatal(err)
	}
	if turn, err := d.Turn(context.Background(), req.Key()); !errors.Is(err, dispatch.ErrNotFound) {
		t.Fatalf("after a cancelled intake: turn %+v, %v; want none recorded", turn, err)
	}
}

// awaitWatch waits until the watch id, read through d, has ended.
func awaitWatch(t *testing.T, d *dispatch.Dispatcher, id string, within time.Duration) *dispatch.Watch {
	t.Helper()
	var w *dispatch.Watch
	testutil.WaitForWhat(t, within, "watch "+id+" to end", func() bool {
		var err error
		w, err = d.WatchStatus(context.Background(), id)
		return err == nil && w.State != dispatch.WatchActive
	})
	return w
}

// runWith starts a dispatcher whose Responses platform is wrap's, logging
// to logs, and declares the test's functions to it; cancel ends its Run's
// context (it may be called from a platform call) and wait returns what
// Run returned.
func runWith(t *testing.T, e *env, wrap func(dispatch.Platform) dispatch.Platform, logs *testutil.Buffer,
	opts dispatch.Options) (d *dispatch.Dispatcher, cancel func(), wait func() error) {
	t.Helper()
	_, js := e.srv.Connect(t)
	var platforms []dispatch.Platform
	for _, p := range openaiplatform.New(e.client) {
		if p.Name() == protocol.PlatformResponses {
			p = wrap(p)
		}
		platforms = append(platforms, p)
	}
	opts.Logger = slog.New(slog.NewTextHandler(logs, nil))
	d, err := dispatch.New(js, platforms, opts)
	if err != nil {
		t.Fatal(err)
	}
	watch.New(d, js)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	testutil.WaitForWhat(t, 10*time.Second, "the dispatcher to be ready", d.Ready)
	e.redeclare()
	return d, cancel, func() error {
		select {
		case err := <-done:
			return err
		case <-time.After(20 * time.Second):
			t.Fatal("Run did not return")
			return nil
		}
	}
}

// A caller that goes away once its turn is recorded (a webhook whose
// connection closed) does not leave the turn half taken in: this replica
// gathers for it, so the sweep would not resume it, and a failure decided
// at intake that was never recorded would hold the turn to its deadline.
func TestAnIntakeWhoseCallerGoesAwayStillFinishes(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	d, _ := e.dispatcher(dispatch.Options{})
	req := &dispatch.TurnRequest{
		Ref: dispatch.Ref{Platform: protocol.PlatformResponses, ResponseID: "resp_gone"}, Scope: "resp_gone",
		Calls: []dispatch.CallRequest{{ID: "call_1", Name: "no_such_function", Arguments: []byte(`{}`)}},
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	t.Cleanup(crashpoint.Add(func(point, _, turn string) {
		if point == crashpoint.Intake && turn == string(req.Key()) {
			cancel() // the caller goes away as the record is stored
		}
	}))
	if _, err := d.Intake(ctx, req); err != nil {
		t.Fatal(err)
	}
	testutil.WaitForWhat(t, 10*time.Second, "the turn to be closed", func() bool {
		turn, err := d.Turn(context.Background(), req.Key())
		return err == nil && !turn.Open()
	})
}

// A dispatcher that dies with its embedded server (kill -9) between the
// record's storage and the timer's (two streams, stored by two of the
// server's goroutines) leaves a turn recorded with no deadline and out of
// the index the sweep reads. The platform then repeats the required action
// (a webhook retried, the next poll, a stream reconnecting): the repeat
// writes the timer beside its attempt at the record, as every intake does,
// so the timer is armed even though the record exists, and the deadline
// fires.
func TestARepeatedIntakeArmsATimerTheFirstLeftUnstored(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.register("geo", "get_forecast", weatherSchema)
	e.serveWith("geo", []string{"get_forecast"}, func(*protocol.Call, int) (*protocol.Result, bool) { return nil, false })
	nc, js := e.srv.Connect(t)
	d1, err := dispatch.New(js, openaiplatform.New(e.client), dispatch.Options{Logger: testutil.Logger(t), ShutdownTimeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	req := &dispatch.TurnRequest{
		Ref: dispatch.Ref{Platform: protocol.PlatformResponses, ResponseID: "resp_no_timer"}, Scope: "resp_no_timer",
		Deadline: time.Now().Add(4 * time.Second),
		Calls:    []dispatch.CallRequest{{ID: "call_1", Name: "get_forecast", Arguments: json.RawMessage(`{"location":"Oslo"}`)}},
	}
	// The crash: the record is stored, its timer is not, the dispatcher
	// is gone.
	removeHook := crashpoint.Add(func(point, _, key string) {
		if point == crashpoint.Intake && key == string(req.Key()) {
			timers, err := e.js.Stream(context.Background(), provision.TimerStream)
			if err == nil {
				err = timers.Purge(context.Background(), jetstream.WithPurgeSubject(provision.TimerSubjectPrefix+".sched."+key))
			}
			if err != nil {
				t.Errorf("purge the timer: %v", err)
			}
			nc.Close()
		}
	})
	t.Cleanup(removeHook)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d1.Run(ctx) }()
	testutil.WaitForWhat(t, 10*time.Second, "the first replica to be ready with get_forecast served", func() bool { return d1.Ready() && dispatch.LiveSchemas(d1, "get_forecast") == 1 })
	_, _ = d1.Intake(context.Background(), req) // cut short by the crash
	cancel()
	<-done
	removeHook()
	e.srv.Restart(t) // the server died too: what it remembers is what it stored
	testutil.WaitForWhat(t, 10*time.Second, "the test's connection to reconnect to the restarted server", func() bool { return e.js.Conn().IsConnected() })
	timers, err := e.js.Stream(context.Background(), provision.TimerStream)
	if err != nil {
		t.Fatal(err)
	}
	if info, err := timers.Info(context.Background(), jetstream.WithSubjectFilter(provision.TimerSubjectPrefix+".>")); err != nil || len(info.State.Subjects) != 0 {
		t.Fatalf("timer subjects after the crash = %v, %v; want none (the test's crash did not take the timer)", info, err)
	}

	d2, _ := e.dispatcher(dispatch.Options{})
	testutil.WaitForWhat(t, 10*time.Second, "the second replica to be ready", d2.Ready)
	if turn, err := d2.Intake(context.Background(), req); err != nil || turn.State != dispatch.TurnCollecting {
		t.Fatalf("the repeat = %+v, %v; want the turn still collecting", turn, err)
	}
	// Within sweepAfter (15 s) of intake, so that only the timer, and not
	// a sweep's look at a turn missing from the index, can have cut it off.
	testutil.WaitForWhat(t, 10*time.Second, "the turn to be cut off at its deadline", func() bool {
		turn, err := d2.Turn(context.Background(), req.Key())
		return err == nil && turn.Outcome().CutOff
	})
}

// A restarted dispatcher publishes again the calls of a turn without a
// result only while the calls stream's duplicates window drops the
// repeat of one that went out: a young turn's call is published twice and
// runs once; an old turn's call, still running, is not published again,
// as its repeat would be queued and run a second time.
func TestCallsArePublishedAgainOnlyWithinTheirWindow(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		age   time.Duration // how old the turn is made before the restart
		sends int           // publications of the call seen in all
	}{
		{"young", 0, 2},
		{"past the window", protocol.CallDuplicateWindow, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			e.register("geo", "get_weather", weatherSchema)
			release := make(chan struct{})
			ran := e.serve("geo", []string{"get_weather"}, func(*protocol.Call) (string, bool) {
				<-release
				return "sunny", false
			})
			nc, _ := e.srv.Connect(t)
			var sends atomic.Int32
			sub, err := nc.Subscribe(protocol.CallSubject("geo", "get_weather"), func(*nats.Msg) { sends.Add(1) })
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = sub.Unsubscribe() }()
			d1, stop1 := e.dispatcher(dispatch.Options{})
			turn, err := d1.Intake(context.Background(), &dispatch.TurnRequest{
				Ref: dispatch.Ref{Platform: protocol.PlatformAgents, SessionID: "as_window"}, Scope: "as_window/turn_1", TurnID: "turn_1",
				Calls: []dispatch.CallRequest{{ID: "call_1", Name: "get_weather", Arguments: json.RawMessage(`{"location":"Oslo"}`)}}})
			if err != nil {
				t.Fatal(err)
			}
			testutil.WaitForWhat(t, 10*time.Second, "the call to start running", func() bool { return ran.Load() == 1 })
			stop1()
			if tc.age > 0 {
				ageTurn(t, e.js, turn.Key, tc.age)
			}
			logs := &testutil.Buffer{}
			e.dispatcher(dispatch.Options{Logger: testutil.LoggerTo(t, logs)})
			testutil.WaitForWhat(t, 15*time.Second, "the restart to look at the turn", func() bool {
				return sends.Load() == 2 || logs.Logged("WARN", "none of its calls is published again")
			})
			close(release)
			if n := sends.Load(); n != int32(tc.sends) {
				t.Errorf("the call was published %d times, want %d", n, tc.sends)
			}
			calls, err := e.js.Stream(context.Background(), protocol.CallStream("geo"))
			if err != nil {
				t.Fatal(err)
			}
			if info, err := calls.Info(context.Background()); err != nil || info.State.LastSeq != 1 {
				t.Errorf("the call stream stored %+v (%v), want one message", info.State, err)
			}
		})
	}
}

// ageTurn moves the creation of turn key's record back by age.
func ageTurn(t *testing.T, js jetstream.JetStream, key protocol.TurnKey, age time.Duration) {
	t.Helper()
	ctx := context.Background()
	kv, err := js.KeyValue(ctx, provision.TurnBucket)
	if err != nil {
		t.Fatal(err)
	}
	entry, err := kv.Get(ctx, string(key))
	if err != nil {
		t.Fatal(err)
	}
	var rec map[string]json.RawMessage
	if err := json.Unmarshal(entry.Value(), &rec); err != nil {
		t.Fatal(err)
	}
	var created time.Time
	if err := json.Unmarshal(rec["created_at"], &created); err != nil {
		t.Fatal(err)
	}
	rec["created_at"], _ = json.Marshal(created.Add(-age))
	b, _ := json.Marshal(rec)
	if _, err := kv.Update(ctx, string(key), b, entry.Revision()); err != nil {
		t.Fatal(err)
	}
}
