package exec

import (
	"context"

	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// Invocation is one run of a function for one call. It is the one source
// of a call's data: name, arguments, keys, platform and deadline are in
// Call, so a handler, a middleware and a test all read them the same way.
type Invocation struct {
	// Call is the envelope: Function, Arguments (the JSON the model
	// supplied, already checked against the function's schema), CallID,
	// Key (and Key.Turn()), Platform and the absolute Deadline.
	Call *protocol.Call
	// Attempt is 1 on the first delivery of the call, 2 on the next, ...
	Attempt int
}

// Input returns the model's raw text for a call of a custom tool (a
// function declared with a Format), and false for a call with JSON
// arguments.
func (inv *Invocation) Input() (string, bool) { return inv.Call.Input() }

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

// ctxKey is unexported so no other package can collide with it.
type ctxKey int

const invocationKey ctxKey = iota

// InvocationFromContext returns the invocation a handler's context belongs
// to. A handler has it as its argument; this is for code the handler calls
// that only has the context, such as a database helper that uses the call's
// key as an idempotency key.
func InvocationFromContext(ctx context.Context) (*Invocation, bool) {
	inv, ok := ctx.Value(invocationKey).(*Invocation)
	return inv, ok
}
