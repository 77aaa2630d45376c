package dispatch

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/toolrelay/toolrelay/internal/natstest"
	"github.com/toolrelay/toolrelay/internal/testutil"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// The closes of one process racing each other: two closes, a close and a
// cancel, a release, a take-over, the deadline. Each test drives the real
// functions against a real JetStream and counts what the platform got.

// traced gives d a span recorder.
func traced(rec *tracetest.SpanRecorder) func(*Dispatcher) {
	return func(d *Dispatcher) {
		tel, err := newTelemetry(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)), nil, d.registry.fleet)
		if err != nil {
			panic(err)
		}
		d.tel = tel
	}
}

// keepSpan opens the turn's span as Intake does.
func keepSpan(d *Dispatcher, turn *Turn) {
	_, span := d.tel.startTurn(context.Background(), turn)
	d.tel.keepTurn(turn.Key, span)
}

// turnOutcomes lists the outcomes the ended spans of turn key carry.
func turnOutcomes(rec *tracetest.SpanRecorder, key protocol.TurnKey) []string {
	var out []string
	for _, s := range rec.Ended() {
		mine, outcome := false, ""
		for _, a := range s.Attributes() {
			switch a.Key {
			case attrTurnKey:
				mine = a.Value.AsString() == string(key)
			case attrOutcome:
				outcome = a.Value.AsString()
			}
		}
		if mine && s.Name() == "turn "+string(protocol.PlatformResponses) {
			out = append(out, outcome)
		}
	}
	return out
}

// Two closes of one held turn, one of them repeated as re-checks and
// nudges repeat it: the one that comes second read the gatherer's copy
// (held, young) before the first submitted the turn and let it go, and
// must not submit it again from that copy. Before, 28 of 300 turns went
// to the platform twice.
func TestTwoClosesOfAHeldTurnSubmitItOnce(t *testing.T) {
	_, js := natstest.Start(t).Connect(t)
	p := &stampingPlatform{}
	d := replicaOn(t, js, "one", p)
	d.gather.streams.stop() // the test closes the turns itself
	ctx := t.Context()
	const trials = 150
	twice := 0
	for i := range trials {
		key := protocol.TurnKey(fmt.Sprintf("a0000000000000000000000000%06x", i))
		turn := heldTurn(t, d, key, "call_1")
		recordResult(t, d, turn, 0)
		before := len(p.submissions())
		var wg sync.WaitGroup
		wg.Go(func() {
			for d.gather.tracking(key) {
				d.closeTurn(ctx, key, false)
			}
		})
		wg.Go(func() { d.closeTurn(ctx, key, false) })
		wg.Wait()
		if r, _, err := d.turns.get(ctx, key); err != nil || r.Open() {
			t.Fatalf("turn %s is %v (%v) after its closes; want closed", key, r, err)
		}
		if len(p.submissions())-before > 1 {
			twice++
		}
	}
	if twice > 0 {
		t.Errorf("%d of %d turns were submitted twice", twice, trials)
	}
}

// A cancel writes the record failed; a close of the same process that
// comes between that write and the end of the cancel (a result's, a
// nudge's, a re-check's) must not submit the turn from the gatherer's
// copy, still held: before, it did.
func TestACloseDuringACancelDoesNotSubmit(t *testing.T) {
	_, js := natstest.Start(t).Connect(t)
	p := &stampingPlatform{}
	d := replicaOn(t, js, "one", p)
	d.gather.streams.stop()
	ctx := t.Context()
	turn := heldTurn(t, d, "0123456789abcdef0123456789abcd01", "call_1")
	recordResult(t, d, turn, 0)

	d.closing.mu.Lock() // the cancel stops after its write, at closing.closed
	var cancelled atomic.Bool
	var wg sync.WaitGroup
	wg.Go(func() { cancelled.Store(d.cancelTurn(context.Background(), turn.Key, "not submitted: ended", "ended")) })
	testutil.WaitFor(t, 10*time.Second, func() bool {
		r, _, err := d.turns.get(ctx, turn.Key)
		return err == nil && r.State == TurnFailed
	})
	d.closeTurn(ctx, turn.Key, false)
	d.closing.mu.Unlock()
	wg.Wait()
	if !cancelled.Load() {
		t.Error("the cancel reports the turn not cancelled")
	}
	if n := len(p.submissions()); n != 0 {
		t.Errorf("a cancelled turn was submitted %d times", n)
	}
}

