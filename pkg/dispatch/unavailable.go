package dispatch

import (
	"context"
	"time"

	"github.com/toolrelay/toolrelay/internal/jsretry"
)

// unavailableRetryFor bounds how long an operation is retried while
// JetStream is unavailable.
const unavailableRetryFor = jsretry.UnavailableFor

// ackTimeout bounds the wait for a publication's acknowledgement.
const ackTimeout = 5 * time.Second

// asyncMaxPending bounds the asynchronous publications waiting for their
// acknowledgements; one more waits a moment for a slot, then fails with
// jetstream.ErrTooManyStalledMsgs, which may pass.
const asyncMaxPending = 4096

// awaitAck waits for the acknowledgement of an asynchronous publication
// and returns the sequence it is stored at. A publication whose
// acknowledgement was lost with a server fails ackTimeout after it went out
// (the publisher's timeout), with jetstream.ErrAsyncPublishTimeout, which
// may pass: message IDs make publishing again safe.
func awaitAck(ctx context.Context, f ackFuture) (uint64, error) {
	// An answer already in is taken as it is, however late it is looked
	// at: a select with ctx done could pick either, and a turn's later
	// calls are settled only once all are published.
	if answered(f) {
		return f.Result()
	}
	select {
	case <-f.Done():
		return f.Result()
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

// ackFuture is an asynchronous publication's answer to come
// (*jspub.Future).
type ackFuture interface {
	Done() <-chan struct{}
	Result() (seq uint64, err error)
}

// answered reports whether f's answer is in, without waiting.
func answered(f ackFuture) bool {
	select {
	case <-f.Done():
		return true
	default:
		return false
	}
}

// whileUnavailable is [jsretry.While] wrapping ErrUnavailable.
func whileUnavailable[T any](ctx context.Context, within time.Duration, op func(context.Context) (T, error)) (T, error) {
	return jsretry.While(ctx, within, ErrUnavailable, op)
}
