package dispatch

import (
	"context"
	"errors"
	"sync"
	"time"
)

// A replica submitting a turn holds it by the record's SubmittingSince:
// another replica's sweep takes over a turn submitting for stuckAfter. A
// submission the platform keeps refusing (a rate limit, an outage) can be
// retried for longer than that, so while it is, its replica renews the
// claim; before, a healthy replica's retries were taken over after 15 s,
// and two replicas then retried the same turn side by side.

// claimRenewEvery is how often a submission being retried renews its
// claim: well within stuckAfter.
const claimRenewEvery = stuckAfter / 3

// errTakenOver ends a submission another replica has taken over.
var errTakenOver = errors.New("dispatch: another replica took the submission over")

// submitClaim renews a replica's claim on a turn while its submission is
// retried. Renewal starts with hold, on the first retry (most submissions
// never need one); end stops it and returns the record's revision and
// claim time as last written.
type submitClaim struct {
	d *Dispatcher
	// turn is the record as claimed; renewals write copies of it.
	turn Turn

	mu      sync.Mutex
	rev     uint64
	lost    bool
	stop    context.CancelFunc
	stopped chan struct{}
}

func (d *Dispatcher) claim(t *Turn, rev uint64) *submitClaim {
	return &submitClaim{d: d, turn: *t, rev: rev}
}

// hold starts renewing the claim, if it is not renewed already, and
// returns ctx ended with errTakenOver once the claim is lost.
func (c *submitClaim) hold(ctx context.Context) context.Context {
	if c == nil {
		return ctx
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stop != nil {
		return ctx
	}
	ctx, cancel := context.WithCancelCause(ctx)
	c.stop = func() { cancel(nil) }
	c.stopped = make(chan struct{})
	go func() {
		defer close(c.stopped)
		tick := time.NewTicker(c.d.claimRenewEvery)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			if !c.renew(ctx) {
				cancel(errTakenOver)
				return
			}
		}
	}()
	return ctx
}

// renew writes the claim again; false when another replica has the turn.
// A renewal that cannot be written (JetStream away) keeps the claim as it
// is: the sweep takes the turn over if that goes on for stuckAfter.
func (c *submitClaim) renew(ctx context.Context) bool {
	c.mu.Lock()
	rev := c.rev
	c.mu.Unlock()
	next := c.turn
	next.SubmittingSince = time.Now().UTC()
	newRev, err := c.d.turns.update(ctx, &next, rev)
	if errors.Is(err, errConflict) {
		// Another replica's write, or a renewal of ours whose answer was
		// lost: the record tells which.
		have, haveRev, gerr := c.d.turns.get(ctx, next.Key)
		if gerr != nil {
			return true
		}
		if have.State != TurnSubmitting || have.Owner != c.d.opts.Name {
			c.mu.Lock()
			c.lost = true
			c.mu.Unlock()
			return false
		}
		next, newRev, err = *have, haveRev, nil
	}
	if err != nil {
		c.d.log.Warn("renewing the claim on a submission failed; retrying it", "turn", next.Key, "err", err)
		return true
	}
	c.mu.Lock()
	c.turn, c.rev = next, newRev
	c.mu.Unlock()
	return true
}

// end stops renewing and returns the claim as last written: the record's
// revision, its SubmittingSince, and whether another replica took it.
func (c *submitClaim) end() (rev uint64, since time.Time, lost bool) {
	c.mu.Lock()
	stop, stopped := c.stop, c.stopped
	c.mu.Unlock()
	if stop != nil {
		stop()
		<-stopped
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.rev, c.turn.SubmittingSince, c.lost
}
