package exec

import (
	"context"
	"errors"
	"testing"

	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// Cancelling a turn cancels the calls of it running here, and only those,
// with ErrCallCancelled; a call of it tracked afterwards starts cancelled.
func TestCancellingATurnCancelsItsRunningCalls(t *testing.T) {
	c := newCancels()
	turnA := protocol.NewTurnKey(protocol.PlatformResponses, "resp_a", []string{"call_1", "call_2"})
	turnB := protocol.NewTurnKey(protocol.PlatformResponses, "resp_b", []string{"call_1"})
	a1, doneA1 := c.track(t.Context(), turnA.Call("call_1"))
	defer doneA1()
	a2, doneA2 := c.track(t.Context(), turnA.Call("call_2"))
	b1, doneB1 := c.track(t.Context(), turnB.Call("call_1"))
	defer doneB1()
	doneA2() // call_2 ended before the cancel: nothing of it remains
	c.cancel(turnA, "")
	if !errors.Is(context.Cause(a1), ErrCallCancelled) {
		t.Errorf("running call of the cancelled turn: cause %v", context.Cause(a1))
	}
	if errors.Is(context.Cause(a2), ErrCallCancelled) {
		t.Error("a call that had ended was cancelled as if it still ran")
	}
	if b1.Err() != nil {
		t.Errorf("a call of another turn was cancelled: %v", context.Cause(b1))
	}
	late, doneLate := c.track(t.Context(), turnA.Call("call_2"))
	defer doneLate()
	if !errors.Is(context.Cause(late), ErrCallCancelled) {
		t.Errorf("a call of a cancelled turn tracked after the cancel: cause %v", context.Cause(late))
	}
	if len(c.running) != 3 {
		t.Errorf("%d calls tracked, want 3 (a1, b1, the late one)", len(c.running))
	}
}

// The reason a cancellation carries is what the model reads; without one,
// the platform ended the run.
func TestCancellationKeepsItsReason(t *testing.T) {
	c := newCancels()
	turnA := protocol.NewTurnKey(protocol.PlatformMCP, "mcp/a", []string{"call_1"})
	turnB := protocol.NewTurnKey(protocol.PlatformResponses, "resp_b", []string{"call_1"})
	c.cancel(turnA, "the MCP client cancelled the call")
	c.cancel(turnB, "")
	if why, ok := c.cancelled(turnA); !ok || why != "the MCP client cancelled the call" {
		t.Errorf("turn A: %q, %v; want the MCP client's cancellation", why, ok)
	}
	if why, ok := c.cancelled(turnB); !ok || why != "the platform ended the run" {
		t.Errorf("turn B: %q, %v; want the platform's", why, ok)
	}
}
