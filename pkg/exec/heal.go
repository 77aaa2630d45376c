package exec

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolrelay/toolrelay/internal/backoff"
	"github.com/toolrelay/toolrelay/internal/jsretry"
	"github.com/toolrelay/toolrelay/internal/provision"
)

// A function's consumer can disappear under a running executor: an
// operator deletes it or recreates the team's stream, a stream is restored
// or moved, a server starts again on a fresh store. The pull iterator does
// not say so plainly: a deleted consumer ends it with ErrConsumerDeleted,
// but a consumer that no longer exists on the server it reconnected to
// shows only as missing heartbeats, for ever. So every such sign is
// checked against the server (consumerGone), and a consumer that is gone
// is recreated with what it needs (healConsumer). Where that is not
// possible (the process may not create streams or consumers, or what
// exists now is incompatible), the function's declaration is withdrawn,
// with an error in the log, so no dispatcher counts it served, and the
// worker keeps looking for the consumer to come back.

const (
	// healAttemptTimeout bounds one attempt to look up or create what a
	// function's consumer needs.
	healAttemptTimeout = 5 * time.Second
	// healWithdrawAfter is how long a consumer may stay missing before the
	// function's declaration is withdrawn, when every failure so far may
	// pass (a server still starting, a leader being elected).
	healWithdrawAfter = 3 * time.Second
	// infoTimeout bounds the look-up that tells a consumer gone from a
	// server slow to answer.
	infoTimeout = 2 * time.Second
	// healSettle is how long a worker waits before recreating a consumer
	// it found gone (see healConsumer).
	healSettle = time.Second
	// healAgain is how soon after one healing another waits a backoff,
	// so a consumer that keeps vanishing is not recreated in a tight loop.
	healAgain = time.Minute
)

// consumerLostError says a worker's consumer (or its stream) is gone.
type consumerLostError struct{ cause error }

func (e *consumerLostError) Error() string { return "exec: consumer gone: " + e.cause.Error() }
func (e *consumerLostError) Unwrap() error { return e.cause }

// mayBeGone reports whether a pull failure may mean the consumer is gone.
func mayBeGone(err error) bool {
	return errors.Is(err, jetstream.ErrNoHeartbeat) || errors.Is(err, jetstream.ErrConsumerDeleted) ||
		errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, nats.ErrNoResponders)
}

// consumerGone asks the server whether the consumer still exists after a
// pull failed with err, and returns a *consumerLostError if it does not
// (or if err says so: the server deleted it). A server that does not
// answer is no proof of anything: nil.
func (w *worker) consumerGone(ctx context.Context, err error) *consumerLostError {
	if errors.Is(err, jetstream.ErrConsumerDeleted) {
		return &consumerLostError{cause: err}
	}
	ictx, cancel := context.WithTimeout(ctx, infoTimeout)
	defer cancel()
	_, ierr := w.cons.Info(ictx)
	if errors.Is(ierr, jetstream.ErrConsumerNotFound) || errors.Is(ierr, jetstream.ErrStreamNotFound) {
		return &consumerLostError{cause: errors.Join(err, ierr)}
	}
	return nil
}

// healConsumer recreates the consumer (and what it needs) until that
// works or ctx ends, reporting whether the worker can serve again. While
// it cannot, the function's declaration is withdrawn (see served).
func (w *worker) healConsumer(ctx context.Context, lost *consumerLostError) bool {
	if !w.lastHealed.IsZero() && time.Since(w.lastHealed) < healAgain {
		// Gone again soon after it was recreated: do not race whoever
		// removes it.
		if !backoff.Sleep(ctx, w.healRetry.Next()) {
			return false
		}
	} else {
		w.healRetry.Reset()
	}
	w.log.Warn("the function's consumer is gone; recreating it", "err", lost.cause)
	began := time.Now()
	// The consumer is gone the moment a stream's deletion begins: let the
	// deletion finish first. A stream created again while its deletion is
	// still being carried out can be left taking no publications at all
	// (nats-server 2.15.2, reproduced under load).
	if !backoff.Sleep(ctx, backoff.Jitter(healSettle)) {
		return false
	}
	retry := backoff.Backoff{Initial: 250 * time.Millisecond, Max: 5 * time.Second}
	withdrawn := false
	for {
		cons, err := w.recreateConsumer(ctx)
		if err == nil {
			w.cons = cons
			w.lastHealed = time.Now()
			if withdrawn {
				w.e.served.resume(ctx, w.fn.Name)
			}
			w.log.Info("the function's consumer exists again; serving it", "after", time.Since(began).Round(time.Millisecond).String())
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		if !withdrawn && (!jsretry.MayPass(err) || time.Since(began) >= healWithdrawAfter) {
			w.log.Error("cannot recreate the function's consumer: not serving the function, and its declaration is withdrawn, until the consumer exists again "+
				"(if this process may not create streams or consumers, the control plane must recreate them)", "err", err)
			w.e.served.suspend(ctx, w.fn.Name)
			withdrawn = true
		}
		if !backoff.Sleep(ctx, retry.Next()) {
			return false
		}
	}
}

// recreateConsumer looks up or creates the team's streams and buckets and
// the function's consumer, as Run does at start.
func (w *worker) recreateConsumer(ctx context.Context) (jetstream.Consumer, error) {
	ctx, cancel := context.WithTimeout(ctx, healAttemptTimeout)
	defer cancel()
	team, err := w.e.provisionTeam(ctx, []*Function{w.fn})
	if err != nil {
		return nil, err
	}
	return provision.Consumer(ctx, team.calls, w.e.consumerConfig(w.fn))
}
