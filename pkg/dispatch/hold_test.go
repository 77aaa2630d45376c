package dispatch_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolrelay/toolrelay/internal/provision"
	"github.com/toolrelay/toolrelay/internal/testutil"
	"github.com/toolrelay/toolrelay/pkg/dispatch"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// tally is a Responses platform that takes every submission and counts
// them by turn, noting which replica's adapter made each.
type tally struct {
	replica string
	mu      *sync.Mutex
	by      map[protocol.TurnKey][]string
}

func newTally() *tally { return &tally{mu: &sync.Mutex{}, by: map[protocol.TurnKey][]string{}} }

// on returns the platform as the replica named replica uses it.
func (p *tally) on(replica string) *tally { c := *p; c.replica = replica; return &c }

func (*tally) Name() protocol.Platform { return protocol.PlatformResponses }

func (*tally) Poll(context.Context, dispatch.Ref) (*dispatch.Observation, error) {
	return &dispatch.Observation{State: dispatch.ObjectRunning}, nil
}

func (p *tally) Submit(_ context.Context, t *dispatch.Turn, _ []dispatch.Output) (*dispatch.Submission, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.by[t.Key] = append(p.by[t.Key], p.replica)
	return &dispatch.Submission{}, nil
}

// submitters lists who submitted key, in order.
func (p *tally) submitters(key protocol.TurnKey) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.by[key]...)
}

// holdReplica runs a dispatcher named name on its own connection with p,
// tuned before it runs; stop ends it (as SIGTERM would) and waits.
func holdReplica(t *testing.T, e *env, name string, p *tally, opts dispatch.Options, tune ...func(*dispatch.Dispatcher)) (d *dispatch.Dispatcher, stop func()) {
	t.Helper()
	_, js := e.srv.Connect(t)
	opts.Name, opts.Logger = name, testutil.Logger(t)
	d, err := dispatch.New(js, []dispatch.Platform{p.on(name)}, opts)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range tune {
		f(d)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = d.Run(ctx); close(done) }()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	testutil.WaitFor(t, 10*time.Second, d.Ready)
	e.redeclare()
	return d, stop
}

// holdTurn is a Responses turn of one call to get_weather.
func holdTurn(id string) *dispatch.TurnRequest {
	return &dispatch.TurnRequest{
		Ref: dispatch.Ref{Platform: protocol.PlatformResponses, ResponseID: id}, Scope: id,
		Calls: []dispatch.CallRequest{{ID: "call_1", Name: "get_weather", Arguments: json.RawMessage(`{"location":"Oslo"}`)}},
	}
}

// wire is a turn record as stored, as any version reads it.
type wire struct {
	State           string    `json:"state"`
	Owner           string    `json:"owner"`
	SubmittingSince time.Time `json:"submitting_since"`
	Held            bool      `json:"held"`
}

func (w wire) String() string {
	if w.Held {
		return w.State + " (held by " + w.Owner + ")"
	}
	return w.State
}

