package dispatch_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/toolrelay/toolrelay/internal/platformsim"
	"github.com/toolrelay/toolrelay/internal/provision"
	"github.com/toolrelay/toolrelay/internal/testutil"
	"github.com/toolrelay/toolrelay/pkg/dispatch"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

const weatherSchema = `{"type":"object","properties":{"location":{"type":"string"},"unit":{"enum":["c","f"]}},"required":["location"],"additionalProperties":false}`

func weatherScenario(name, prompt, args string) platformsim.Scenario {
	return platformsim.Scenario{
		Name: name, Prompt: prompt,
		Steps:  []platformsim.Step{{{Name: "get_weather", Arguments: args}}},
		Answer: `weather: {{out "get_weather"}}`,
	}
}

func TestEachPlatformIsSubmittedOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t, platformsim.SeedScenarios()...)
	seeds := []string{"get_customer", "get_weather", "get_horoscope", "getUserFavoriteCity", "getCityNickname", "getCurrentWeatherAtLocation"}
	for _, fn := range seeds {
		e.register("demo", fn, `{"type":"object"}`)
	}
	outputs := map[string]string{
		"get_customer": `{"name":"Example Customer","plan":"pro"}`, "get_weather": `{"location":"Paris","conditions":"fog","temperature":"9c"}`,
		"get_horoscope": "Aquarius: otters.", "getUserFavoriteCity": "Seattle, WA", "getCityNickname": "The Emerald City",
		"getCurrentWeatherAtLocation": "70f",
	}
	ran := e.serve("demo", seeds, func(c *protocol.Call) (string, bool) { return outputs[c.Function], false })
	d, _ := e.dispatcher(dispatch.Options{})

	cases := []struct {
		ref  dispatch.Ref
		want string
	}{
		{e.session("customer 123 please"), "Customer 123 is Example Customer on the pro plan. In Paris it is fog and 9c."},
		{e.assistantsRun("my favorite city", nil), "Your favorite city, Seattle, WA, is also known as The Emerald City. The current weather there is 70f."},
		{e.response("my horoscope"), "Your horoscope: Aquarius: otters."},
	}
	for _, tc := range cases {
		w := finish(t, d, tc.ref, 20*time.Second)
		if w.State != dispatch.WatchCompleted || w.Answer != tc.want {
			t.Errorf("%s: watch %s %q (%s), want answer %q", tc.ref, w.State, w.Answer, w.Error, tc.want)
		}
	}
	st := e.sim.Stats()
	if st.ToolResults != 2 || st.SubmitToolOutputs != 2 || st.FunctionCallOutputs != 1 {
		t.Errorf("platform accepted %+v; want 2 tool results, 2 submissions, 1 output", st)
	}
	if ran.Load() != 6 {
		t.Errorf("executor ran %d calls, want 6", ran.Load())
	}
}

func TestBadCallsFailAtOnceWithoutRunning(t *testing.T) {
	t.Parallel()
	e := newEnv(t,
		weatherScenario("schema", "schema violation", `{"location":5}`),
		platformsim.Scenario{Name: "unknown", Prompt: "unknown function",
			Steps: []platformsim.Step{{{Name: "no_such_function"}}}, Answer: `{{out "no_such_function"}}`},
	)
	e.register("geo", "get_weather", weatherSchema)
	ran := e.serve("geo", []string{"get_weather"}, func(c *protocol.Call) (string, bool) { return "sunny", false })
	d, _ := e.dispatcher(dispatch.Options{})

	w := finish(t, d, e.response("schema violation"), 10*time.Second)
	var out struct {
		Error protocol.CallError `json:"error"`
	}
	if err := json.Unmarshal([]byte(strings.TrimPrefix(w.Answer, "weather: ")), &out); err != nil {
		t.Fatalf("answer %q does not carry a JSON error: %v", w.Answer, err)
	}
	if out.Error.Code != protocol.CodeInvalidArguments || !strings.Contains(out.Error.Message, "/location") {
		t.Errorf("error = %+v, want invalid_arguments naming /location", out.Error)
	}

	w = finish(t, d, e.response("unknown function"), 10*time.Second)
	if !strings.Contains(w.Answer, `"type":"unknown_function"`) || !strings.Contains(w.Answer, "no_such_function") {
		t.Errorf("answer = %q, want an unknown_function error", w.Answer)
	}
	if n := ran.Load(); n != 0 {
		t.Errorf("the executor ran %d calls; bad calls must not run", n)
	}
}

