// Package testhook lets package exectest run a function exactly as an
// executor does, without package exec exporting the machinery a worker
// uses: exec sets [Run] when it is initialised, and exectest calls it.
// Being internal to pkg/exec, nothing else can import it.
package testhook

import (
	"context"
	"time"

	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// Request is one delivery of a call.
type Request struct {
	// Function is an exec.Function (typed as any: this package cannot
	// import exec).
	Function any
	Call     *protocol.Call
	// Attempt is the delivery number, from 1.
	Attempt int
	// MayHaveRun: an earlier attempt of a SideEffects function may have
	// run, so the executor reconciles instead of running the handler.
	MayHaveRun bool
}

// Outcome is what the executor would do with the delivery.
type Outcome struct {
	// Result is what it records, or would record were it not retrying.
	Result *protocol.Result
	// Err is what the handler or Reconcile hook returned.
	Err error
	// Retry: it would run the call again after RetryIn, recording nothing.
	Retry   bool
	RetryIn time.Duration
	// Refused: the handler refused the call.
	Refused bool
	// DeadLetter is the reason of the dead letter it would leave, or "".
	DeadLetter string
}

// Run is set by package exec.
var Run func(ctx context.Context, r Request) (Outcome, error)