// A release of this process's hold meeting its cancel: neither gives up
// (before, the cancel lost, leaving the turn collecting and its executors
// untold), and the turn's span says it was cancelled here.
func TestACancelMeetingAReleaseCancels(t *testing.T) {
	_, js := natstest.Start(t).Connect(t)
	rec := tracetest.NewSpanRecorder()
	d := replicaOn(t, js, "one", &stampingPlatform{}, traced(rec), func(d *Dispatcher) { d.holdScanEvery = time.Hour })
	d.gather.streams.stop()
	ctx := t.Context()
	const trials = 40
	for i := range trials {
		key := protocol.TurnKey(fmt.Sprintf("c0000000000000000000000000%06x", i))
		heldTurnAged(t, d, key, 2*d.holdFor(), "call_1")
		turn, _ := d.gather.known(key)
		keepSpan(d, turn)
		var cancelled atomic.Bool
		var wg sync.WaitGroup
		wg.Go(func() { d.release(ctx, key) })
		// Offsets of a few hundred microseconds put the cancel before,
		// within and after the release's write.
		off := time.Duration(i%8) * 100 * time.Microsecond
		wg.Go(func() { time.Sleep(off); cancelled.Store(d.cancelTurn(ctx, key, "not submitted: ended", "ended")) })
		wg.Wait()
		r, _, err := d.turns.get(ctx, key)
		if err != nil || r.State != TurnFailed || !cancelled.Load() {
			t.Fatalf("trial %d: the record is %v (%v), cancelled %v; want failed by the cancel", i, r, err, cancelled.Load())
		}
		if got := turnOutcomes(rec, key); len(got) != 1 || got[0] != string(TurnFailed) {
			t.Fatalf("trial %d: the turn's span ended %q; want once, failed", i, got)
		}
	}
}

// The deadline firing while this process's own submission of the turn is
// finishing (recorded, not yet ended) leaves the span to the submission:
// before, it ended it as closed by another replica.
func TestADeadlineDuringTheSubmissionLeavesItsSpan(t *testing.T) {
	_, js := natstest.Start(t).Connect(t)
	rec := tracetest.NewSpanRecorder()
	release := make(chan struct{})
	inEvent := make(chan struct{}, 1)
	d := replicaOn(t, js, "one", &stampingPlatform{}, traced(rec), func(d *Dispatcher) {
		d.opts.OnEvent = func(e Event) {
			if e.Kind == EventTurnSubmitted {
				inEvent <- struct{}{}
				<-release
			}
		}
	})
	turn := heldTurn(t, d, "0123456789abcdef0123456789abcd03", "call_1")
	keepSpan(d, turn)
	recordResult(t, d, turn, 0) // the gatherer closes it
	select {
	case <-inEvent:
	case <-time.After(10 * time.Second):
		t.Fatal("the turn was not submitted")
	}
	d.closeTurn(t.Context(), turn.Key, true) // the deadline's timer
	close(release)
	testutil.WaitFor(t, 5*time.Second, func() bool { return len(turnOutcomes(rec, turn.Key)) > 0 })
	if got := turnOutcomes(rec, turn.Key); len(got) != 1 || got[0] != string(TurnSubmitted) {
		t.Errorf("the turn's span ended %q; want once, submitted", got)
	}
}