func TestDeadlineSubmitsTimeoutsAndLateResultsAreNotSubmitted(t *testing.T) {
	t.Parallel()
	e := newEnv(t, weatherScenario("slow", "slow weather", `{"location":"Oslo"}`))
	e.register("geo", "get_weather", weatherSchema)
	release := make(chan *protocol.Call, 1)
	e.serve("geo", []string{"get_weather"}, func(c *protocol.Call) (string, bool) {
		release <- c
		return "", false // never answers in time
	})
	// No expiry on Responses: RUN_TTL applies; a quarter of it is the margin.
	reader := sdkmetric.NewManualReader()
	d, _ := e.dispatcher(dispatch.Options{RunTTL: 4 * time.Second, MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))})
	w := finish(t, d, e.response("slow weather"), 15*time.Second)
	if w.State != dispatch.WatchCompleted || !strings.Contains(w.Answer, `"type":"timeout"`) || !strings.Contains(w.Answer, "get_weather timed out") {
		t.Fatalf("watch %s answer %q (%s), want a timeout result", w.State, w.Answer, w.Error)
	}
	turn, err := d.Turn(context.Background(), w.Turns[0])
	if err != nil || !turn.Outcome().CutOff || len(turn.Outcome().TimedOut) != 1 {
		t.Fatalf("turn = %+v, %v; want cut off with one timed-out call", turn, err)
	}
	if !turn.Outcome().SubmittedAt.Before(turn.ExpiresAt) || turn.Outcome().SubmittedAt.Before(turn.Deadline) {
		t.Errorf("submitted at %s; want between the deadline %s and the expiry %s", turn.Outcome().SubmittedAt, turn.Deadline, turn.ExpiresAt)
	}

	// The straggler's result arrives late: recorded, never submitted.
	before := e.sim.Stats().FunctionCallOutputs
	c := <-release
	res := &protocol.Result{Version: protocol.Version, Key: c.Key, CallID: c.CallID, Team: c.Team, Function: c.Function, Output: "late", FinishedAt: time.Now()}
	data, err := protocol.EncodeResult(res)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.js.Publish(context.Background(), res.Subject(), data); err != nil {
		t.Fatal(err)
	}
	// Wait until the dispatcher has taken the result in and judged it late:
	// whatever it would do with it, it has decided by then.
	testutil.WaitForWhat(t, 10*time.Second, "the late result to be counted", func() bool { return counter(t, reader, "toolrelay.results.late") == 1 })
	if after := e.sim.Stats().FunctionCallOutputs; after != before {
		t.Errorf("late result was submitted: outputs %d -> %d", before, after)
	}
	if turn, err := d.Turn(context.Background(), w.Turns[0]); err != nil || turn.State != dispatch.TurnSubmitted || len(turn.Outcome().TimedOut) != 1 {
		t.Errorf("after the late result: turn = %+v, %v; want it still submitted with the call timed out", turn, err)
	}
	s, err := e.js.Stream(context.Background(), protocol.ResultStream(res.Team))
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.GetLastMsgForSubject(context.Background(), res.Subject())
	if err != nil {
		t.Fatalf("the late result is not recorded: %v", err)
	}
	if got, err := protocol.DecodeResult(m.Data); err != nil || got.Output != "late" {
		t.Errorf("recorded result = %+v, %v; want the late one", got, err)
	}
}

func TestReplicasSubmitEachTurnOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t, platformsim.FavoriteCityScenario)
	city := []string{"getUserFavoriteCity", "getCityNickname", "getCurrentWeatherAtLocation"}
	for _, fn := range city {
		e.register("demo", fn, `{"type":"object"}`)
	}
	e.serve("demo", city, func(c *protocol.Call) (string, bool) {
		return map[string]string{"getUserFavoriteCity": "Seattle, WA", "getCityNickname": "The Emerald City", "getCurrentWeatherAtLocation": "70f"}[c.Function], false
	})
	var ds []*dispatch.Dispatcher
	for range 3 {
		d, _ := e.dispatcher(dispatch.Options{})
		ds = append(ds, d)
	}
	const runs = 10
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		turns []protocol.TurnKey
	)
	for i := range runs {
		ref := e.assistantsRun("favorite city", nil)
		wg.Go(func() {
			// Every replica is asked to drive the same run.
			var ws []*dispatch.Watch
			for _, d := range ds {
				ws = append(ws, finish(t, d, ref, 30*time.Second))
			}
			for _, w := range ws {
				if w.State != dispatch.WatchCompleted || !strings.Contains(w.Answer, "The Emerald City") {
					t.Errorf("run %d: watch %s %q %s", i, w.State, w.Answer, w.Error)
				}
			}
			mu.Lock()
			turns = append(turns, ws[0].Turns...)
			mu.Unlock()
		})
	}
	wg.Wait()
	if len(turns) != 2*runs {
		t.Fatalf("the watches drove %d turns, want %d", len(turns), 2*runs)
	}
	// A run completes as soon as its last submission is accepted; another
	// replica could still submit a turn again (a sweep taking over one it
	// thinks stuck). Wait until no replica can: every turn is recorded
	// submitted and has left the index of open turns the sweeps read.
	ctx := context.Background()
	timers, err := e.js.Stream(ctx, provision.TimerStream)
	if err != nil {
		t.Fatal(err)
	}
	testutil.WaitForWhat(t, 30*time.Second, "every turn to be submitted and out of the timer index", func() bool {
		for _, key := range turns {
			if turn, err := ds[0].Turn(ctx, key); err != nil || turn.State != dispatch.TurnSubmitted {
				return false
			}
		}
		info, err := timers.Info(ctx, jetstream.WithSubjectFilter(provision.TimerSubjectPrefix+".>"))
		return err == nil && len(info.State.Subjects) == 0
	})
	if got := e.sim.Stats().SubmitToolOutputs; got != 2*runs {
		t.Errorf("accepted submissions = %d, want exactly %d (two steps per run)", got, 2*runs)
	}
	if rej := e.sim.Stats().Rejected; rej != 0 {
		t.Errorf("the platform rejected %d requests", rej)
	}
}

