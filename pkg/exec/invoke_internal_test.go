package exec

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/toolrelay/toolrelay/pkg/protocol"
)

func invokeCall(deadline time.Time) *protocol.Call {
	key := protocol.NewTurnKey(protocol.PlatformResponses, "resp_1", []string{"call_1"}).Call("call_1")
	return &protocol.Call{Version: protocol.Version, Key: key, CallID: "call_1", Team: "team-a", Function: "slow",
		Arguments: []byte(`{}`), Deadline: deadline}
}

func discardLog() *slog.Logger { return slog.New(slog.DiscardHandler) }

// A handler that runs longer than the heartbeat interval keeps its
// delivery alive: invoke beats while it runs, again and again.
func TestInvokeBeatsWhileTheHandlerRuns(t *testing.T) {
	var beats atomic.Int32
	enough := make(chan struct{})
	h := HandlerFunc(func(ctx context.Context, _ *Invocation) ([]byte, error) {
		select {
		case <-enough:
			return []byte(`"done"`), nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	})
	heartbeat := func() {
		if beats.Add(1) == 3 {
			close(enough)
		}
	}
	// Should the beats stop, the deadline ends the handler without its
	// output, and the test fails within seconds.
	o := invoke(t.Context(), h, invokeCall(time.Now().Add(5*time.Second)), 1, 0, 5*time.Millisecond, heartbeat, "test", discardLog)
	if o.res == nil || o.res.Error != nil || o.res.Output != `"done"` {
		t.Fatalf("outcome %+v, want the handler's output", o.res)
	}
	if n := beats.Load(); n < 3 {
		t.Fatalf("%d heartbeats, want at least 3", n)
	}
}

// A handler that ignores its context is abandoned once the deadline and
// the grace after it have passed, beating until then: the call gets a
// timeout result.
func TestInvokeAbandonsAHandlerThatIgnoresItsDeadline(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	h := HandlerFunc(func(context.Context, *Invocation) ([]byte, error) {
		<-release // ignores its context
		return nil, nil
	})
	var beats atomic.Int32
	deadline := time.Now().Add(20 * time.Millisecond)
	returned := make(chan outcome, 1)
	go func() {
		returned <- invoke(t.Context(), h, invokeCall(deadline), 1, 0, 50*time.Millisecond, func() { beats.Add(1) }, "test", discardLog)
	}()
	var o outcome
	select {
	case o = <-returned:
	case <-time.After(abandonGrace + 30*time.Second):
		t.Fatal("a handler that ignores its context was never abandoned")
	}
	if time.Now().Before(deadline.Add(abandonGrace)) {
		t.Fatal("abandoned before the deadline's grace was over")
	}
	if o.res == nil || o.res.Error == nil || o.res.Error.Code != protocol.CodeTimeout {
		t.Fatalf("outcome %+v, want a timeout failure", o.res)
	}
	if beats.Load() == 0 {
		t.Fatal("no heartbeat while the abandoned handler ran")
	}
}
