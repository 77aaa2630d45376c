package dispatch

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/toolrelay/toolrelay/internal/backoff"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// A replica submitting a turn holds it by the record's SubmittingSince:
// another replica's sweep (or its own) takes over a turn submitting for
// stuckAfter. A submission can take longer than that (results read while
// JetStream fails over, a platform that hangs or keeps refusing), so while
// it is under way its replica renews the claim; before, a healthy
// replica's retries were taken over after 15 s, and two replicas then
// retried the same turn side by side.

// claimRenewEvery is how often a submission under way renews its claim:
// well within stuckAfter.
const claimRenewEvery = stuckAfter / 3

// claimRenewTimeout bounds one renewal: an answer lost with a server must
// not hold the claim's renewals up while it lapses.
const claimRenewTimeout = 3 * time.Second

// errTakenOver ends a submission another replica has taken over.
var errTakenOver = errors.New("dispatch: another replica took the submission over")

// submitClaim renews a replica's claim on a turn while it submits it. The
// first renewal is due claimRenewEvery after the claim was written (at
// once if that is past); most submissions end before, and cost a timer.
type submitClaim struct {
	d      *Dispatcher
	cancel context.CancelCauseFunc
	// renewing is held by a renewal under way; end waits for it.
	renewing sync.Mutex

	mu    sync.Mutex
	timer *time.Timer
	ended bool
	// turn is the record as last written by this replica; rev its
	// revision.
	turn *Turn
	rev  uint64
	lost bool
	// unsure holds the claims written without an answer (any may be
	// stored); only renewals, one at a time, use it.
	unsure []time.Time
}

// claim starts holding t, recorded at rev, and returns the context of the
// submission: ended with errTakenOver if another replica takes it.
func (d *Dispatcher) claim(ctx context.Context, t *Turn, rev uint64) (*submitClaim, context.Context) {
	c := &submitClaim{d: d, turn: t.clone(), rev: rev}
	ctx, c.cancel = context.WithCancelCause(ctx)
	c.mu.Lock()
	c.timer = time.AfterFunc(max(d.claimRenewEvery-time.Since(t.Outcome().SubmittingSince), 0), func() { c.fire(ctx) })
	c.mu.Unlock()
	return c, ctx
}

func (c *submitClaim) fire(ctx context.Context) {
	c.renewing.Lock()
	defer c.renewing.Unlock()
	c.mu.Lock()
	ended := c.ended
	c.mu.Unlock()
	if ended {
		return
	}
	if !c.renew(ctx) {
		c.cancel(errTakenOver)
		return
	}
	c.mu.Lock()
	if !c.ended {
		c.timer.Reset(c.d.claimRenewEvery)
	}
	c.mu.Unlock()
}

// renew writes the claim again; false when another replica, or another
// submission of this one's, has the turn. A renewal that cannot be
// written (JetStream away) keeps the claim as it is: the sweep takes the
// turn over if that goes on for stuckAfter.
func (c *submitClaim) renew(ctx context.Context) bool {
	c.mu.Lock()
	next, rev := c.turn.clone(), c.rev
	c.mu.Unlock()
	claim := next.writeOutcome()
	claim.SubmittingSince = time.Now().UTC()
	rctx, cancel := context.WithTimeout(ctx, claimRenewTimeout)
	newRev, err := c.d.turns.update(rctx, next, rev)
	cancel()
	if err != nil {
		// A conflict is another writer's claim, or a write of this
		// claim's whose answer was lost (this one's, or an earlier
		// renewal's that failed so): the record tells which, by the
		// exact claims written.
		c.unsure = append(c.unsure, claim.SubmittingSince)
		have, haveRev, found, taken := c.d.findClaim(ctx, next.Key, rev, claim.Owner, c.unsure)
		switch {
		case found:
			next, newRev, err = have, haveRev, nil
		case taken:
			c.mu.Lock()
			c.lost = true
			c.mu.Unlock()
			return false
		}
	}
	if err != nil {
		c.d.log.Warn("renewing the claim on a submission failed; it is tried again", "turn", next.Key, "err", err)
		return true
	}
	c.mu.Lock()
	c.turn, c.rev = next, newRev
	c.mu.Unlock()
	c.unsure = c.unsure[:0]
	return true
}

// findClaim reads the record of key after a write of a claim on it, made
// at revision rev, failed without a clear answer: the write may be stored
// with its answer lost, or still on its way to being stored when the
// record is read, so a record no later than rev is read again, for a
// moment. It returns the record if it holds a claim of owner
// made at one of the instants since (found), or whether it holds anything
// else written after rev (taken); neither if it cannot tell.
func (d *Dispatcher) findClaim(ctx context.Context, key protocol.TurnKey, rev uint64, owner string, since []time.Time) (have *Turn, haveRev uint64, found, taken bool) {
	wait := backoff.Backoff{Initial: 50 * time.Millisecond, Max: 500 * time.Millisecond}
	for range 5 {
		rctx, cancel := context.WithTimeout(ctx, claimRenewTimeout)
		have, haveRev, err := d.turns.get(rctx, key)
		cancel()
		if err == nil && haveRev > rev {
			claim := have.Outcome()
			ours := have.State == TurnSubmitting && claim.Owner == owner && slices.ContainsFunc(since, claim.SubmittingSince.Equal)
			return have, haveRev, ours, !ours
		}
		if !backoff.Sleep(ctx, wait.Next()) {
			break
		}
	}
	return nil, 0, false, false
}

// end stops renewing and returns the claim as last written: the record's
// revision, its SubmittingSince, and whether another submission took it.
func (c *submitClaim) end() (rev uint64, since time.Time, lost bool) {
	c.mu.Lock()
	c.ended = true
	c.timer.Stop()
	c.mu.Unlock()
	c.renewing.Lock() // a renewal under way finishes first
	c.renewing.Unlock()
	c.cancel(nil)
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.rev, c.turn.Outcome().SubmittingSince, c.lost
}

// submittingHere marks key as submitted by this process until the
// returned done is called; false if it already is (the sweep found it
// looking stuck while it is being submitted here).
func (d *Dispatcher) submittingHere(key protocol.TurnKey) (done func(), ok bool) {
	d.submittingMu.Lock()
	defer d.submittingMu.Unlock()
	if d.submitting[key] {
		return nil, false
	}
	if d.submitting == nil {
		d.submitting = map[protocol.TurnKey]bool{}
	}
	d.submitting[key] = true
	return func() {
		d.submittingMu.Lock()
		delete(d.submitting, key)
		d.submittingMu.Unlock()
	}, true
}

// isSubmittingHere reports whether this process submits key now.
func (d *Dispatcher) isSubmittingHere(key protocol.TurnKey) bool {
	d.submittingMu.Lock()
	defer d.submittingMu.Unlock()
	return d.submitting[key]
}
