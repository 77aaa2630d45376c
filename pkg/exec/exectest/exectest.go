// Package exectest is the test double of package exec, in the way
// net/http/httptest is of net/http: [Run] handles one delivery of a call
// to a function exactly as an executor would — arguments checked against
// the schema, the handler run under a deadline, panics recovered, the
// output checked, the retry decision and the dead-letter reason — without
// NATS, and says what the executor would do next.
//
//	res := exectest.Run(t, fn, `{"order_id":"A-1"}`, exectest.Options{})
//	if !res.OK() { t.Fatal(res.Error.Message) }
//	if res.Verdict != exectest.Retried { t.Fatal("a busy backend should be retried") }
//
// Set [Options.Attempt] to see the last attempt, and [Options.MayHaveRun]
// to run a side-effect function's Reconcile hook.
package exectest

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/toolrelay/toolrelay/pkg/exec"
	"github.com/toolrelay/toolrelay/pkg/exec/internal/testhook"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// Options shape the call. The zero value is the first delivery of a call
// with a one-minute deadline from the Responses platform.
type Options struct {
	// Deadline is how long from now the call's deadline is. Default: 1m.
	Deadline time.Duration
	// CallID is the platform's call ID. Default: "call_test".
	CallID string
	// Platform that asks. Default: responses.
	Platform protocol.Platform
	// Team owning the function. Default: "test".
	Team string
	// Context for the handler. Default: the test's context.
	Context context.Context
	// Attempt is which delivery of the call this is, from 1. On the last
	// attempt the function's RetryPolicy allows, a retryable error fails
	// the call for good instead of being retried. Default: 1.
	Attempt int
	// MayHaveRun delivers the call as the executor does when an earlier
	// attempt of a SideEffects function may have run without recording a
	// result: the function's Reconcile hook decides, and Handler runs only
	// if it returns [exec.ErrDidNotRun]; without a Reconcile hook the call
	// fails. Run fails the test if the function is not SideEffects.
	MayHaveRun bool
}

// Verdict is what the executor does with a delivery's outcome.
type Verdict string

const (
	// Recorded: the result is recorded and the call is done — an output,
	// or a failure nobody needs to look at (invalid arguments, a timeout).
	Recorded Verdict = "recorded"
	// Retried: a retryable error with attempts and time left. Nothing is
	// recorded yet; the call runs again after a backoff, on any replica.
	// Result is what would be recorded if no attempt were left.
	Retried Verdict = "retried"
	// Refused: the handler refused the call ([exec.ErrRefused]). The
	// failure is recorded; it is not retried and leaves no dead letter.
	Refused Verdict = "refused"
	// DeadLettered: a failure for good — a permanent error, a panic,
	// exhausted attempts, an attempt that may have run. The failure is
	// recorded and a dead letter left; [Result.DeadLetter] says why.
	DeadLettered Verdict = "dead_lettered"
)

// Result is the result the executor would record, and what it would do.
type Result struct {
	*protocol.Result
	// Verdict is what the executor does next.
	Verdict Verdict
	// DeadLetter is the reason of the dead letter left
	// (protocol.ReasonPermanent, ReasonPanic, ReasonExhausted, ...) when
	// Verdict is DeadLettered; empty otherwise.
	DeadLetter string
	// RetryIn is the backoff before the next attempt when Verdict is
	// Retried (with the policy's jitter).
	RetryIn time.Duration
	// Err is the error the handler (or Reconcile hook) returned, for
	// errors.Is; nil when it succeeded or did not run.
	Err error
}

// Call builds the call envelope an executor would receive.
func Call(fn exec.Function, args string, opts Options) *protocol.Call {
	if opts.Deadline == 0 {
		opts.Deadline = time.Minute
	}
	if opts.CallID == "" {
		opts.CallID = "call_test"
	}
	if opts.Platform == "" {
		opts.Platform = protocol.PlatformResponses
	}
	if opts.Team == "" {
		opts.Team = "test"
	}
	turn := protocol.NewTurnKey(opts.Platform, "exectest", []string{opts.CallID})
	return &protocol.Call{
		Version: protocol.Version, Key: turn.Call(opts.CallID), Platform: opts.Platform, Scope: "exectest",
		CallID: opts.CallID, Team: opts.Team, Function: fn.Name, Arguments: json.RawMessage(args),
		Deadline: time.Now().Add(opts.Deadline), CreatedAt: time.Now(),
	}
}

// Run delivers one call of fn with the given arguments JSON and returns
// the result an executor would record, with its verdict. It fails the test
// if fn or opts are invalid. Middleware of exec.Options is not applied.
func Run(t testing.TB, fn exec.Function, args string, opts Options) *Result {
	t.Helper()
	ctx := opts.Context
	if ctx == nil {
		ctx = t.Context()
	}
	o, err := testhook.Run(ctx, testhook.Request{Function: fn, Call: Call(fn, args, opts), Attempt: opts.Attempt, MayHaveRun: opts.MayHaveRun})
	if err != nil {
		t.Fatalf("exectest: %v", err)
	}
	res := &Result{Result: o.Result, DeadLetter: o.DeadLetter, Err: o.Err, Verdict: Recorded}
	switch {
	case o.Retry:
		res.Verdict, res.RetryIn = Retried, o.RetryIn
	case o.Refused:
		res.Verdict = Refused
	case o.DeadLetter != "":
		res.Verdict = DeadLettered
	}
	return res
}
