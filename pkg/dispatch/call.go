package dispatch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// A direct call runs one function on the fleet for a client that waits for
// its result on an open request (an MCP client's tools/call). It is a turn
// of one call of the pseudo-platform "mcp", so intake, validation, fan-out,
// the deadline timer, first-result-wins and gather apply unchanged. Its
// submission only records the turn submitted: the waiting request, on
// whichever replica holds it, learns of that by watching the turn record
// (any replica may gather and submit the turn), and reads the result.

// mcpPlatform is the adapter of the "mcp" pseudo-platform.
type mcpPlatform struct{}

var _ Platform = mcpPlatform{}

func (mcpPlatform) Name() protocol.Platform { return protocol.PlatformMCP }

func (mcpPlatform) Poll(context.Context, Ref) (*Observation, error) {
	return nil, errors.New("dispatch: MCP calls are answered on their request; there is nothing to poll")
}

// Submit has nothing to send: the turn's record, moved to submitted by the
// caller, is what the waiting request watches.
func (mcpPlatform) Submit(context.Context, *Turn, []Output) (*Submission, error) {
	return &Submission{}, nil
}

const (
	// directAnswerSlack is how long after a direct call's deadline its turn
	// expires: time for whichever replica closes it to record the outcome,
	// and for the waiting request to read it.
	directAnswerSlack = 5 * time.Second
	// directCancelTimeout bounds telling executors that a direct call's
	// client went away.
	directCancelTimeout = 5 * time.Second
)

// DirectCall is a call of one function by a client that waits for its
// result on an open request.
type DirectCall struct {
	// Function names the function; Arguments are its arguments, a JSON
	// object.
	Function  string
	Arguments json.RawMessage
	// Timeout bounds the call: its turn's deadline is this long after
	// intake. Required.
	Timeout time.Duration
	// Handle, if set, names the call for its client, so that a
	// cancellation naming it ([Dispatcher.CancelCall]) reaches it on
	// whichever replica runs it. For an MCP call: its caller and JSON-RPC
	// request id. Calls running at once with one handle are cancelled
	// together.
	Handle string
	// Progress, if set, is called every ProgressEvery while the call runs,
	// with how long it has run. It must not block for long.
	Progress      func(elapsed time.Duration)
	ProgressEvery time.Duration
}

// Call runs c as a turn of one call of the pseudo-platform "mcp"
// ([protocol.PlatformMCP]) and returns its result: an output, or a
// failure written for the model (invalid arguments, function error,
// timeout, unavailable), exactly as a platform would get it. Any replica
// may gather the turn; this one learns the outcome from its record. It
// returns an error only if the call could not be taken in, or, wrapping
// ctx's cause, if ctx ended first or the call was cancelled
// ([ErrCancelled]): then the turn is cancelled and its executors are
// told, so a running handler is cancelled too.
func (d *Dispatcher) Call(ctx context.Context, c DirectCall) (*protocol.Result, error) {
	if !d.Ready() {
		return d.directFailure(c.Function, "", protocol.CodeUnavailable,
			fmt.Sprintf("%s is unavailable: the dispatcher is starting or stopping. Try again shortly.", c.Function)), nil
	}
	if c.Handle != "" {
		var cancel context.CancelCauseFunc
		ctx, cancel = context.WithCancelCause(ctx)
		defer cancel(nil)
		defer d.calls.add(c.Handle, cancel)()
	}
	id := uuid.NewString()
	callID := "call_" + id
	deadline := time.Now().Add(c.Timeout)
	t, err := d.Intake(ctx, &TurnRequest{
		Ref: Ref{Platform: protocol.PlatformMCP}, Scope: "mcp/" + id, Channel: "mcp",
		Calls:     []CallRequest{{ID: callID, Name: c.Function, Arguments: c.Arguments}},
		ExpiresAt: deadline.Add(directAnswerSlack), Deadline: deadline,
	})
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("dispatch: call %s: %w", c.Function, context.Cause(ctx))
		}
		return nil, err
	}
	if c.Progress != nil && c.ProgressEvery > 0 {
		stop := progressEvery(c.ProgressEvery, c.Progress)
		defer stop()
	}
	wctx, cancel := context.WithDeadline(ctx, t.ExpiresAt)
	defer cancel()
	final, outputs, _, err := d.awaitClosed(wctx, t.Key, nil, Ref{})
	switch {
	case err != nil && ctx.Err() != nil:
		cctx, ccancel := context.WithTimeout(context.WithoutCancel(ctx), directCancelTimeout)
		defer ccancel()
		if d.cancelTurn(cctx, t.Key, cancelledByClient, "the MCP client cancelled the call") {
			d.log.InfoContext(ctx, "MCP call cancelled by its client", "turn", t.Key, "fn", c.Function)
		}
		return nil, fmt.Errorf("dispatch: call %s: %w", c.Function, context.Cause(ctx))
	case err != nil:
		// No replica closed the turn by its expiry (JetStream unreachable
		// all along): the caller cannot wait longer.
		return d.directFailure(c.Function, t.Calls[0].Team, protocol.CodeTimeout,
			fmt.Sprintf("%s timed out after %s. Continue without its result, or try again with a simpler request.",
				c.Function, c.Timeout.Round(time.Second))), nil
	case final.State == TurnFailed:
		return d.directFailure(c.Function, t.Calls[0].Team, protocol.CodeUnavailable,
			fmt.Sprintf("%s was not run to completion (%s). Try again later or continue without it.", c.Function, final.Outcome().Error)), nil
	}
	if outputs == nil {
		if outputs, err = d.outputs(ctx, final); err != nil {
			return nil, err
		}
	}
	return outputs[0].Result, nil
}

// directFailure is a failed result made by the dispatcher itself.
func (d *Dispatcher) directFailure(name, team string, code protocol.ErrorCode, message string) *protocol.Result {
	return &protocol.Result{Version: protocol.Version, Team: team, Function: safeName(name),
		Error: &protocol.CallError{Code: code, Message: message}, Executor: "dispatcher/" + d.opts.Name, FinishedAt: time.Now().UTC()}
}

// progressEvery calls report every interval, with the time since it
// started, until the returned stop is called; stop returns once report is
// no longer running.
func progressEvery(interval time.Duration, report func(elapsed time.Duration)) (stop func()) {
	start := time.Now()
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				report(time.Since(start))
			}
		}
	})
	return func() { close(done); wg.Wait() }
}
