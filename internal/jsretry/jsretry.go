// Package jsretry tells a JetStream failure that may pass by itself (a
// server gone, a leader being elected) from one that will not, and retries
// an operation while it may: the one classification the dispatcher and
// executors share. It imports nats.go and internal/backoff only.
package jsretry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolrelay/toolrelay/internal/backoff"
)

// errCodeDuplicateInProcess is the server's JSStreamDuplicateMessageConflict
// ("duplicate message id is in process"), which nats.go does not name.
const errCodeDuplicateInProcess jetstream.ErrorCode = 10158

// MayPass reports whether a JetStream failure may pass by itself: a request
// timed out or found no responder (a server went away), the server
// answered that it is temporarily unavailable (a leader is being elected),
// or too many publications await their acknowledgement. Anything else (a
// full queue, a message too large, a refused compare-and-set) will not.
func MayPass(err error) bool {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		// A publication whose message ID another one, still in flight,
		// carries (a duplicate intake publishing a turn's calls again)
		// passes as soon as that one is stored: tried again, it is a
		// duplicate, which is success.
		return apiErr.Code == http.StatusServiceUnavailable || apiErr.ErrorCode == errCodeDuplicateInProcess
	}
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse) ||
		errors.Is(err, jetstream.ErrAsyncPublishTimeout) || errors.Is(err, jetstream.ErrTooManyStalledMsgs) ||
		errors.Is(err, nats.ErrConnectionReconnecting) || errors.Is(err, nats.ErrDisconnected)
}

// UntilReady runs op until it succeeds, fails for a reason that will not
// pass, or ctx ends (then it returns nil: stopped while starting is a
// clean stop). Between attempts it logs what it waits for and backs off
// from 250ms to 5s: for start-up work that must wait for a cluster to
// elect its leaders, as a process waits for its servers to connect.
func UntilReady(ctx context.Context, log *slog.Logger, what string, op func(context.Context) error) error {
	retry := backoff.Backoff{Initial: 250 * time.Millisecond, Max: 5 * time.Second}
	for {
		err := op(ctx)
		if err == nil || ctx.Err() != nil {
			return nil
		}
		if !MayPass(err) {
			return err
		}
		wait := retry.Next()
		log.Warn("JetStream not ready yet; "+what+" again", "err", err, "in", wait.String())
		if !backoff.Sleep(ctx, wait) {
			return nil
		}
	}
}

// UnavailableFor is how long [While] is usually given: long enough for a
// stream to elect a new leader.
const UnavailableFor = 10 * time.Second

// attemptTimeout bounds each attempt of While: a request to a server that
// went away fails after it, and is tried again.
const attemptTimeout = 3 * time.Second

// While runs op, each attempt bounded by a few seconds, until it succeeds,
// fails for a reason that will not pass, or within has gone by; a failure
// that may still pass is then wrapped in unavailable (the caller's
// sentinel, such as dispatch.ErrUnavailable). op must be safe to repeat: an
// attempt that timed out may have taken effect.
func While[T any](ctx context.Context, within time.Duration, unavailable error, op func(context.Context) (T, error)) (T, error) {
	giveUp := time.Now().Add(within)
	retry := backoff.Backoff{Initial: 100 * time.Millisecond, Max: time.Second}
	for {
		actx, cancel := context.WithTimeout(ctx, attemptTimeout)
		v, err := op(actx)
		cancel()
		if err == nil || !MayPass(err) || errors.Is(ctx.Err(), context.Canceled) {
			return v, err
		}
		wait := retry.Next()
		if ctx.Err() != nil || time.Now().Add(wait).After(giveUp) {
			return v, fmt.Errorf("%w: %w", unavailable, err)
		}
		backoff.Sleep(ctx, wait)
	}
}
