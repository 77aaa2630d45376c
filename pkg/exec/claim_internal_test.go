package exec

import (
	"testing"

	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// A call this process runs is claimed once: a redelivery of it finds the
// run under way (and waits for it, in awaitOwnRun) instead of running it
// a second time; once the run ends the call can be claimed again.
func TestARunningCallIsClaimedOnce(t *testing.T) {
	var w worker
	key := protocol.NewTurnKey(protocol.PlatformResponses, "resp_1", []string{"call_1"}).Call("call_1")
	release, busy := w.claim(key)
	if release == nil || busy != nil {
		t.Fatal("first claim refused")
	}
	again, running := w.claim(key)
	if again != nil || running == nil {
		t.Fatal("a second claim of a running call was granted")
	}
	select {
	case <-running:
		t.Fatal("the run's channel is closed while it runs")
	default:
	}
	release()
	select {
	case <-running:
	default:
		t.Fatal("ending the run does not tell whoever waits for it")
	}
	if r, b := w.claim(key); r == nil || b != nil {
		t.Fatal("a call whose run ended cannot be claimed again")
	}
}