func TestIntakeIsIdempotent(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.register("geo", "get_weather", weatherSchema)
	ran := e.serve("geo", []string{"get_weather"}, func(c *protocol.Call) (string, bool) { return "sunny", false })
	d1, _ := e.dispatcher(dispatch.Options{})
	d2, _ := e.dispatcher(dispatch.Options{})
	req := &dispatch.TurnRequest{
		Ref:   dispatch.Ref{Platform: protocol.PlatformResponses, ResponseID: "resp_x"},
		Scope: "resp_x",
		Calls: []dispatch.CallRequest{{ID: "call_1", Name: "get_weather", Arguments: json.RawMessage(`{"location":"Oslo"}`)}},
	}
	var wg sync.WaitGroup
	keys := make([]protocol.TurnKey, 8)
	for i := range keys {
		d := d1
		if i%2 == 1 {
			d = d2
		}
		wg.Go(func() {
			turn, err := d.Intake(context.Background(), req)
			if err != nil {
				t.Error(err)
				return
			}
			keys[i] = turn.Key
		})
	}
	wg.Wait()
	for _, k := range keys {
		if k != keys[0] {
			t.Fatalf("different keys for one required action: %v", keys)
		}
	}
	// Every Intake has returned, so whatever it published is stored. Wait
	// until the turn is closed (nothing re-publishes its calls any more)
	// and the executor has run and acknowledged every call stored: a second
	// publication would have run by then.
	ctx := context.Background()
	testutil.WaitForWhat(t, 10*time.Second, "the turn to be closed", func() bool {
		turn, err := d1.Turn(ctx, keys[0])
		return err == nil && !turn.Open()
	})
	// A repeat once the turn is closed (a late webhook, a poll of the same
	// response) gets the closed turn and runs nothing.
	for _, d := range []*dispatch.Dispatcher{d1, d2} {
		if turn, err := d.Intake(ctx, req); err != nil || turn.Open() {
			t.Fatalf("a repeat after the close: %+v, %v; want the closed turn", turn, err)
		}
	}
	calls, err := e.js.Stream(ctx, protocol.CallStream("geo"))
	if err != nil {
		t.Fatal(err)
	}
	testutil.WaitForWhat(t, 10*time.Second, "the executor to have run and acknowledged every stored call", func() bool {
		ci, err := calls.Consumer(ctx, "get_weather")
		if err != nil {
			return false
		}
		info, err := ci.Info(ctx)
		return err == nil && info.NumPending == 0 && info.NumAckPending == 0
	})
	info, err := calls.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.LastSeq != 1 {
		t.Errorf("the call stream stored %d messages, want 1", info.State.LastSeq)
	}
	if n := ran.Load(); n != 1 {
		t.Errorf("the call ran %d times, want once", n)
	}
}

func TestResumeAfterRestart(t *testing.T) {
	t.Parallel()
	e := newEnv(t, weatherScenario("resume", "resume weather", `{"location":"Oslo"}`))
	e.register("geo", "get_weather", weatherSchema)
	release := make(chan struct{})
	e.serve("geo", []string{"get_weather"}, func(c *protocol.Call) (string, bool) {
		<-release // the result comes only after the dispatcher is gone
		return "sunny", false
	})
	d1, stop1 := e.dispatcher(dispatch.Options{})
	w, err := d1.Watch(context.Background(), e.response("resume weather"))
	if err != nil {
		t.Fatal(err)
	}
	testutil.WaitForWhat(t, 10*time.Second, "the watch to list its turn", func() bool {
		w, err = d1.WatchStatus(context.Background(), w.ID)
		return err == nil && len(w.Turns) == 1
	})
	stop1() // the dispatcher goes away mid-gather
	close(release)

	d2, _ := e.dispatcher(dispatch.Options{})
	testutil.WaitForWhat(t, 20*time.Second, "the second replica to end the watch", func() bool {
		w, err = d2.WatchStatus(context.Background(), w.ID)
		return err == nil && w.State != dispatch.WatchActive
	})
	if w.State != dispatch.WatchCompleted || w.Answer != "weather: sunny" {
		t.Fatalf("after restart: watch %s %q %s", w.State, w.Answer, w.Error)
	}
	if n := e.sim.Stats().FunctionCallOutputs; n != 1 {
		t.Errorf("outputs submitted = %d, want 1", n)
	}
}

func TestFunctionNobodyServesFailsAtOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t, weatherScenario("orphan", "orphan weather", `{"location":"Oslo"}`))
	d, _ := e.dispatcher(dispatch.Options{ServeGrace: 200 * time.Millisecond})
	// Claimed by geo's executor, which is gone again.
	e.declare("geo", "get_weather", weatherSchema, "test-executor", "gone")()
	w := finish(t, d, e.response("orphan weather"), 10*time.Second)
	if !strings.Contains(w.Answer, `"type":"unavailable"`) || !strings.Contains(w.Answer, "no executor is serving it") {
		t.Fatalf("answer = %q, want an unavailable error", w.Answer)
	}
	turn, err := d.Turn(context.Background(), w.Turns[0])
	if err != nil || !turn.Calls[0].Rejected || turn.Outcome().CutOff {
		t.Errorf("turn = %+v, %v; want the call rejected at intake, not cut off", turn, err)
	}
}

