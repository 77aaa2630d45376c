package dispatch

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/toolrelay/toolrelay/internal/testutil"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// A call is held before its turn's record is written; a decision that
// comes in between (a quick approver, a bot on the announcement) waits for
// the intake under way to write the record, rather than failing with the
// record not found.
func TestADecisionWaitsForTheTurnBeingTakenIn(t *testing.T) {
	t.Parallel()
	d, _, _ := provisioned(t, Options{Logger: testutil.Logger(t)})
	ctx := t.Context()
	now := time.Now().UTC()
	key := protocol.NewTurnKey(protocol.PlatformResponses, "resp_held", []string{"call_1"})
	tn := &Turn{Version: protocol.Version, Key: key, Ref: Ref{Platform: protocol.PlatformResponses}, State: TurnCollecting,
		CreatedAt: now, Deadline: now.Add(5 * time.Minute), ExpiresAt: now.Add(6 * time.Minute),
		Calls: []TurnCall{{ID: "call_1", Name: "refund", Team: "billing", Key: key.Call("call_1"), Arguments: json.RawMessage(`{}`), Approval: true}}}
	a := &Approval{CallKey: tn.Calls[0].Key, Turn: key, CallID: "call_1", Platform: protocol.PlatformResponses, Team: "billing",
		Function: "refund", Arguments: json.RawMessage(`{}`), State: ApprovalAwaiting, Approvers: []string{protocol.ApproverAdmin, protocol.ApproverTeam}, RequestedAt: now, Deadline: tn.Deadline,
		AutoDenyAt: tn.Deadline.Add(-time.Minute)}
	b, _ := json.Marshal(a)
	if _, err := d.approvals.Create(ctx, string(a.CallKey), b); err != nil {
		t.Fatal(err)
	}
	recorded := make(chan error, 1)
	time.AfterFunc(100*time.Millisecond, func() { _, err := d.turns.create(ctx, tn); recorded <- err })
	got, err := d.Decide(ctx, Caller{Name: "oncall", Admin: true}, a.CallKey, Decision{Reason: "not today"})
	if err != nil {
		t.Fatalf("a decision while the turn was being taken in: %v", err)
	}
	if got.State != ApprovalDenied || got.DecidedBy != "oncall" {
		t.Fatalf("decided %s by %q, want denied by oncall", got.State, got.DecidedBy)
	}
	if err := <-recorded; err != nil {
		t.Fatal(err)
	}
}
