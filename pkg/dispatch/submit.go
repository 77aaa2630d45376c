package dispatch

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolrelay/toolrelay/internal/backoff"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// The lifecycle engine (package lifecycle; docs/turns.md) decides when a
// turn is submitted and by which replica; turnEnv.Submit makes each
// attempt. What is here gathers a turn's outputs and finishes it.

// finished does what follows the close of turn t, wherever it was closed
// (submitted, failed, cancelled, or found closed by the sweep): its span
// ends, this replica stops gathering for it, and its timer leaves the index
// of open turns (the fired one too, when fired: the deadline closed it or
// it is not known to be unfired).
func (d *Dispatcher) finished(t *Turn, fired bool) {
	d.tel.endTurn(t.Key, t.State, t.Outcome().Error)
	d.gather.forget(t.Key)
	d.unindex(t.Key, fired)
	d.recent.add(t.Key, time.Now())
}

// closedElsewhere drops a turn this replica gathered for that another
// replica closed (or is submitting).
func (d *Dispatcher) closedElsewhere(key protocol.TurnKey) {
	d.gather.forget(key)
	d.tel.endTurnOutcome(key, "closed by another replica", false, "")
}

// cutOffLate closes a turn found collecting past its deadline (its timer
// did not close it), submitting what it has.
func (d *Dispatcher) cutOffLate(key protocol.TurnKey, why string) {
	d.log.Warn(why, "turn", key)
	d.engine.Due(string(key))
}

// resultReadFor bounds how long reading a recorded result is retried while
// JetStream is unavailable; the read also stops submitLeeway before the run
// expires, so the submission still has time, but is given minResultRead at
// least.
const (
	resultReadFor = 30 * time.Second
	submitLeeway  = 2 * time.Second
	minResultRead = time.Second
)

// outputs lists the result of every call, in the turn's order.
func (d *Dispatcher) outputs(ctx context.Context, t *Turn) ([]Output, error) {
	out := make([]Output, 0, len(t.Calls))
	// One allowance for results that read as missing, for the whole turn.
	lagUntil := time.Now().Add(min(resultLagFor, max(time.Until(t.ExpiresAt)-submitLeeway, 0)))
	for i := range t.Calls {
		c := &t.Calls[i]
		var res *protocol.Result
		if timedOut(t, c.Key) {
			res = &protocol.Result{
				Version: protocol.Version, Key: c.Key, CallID: c.ID, Team: c.Team, Function: safeName(c.Name),
				Error: &protocol.CallError{Code: protocol.CodeTimeout,
					Message: fmt.Sprintf("%s timed out after %s. Continue without its result, or try again with a simpler request.",
						c.Name, t.Deadline.Sub(t.CreatedAt).Round(time.Second))},
				FinishedAt: t.Outcome().SubmittingSince,
			}
		} else {
			var err error
			// A result gathered here is in hand. Any other (gathered by
			// another replica, or before a restart) is read from the
			// stream; a read that times out while JetStream fails over is
			// tried again: the result is recorded, and failing the turn
			// for it would throw the whole submission away. The run's
			// expiry bounds the wait.
			if res = d.gather.local(t.Key, c.Key); res == nil {
				within := min(max(time.Until(t.ExpiresAt)-submitLeeway, minResultRead), resultReadFor)
				res, err = d.recordedResult(ctx, t, c, within, lagUntil)
			}
			if err == nil && (res.Key != c.Key || res.Team != c.Team) {
				err = errors.New("the recorded result names another call")
			}
			if err != nil && !errors.Is(err, ErrUnavailable) && ctx.Err() == nil {
				// Not a passing failure: the result never appeared, or
				// what holds its subject is not a result of this call
				// (the first message on it wins, so no result will
				// follow). That call fails; the turn's others go out.
				d.log.Warn("a call's recorded result cannot be read; submitting it as failed", "turn", t.Key, "call", c.Key, "err", err)
				res, err = &protocol.Result{Version: protocol.Version, Key: c.Key, CallID: c.ID, Team: c.Team, Function: safeName(c.Name),
					Error: &protocol.CallError{Code: protocol.CodeUnavailable,
						Message: fmt.Sprintf("The result of %s could not be read. Continue without it.", c.Name)},
					FinishedAt: t.Outcome().SubmittingSince}, nil
			}
			if err != nil {
				return nil, fmt.Errorf("dispatch: result of call %s (%s): %w", c.ID, c.Name, err)
			}
		}
		out = append(out, Output{Call: *c, Result: res})
	}
	return out, nil
}

// resultLagFor bounds how long a result known to be recorded may read as
// not found. Results are read from the stream's leader, which holds every
// result acknowledged; before, a direct get answered by a replica that
// had not stored it yet failed a whole turn in a chaos soak, and the
// allowance stays for whatever else may answer so for a moment.
const resultLagFor = 2 * time.Second

// recordedResult reads the result of c, known to be recorded: it is tried
// again while JetStream is unavailable (up to within) and while it reads
// as not found (until giveUp).
func (d *Dispatcher) recordedResult(ctx context.Context, t *Turn, c *TurnCall, within time.Duration, giveUp time.Time) (*protocol.Result, error) {
	lag := backoff.Backoff{Initial: 20 * time.Millisecond, Max: 500 * time.Millisecond}
	for {
		res, err := whileUnavailable(ctx, within, func(ctx context.Context) (*protocol.Result, error) {
			return d.gather.result(ctx, t, c)
		})
		if !errors.Is(err, jetstream.ErrMsgNotFound) || time.Now().After(giveUp) {
			return res, err
		}
		if !backoff.Sleep(ctx, lag.Next()) {
			return nil, err
		}
	}
}

func timedOut(t *Turn, key protocol.CallKey) bool {
	for _, k := range t.Outcome().TimedOut {
		if k == key {
			return true
		}
	}
	return false
}

// submitAttemptTimeout bounds one request submitting a turn's outputs.
const submitAttemptTimeout = 30 * time.Second

// lastAttemptLead is how long before a run's expiry the last submission
// attempt goes out.
const lastAttemptLead = time.Second

// retryWait is how long to wait before the next submission attempt, with
// left until the run expires, backoff the next step of the backoff and
// retryAfter what the platform asked for; false if no attempt fits.
//
// The backoff is cut to a quarter of the time left, so attempts come
// closer together as expiry nears instead of sleeping through the moments
// the platform answers again (a soak lost a run waiting 6 s of its last 11
// between two rate limits). The platform's Retry-After stands. A wait that
// would outlast the run is cut short: one last attempt goes out just before
// it expires, and only when there is no time for that does the submission
// give up.
func retryWait(left, backoff, retryAfter time.Duration) (time.Duration, bool) {
	wait := max(retryAfter, min(backoff, left/4))
	if last := left - lastAttemptLead; wait > last {
		if last <= 0 {
			return 0, false
		}
		wait = last
	}
	return wait, true
}

// lateResult notes a result that arrived after its turn was closed: it is
// recorded in the stream, but the turn was submitted without it.
func (d *Dispatcher) lateResult(ctx context.Context, t *Turn) {
	d.tel.late.Add(ctx, 1)
	d.log.InfoContext(ctx, "late result for a closed turn; recorded, not submitted", "turn", t.Key, "state", t.State)
}

// earliest returns the earlier of a and b.
func earliest(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}