// Arguments too large to keep in the turn record (one call's, or a turn's
// together) fail their call at intake with a reason the model can act on;
// the turn's other calls run, and nothing is retried for ever.
func TestOversizedArgumentsFailAtIntake(t *testing.T) {
	t.Parallel()
	pad := func(kib int) string { return `{"pad":"` + strings.Repeat("x", kib<<10) + `"}` }
	e := newEnv(t,
		platformsim.Scenario{Name: "one", Prompt: "one huge call",
			Steps: []platformsim.Step{{{Name: "f1", Arguments: pad(300)}}}, Answer: `{{out "f1"}}`},
		platformsim.Scenario{Name: "four", Prompt: "four large calls",
			Steps: []platformsim.Step{{{Name: "f1", Arguments: pad(200)}, {Name: "f2", Arguments: pad(200)},
				{Name: "f3", Arguments: pad(200)}, {Name: "f4", Arguments: pad(200)}}},
			Answer: `{{out "f1"}}|{{out "f2"}}|{{out "f3"}}|{{out "f4"}}`})
	fns := []string{"f1", "f2", "f3", "f4"}
	for _, fn := range fns {
		e.register("big", fn, `{"type":"object"}`)
	}
	e.serve("big", fns, func(c *protocol.Call) (string, bool) { return "ran", false })
	d, _ := e.dispatcher(dispatch.Options{})

	w, err := d.Watch(context.Background(), e.response("one huge call"))
	if err != nil {
		t.Fatal(err)
	}
	w = awaitWatch(t, d, w.ID, 15*time.Second)
	if !strings.Contains(w.Answer, "invalid_arguments") || !strings.Contains(w.Answer, "KiB, more than the 256 KiB a call may carry") {
		t.Errorf("one 300 KiB call: answer %.300q", w.Answer)
	}

	w, err = d.Watch(context.Background(), e.response("four large calls"))
	if err != nil {
		t.Fatal(err)
	}
	w = awaitWatch(t, d, w.ID, 15*time.Second)
	outs := strings.Split(w.Answer, "|")
	if len(outs) != 4 || outs[0] != "ran" || outs[1] != "ran" || outs[2] != "ran" ||
		!strings.Contains(outs[3], "more than the 768 KiB this turn's calls may carry together") {
		t.Errorf("four 200 KiB calls: answer %.600q", w.Answer)
	}
}

// An Agents session answers a step's calls one tool_result at a time and
// until the last lands still lists the others as required. Seen then (a
// webhook retried, a restarted driver's poll), the remaining calls are the
// step already taken in, not a new turn that runs them again.
func TestTheRestOfAnAgentsStepIsNotANewTurn(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.register("geo", "get_weather", weatherSchema)
	ran := e.serve("geo", []string{"get_weather"}, func(c *protocol.Call) (string, bool) { return "sunny", false })
	d, _ := e.dispatcher(dispatch.Options{})
	ref := dispatch.Ref{Platform: protocol.PlatformAgents, SessionID: "as_step"}
	call := func(id string) dispatch.CallRequest {
		return dispatch.CallRequest{ID: id, Name: "get_weather", Arguments: json.RawMessage(`{"location":"Oslo"}`)}
	}
	ctx := context.Background()
	step, err := d.Intake(ctx, &dispatch.TurnRequest{Ref: ref, Scope: "as_step/turn_1", TurnID: "turn_1",
		Calls: []dispatch.CallRequest{call("call_1"), call("call_2")}})
	if err != nil {
		t.Fatal(err)
	}
	rest, err := d.Intake(ctx, &dispatch.TurnRequest{Ref: ref, Scope: "as_step/turn_1", TurnID: "turn_1",
		Calls: []dispatch.CallRequest{call("call_2")}})
	if err != nil {
		t.Fatal(err)
	}
	if rest.Key != step.Key {
		t.Errorf("the step's remaining call was taken in as turn %s, want the step's turn %s", rest.Key, step.Key)
	}
	// The session turn's next step is a turn of its own.
	next, err := d.Intake(ctx, &dispatch.TurnRequest{Ref: ref, Scope: "as_step/turn_1", TurnID: "turn_1",
		Calls: []dispatch.CallRequest{call("call_3")}})
	if err != nil {
		t.Fatal(err)
	}
	if next.Key == step.Key {
		t.Error("the next step of the session turn was taken for the first")
	}
	testutil.WaitForWhat(t, 10*time.Second, "three calls to run", func() bool { return ran.Load() >= 3 })
	calls, err := e.js.Stream(ctx, protocol.CallStream("geo"))
	if err != nil {
		t.Fatal(err)
	}
	info, err := calls.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.LastSeq != 3 || ran.Load() != 3 {
		t.Errorf("calls stored %d, run %d; want 3 and 3 (call_2 once)", info.State.LastSeq, ran.Load())
	}
}

