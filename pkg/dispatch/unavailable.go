package dispatch

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolrelay/toolrelay/internal/backoff"
	"github.com/toolrelay/toolrelay/internal/jsretry"
)

// unavailableRetryFor bounds how long an operation is retried while
// JetStream is unavailable: long enough for a stream to elect a new leader.
const unavailableRetryFor = 10 * time.Second

// ackTimeout bounds the wait for a publication's acknowledgement.
const ackTimeout = 5 * time.Second

// awaitAck waits for the acknowledgement of an asynchronous publication
// sent at sent. A JetStream context made without WithPublishAsyncTimeout
// never fails a future whose acknowledgement was lost with a server (only a
// reconnect of this client does), so the wait ends ackTimeout after sent:
// a lost acknowledgement is jetstream.ErrAsyncPublishTimeout, which may
// pass, and message IDs make publishing again safe.
func awaitAck(ctx context.Context, f jetstream.PubAckFuture, sent time.Time) (*jetstream.PubAck, error) {
	// An answer already in is taken as it is, however long ago the write
	// was sent: a select with the timeout already fired could pick either,
	// and a turn's later calls are settled only once all are published.
	if ack, in, err := answered(f); in {
		return ack, err
	}
	timeout := time.NewTimer(time.Until(sent.Add(ackTimeout)))
	defer timeout.Stop()
	select {
	case ack := <-f.Ok():
		return ack, nil
	case err := <-f.Err():
		return nil, err
	case <-timeout.C:
		if ack, in, err := answered(f); in { // came in as the timer fired
			return ack, err
		}
		return nil, jetstream.ErrAsyncPublishTimeout
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// answered returns f's answer if it is in, without waiting.
func answered(f jetstream.PubAckFuture) (ack *jetstream.PubAck, in bool, err error) {
	select {
	case ack := <-f.Ok():
		return ack, true, nil
	case err := <-f.Err():
		return nil, true, err
	default:
		return nil, false, nil
	}
}

// unavailableAttemptTimeout bounds each attempt of whileUnavailable: a
// request to a server that went away fails after it, and is tried again.
const unavailableAttemptTimeout = 3 * time.Second

// whileUnavailable runs op, each attempt bounded by a few seconds, until it
// succeeds, fails for a reason that will not pass, or the time given has
// gone by; a failure that may still pass is then wrapped in ErrUnavailable.
// op must be safe to repeat: an attempt that timed out may have taken
// effect.
func whileUnavailable[T any](ctx context.Context, within time.Duration, op func(context.Context) (T, error)) (T, error) {
	giveUp := time.Now().Add(within)
	retry := backoff.Backoff{Initial: 100 * time.Millisecond, Max: time.Second}
	for {
		actx, cancel := context.WithTimeout(ctx, unavailableAttemptTimeout)
		v, err := op(actx)
		cancel()
		if err == nil || !jsretry.MayPass(err) || errors.Is(ctx.Err(), context.Canceled) {
			return v, err
		}
		wait := retry.Next()
		if ctx.Err() != nil || time.Now().Add(wait).After(giveUp) {
			return v, fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		backoff.Sleep(ctx, wait)
	}
}
