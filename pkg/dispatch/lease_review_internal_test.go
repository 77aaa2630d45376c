package dispatch

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/toolrelay/toolrelay/internal/natstest"
	"github.com/toolrelay/toolrelay/internal/testutil"
	"github.com/toolrelay/toolrelay/pkg/dispatch/internal/lifecycle"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// repeatPlatform records, per submission, whether the dispatcher told the
// adapter the submission may be a repeat (Repeated(ctx)), which is what
// makes the Responses adapter look for an earlier continuation.
type repeatPlatform struct {
	idlePlatform
	mu       sync.Mutex
	repeated []bool
	epochs   []uint64
}

func (p *repeatPlatform) Submit(ctx context.Context, t *Turn, _ []Output) (*Submission, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.repeated = append(p.repeated, Repeated(ctx))
	p.epochs = append(p.epochs, t.lease.Epoch)
	return &Submission{}, nil
}

func (p *repeatPlatform) seen() ([]bool, []uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]bool(nil), p.repeated...), append([]uint64(nil), p.epochs...)
}

// storeAsPreviousVersion writes turn as a replica of the version before
// the lease wrote it: this version's encoding without the "lease" field
// (which that version neither reads nor writes back).
func storeAsPreviousVersion(t *testing.T, d *Dispatcher, turn *Turn) {
	t.Helper()
	b, err := appendTurn(nil, turn)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	delete(m, "lease")
	b, _ = json.Marshal(m)
	if _, err := d.turns.kv.Create(t.Context(), string(turn.Key), b); err != nil {
		t.Fatal(err)
	}
}

// Found by review (rolling upgrade), failing before its fix: a replica of
// the version before the lease claimed a turn (state submitting, owner,
// submitting_since), or held it (submitting, held, holder: its holder
// submits without a claim within holdFor of intake), may have submitted
// it, and died. This version takes the turn over once the claim or hold
// lapses and submits it again; that repeat must be marked Repeated, so
// that the Responses adapter looks in the conversation for the first
// continuation instead of continuing it a second time. It was not: the
// record read as a lease of epoch 0, the take-over wrote epoch 1, and
// turnEnv.Submit marks a repeat only from epoch 2 on.
func TestLeaseTakeOverOfPreviousVersionIsMarkedRepeated(t *testing.T) {
	t.Parallel()
	now := time.Now().UTC()
	for _, tc := range []struct {
		name  string
		key   protocol.TurnKey
		state TurnState
		out   *TurnOutcome
		lease lifecycle.Lease
	}{
		{"claim", "0123456789abcdef0123456789abcde1", TurnSubmitting,
			&TurnOutcome{Owner: "old-replica", SubmittingSince: now.Add(-20 * time.Second)}, lifecycle.Lease{}},
		// This version writes a collecting turn under a lease as the
		// previous version's hold; that version's own hold looks the same
		// on the wire without the "lease" field.
		{"hold", "0123456789abcdef0123456789abcde2", TurnCollecting,
			nil, lifecycle.Lease{Owner: "old-replica/holder1", Until: now.Add(-25 * time.Second), Epoch: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, js := natstest.Start(t).Connect(t)
			p := &repeatPlatform{}
			d := replicaOn(t, js, "new", p)
			turn := &Turn{Version: protocol.Version, Key: tc.key,
				Ref:   Ref{Platform: protocol.PlatformResponses, ResponseID: "resp_" + tc.name, Conversation: "conv_" + tc.name},
				State: tc.state, CreatedAt: now.Add(-40 * time.Second), ExpiresAt: now.Add(5 * time.Minute), Deadline: now.Add(4 * time.Minute),
				out: tc.out, lease: tc.lease}
			storeAsPreviousVersion(t, d, turn)
			have, rev, err := d.turns.get(t.Context(), tc.key)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("read back: state %s, lease %s", have.State, have.lease)
			d.gather.track(have, rev)
			d.engine.Close(string(tc.key))
			closedRecord(t, d, tc.key)
			rep, epochs := p.seen()
			if len(rep) != 1 {
				t.Fatalf("%d submissions, want 1", len(rep))
			}
			if !rep[0] {
				t.Errorf("the take-over of a previous version's %s (which may have reached the platform) was submitted "+
					"without Repeated: lease epoch %d; the Responses adapter continues the conversation a second time", tc.name, epochs[0])
			}
		})
	}
}