// A repeat of a required action while its turn is still open publishes
// again only the calls without a result. One that ran was deleted from its
// work queue when acknowledged, and a restarted server rebuilds its
// message IDs from the messages it still stores: the dedupe window alone
// would let the repeat run it again.
func TestARepeatAfterAServerRestartRunsNoCallAgain(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.register("geo", "get_weather", weatherSchema)
	e.register("geo", "get_forecast", weatherSchema)
	ran := e.serve("geo", []string{"get_weather"}, func(*protocol.Call) (string, bool) { return "sunny", false })
	e.serve("geo", []string{"get_forecast"}, func(*protocol.Call) (string, bool) { return "", false }) // keeps the turn open
	// A request in flight as the server goes down can go unanswered for
	// good; stopping need not wait the default 10 s for it.
	d, _ := e.dispatcher(dispatch.Options{ShutdownTimeout: 500 * time.Millisecond})
	testutil.WaitForWhat(t, 10*time.Second, "get_weather and get_forecast to be served", func() bool {
		return dispatch.LiveSchemas(d, "get_weather") == 1 && dispatch.LiveSchemas(d, "get_forecast") == 1
	})
	ctx := context.Background()
	req := &dispatch.TurnRequest{
		Ref: dispatch.Ref{Platform: protocol.PlatformResponses, ResponseID: "resp_restart"}, Scope: "resp_restart",
		Calls: []dispatch.CallRequest{
			{ID: "call_1", Name: "get_weather", Arguments: json.RawMessage(`{"location":"Oslo"}`)},
			{ID: "call_2", Name: "get_forecast", Arguments: json.RawMessage(`{"location":"Oslo"}`)},
		},
	}
	if _, err := d.Intake(ctx, req); err != nil {
		t.Fatal(err)
	}
	calls, err := e.js.Stream(ctx, protocol.CallStream("geo"))
	if err != nil {
		t.Fatal(err)
	}
	// call_1 ran and was acknowledged (so deleted); call_2 waits, stored.
	testutil.WaitForWhat(t, 10*time.Second, "call_1 to run and be deleted, call_2 to wait stored", func() bool {
		info, err := calls.Info(ctx)
		return err == nil && ran.Load() == 1 && info.State.Msgs == 1
	})
	e.srv.Restart(t)
	testutil.WaitForWhat(t, 10*time.Second, "the restarted server to be reconnected and the dispatcher ready", func() bool { return e.js.Conn().IsConnected() && d.Ready() })
	turn, err := d.Intake(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if turn.State != dispatch.TurnCollecting {
		t.Fatalf("the repeat found the turn %s, want it still collecting", turn.State)
	}
	// The repeat's publications are acknowledged once Intake returns.
	info, err := calls.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.LastSeq != 2 {
		t.Errorf("the call stream stored %d messages, want 2: a call that ran was queued again", info.State.LastSeq)
	}
}