// recordWrites follows the writes of key's record as they are published
// (a KV watch may skip a revision replaced at once), until its state is
// final. Only one replica writes at a time in these tests, so each is
// stored.
func recordWrites(t *testing.T, e *env, key protocol.TurnKey) <-chan wire {
	t.Helper()
	nc, _ := e.srv.Connect(t)
	out := make(chan wire, 16)
	var once sync.Once
	sub, err := nc.Subscribe("$KV."+provision.TurnBucket+"."+string(key), func(m *nats.Msg) {
		var r wire
		if err := json.Unmarshal(m.Data, &r); err != nil {
			t.Errorf("record of %s: %v", key, err)
			return
		}
		out <- r
		if r.State == string(dispatch.TurnSubmitted) || r.State == string(dispatch.TurnFailed) {
			once.Do(func() { close(out) })
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return out
}

// collect reads writes until the final one.
func collect(t *testing.T, writes <-chan wire) []wire {
	t.Helper()
	var all []wire
	timeout := time.After(30 * time.Second)
	for {
		select {
		case w, ok := <-writes:
			if !ok {
				return all
			}
			all = append(all, w)
		case <-timeout:
			t.Fatalf("the record did not reach a final state; writes so far %v", all)
		}
	}
}

// A turn is held by the replica that takes it in: its record is created
// claimed by that replica (submitting, held, as every version reads it),
// and once its result is in the replica submits it with no claim between:
// two writes of the record in its life, not three as with holds off.
func TestAHeldTurnIsSubmittedWithoutAClaim(t *testing.T) {
	for _, c := range []struct {
		noHolds bool
		want    string
	}{
		{false, "[submitting (held by one) submitted]"},
		{true, "[collecting submitting submitted]"},
	} {
		t.Run(fmt.Sprintf("NoHolds=%v", c.noHolds), func(t *testing.T) {
			e := newEnv(t)
			e.register("geo", "get_weather", weatherSchema)
			e.serve("geo", []string{"get_weather"}, func(*protocol.Call) (string, bool) { return "sunny", false })
			p := newTally()
			d, _ := holdReplica(t, e, "one", p, dispatch.Options{NoHolds: c.noHolds})
			req := holdTurn("resp_held")
			writes := recordWrites(t, e, req.Key())
			if _, err := d.Intake(t.Context(), req); err != nil {
				t.Fatal(err)
			}
			all := collect(t, writes)
			if got := fmt.Sprint(all); got != c.want {
				t.Errorf("the record was written %s, want %s", got, c.want)
			}
			if !c.noHolds && all[0].SubmittingSince.IsZero() {
				t.Error("a held record says since when it is held by nobody's clock: an older replica would take it for stuck at once")
			}
			if got := p.submitters(req.Key()); fmt.Sprint(got) != "[one]" {
				t.Errorf("submitted by %v, want once by one", got)
			}
		})
	}
}

// A turn due within holdMinLead is not held: a deadline must never find a
// hold that no replica may take yet.
func TestATurnDueSoonIsNotHeld(t *testing.T) {
	e := newEnv(t)
	e.register("geo", "get_weather", weatherSchema)
	e.serve("geo", []string{"get_weather"}, func(*protocol.Call) (string, bool) { return "sunny", false })
	d, _ := holdReplica(t, e, "one", newTally(), dispatch.Options{})
	req := holdTurn("resp_soon")
	req.Deadline = time.Now().Add(15 * time.Second)
	writes := recordWrites(t, e, req.Key())
	if _, err := d.Intake(t.Context(), req); err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(collect(t, writes)); got != "[collecting submitting submitted]" {
		t.Errorf("the record was written %s, want it taken in collecting", got)
	}
}

// A hold kept past its time while the turn's call still runs is released:
// the record goes back to collecting (so a replica of a version without
// holds never takes the turn for a stuck submission), and the turn is then
// claimed and submitted once.
func TestAHoldKeptTooLongIsReleased(t *testing.T) {
	e := newEnv(t)
	e.register("geo", "get_weather", weatherSchema)
	release := make(chan struct{})
	e.serve("geo", []string{"get_weather"}, func(*protocol.Call) (string, bool) { <-release; return "sunny", false })
	p := newTally()
	d, _ := holdReplica(t, e, "one", p, dispatch.Options{}, func(d *dispatch.Dispatcher) {
		dispatch.HoldFor(d, 100*time.Millisecond, 20*time.Millisecond)
	})
	req := holdTurn("resp_slow")
	writes := recordWrites(t, e, req.Key())
	if _, err := d.Intake(t.Context(), req); err != nil {
		t.Fatal(err)
	}
	var seen []wire
	for len(seen) < 2 {
		select {
		case w := <-writes:
			seen = append(seen, w)
		case <-time.After(10 * time.Second):
			t.Fatalf("the hold was not released; writes so far %v", seen)
		}
	}
	close(release)
	all := append(seen, collect(t, writes)...)
	if got := fmt.Sprint(all); got != "[submitting (held by one) collecting submitting submitted]" {
		t.Errorf("the record was written %s, want held, released, claimed, submitted", got)
	}
	if got := p.submitters(req.Key()); fmt.Sprint(got) != "[one]" {
		t.Errorf("submitted by %v, want once by one", got)
	}
}

// A replica that receives the result of a turn another replica holds does
// not close the turn: it passes the result on, and the holder submits it at
// once. With holds longer than the test, a result not passed on would keep
// its turn open until the holder's sweep re-checks it (15 s).
func TestResultsReceivedElsewhereReachTheHolder(t *testing.T) {
	e := newEnv(t)
	e.register("geo", "get_weather", weatherSchema)
	e.serve("geo", []string{"get_weather"}, func(*protocol.Call) (string, bool) { return "sunny", false })
	p := newTally()
	long := func(d *dispatch.Dispatcher) { dispatch.HoldFor(d, 10*time.Minute, time.Minute) }
	one, _ := holdReplica(t, e, "one", p, dispatch.Options{}, long)
	holdReplica(t, e, "two", p, dispatch.Options{}, long)
	var nudges atomic.Int32
	nc, _ := e.srv.Connect(t)
	counter, err := nc.Subscribe(dispatch.NudgeSubject(one), func(*nats.Msg) { nudges.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = counter.Unsubscribe() }()

	const n = 40
	keys := make([]protocol.TurnKey, n)
	for i := range keys {
		req := holdTurn("resp_split_" + strconv.Itoa(i))
		keys[i] = req.Key()
		if _, err := one.Intake(t.Context(), req); err != nil {
			t.Fatal(err)
		}
	}
	testutil.WaitFor(t, 10*time.Second, func() bool {
		for _, k := range keys {
			if len(p.submitters(k)) == 0 {
				return false
			}
		}
		return true
	})
	for _, k := range keys {
		if got := p.submitters(k); fmt.Sprint(got) != "[one]" {
			t.Errorf("turn %s submitted by %v, want once by its holder", k, got)
		}
	}
	if nudges.Load() == 0 {
		t.Error("no result reached the other replica; the test tested nothing")
	}
}

// A replica that stops releases the turns it holds, so that another takes
// them at once, not when their holds are old enough to look abandoned.
func TestAStoppingReplicaReleasesItsHolds(t *testing.T) {
	e := newEnv(t)
	e.register("geo", "get_weather", weatherSchema)
	running, release := make(chan struct{}, 1), make(chan struct{})
	e.serve("geo", []string{"get_weather"}, func(*protocol.Call) (string, bool) {
		running <- struct{}{}
		<-release
		return "sunny", false
	})
	p := newTally()
	one, stopOne := holdReplica(t, e, "one", p, dispatch.Options{})
	req := holdTurn("resp_stop")
	writes := recordWrites(t, e, req.Key())
	if _, err := one.Intake(t.Context(), req); err != nil {
		t.Fatal(err)
	}
	<-running
	stopOne()
	var seen []wire
	for len(seen) < 2 {
		select {
		case w := <-writes:
			seen = append(seen, w)
		case <-time.After(5 * time.Second):
			t.Fatalf("the stopping replica did not release its hold; writes so far %v", seen)
		}
	}
	if got := fmt.Sprint(seen); got != "[submitting (held by one) collecting]" {
		t.Fatalf("the record was written %s, want held then released", got)
	}
	// The restart (or any replica) finishes it well before the hold
	// would have looked abandoned (15 s).
	holdReplica(t, e, "two", p, dispatch.Options{})
	close(release)
	collect(t, writes)
	if got := p.submitters(req.Key()); fmt.Sprint(got) != "[two]" {
		t.Errorf("submitted by %v, want once by two", got)
	}
}

// Holds, their release, results passed between replicas and claims race
// one another: two replicas, holds of 20 ms released every 2 ms, calls that
// take up to 40 ms (one at a time: about 2 s for all). Every turn is
// submitted exactly once.
func TestHoldsReleasesAndClaimsSubmitEachTurnOnce(t *testing.T) {
	e := newEnv(t)
	e.register("geo", "get_weather", weatherSchema)
	e.serve("geo", []string{"get_weather"}, func(*protocol.Call) (string, bool) {
		time.Sleep(time.Duration(rand.IntN(40)) * time.Millisecond)
		return "sunny", false
	})
	p := newTally()
	short := func(d *dispatch.Dispatcher) { dispatch.HoldFor(d, 20*time.Millisecond, 2*time.Millisecond) }
	ds := []*dispatch.Dispatcher{}
	for _, name := range []string{"one", "two"} {
		d, _ := holdReplica(t, e, name, p, dispatch.Options{}, short)
		ds = append(ds, d)
	}
	const n = 200
	keys := make([]protocol.TurnKey, n)
	var wg sync.WaitGroup
	for i := range keys {
		req := holdTurn("resp_race_" + strconv.Itoa(i))
		keys[i] = req.Key()
		wg.Go(func() {
			if _, err := ds[i%2].Intake(context.Background(), req); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	ctx := context.Background()
	// Each turn is closed by the holds' own machinery, not rescued by a
	// sweep's take-over 15 s after a close was dropped.
	testutil.WaitFor(t, 10*time.Second, func() bool {
		for _, k := range keys {
			turn, err := ds[0].Turn(ctx, k)
			if err != nil || turn.State != dispatch.TurnSubmitted {
				return false
			}
		}
		return true
	})
	for _, k := range keys {
		if got := p.submitters(k); len(got) != 1 {
			t.Errorf("turn %s submitted %d times (by %v), want once", k, len(got), got)
		}
	}
	// Nothing submits a closed turn again later (a sweep's take-over).
	timers, err := e.js.Stream(ctx, provision.TimerStream)
	if err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 30*time.Second, func() bool {
		info, err := timers.Info(ctx, jetstream.WithSubjectFilter(provision.TimerSubjectPrefix+".>"))
		return err == nil && len(info.State.Subjects) == 0 || errors.Is(err, jetstream.ErrStreamNotFound)
	})
	for _, k := range keys {
		if got := p.submitters(k); len(got) != 1 {
			t.Errorf("turn %s submitted %d times in the end (by %v), want once", k, len(got), got)
		}
	}
}
