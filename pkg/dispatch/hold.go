package dispatch

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolrelay/toolrelay/internal/backoff"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// Holds: a turn claimed by the replica that takes it in.
//
// Only the replica that claims a turn submits it. Claimed when its last
// result came in (collecting → submitting by compare-and-set), the claim
// was a write that every turn waited for between its results and its
// submission, and a third write of its record. Now the replica that takes
// a turn in holds it from the start: the record is created claimed by it,
// and when the turn's results are all in within holdFor of its intake, the
// replica submits at once. The record is then written twice in the turn's
// life (taken in, submitted), and nothing is waited for between the last
// result and the submission.
//
// On the wire a held turn is submitting, owned by its replica since its
// intake, marked Held: every replica, a version that knows nothing of
// holds included, leaves it alone as a turn being submitted until it is
// stuckAfter old. Read back (decodeTurn) it is a turn collecting whose
// outcome says who holds it.
//
// The rules:
//   - the holder submits without another claim only within holdFor of
//     the hold (claimRenewEvery: a submission under way renews its claim
//     as often), and only a turn whose results are all in;
//   - a hold still there after holdFor is released: the record goes back
//     to collecting, and the turn is closed as any other, by a claim. Its
//     holder may also claim it at once (its compare-and-set on the
//     revision it knows wins against its own release, or loses to it);
//   - another replica takes a hold younger than stuckAfter for a claim:
//     it does not close the turn, and tells the holder of each result of
//     the turn it receives (a message on the holder's nudge subject); a
//     hold older than that is a turn collecting whose holder died, which
//     it may claim;
//   - only a turn whose deadline is at least holdMinLead away is held, so
//     a deadline never finds a hold younger than stuckAfter.
//
// What a hold leans on is what a renewed claim leans on: a holder paused
// for longer than stuckAfter - holdFor between its check and its
// submission could submit a turn another replica took over meanwhile, as
// a claimant so paused between two renewals could. Options.NoHolds turns
// holds off (intake records turns collecting, as before): a rolling
// upgrade from a version without holds may want it while that version
// runs, since its replicas, finding the hold of a replica that died, take
// the turn over as a stuck submission and submit its missing results as
// unreadable.

// holdMinLead is how far away a turn's deadline must be for it to be
// held: past stuckAfter, with room for the timer to fire a second early.
const holdMinLead = stuckAfter + 5*time.Second

// holdScanEvery is how often a replica releases the holds it kept longer
// than holdFor (Dispatcher.holdScanEvery: tests shorten it).
const holdScanEvery = time.Second

// holdReleaseTimeout bounds the writes that release holds at shutdown.
const holdReleaseTimeout = 2 * time.Second

// holdPoll is how often a replica gathering for a turn another replica
// holds looks at its record again.
const holdPoll = time.Second

// hold reports whether a turn taken in now is held: holds are on, the
// replica is not stopping, and the turn's deadline is far enough. If so,
// the caller must call unhold once the turn is tracked (or not recorded):
// a stopping replica releases the holds it tracks, and waits for those
// being taken in.
func (d *Dispatcher) hold(t *Turn, now time.Time) bool {
	if d.opts.NoHolds || t.Deadline.Sub(now) < holdMinLead {
		return false
	}
	d.holdGate.RLock()
	if d.holdsOff.Load() {
		d.holdGate.RUnlock()
		return false
	}
	return true
}

// unhold ends what hold began.
func (d *Dispatcher) unhold() { d.holdGate.RUnlock() }

// holdFor is how long the replica holding a turn may submit it without
// claiming it.
func (d *Dispatcher) holdFor() time.Duration { return d.claimRenewEvery }

// heldHere reports whether t is held by this replica.
func (d *Dispatcher) heldHere(t *Turn) bool {
	return t.out != nil && t.out.Held && t.out.Owner == d.opts.Name
}

// heldElsewhere returns the replica holding t, if it is another one and
// its hold is younger than stuckAfter.
func (d *Dispatcher) heldElsewhere(t *Turn, now time.Time) (owner string, ok bool) {
	o := t.out
	if o == nil || !o.Held || o.Owner == d.opts.Name || now.Sub(t.submittingSince()) >= stuckAfter {
		return "", false
	}
	return o.Owner, true
}

// submittingSince is when t's submission was claimed or held. The turns
// this replica holds share one outcome (d.holdOutcome), dated by each
// turn's intake.
func (t *Turn) submittingSince() time.Time {
	o := t.out
	switch {
	case o == nil:
		return time.Time{}
	case o.Held && o.SubmittingSince.IsZero():
		return t.CreatedAt
	}
	return o.SubmittingSince
}

// recordState is the state a turn's record carries: a held turn's says
// submitting.
func (t *Turn) recordState() TurnState {
	if t.State == TurnCollecting && t.out != nil && t.out.Held {
		return TurnSubmitting
	}
	return t.State
}