// A take-over claims a stuck turn; a close of the same process racing it
// must not leave the claim unsubmitted (before, the take-over found the
// close's mark and dropped the turn it had claimed: 160 of 200 so).
func TestATakeOverRacingACloseSubmits(t *testing.T) {
	_, js := natstest.Start(t).Connect(t)
	p := &stampingPlatform{}
	d := replicaOn(t, js, "one", p)
	d.gather.streams.stop()
	ctx := t.Context()
	const trials = 100
	for i := range trials {
		key := protocol.TurnKey(fmt.Sprintf("b0000000000000000000000000%06x", i))
		now := time.Now().UTC()
		turn := geoTurn(key, now.Add(-time.Minute), nil, "call_1")
		rev := storeTurn(t, d, turn)
		d.gather.track(turn, rev)
		recordResult(t, d, turn, 0)
		// Another replica claimed it and died 20 s ago.
		claimed := turn.clone()
		claimed.State = TurnSubmitting
		*claimed.writeOutcome() = TurnOutcome{Owner: "gone", SubmittingSince: now.Add(-20 * time.Second)}
		if _, err := d.turns.update(ctx, claimed, rev); err != nil {
			t.Fatal(err)
		}
		before := len(p.submissions())
		var wg sync.WaitGroup
		wg.Go(func() { d.takeOver(ctx, key) })
		off := time.Duration(i%8) * 150 * time.Microsecond
		wg.Go(func() { time.Sleep(off); d.closeTurn(ctx, key, false) })
		wg.Wait()
		r, _, err := d.turns.get(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if r.State == TurnSubmitting && r.Outcome().Owner == d.opts.Name && !d.isSubmittingHere(key) {
			t.Fatalf("trial %d: claimed by this live replica and left unsubmitted (%d submissions)", i, len(p.submissions())-before)
		}
	}
}

// Spans of the turns a stopping replica submits while it drains end as
// submitted, not as left unfinished.
func TestASubmissionFinishedInTheDrainEndsItsSpan(t *testing.T) {
	_, js := natstest.Start(t).Connect(t)
	rec := tracetest.NewSpanRecorder()
	p := &slowPlatform{slow: time.Second}
	d, err := New(js, []Platform{p}, Options{Name: "one", Logger: testutil.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	traced(rec)(d)
	stop := runUntilStopped(t, d)
	turn := heldTurn(t, d, "0123456789abcdef0123456789abcd0f", "call_1")
	keepSpan(d, turn)
	recordResult(t, d, turn, 0)
	testutil.WaitFor(t, 5*time.Second, func() bool { return p.n.Load() == 1 })
	stop()
	r, _, err := d.turns.get(t.Context(), turn.Key)
	if err != nil || r.State != TurnSubmitted {
		t.Fatalf("the record is %v (%v); want submitted in the drain", r, err)
	}
	if got := turnOutcomes(rec, turn.Key); len(got) != 1 || got[0] != string(TurnSubmitted) {
		t.Errorf("the turn's span ended %q; want once, submitted", got)
	}
}

// slowPlatform takes each submission slowly; deaf, it answers whatever
// its context says (an answer already on its way).
type slowPlatform struct {
	idlePlatform
	slow time.Duration
	deaf bool
	n    atomic.Int32
}

func (p *slowPlatform) Submit(ctx context.Context, _ *Turn, _ []Output) (*Submission, error) {
	p.n.Add(1)
	if p.deaf {
		time.Sleep(p.slow)
		return &Submission{}, nil
	}
	select {
	case <-time.After(p.slow):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return &Submission{}, nil
}

// runUntilStopped runs d until stop, which ends it as SIGTERM would and
// waits for Run to return.
func runUntilStopped(t *testing.T, d *Dispatcher) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = d.Run(ctx); close(done) }()
	stop = sync.OnceFunc(func() { cancel(); <-done })
	t.Cleanup(stop)
	testutil.WaitFor(t, 30*time.Second, d.Ready)
	return stop
}

// A submission the platform took, whose answer comes in just as the
// shutdown's timeout ends the work, is recorded as submitted: before, its
// record stayed held by the stopped replica, and another replica
// submitted the turn again once the hold was stale.
func TestASubmissionAnsweredAtTheShutdownTimeoutIsRecorded(t *testing.T) {
	_, js := natstest.Start(t).Connect(t)
	p := &slowPlatform{slow: 600 * time.Millisecond, deaf: true}
	d, err := New(js, []Platform{p}, Options{Name: "one", Logger: testutil.Logger(t), ShutdownTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	stop := runUntilStopped(t, d)
	turn := heldTurn(t, d, "0123456789abcdef0123456789abcd77", "call_1")
	recordResult(t, d, turn, 0)
	testutil.WaitFor(t, 5*time.Second, func() bool { return p.n.Load() == 1 })
	stop()
	r, _, err := d.turns.get(t.Context(), turn.Key)
	if err != nil || r.State != TurnSubmitted {
		t.Fatalf("after the shutdown the record is %v (%v); want submitted", r, err)
	}
}

// A release whose write fails (it may yet be stored: the answer lost)
// leaves this process's copy of the turn no longer held: a close of it
// then claims the record rather than submitting at once, so it never
// submits a turn another replica claimed as released.
func TestAFailedReleaseLeavesTheTurnToAClaim(t *testing.T) {
	_, js := natstest.Start(t).Connect(t)
	p := &stampingPlatform{}
	d := replicaOn(t, js, "one", p, func(d *Dispatcher) { d.holdScanEvery = time.Hour })
	d.gather.streams.stop()
	ctx := t.Context()
	turn := heldTurn(t, d, "0123456789abcdef0123456789abcd78", "call_1")
	recordResult(t, d, turn, 0)
	failed, cancel := context.WithCancel(ctx)
	cancel()
	d.release(failed, turn.Key)
	if known, _ := d.gather.known(turn.Key); known == nil || d.heldHere(known) {
		t.Fatalf("after a failed release this process's copy is %v; want tracked, not held", known)
	}
	// Another replica claims the turn first, as it may once the release
	// is stored (or the hold stale).
	r, rev, err := d.turns.get(ctx, turn.Key)
	if err != nil {
		t.Fatal(err)
	}
	r.out = nil
	r.State = TurnSubmitting
	*r.writeOutcome() = TurnOutcome{Owner: "two", SubmittingSince: time.Now().UTC()}
	if _, err := d.turns.update(ctx, r, rev); err != nil {
		t.Fatal(err)
	}
	d.closeTurn(ctx, turn.Key, false)
	if n := len(p.submissions()); n != 0 {
		t.Errorf("this process submitted a turn another replica claimed, %d times", n)
	}
}