// Found by review (rolling upgrade), failing before its fix: record.go and docs/turns.md say a turn this
// version writes in the claim form is taken over by the previous version
// "at the same moment this one would": Skew after the lease lapses. The
// previous version takes a claim over once now-submitting_since >=
// stuckAfter (15 s): at Until, Skew (2 s) earlier, so beside it the pause
// window this version's owner is fenced for shrinks from Ahead+Skew (7 s)
// to Ahead (5 s).
func TestLeasePreviousVersionTakesClaimOverNoEarlierThanThisOne(t *testing.T) {
	now := time.Now().UTC().Truncate(time.Millisecond)
	l := lifecycle.Lease{Owner: "new/abc", Until: now.Add(lifecycle.LeaseFor), Epoch: 3}
	turn := &Turn{Version: protocol.Version, Key: "0123456789abcdef0123456789abcde3", State: TurnSubmitting,
		CreatedAt: now, ExpiresAt: now.Add(time.Hour), Deadline: now.Add(time.Hour), lease: l}
	w := turn.wire()
	const previousStuckAfter = 15 * time.Second // 79eb6c0:pkg/dispatch/sweep.go:41, submit.go:162
	oldTakesAt := w.SubmittingSince.Add(previousStuckAfter)
	thisTakesAt := l.Until.Add(lifecycle.Skew)
	if oldTakesAt.Before(thisTakesAt) {
		t.Errorf("the previous version takes this claim over at %s, %s before this version would (%s)",
			oldTakesAt.Format(time.RFC3339Nano), thisTakesAt.Sub(oldTakesAt), thisTakesAt.Format(time.RFC3339Nano))
	}
}

// acceptingPlatform takes a submission (the platform has it) and then does
// not answer until the attempt's context ends; it polls as done (the run
// went on with the outputs it took and finished).
type acceptingPlatform struct {
	idlePlatform
	mu       sync.Mutex
	accepted int
	got      chan struct{}
}

func (p *acceptingPlatform) Submit(ctx context.Context, t *Turn, _ []Output) (*Submission, error) {
	p.mu.Lock()
	p.accepted++
	first := p.accepted == 1
	p.mu.Unlock()
	if first {
		close(p.got)
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return &Submission{}, nil
}

func (p *acceptingPlatform) Poll(context.Context, Ref) (*Observation, error) {
	return &Observation{State: ObjectDone}, nil
}

func (p *acceptingPlatform) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accepted
}

// startReplica is replicaOn with the stop in the test's hands.
func startReplica(t *testing.T, d *Dispatcher) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = d.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	testutil.WaitForWhat(t, 30*time.Second, "the dispatcher to be ready", d.Ready)
	return func() { cancel(); <-done }
}

