package dispatch

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// One approved request lets one MCP call run, however often its approval
// is recorded: recording it again (the auto-deny timer or a resuming
// replica, after a recording that failed) before or after its call took
// the grant grants nothing more. Another request with the same function
// and arguments grants one call more.
func TestAGrantIsOneCallPerRequest(t *testing.T) {
	d, _, _ := provisioned(t, Options{})
	ctx := t.Context()
	until := time.Now().Add(time.Minute)
	args := json.RawMessage(`{"order":"A-1","amount":250}`)
	same := json.RawMessage(`{ "amount": 250, "order": "A-1" }`)
	r1, r2 := protocol.CallKey("turn1.call_1"), protocol.CallKey("turn2.call_1")
	grant := func(r protocol.CallKey) {
		t.Helper()
		if err := d.grant(ctx, r, "issue_refund", args, until); err != nil {
			t.Fatal(err)
		}
	}
	take := func(want bool, why string) {
		t.Helper()
		if got := d.takeGrant(ctx, "issue_refund", same); got != want {
			t.Fatalf("%s: a call took a grant: %v, want %v", why, got, want)
		}
	}
	grant(r1)
	grant(r1)
	take(true, "after one request's approval recorded twice")
	take(false, "with its one grant taken")
	grant(r1)
	take(false, "after the same approval recorded once more")
	grant(r2)
	take(true, "after a second request's approval")
	take(false, "with both grants taken")
	if d.takeGrant(ctx, "issue_refund", json.RawMessage(`{"order":"A-2","amount":250}`)) {
		t.Fatal("a call with other arguments took a grant")
	}
}
