package dispatch

import (
	"context"
	"encoding/json"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolrelay/toolrelay/internal/firstwins"
	"github.com/toolrelay/toolrelay/internal/natstest"
	"github.com/toolrelay/toolrelay/internal/testutil"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// stampingPlatform takes every submission and notes when it came.
type stampingPlatform struct {
	idlePlatform
	mu sync.Mutex
	at []time.Time
}

func (p *stampingPlatform) Submit(context.Context, *Turn, []Output) (*Submission, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.at = append(p.at, time.Now())
	return &Submission{}, nil
}

func (p *stampingPlatform) submissions() []time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]time.Time(nil), p.at...)
}

// The hold of a replica that died (nobody releases it) is its claim until
// it is stuckAfter old: no other replica submits the turn before, though its
// result is in; then one takes the turn as collecting and submits it once.
func TestADeadReplicasHoldIsTakenOnlyOnceStale(t *testing.T) {
	_, js := natstest.Start(t).Connect(t)
	p := &stampingPlatform{}
	two := replicaOn(t, js, "two", p, func(d *Dispatcher) { d.opts.SweepInterval = 100 * time.Millisecond })
	ctx := t.Context()

	now := time.Now().UTC()
	key := protocol.TurnKey("0123456789abcdef0123456789abcdef")
	since := now.Add(-stuckAfter + 2*time.Second) // stale two seconds from now
	turn := geoTurn(key, since, &TurnOutcome{Owner: "gone", SubmittingSince: since, Held: true}, "call_1")
	rev := storeTurn(t, two, turn)
	res := &protocol.Result{Version: protocol.Version, Key: turn.Calls[0].Key, CallID: "call_1", Team: "geo", Function: "get_weather",
		Output: `"sunny"`, Executor: "test", FinishedAt: now}
	if err := firstwins.Record(ctx, js.Conn(), res, nil); err != nil {
		t.Fatal(err)
	}

	staleAt := since.Add(stuckAfter)
	for time.Until(staleAt) > 200*time.Millisecond {
		if got := p.submissions(); len(got) != 0 {
			t.Fatalf("submitted at %s, %s before the hold of a replica that may still run was stale", got[0].Format(time.StampMilli), staleAt.Sub(got[0]))
		}
		if _, have, err := two.turns.get(ctx, key); err != nil || have != rev {
			t.Fatalf("the held record changed (revision %d, want %d; %v) before the hold was stale", have, rev, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	testutil.WaitFor(t, 10*time.Second, func() bool { return len(p.submissions()) > 0 })
	got := p.submissions()
	if got[0].Before(staleAt) {
		t.Errorf("submitted %s before the hold was stale", staleAt.Sub(got[0]))
	}
	testutil.WaitFor(t, 10*time.Second, func() bool {
		have, _, err := two.turns.get(ctx, key)
		return err == nil && have.State == TurnSubmitted
	})
	if got := p.submissions(); len(got) != 1 {
		t.Errorf("submitted %d times, want once", len(got))
	}
	have, _, err := two.turns.get(ctx, key)
	if err != nil || have.Outcome().Owner != "two" || have.Outcome().Held {
		t.Errorf("the record is %+v (%v); want submitted by two, no longer held", have.Outcome(), err)
	}
}

// A held turn's record says submitting, owned by its holder, as every
// version of the dispatcher reads records; to a version without holds,
// claimed stuckAfter before its deadline, so that such a version takes it
// over as stuck no sooner than it is due. Read back, it is the turn
// collecting that it is, held since its intake.
func TestAHeldRecordReadsAsSubmittingToEveryVersion(t *testing.T) {
	created := time.Date(2026, 12, 5, 10, 0, 0, 0, time.UTC)
	deadline := created.Add(9*time.Minute + 30*time.Second)
	d := &Dispatcher{opts: Options{Name: "one"}}
	d.holdOutcome = &TurnOutcome{Owner: "one", Held: true, Holder: "process-1"}
	turn := &Turn{Version: protocol.Version, Key: "0123456789abcdef0123456789abcdef", State: TurnCollecting, CreatedAt: created,
		Deadline: deadline, Calls: []TurnCall{{ID: "c", Arguments: json.RawMessage(`{}`)}}, out: d.holdOutcome}
	b, err := appendTurn(nil, turn)
	if err != nil {
		t.Fatal(err)
	}
	var old struct { // a record as a version without holds reads it
		State           TurnState `json:"state"`
		Owner           string    `json:"owner"`
		SubmittingSince time.Time `json:"submitting_since"`
	}
	if err := json.Unmarshal(b, &old); err != nil {
		t.Fatal(err)
	}
	if old.State != TurnSubmitting || old.Owner != "one" || !old.SubmittingSince.Equal(deadline.Add(-stuckAfter)) {
		t.Errorf("the record reads %+v; want submitting by one since %s", old, deadline.Add(-stuckAfter))
	}
	back, err := decodeTurn(b)
	if err != nil {
		t.Fatal(err)
	}
	if back.State != TurnCollecting || !d.heldHere(back) || !back.submittingSince().Equal(created) {
		t.Errorf("read back: %s, %+v; want collecting, held by one since %s", back.State, back.Outcome(), created)
	}
	// Changing the outcome of a turn held here changes that turn's only.
	claimed := back.clone()
	claimed.writeOutcome().Held = false
	turn.writeOutcome().Held = false
	if !d.holdOutcome.Held {
		t.Error("changing a held turn's outcome changed the outcome the held turns share")
	}
	sameRecord(t, back)
}

// finishingPlatform is a run that is done as soon as a submission reaches
// it, whose answer comes back slowly (a slow or retried answer).
type finishingPlatform struct {
	idlePlatform
	done      atomic.Bool
	submitted atomic.Int32
	slow      time.Duration
}

func (p *finishingPlatform) Poll(context.Context, Ref) (*Observation, error) {
	if p.done.Load() {
		return &Observation{State: ObjectDone, Answer: "ok"}, nil
	}
	return &Observation{State: ObjectRunning}, nil
}

func (p *finishingPlatform) Submit(context.Context, *Turn, []Output) (*Submission, error) {
	p.submitted.Add(1)
	p.done.Store(true)
	time.Sleep(p.slow)
	return &Submission{}, nil
}

// heldTurn takes in, as d's intake would, a turn of calls held by d and
// tracked by it.
func heldTurn(t *testing.T, d *Dispatcher, key protocol.TurnKey, calls ...string) *Turn {
	t.Helper()
	return heldTurnAged(t, d, key, 0, calls...)
}

// heldTurnAged is heldTurn for a turn taken in age ago.
func heldTurnAged(t *testing.T, d *Dispatcher, key protocol.TurnKey, age time.Duration, calls ...string) *Turn {
	t.Helper()
	turn := geoTurn(key, time.Now().UTC().Add(-age), d.holdOutcome, calls...)
	d.gather.track(turn, storeTurn(t, d, turn))
	return turn
}

// geoTurn is a turn of calls to get_weather, of team geo, taken in at
// createdAt, expiring five minutes from now (its deadline a minute
// before), with outcome out.
func geoTurn(key protocol.TurnKey, createdAt time.Time, out *TurnOutcome, calls ...string) *Turn {
	now := time.Now().UTC()
	turn := &Turn{Version: protocol.Version, Key: key, Ref: Ref{Platform: protocol.PlatformResponses, ResponseID: "resp_" + string(key)},
		Scope: "resp_" + string(key), State: TurnCollecting, CreatedAt: createdAt, ExpiresAt: now.Add(5 * time.Minute), Deadline: now.Add(4 * time.Minute),
		out: out}
	for _, c := range calls {
		turn.Calls = append(turn.Calls, TurnCall{ID: c, Name: "get_weather", Key: key.Call(c), Team: "geo", Arguments: json.RawMessage(`{}`)})
	}
	return turn
}

// storeTurn records turn as d's intake would (its record, its deadline,
// its team's results stream) and returns the record's revision.
func storeTurn(t *testing.T, d *Dispatcher, turn *Turn) uint64 {
	t.Helper()
	ctx := t.Context()
	rev, err := d.turns.create(ctx, turn)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.scheduleDeadline(ctx, turn); err != nil {
		t.Fatal(err)
	}
	if _, err := d.gather.streams.stream(ctx, "geo"); err != nil {
		t.Fatal(err)
	}
	return rev
}

// recordResult records the result of turn's call i, as an executor would.
func recordResult(t *testing.T, d *Dispatcher, turn *Turn, i int) {
	t.Helper()
	c := turn.Calls[i]
	res := &protocol.Result{Version: protocol.Version, Key: c.Key, CallID: c.ID, Team: "geo", Function: "get_weather",
		Output: `"sunny"`, Executor: "test", FinishedAt: time.Now().UTC()}
	if err := firstwins.Record(t.Context(), d.js.Conn(), res, nil); err != nil {
		t.Fatal(err)
	}
}

// A watch's driver that finds the run done while the turn's holder is
// submitting it (nothing is written before a held turn's submission)
// waits for the submission's outcome: it neither reports the run
// finished without the calls' results nor cancels the turn.
func TestADriverLeavesAHeldTurnBeingSubmitted(t *testing.T) {
	_, js := natstest.Start(t).Connect(t)
	p := &finishingPlatform{slow: 2 * time.Second}
	d := replicaOn(t, js, "one", p)
	ctx := t.Context()
	turn := heldTurn(t, d, "0123456789abcdef0123456789abcdef", "call_1")
	recordResult(t, d, turn, 0)

	var wg sync.WaitGroup
	wg.Go(func() { d.closeTurn(context.Background(), turn.Key, false) })
	testutil.WaitFor(t, 10*time.Second, p.done.Load)
	if d.cancelTurn(ctx, turn.Key, "not submitted: the run ended", "the run ended") {
		t.Error("a turn whose submission is under way was cancelled")
	}
	got, _, obs, err := d.awaitClosed(ctx, turn.Key, p, turn.Ref, nil)
	wg.Wait()
	if err != nil || obs != nil {
		t.Fatalf("awaitClosed = %v, %v; want the submitted turn", obs, err)
	}
	if got.State != TurnSubmitted || p.submitted.Load() != 1 {
		t.Errorf("the turn is %s after %d submissions; want submitted once", got.State, p.submitted.Load())
	}
}

// A turn another replica holds is cancelled (its run ended) only once its
// holder released it, and the holder then does not submit it: before, the
// holder submitted a turn already failed.
func TestAHeldTurnCancelledElsewhereIsNotSubmitted(t *testing.T) {
	_, js := natstest.Start(t).Connect(t)
	p := &stampingPlatform{}
	short := func(d *Dispatcher) { d.claimRenewEvery, d.holdScanEvery = 200*time.Millisecond, 20*time.Millisecond }
	one := replicaOn(t, js, "one", p, short)
	two := replicaOn(t, js, "two", p, short)
	ctx := t.Context()
	turn := heldTurn(t, one, "0123456789abcdef0123456789abcded", "call_1")
	if !two.cancelTurn(ctx, turn.Key, "not submitted: the run ended", "the run ended") {
		t.Fatal("the other replica could not cancel the turn once released")
	}
	recordResult(t, one, turn, 0)
	one.closeTurn(ctx, turn.Key, false) // as the holder's gatherer does
	if have, _, err := one.turns.get(ctx, turn.Key); err != nil || have.State != TurnFailed {
		t.Fatalf("the record is %v (%v); want failed", have, err)
	}
	if n := len(p.submissions()); n != 0 {
		t.Errorf("a failed turn was submitted %d times", n)
	}
}

// Two processes given one name do not both take a hold for theirs: a turn
// whose results each sees is submitted once.
func TestTwoProcessesOfOneNameSubmitAHeldTurnOnce(t *testing.T) {
	_, js := natstest.Start(t).Connect(t)
	p := &stampingPlatform{}
	a := replicaOn(t, js, "same", p)
	b := replicaOn(t, js, "same", p)
	turn := heldTurn(t, a, "0123456789abcdef0123456789abcdee", "call_1", "call_2")
	have, rev, err := b.turns.get(t.Context(), turn.Key)
	if err != nil {
		t.Fatal(err)
	}
	b.gather.track(have, rev) // as its startup's resumption would
	recordResult(t, a, turn, 0)
	recordResult(t, a, turn, 1)
	var wg sync.WaitGroup
	wg.Go(func() { a.gather.recheck(context.Background(), turn.Key) })
	wg.Go(func() { b.gather.recheck(context.Background(), turn.Key) })
	wg.Wait()
	testutil.WaitFor(t, 10*time.Second, func() bool {
		r, _, err := a.turns.get(t.Context(), turn.Key)
		return err == nil && !r.Open()
	})
	if n := len(p.submissions()); n != 1 {
		t.Errorf("submitted %d times, want once", n)
	}
}

// Recording the submission of a turn held here, tried again after a write
// whose answer was lost, finds the record held (not claimed) and records
// it: before, it gave the turn up as closed elsewhere, and the turn was
// submitted again once its hold was stale.
func TestMarkingAHeldTurnSubmittedAgainRecordsIt(t *testing.T) {
	_, js := natstest.Start(t).Connect(t)
	d := replicaOn(t, js, "one", &stampingPlatform{})
	ctx := t.Context()
	turn := heldTurn(t, d, "0123456789abcdef0123456789abcdec", "call_1")
	final, err := d.markSubmitted(ctx, turn, 0 /* a stale revision: the first try fails, the retry reads */, func(r *Turn) {
		r.State = TurnSubmitted
		r.writeOutcome().SubmittedAt = time.Now().UTC()
	})
	if err != nil || final == nil || final.State != TurnSubmitted {
		t.Fatalf("markSubmitted = %v, %v; want the turn submitted", final, err)
	}
	have, _, err := d.turns.get(ctx, turn.Key)
	if err != nil || have.State != TurnSubmitted || have.Outcome().Held || have.Outcome().Owner != "one" {
		t.Errorf("the record is %s, %+v (%v); want submitted by one, no longer held", have.State, have.Outcome(), err)
	}
}

// A result the holder never hears of (its nudge lost, or taken by a
// replica of a version without holds, which drops it as late) is found
// when the hold is released, not when the sweep looks at the turn, 15 s
// after its intake.
func TestAResultTheHolderDidNotHearOfIsFoundOnRelease(t *testing.T) {
	_, js := natstest.Start(t).Connect(t)
	p := &stampingPlatform{}
	one := replicaOn(t, js, "one", p, func(d *Dispatcher) { d.claimRenewEvery, d.holdScanEvery = 100*time.Millisecond, 20*time.Millisecond })
	ctx := t.Context()
	turn := heldTurn(t, one, "0123456789abcdef0123456789abcdeb", "call_1")
	one.gather.streams.stop() // the results now go to the stand-in below only
	s, err := js.Stream(ctx, protocol.ResultStream("geo"))
	if err != nil {
		t.Fatal(err)
	}
	cons, err := s.Consumer(ctx, resultsConsumer)
	if err != nil {
		t.Fatal(err)
	}
	cc, err := cons.Consume(func(m jetstream.Msg) { _ = m.Ack() })
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Stop()
	recordResult(t, one, turn, 0)
	testutil.WaitFor(t, 5*time.Second, func() bool { return len(p.submissions()) > 0 })
}

// A close of a held turn that finds it being released here (the mark that
// it is submitted here taken) neither claims it nor gives it up: it looks
// again in a moment and submits it. Before, a claim won while the release
// held the mark, and the submission that followed found the mark taken
// and dropped the turn, left submitting until a take-over 15 s later.
func TestACloseMeetingARelease(t *testing.T) {
	for _, stale := range []bool{false, true} {
		t.Run(map[bool]string{false: "hold young", true: "hold old"}[stale], func(t *testing.T) {
			_, js := natstest.Start(t).Connect(t)
			p := &stampingPlatform{}
			one := replicaOn(t, js, "one", p, func(d *Dispatcher) { d.holdScanEvery = time.Hour })
			ctx := t.Context()
			var age time.Duration
			if stale {
				age = 2 * one.holdFor() // claimed, not submitted at once
			}
			turn := heldTurnAged(t, one, "0123456789abcdef0123456789abcdea", age, "call_1")
			releasing, ok := one.submittingHere(turn.Key) // as a release under way
			if !ok {
				t.Fatal("the turn is marked already")
			}
			recordResult(t, one, turn, 0) // its gatherer closes it, as does this
			one.closeTurn(ctx, turn.Key, false)
			if have, _, err := one.turns.get(ctx, turn.Key); err != nil || !have.held() {
				t.Fatalf("while the turn was marked, its close changed its record: %v (%v)", have, err)
			}
			releasing()
			testutil.WaitFor(t, 10*time.Second, func() bool {
				have, _, err := one.turns.get(ctx, turn.Key)
				return err == nil && have.State == TurnSubmitted
			})
			if n := len(p.submissions()); n != 1 {
				t.Errorf("submitted %d times, want once", n)
			}
		})
	}
}
