package exec

import (
	"context"
	"encoding/json"
	"time"

	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// Invocation is one run of a function for one call.
type Invocation struct {
	// Function is the name the call was made for.
	Function string
	// Arguments is the JSON the model supplied, already checked against the
	// function's schema by the dispatcher.
	Arguments json.RawMessage
	// Call is the whole envelope: keys, platform, deadline.
	Call *protocol.Call
	// Attempt is 1 on the first delivery of the call, 2 on the next, ...
	Attempt int
}

// Handler runs a function. It returns the output given to the model, or an
// error whose message the model sees: say what failed and what the model can
// do differently. The context ends at the call's deadline (or the function's
// timeout, whichever is first) and when the executor is shut down.
//
// Handle may be called concurrently, up to the function's concurrency.
type Handler interface {
	Handle(ctx context.Context, inv *Invocation) ([]byte, error)
}

// HandlerFunc adapts a function to a Handler.
type HandlerFunc func(ctx context.Context, inv *Invocation) ([]byte, error)

// Handle calls f(ctx, inv).
func (f HandlerFunc) Handle(ctx context.Context, inv *Invocation) ([]byte, error) {
	return f(ctx, inv)
}

// Middleware wraps a Handler. Middleware given first runs outermost.
type Middleware func(Handler) Handler

func chain(h Handler, mws []Middleware) Handler {
	for i := len(mws) - 1; i >= 0; i-- {
		h = mws[i](h)
	}
	return h
}

type ctxKey int

const invocationKey ctxKey = iota

// InvocationFrom returns the invocation a handler's context belongs to.
func InvocationFrom(ctx context.Context) (*Invocation, bool) {
	inv, ok := ctx.Value(invocationKey).(*Invocation)
	return inv, ok
}

// CallID returns the platform's ID of the call a handler runs for.
func CallID(ctx context.Context) (string, bool) {
	inv, ok := InvocationFrom(ctx)
	if !ok {
		return "", false
	}
	return inv.Call.CallID, true
}

// TurnKey returns the key of the turn the call belongs to.
func TurnKey(ctx context.Context) (protocol.TurnKey, bool) {
	inv, ok := InvocationFrom(ctx)
	if !ok {
		return "", false
	}
	return inv.Call.Key.Turn(), true
}

// Platform returns the platform that asked for the call.
func Platform(ctx context.Context) (protocol.Platform, bool) {
	inv, ok := InvocationFrom(ctx)
	if !ok {
		return "", false
	}
	return inv.Call.Platform, true
}

// Attempt returns which run of the call this is, from 1.
func Attempt(ctx context.Context) (int, bool) {
	inv, ok := InvocationFrom(ctx)
	if !ok {
		return 0, false
	}
	return inv.Attempt, true
}

// Deadline returns the call's absolute deadline (the handler's context may
// end earlier, at the function's timeout).
func Deadline(ctx context.Context) (time.Time, bool) {
	inv, ok := InvocationFrom(ctx)
	if !ok {
		return time.Time{}, false
	}
	return inv.Call.Deadline, true
}
