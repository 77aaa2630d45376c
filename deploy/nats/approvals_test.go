package natsdeploy

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolrelay/toolrelay/internal/provision"
	"github.com/toolrelay/toolrelay/internal/testutil"
	"github.com/toolrelay/toolrelay/pkg/dispatch"
	"github.com/toolrelay/toolrelay/pkg/exec"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// Under the generated accounts a team hears the approval requests and
// decisions of its own calls, in its own account, and nothing of another
// team's: not their announcements (which carry the arguments), not the
// approval bucket, not the audit trail.
func TestApprovalsStayWithTheirTeam(t *testing.T) {
	x := deploy(t)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	_, bjs := x.connect("billing")
	x.serve(ctx, &wg, bjs, "billing", exec.Function{Name: "wipe_ledger", SideEffects: true,
		Approval: &protocol.ApprovalPolicy{Required: true},
		Handler:  exec.HandlerFunc(func(context.Context, *exec.Invocation) ([]byte, error) { return []byte("wiped"), nil })})

	bnc, _ := x.connect("billing")
	own, err := bnc.SubscribeSync(protocol.ApprovalSubjectPrefix + ".>")
	if err != nil {
		t.Fatal(err)
	}
	onc, ojs := x.connect("orders")
	leaked := make(chan string, 16)
	if _, err := onc.Subscribe(">", func(m *nats.Msg) {
		if strings.Contains(string(m.Data), secretOutput) {
			leaked <- m.Subject
		}
	}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []*nats.Conn{bnc, onc} {
		if err := c.Flush(); err != nil {
			t.Fatal(err)
		}
	}

	started, err := x.d.StartCall(ctx, "ops", dispatch.DirectCall{Function: "wipe_ledger",
		Arguments: json.RawMessage(`{"ledger":"` + secretOutput + `"}`), Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	msg, err := own.NextMsg(10 * time.Second)
	if err != nil || msg.Subject != protocol.ApprovalRequestedSubject("billing") || !strings.Contains(string(msg.Data), secretOutput) {
		t.Fatalf("billing's own announcement: %v %v", msg, err)
	}
	var held dispatch.Approval
	if err := json.Unmarshal(msg.Data, &held); err != nil || held.Turn != started.Key {
		t.Fatalf("announced %s (%v), want the held call of turn %s", msg.Data, err, started.Key)
	}

	// Orders cannot read or write the dispatchers' approvals or audit.
	if _, err := ojs.KeyValue(short(t), provision.ApprovalBucket); !refused(err) {
		t.Errorf("orders opening the approval bucket: %v, want refused", err)
	}
	if _, err := ojs.Stream(short(t), provision.AuditStream); !refused(err) {
		t.Errorf("orders opening the audit stream: %v, want refused", err)
	}
	if _, err := ojs.Publish(short(t), "$KV."+provision.ApprovalBucket+"."+string(held.CallKey), []byte(`{"state":"approved"}`)); !refused(err) {
		t.Errorf("orders writing billing's approval: %v, want refused", err)
	}
	if _, err := ojs.Publish(short(t), provision.AuditSubjectPrefix+".billing.approved", []byte(`{}`)); !refused(err) {
		t.Errorf("orders writing billing's audit trail: %v, want refused", err)
	}

	if _, err := x.d.Decide(ctx, dispatch.Caller{Name: "billing-oncall", Teams: []string{"billing"}}, held.CallKey,
		dispatch.Decision{Reason: "not during the audit"}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitForWhat(t, 10*time.Second, "billing to hear the decision", func() bool {
		m, err := own.NextMsg(100 * time.Millisecond)
		return err == nil && m.Subject == protocol.ApprovalDecidedSubject("billing") && strings.Contains(string(m.Data), "not during the audit")
	})
	if err := onc.Flush(); err != nil {
		t.Fatal(err)
	}
	select {
	case s := <-leaked:
		t.Errorf("orders received billing's approval traffic on %s", s)
	default:
	}
}
