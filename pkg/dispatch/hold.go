package dispatch

import (
	"context"
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
// On the wire a held turn is submitting, owned by its replica, marked
// Held: every replica, a version that knows nothing of holds included,
// leaves it alone as a turn being submitted (see below for how long).
// Read back (decodeTurn) it is a turn collecting whose outcome says who
// holds it, held since its intake.
//
// The rules:
//   - the holder submits without another claim only within holdFor of
//     the hold (claimRenewEvery: a submission under way renews its claim
//     as often), and only a turn whose results are all in;
//   - a hold still there after holdFor is released: the record goes back
//     to collecting, and the turn is closed as any other, by a claim (the
//     release looks at the stream once, for results the holder did not
//     hear of). Its holder may also claim it at once. Every close of a
//     turn in a process (a submission at once, a claim or a take-over
//     and a submission), its release and its cancellation are made under
//     the mark that the turn is submitted in this process
//     (submittingHere), so none of them comes between another's check
//     and its write; and under the mark only the gatherer's copy of the
//     turn is trusted (a close forgets it before the mark goes), never
//     one read before;
//   - another process takes a hold younger than stuckAfter for a claim:
//     it does not close the turn nor cancel it, and tells the holder of
//     each result of the turn it receives (a message on the holder's
//     nudge subject); a hold older than that is a turn collecting whose
//     holder died, which it may claim. A process is told by its name and
//     its instance (TurnOutcome.Holder): two may share a name;
//   - only a turn whose deadline is at least holdMinLead away is held, so
//     a deadline never finds a hold younger than stuckAfter.
//
// What a hold leans on is what a renewed claim leans on: a holder paused
// for longer than stuckAfter - holdFor between its check and its
// submission could submit a turn another replica took over meanwhile, as
// a claimant so paused between two renewals could. A killed replica's
// holds keep its turns from the others until they are stuckAfter old
// (and a sweep finds them).
//
// Beside replicas of a version without holds (a rolling upgrade), which
// read a hold as a claim: they leave a held turn alone, dropping a result
// of it they receive as late (its holder finds it when it releases the
// hold); and since the record dates the claim stuckAfter before the
// turn's deadline, they take it over as stuck, and submit what is missing
// as unreadable, only when it is due anyway. Options.NoHolds turns holds
// off (intake records turns collecting, as before), for an upgrade that
// should not see those delays.

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

// held reports whether t is a turn collecting under a hold.
func (t *Turn) held() bool {
	return t.State == TurnCollecting && t.out != nil && t.out.Held
}

// heldHere reports whether t is held by this process: by its name and
// its instance, since two processes may share a name.
func (d *Dispatcher) heldHere(t *Turn) bool {
	return t.held() && t.out.Owner == d.opts.Name && t.out.Holder == d.holdOutcome.Holder
}

// heldElsewhere returns the process holding t (TurnOutcome.Holder), if it
// is another process and its hold is younger than stuckAfter.
func (d *Dispatcher) heldElsewhere(t *Turn, now time.Time) (holder string, ok bool) {
	if !t.held() || d.heldHere(t) || now.Sub(t.submittingSince()) >= stuckAfter {
		return "", false
	}
	return t.out.Holder, true
}

// heldFresh reports whether t is held by any process, this one included,
// and its hold is younger than stuckAfter: as good as a claim.
func (d *Dispatcher) heldFresh(t *Turn, now time.Time) bool {
	return t.held() && now.Sub(t.submittingSince()) < stuckAfter
}

// submittingSince is when t's submission was claimed, or held: a hold is
// taken at intake, so it is dated by the turn's CreatedAt (the turns this
// replica holds share one outcome, d.holdOutcome).
func (t *Turn) submittingSince() time.Time {
	switch {
	case t.out == nil:
		return time.Time{}
	case t.out.Held:
		return t.CreatedAt
	}
	return t.out.SubmittingSince
}

// claimHeld makes t, held, the claim its hold stands for: submitting by
// its holder since the hold began.
func (t *Turn) claimHeld() {
	since := t.submittingSince()
	t.State = TurnSubmitting
	o := t.writeOutcome()
	o.SubmittingSince, o.Held, o.Holder = since, false, ""
}

// recordSubmittingSince is the claim's time a turn's record carries. A
// held turn's says stuckAfter before its deadline: a replica of a version
// without holds, which reads the hold as a claim, takes it over as stuck
// only once it is due, and so never submits the calls of a holder that
// died while they still run. (This version dates a hold by CreatedAt.)
func (t *Turn) recordSubmittingSince() time.Time {
	if t.held() {
		return t.Deadline.Add(-stuckAfter)
	}
	return t.submittingSince()
}

// recordState is the state a turn's record carries: a held turn's says
// submitting.
func (t *Turn) recordState() TurnState {
	if t.held() {
		return TurnSubmitting
	}
	return t.State
}

// releaseHeld gives up the holds this replica kept for holdFor without
// submitting their turns: each record goes back to collecting, to be
// closed by a claim as any other turn.
func (d *Dispatcher) releaseHeld(ctx context.Context, now time.Time) {
	for _, key := range d.gather.heldSince(d, now.Add(-d.holdFor())) {
		if ctx.Err() != nil {
			return
		}
		d.release(ctx, key)
	}
}

// release gives up this process's hold on the turn key, unless the turn
// is being submitted here. A result whose holder did not hear of it (its
// nudge lost, or taken by a replica of a version without holds, which
// drops it as late) is found by looking at the stream once the turn is
// released, which closes it.
func (d *Dispatcher) release(ctx context.Context, key protocol.TurnKey) {
	done, ok := d.submittingHere(key) // no submission of it begins meanwhile
	if !ok {
		return
	}
	known, rev := d.gather.known(key)
	if known == nil || !d.heldHere(known) {
		done()
		return
	}
	t := known.clone()
	t.out = nil
	newRev, err := d.turns.update(ctx, t, rev)
	if err == nil {
		d.tel.released.Add(ctx, 1)
	}
	if errors.Is(err, errConflict) {
		// Changed by another: taken over, cancelled, closed. As it is now.
		t, newRev, err = d.turns.get(ctx, key)
	}
	if err != nil {
		// Left held, or released with the answer lost: past stuckAfter
		// any replica takes it as collecting. This one no longer submits
		// it at once: a close of it claims the record as it is.
		unheld := known.clone()
		unheld.out = nil
		d.gather.replace(unheld, rev)
		done()
		d.log.Warn("releasing a held turn failed", "turn", key, "err", err)
		return
	}
	if !t.Open() {
		done()
		d.closedElsewhere(key)
		return
	}
	// Replaced before the mark goes: a close of this process, which reads
	// the copy once it has the mark, claims the turn as it now is.
	d.gather.replace(t, newRev)
	done()
	if present, err := d.gather.present(ctx, t); err == nil && present == len(t.Calls) {
		d.background(func(ctx context.Context) { d.closeTurn(ctx, key, false) })
	}
}

// releaseAllHeld releases, at shutdown, every hold this replica has, so
// that the other replicas or the restart take the turns as collecting at
// once rather than once the holds are stuckAfter old.
func (d *Dispatcher) releaseAllHeld() {
	// No intake holds a turn from now on; those holding one are waited
	// for, for a while, until they track it.
	d.holdsOff.Store(true)
	wait, cancelWait := context.WithTimeout(context.Background(), holdReleaseTimeout)
	defer cancelWait()
	locked := d.holdGate.TryLock()
	for !locked && backoff.Sleep(wait, 5*time.Millisecond) {
		locked = d.holdGate.TryLock()
	}
	if locked {
		d.holdGate.Unlock()
	} else {
		d.log.Warn("intakes still under way at shutdown; the turns they hold stay held until another replica may take them")
	}
	ctx, cancel := context.WithTimeout(context.Background(), holdReleaseTimeout)
	defer cancel()
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

// nudgeSubject is where the process holder (TurnOutcome.Holder) hears of
// the results of the turns it holds that another process received. It is
// the process's, not its name's: a process never nudges itself.
func nudgeSubject(holder string) string { return replicaSubject(holder, "results") }

// nudge tells the process holding a turn that the result of its call key
// is recorded. A nudge lost costs the holder no more than the time until
// its hold is released, when it looks at the stream.
func (d *Dispatcher) nudge(holder string, key protocol.CallKey) {
	if err := d.js.Conn().Publish(nudgeSubject(holder), []byte(key)); err != nil {
		d.log.Debug("telling the replica holding a turn of its result failed", "call_key", key, "holder", holder, "err", err)
	}
}

// serveNudges hears of the results of the turns held here that another
// replica received.
func (d *Dispatcher) serveNudges() (stop func(), err error) {
	return d.hear(nudgeSubject(d.holdOutcome.Holder), func(m *nats.Msg) {
		key := protocol.CallKey(m.Data)
		if key.Validate() != nil {
			return
		}
		if d.gather.recordedElsewhere(key) {
			d.background(func(ctx context.Context) { d.closeTurn(ctx, key.Turn(), false) })
		}
	})
}
