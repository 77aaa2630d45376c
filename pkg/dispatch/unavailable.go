package dispatch

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ErrUnavailable is wrapped by errors from operations that could not reach
// JetStream for unavailableRetryFor, for example while a server
// is lost and its streams elect new leaders. Retrying later may succeed.
var ErrUnavailable = errors.New("dispatch: JetStream is unavailable")

// unavailableRetryFor bounds how long an operation is retried while
// JetStream is unavailable: long enough for a stream to elect a new leader.
const unavailableRetryFor = 10 * time.Second

// mayPass reports whether a JetStream failure may pass by itself: a request
// timed out or found no responder (a server went away), the server
// answered that it is temporarily unavailable (a leader is being elected),
// or too many publications await their acknowledgement. Anything else (a
// full queue, a message too large, a refused compare-and-set) will not.
func mayPass(err error) bool {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		return apiErr.Code == http.StatusServiceUnavailable
	}
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse) ||
		errors.Is(err, jetstream.ErrAsyncPublishTimeout) || errors.Is(err, jetstream.ErrTooManyStalledMsgs) ||
		errors.Is(err, nats.ErrConnectionReconnecting)
}

// whileUnavailable runs op, each attempt bounded by a few seconds, until it
// succeeds, fails for a reason that will not pass, or the time given has
// gone by; a failure that may still pass is then wrapped in ErrUnavailable.
// op must be safe to repeat: an attempt that timed out may have taken
// effect.
func whileUnavailable[T any](ctx context.Context, within time.Duration, op func(context.Context) (T, error)) (T, error) {
	giveUp := time.Now().Add(within)
	for wait := 100 * time.Millisecond; ; wait = min(wait*2, time.Second) {
		actx, cancel := context.WithTimeout(ctx, 3*time.Second)
		v, err := op(actx)
		cancel()
		if err == nil || !mayPass(err) || errors.Is(ctx.Err(), context.Canceled) {
			return v, err
		}
		if ctx.Err() != nil || time.Now().Add(wait).After(giveUp) {
			return v, fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		sleepCtx(ctx, jitter(wait))
	}
}
