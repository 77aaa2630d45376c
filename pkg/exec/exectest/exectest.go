// Package exectest runs a function's handler in a unit test, without NATS,
// exactly as an executor would: arguments checked against the schema, the
// handler run under a deadline, panics recovered, the output checked.
//
//	res := exectest.Run(t, fn, `{"order_id":"A-1"}`, exectest.Options{})
//	if !res.OK() { t.Fatal(res.Error.Message) }
package exectest

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/toolrelay/toolrelay/pkg/exec"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// Options shape the call. The zero value is a call with a one-minute
// deadline from the Responses platform.
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

// Run runs fn for one call with the given arguments JSON and returns the
// result an executor would record. It fails the test if fn is invalid.
func Run(t testing.TB, fn exec.Function, args string, opts Options) *protocol.Result {
	t.Helper()
	ctx := opts.Context
	if ctx == nil {
		ctx = t.Context()
	}
	res, err := exec.Invoke(ctx, fn, Call(fn, args, opts))
	if err != nil {
		t.Fatalf("exectest: %v", err)
	}
	return res
}