// Found by review, failing before its fix: the owner of a turn whose results are all in submits it with no
// write before (the direct path), so while the platform has the outputs
// and the owner has not recorded the answer, the record says collecting.
// Stop the owner then (a routine SIGTERM whose ShutdownTimeout cuts the
// unanswered attempt off; a kill -9 leaves the same record with its lease
// lapsing): the record is collecting with a free lease. await.go's
// awaitClosed reads exactly that as "a turn nobody began to submit", and
// on a finished run reports the platform finished it "without the calls'
// results": the watch driver then cancels the turn (failed, "not
// submitted", executors told to cancel) and fails the watch, though the
// platform took the outputs. The version before wrote the claim
// (submitting) first, which awaitClosed waits for.
func TestLeaseDirectSubmissionReadsAsNeverSubmitted(t *testing.T) {
	t.Parallel()
	_, js := natstest.Start(t).Connect(t)
	p := &acceptingPlatform{got: make(chan struct{})}
	owner, err := New(js, []Platform{p}, Options{Name: "owner", Logger: testutil.Logger(t), PollInterval: 20 * time.Millisecond,
		ShutdownTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	stopOwner := startReplica(t, owner)
	other := replicaOn(t, js, "other", p)
	key := protocol.TurnKey("0123456789abcdef0123456789abcde4")
	turn, rev := leasedTurn(t, owner, key, lifecycle.Lease{Owner: owner.instance, Until: time.Now().Add(lifecycle.LeaseFor), Epoch: 1})
	owner.gather.track(turn, rev)
	owner.engine.Close(string(key))
	select {
	case <-p.got:
	case <-time.After(10 * time.Second):
		t.Fatal("the owner did not submit")
	}
	if r, _, err := owner.turns.get(t.Context(), key); err == nil {
		t.Logf("while the platform has the outputs: record %s, lease %s", r.State, r.lease)
	}
	stopOwner()
	r, _, err := other.turns.get(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("after the owner stopped: record %s, lease %s (free: %v)", r.State, r.lease, r.lease.Free(time.Now()))
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	final, _, ended, err := other.awaitClosed(ctx, key, p, turn.Ref)
	if ended != nil {
		t.Errorf("the platform took the turn's outputs, yet the watch driver concludes %q (and cancels the turn); accepted submissions: %d",
			ended.Reason, p.count())
	} else if err != nil {
		t.Fatal(err)
	} else {
		t.Logf("closed: %s", final.State)
	}
}

// Found by review (rolling upgrade), failing before its fix: the previous version dates a hold by the
// turn's created_at, not by the submitting_since this version writes into
// it (79eb6c0:pkg/dispatch/hold.go:137-147, "a hold is taken at intake, so
// it is dated by the turn's CreatedAt"), and takes a hold older than
// stuckAfter (15 s) for a turn whose holder died: it claims it by
// compare-and-set and submits (hold.go:125). This version stamps
// CreatedAt before resolving the calls (intake.go:40-43; each unserved
// call waits ServeGrace, 3 s, in turn, longer when its executor lapsed
// lately) and computes the intake lease after (intake.go:75): the lease
// runs until CreatedAt + resolve time + LeaseFor. With the resolve taking
// 6 s (two unserved calls), the previous version takes the hold over 6 s
// before this one's lease even lapses, while this version's owner still
// holds it with more than Ahead left and submits with no write before
// (the direct path): nothing in the record makes the previous version's
// claim lose, and both submit.
func TestLeasePreviousVersionLeavesAHoldAloneWhileItsLeaseHolds(t *testing.T) {
	created := time.Now().UTC().Truncate(time.Millisecond)
	// Intake may take a while after the turn's creation (two calls whose
	// function nobody serves wait ServeGrace each): the lease is dated by
	// the creation all the same.
	l := lifecycle.New("new/abc", nil, nil).IntakeLease(created, created.Add(9*time.Minute))
	turn := &Turn{Version: protocol.Version, Key: "0123456789abcdef0123456789abcde5", State: TurnCollecting,
		CreatedAt: created, ExpiresAt: created.Add(10 * time.Minute), Deadline: created.Add(9 * time.Minute), lease: l}
	b, err := appendTurn(nil, turn)
	if err != nil {
		t.Fatal(err)
	}
	var onWire struct {
		State     string    `json:"state"`
		Held      bool      `json:"held"`
		CreatedAt time.Time `json:"created_at"`
	}
	if err := json.Unmarshal(b, &onWire); err != nil {
		t.Fatal(err)
	}
	if onWire.State != "submitting" || !onWire.Held {
		t.Fatalf("not written as a hold: %s", b)
	}
	const previousStuckAfter = 15 * time.Second
	oldTakesAt := onWire.CreatedAt.Add(previousStuckAfter) // the previous version's take-over of a hold
	// The last moment this version's owner submits with no write: HeldBy.
	lastDirect := l.Until.Add(-lifecycle.Ahead)
	if !oldTakesAt.After(lastDirect) {
		t.Errorf("the previous version takes this hold over at created+%s, while this version's owner may still submit it "+
			"with no write until created+%s (lease until created+%s): both submit", oldTakesAt.Sub(created), lastDirect.Sub(created), l.Until.Sub(created))
	}
}

// Found by review, failing before its fix: the engine-level finding (lifecycle review_test.go,
// TestReviewStoppingEngineDoesNotRetakeReleasedLease) in a dispatcher: a
// replica stops (SIGTERM) while its platform has not answered a turn's
// submission; releaseAll queues the turn's release behind the attempt and
// keeps hearing tells meanwhile (dispatcher.go: stopTells after
// releaseAll). Another replica tells it of the turn then. The drain cuts
// the attempt off, the release frees the lease, and the tell's Close
// right after takes it back (epoch up) with a context that allows no
// attempt: the stopped replica leaves the turn under its own lease, and
// the others wait LeaseFor+Skew for a process that is gone.
func TestLeaseStoppedReplicaLeavesNoLeaseBehind(t *testing.T) {
	t.Parallel()
	_, js := natstest.Start(t).Connect(t)
	p := &acceptingPlatform{got: make(chan struct{})}
	owner, err := New(js, []Platform{p}, Options{Name: "owner", Logger: testutil.Logger(t), PollInterval: 20 * time.Millisecond,
		ShutdownTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	stopOwner := startReplica(t, owner)
	key := protocol.TurnKey("0123456789abcdef0123456789abcde6")
	turn, rev := leasedTurn(t, owner, key, lifecycle.Lease{Owner: owner.instance, Until: time.Now().Add(lifecycle.LeaseFor), Epoch: 1})
	owner.gather.track(turn, rev)
	owner.engine.Close(string(key))
	select {
	case <-p.got:
	case <-time.After(10 * time.Second):
		t.Fatal("the owner did not submit")
	}
	stopped := make(chan struct{})
	go func() { stopOwner(); close(stopped) }()
	time.Sleep(500 * time.Millisecond) // releaseAll waits for the busy turn, hearing tells
	// What another replica with a result of the turn does (turnEnv.Tell).
	if err := js.Conn().Publish(tellSubject(leaseInstance(owner.instance)), []byte(key)); err != nil {
		t.Fatal(err)
	}
	<-stopped
	r, _, err := owner.turns.get(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	if r.lease.Owner == owner.instance && !r.lease.Free(time.Now()) {
		t.Errorf("after its clean stop the replica still holds the turn: record %s, lease %s (free for the others only in %s)",
			r.State, r.lease, time.Until(r.lease.Until.Add(lifecycle.Skew)).Round(time.Second))
	} else {
		t.Logf("record %s, lease %s", r.State, r.lease)
	}
}