// submitHeld submits t, held here and known at revision rev, without
// claiming it, if its hold is young enough. It reports false when the
// turn must be claimed instead (the hold is older than holdFor); true when
// it is submitted here, or already being submitted or released here (a
// release re-checks the turn).
func (d *Dispatcher) submitHeld(ctx context.Context, known *Turn, rev uint64) bool {
	done, ok := d.submittingHere(known.Key)
	if !ok {
		return true
	}
	since := known.submittingSince()
	if time.Since(since) >= d.holdFor() {
		done()
		return false
	}
	t := known.clone()
	t.State = TurnSubmitting
	o := t.writeOutcome()
	o.Held, o.SubmittingSince = false, since
	d.submitClaimed(ctx, t, rev, done)
	return true
}

// releaseHeld gives up the holds this replica kept for holdFor without
// submitting their turns: each record goes back to collecting, to be
// closed by a claim as any other turn. (Its results reached this replica,
// or their nudges did; one whose nudge was lost is found by the sweep's
// re-check.)
func (d *Dispatcher) releaseHeld(ctx context.Context, now time.Time) {
	for _, key := range d.gather.heldSince(d, now.Add(-d.holdFor())) {
		if ctx.Err() != nil {
			return
		}
		d.release(ctx, key)
	}
}

// release gives up this replica's hold on the turn key, unless it is
// being submitted here.
func (d *Dispatcher) release(ctx context.Context, key protocol.TurnKey) {
	done, ok := d.submittingHere(key) // no submission of it begins meanwhile
	if !ok {
		return
	}
	defer done()
	known, rev := d.gather.known(key)
	if known == nil || !d.heldHere(known) {
		return
	}
	t := known.clone()
	t.out = nil
	newRev, err := d.turns.update(ctx, t, rev)
	if errors.Is(err, errConflict) {
		// Changed by another: taken over, cancelled, closed. As it is now.
		t, newRev, err = d.turns.get(ctx, key)
	}
	if err != nil {
		// Left held: past stuckAfter any replica takes it as collecting.
		d.log.Warn("releasing a held turn failed", "turn", key, "err", err)
		return
	}
	if !t.Open() {
		d.closedElsewhere(key)
		return
	}
	d.gather.replace(t, newRev)
}

// releaseAllHeld releases, at shutdown, every hold this replica has, so
// that the other replicas or the restart take the turns as collecting at
// once rather than once the holds are stuckAfter old.
func (d *Dispatcher) releaseAllHeld() {
	ctx, cancel := context.WithTimeout(context.Background(), holdReleaseTimeout)
	defer cancel()
	// No intake holds a turn from now on; those holding one are waited
	// for, until they track it.
	d.holdsOff.Store(true)
	for !d.holdGate.TryLock() {
		if !backoff.Sleep(ctx, 5*time.Millisecond) {
			d.log.Warn("intakes still under way at shutdown; their turns stay held until another replica may take them")
			break
		}
	}
	if ctx.Err() == nil {
		d.holdGate.Unlock()
	}
	d.releaseHeld(ctx, time.Now().Add(time.Hour))
}

// releaseHeldEvery releases holds kept for holdFor, until ctx ends.
func (d *Dispatcher) releaseHeldEvery(ctx context.Context) {
	tick := time.NewTicker(d.holdScanEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			d.releaseHeld(ctx, now)
		}
	}
}

// nudgeSubject is where the replica named name hears of the results of
// the turns it holds that another replica received.
func nudgeSubject(name string) string {
	sum := sha256.Sum256([]byte(name))
	return "toolrelay.dispatcher." + hex.EncodeToString(sum[:12]) + ".results"
}

// nudge tells the replica holding a turn that the result of its call key
// is recorded. A nudge lost costs the holder no more than the time until
// its hold is released and the turn re-checked.
func (d *Dispatcher) nudge(owner string, key protocol.CallKey) {
	if err := d.js.Conn().Publish(nudgeSubject(owner), []byte(key)); err != nil {
		d.log.Debug("telling the replica holding a turn of its result failed", "call_key", key, "holder", owner, "err", err)
	}
}

// serveNudges hears of the results of the turns held here that another
// replica received.
func (d *Dispatcher) serveNudges() (stop func(), err error) {
	nc := d.js.Conn()
	sub, err := nc.Subscribe(nudgeSubject(d.opts.Name), func(m *nats.Msg) {
		key := protocol.CallKey(m.Data)
		if key.Validate() != nil {
			return
		}
		if d.gather.recordedElsewhere(key) {
			d.background(func(ctx context.Context) { d.closeTurn(ctx, key.Turn(), false) })
		}
	})
	if err != nil {
		return nil, err
	}
	if err := nc.FlushTimeout(declareTimeout); err != nil {
		_ = sub.Unsubscribe()
		return nil, err
	}
	return func() { _ = sub.Unsubscribe() }, nil
}
