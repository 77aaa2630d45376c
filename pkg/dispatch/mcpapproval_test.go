package dispatch_test

import (
	"context"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/responses"

	"github.com/toolrelay/toolrelay/internal/platformsim"
	"github.com/toolrelay/toolrelay/internal/testutil"
	"github.com/toolrelay/toolrelay/pkg/dispatch"
	"github.com/toolrelay/toolrelay/pkg/dispatch/httpapi"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// mcpRefundScenario asks for one refund of amount for order, which the
// model makes as an MCP tool call when the request names an MCP server
// listing refund.
func mcpRefundScenario(prompt, order, amount string) platformsim.Scenario {
	return platformsim.Scenario{Name: prompt, Prompt: prompt,
		Steps:  []platformsim.Step{{{Name: "refund", Arguments: `{"order":"` + order + `","amount":` + amount + `}`}}},
		Answer: `refund: {{out "refund"}}`}
}

// mcpResponse starts a response to prompt whose tools are the MCP server
// at url under label, every call of it needing the client's approval.
func (e *env) mcpResponse(prompt, label, url string) dispatch.Ref {
	e.t.Helper()
	r, err := e.client.Responses.New(context.Background(), responses.ResponseNewParams{
		Model: "gpt-5.5", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String(prompt)},
		Tools: []responses.ToolUnionParam{{OfMcp: &responses.ToolMcpParam{ServerLabel: label, ServerURL: openai.String(url),
			RequireApproval: responses.ToolMcpRequireApprovalUnionParam{OfMcpToolApprovalSetting: openai.String("always")}}}},
	})
	if err != nil {
		e.t.Fatal(err)
	}
	return dispatch.Ref{Platform: protocol.PlatformResponses, ResponseID: r.ID}
}

// heldOne waits until caller sees exactly one request awaiting a decision
// on d, and returns it.
func heldOne(t *testing.T, d *dispatch.Dispatcher, caller dispatch.Caller) *dispatch.Approval {
	t.Helper()
	var held []*dispatch.Approval
	testutil.WaitForWhat(t, 15*time.Second, "one MCP approval request to await a decision", func() bool {
		var err error
		held, err = d.Approvals(t.Context(), caller, dispatch.ApprovalQuery{})
		return err == nil && len(held) == 1
	})
	return held[0]
}

// watchEnd waits for the watch id to end on d and returns it.
func watchEnd(t *testing.T, d *dispatch.Dispatcher, id string, within time.Duration) *dispatch.Watch {
	t.Helper()
	var w *dispatch.Watch
	testutil.WaitForWhat(t, within, "the watch to end", func() bool {
		var err error
		w, err = d.WatchStatus(t.Context(), id)
		return err == nil && w.State != dispatch.WatchActive
	})
	return w
}

// auditKinds lists the kinds of the audit entries of team, oldest first.
func auditKinds(t *testing.T, d *dispatch.Dispatcher, team string) []string {
	t.Helper()
	entries, err := d.Audit(t.Context(), dispatch.Caller{Name: "ops", Admin: true}, dispatch.AuditQuery{Team: team})
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, en := range entries {
		kinds = append(kinds, en.Kind)
	}
	return kinds
}

// A Responses conversation stops on an mcp_approval_request for refund,
// served by the fleet's own /mcp: the dispatcher answers it by refund's
// policy. Over 100, the request waits for the billing team as a held call
// does: approved (on another replica, the first stopped meanwhile) the
// platform makes the MCP call, which runs once, unheld, and the
// conversation goes on; denied, the platform is told who denied it and
// why, and nothing runs. Under 100 it is approved at once. Each decision
// is in the audit trail.
func TestMCPApprovalRequestsFollowThePolicy(t *testing.T) {
	t.Parallel()
	e := newEnv(t, mcpRefundScenario("refund o-1 over mcp", "o-1", "500"), mcpRefundScenario("refund o-2 over mcp", "o-2", "700"),
		mcpRefundScenario("refund o-3 over mcp", "o-3", "5"))
	e.declareSpec(refundSpec(5*time.Second), "billing-exec", "b1")
	ranFor := make(chan string, 8)
	e.serve("billing", []string{"refund"}, func(c *protocol.Call) (string, bool) {
		order := string(c.Arguments)
		ranFor <- order
		return `"refunded"`, false
	})
	d1, stop1 := e.dispatcher(dispatch.Options{Name: "d1"})
	d2, _ := e.dispatcher(dispatch.Options{Name: "d2"})
	mcpURL := httptest.NewServer(httpapi.New(d2, httpapi.Options{}))
	t.Cleanup(mcpURL.Close)
	billing := dispatch.Caller{Name: "billing-oncall", Teams: []string{"billing"}}
	ran := func() []string {
		var got []string
		for {
			select {
			case o := <-ranFor:
				got = append(got, o)
			default:
				return got
			}
		}
	}

	t.Run("approved while its replica stops", func(t *testing.T) {
		w, err := d1.Watch(t.Context(), e.mcpResponse("refund o-1 over mcp", "toolrelay", mcpURL.URL+"/mcp"))
		if err != nil {
			t.Fatal(err)
		}
		a := heldOne(t, d2, billing)
		if a.MCPServer != "toolrelay" || a.Function != "refund" || a.Team != "billing" || !strings.Contains(string(a.Arguments), "o-1") {
			t.Errorf("held request %+v", a)
		}
		if got := ran(); len(got) != 0 {
			t.Fatalf("ran %v before any approval", got)
		}
		stop1()
		if _, err := d2.Decide(t.Context(), billing, a.CallKey, dispatch.Decision{Approve: true, Reason: "checked"}); err != nil {
			t.Fatal(err)
		}
		w = watchEnd(t, d2, w.ID, 30*time.Second)
		if w.State != dispatch.WatchCompleted || !strings.Contains(w.Answer, `refund: "refunded"`) {
			t.Errorf("watch %s %q (%s), want the refund's output after the approval", w.State, w.Answer, w.Error)
		}
		if got := ran(); len(got) != 1 || !strings.Contains(got[0], "o-1") {
			t.Errorf("ran %v, want o-1 once", got)
		}
		if held, _ := d2.Approvals(t.Context(), billing, dispatch.ApprovalQuery{}); len(held) != 0 {
			t.Errorf("the approved MCP call was held again: %+v", held[0])
		}
	})
	t.Run("denied", func(t *testing.T) {
		w, err := d2.Watch(t.Context(), e.mcpResponse("refund o-2 over mcp", "toolrelay", mcpURL.URL+"/mcp"))
		if err != nil {
			t.Fatal(err)
		}
		a := heldOne(t, d2, billing)
		if _, err := d2.Decide(t.Context(), billing, a.CallKey, dispatch.Decision{Reason: "over the refund limit"}); err != nil {
			t.Fatal(err)
		}
		w = watchEnd(t, d2, w.ID, 30*time.Second)
		if w.State != dispatch.WatchCompleted || !strings.Contains(w.Answer, "did not approve") ||
			!strings.Contains(w.Answer, "denied by billing-oncall: over the refund limit") {
			t.Errorf("watch %s %q (%s), want the denial and its reason", w.State, w.Answer, w.Error)
		}
		if got := ran(); len(got) != 0 {
			t.Errorf("ran %v, which was denied", got)
		}
	})
	t.Run("no approval needed", func(t *testing.T) {
		w, err := d2.Watch(t.Context(), e.mcpResponse("refund o-3 over mcp", "toolrelay", mcpURL.URL+"/mcp"))
		if err != nil {
			t.Fatal(err)
		}
		w = watchEnd(t, d2, w.ID, 30*time.Second)
		if w.State != dispatch.WatchCompleted || !strings.Contains(w.Answer, `refund: "refunded"`) {
			t.Errorf("watch %s %q (%s), want the refund run without a person", w.State, w.Answer, w.Error)
		}
		if got := ran(); len(got) != 1 || !strings.Contains(got[0], "o-3") {
			t.Errorf("ran %v, want o-3 once", got)
		}
	})
	want := []string{"requested", "approved", "run", "requested", "denied", "requested", "approved", "run"}
	var got []string
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end) && !slices.Equal(got, want); time.Sleep(20 * time.Millisecond) {
		got = auditKinds(t, d2, "billing")
	}
	if !slices.Equal(got, want) {
		t.Errorf("audit trail %v, want %v", got, want)
	}
}

// An MCP approval request nobody decides is denied in time for the turn's
// deadline, and the platform reads that it was not approved in time. A
// request of a server that is not the fleet's own waits for an admin,
// whom a team token cannot stand in for.
func TestMCPApprovalRequestsTimeOutAndOtherServersWaitForAnAdmin(t *testing.T) {
	t.Parallel()
	e := newEnv(t, mcpRefundScenario("refund o-4 over mcp", "o-4", "900"), mcpRefundScenario("refund o-5 elsewhere", "o-5", "5"))
	e.declareSpec(refundSpec(time.Second), "billing-exec", "b1")
	ran := e.serve("billing", []string{"refund"}, func(*protocol.Call) (string, bool) { return `"refunded"`, false })
	// Turns of 24 s: deadline 18 s after intake, auto-deny 10 s before it.
	d, _ := e.dispatcher(dispatch.Options{RunTTL: 24 * time.Second})
	hs := httptest.NewServer(httpapi.New(d, httpapi.Options{}))
	t.Cleanup(hs.Close)
	billing := dispatch.Caller{Name: "billing-oncall", Teams: []string{"billing"}}
	admin := dispatch.Caller{Name: "ops", Admin: true}

	t.Run("not decided in time", func(t *testing.T) {
		w, err := d.Watch(t.Context(), e.mcpResponse("refund o-4 over mcp", "toolrelay", hs.URL+"/mcp"))
		if err != nil {
			t.Fatal(err)
		}
		heldOne(t, d, billing)
		w = watchEnd(t, d, w.ID, 30*time.Second)
		if w.State != dispatch.WatchCompleted || !strings.Contains(w.Answer, "did not approve") || !strings.Contains(w.Answer, "not approved in time") {
			t.Errorf("watch %s %q (%s), want it denied as not approved in time", w.State, w.Answer, w.Error)
		}
		if ran.Load() != 0 {
			t.Errorf("the refund ran %d times", ran.Load())
		}
		if got, want := auditKinds(t, d, "billing"), []string{"requested", "expired"}; !slices.Equal(got, want) {
			t.Errorf("audit trail %v, want %v", got, want)
		}
	})
	t.Run("another server", func(t *testing.T) {
		w, err := d.Watch(t.Context(), e.mcpResponse("refund o-5 elsewhere", "payments", hs.URL+"/mcp"))
		if err != nil {
			t.Fatal(err)
		}
		a := heldOne(t, d, admin)
		if a.MCPServer != "payments" || !slices.Equal(a.Approvers, []string{"admin"}) {
			t.Errorf("held request %+v, want payments' held for an admin", a)
		}
		if held, _ := d.Approvals(t.Context(), billing, dispatch.ApprovalQuery{}); len(held) != 0 {
			t.Errorf("the billing team sees another server's request: %+v", held[0])
		}
		if _, err := d.Decide(t.Context(), billing, a.CallKey, dispatch.Decision{Approve: true}); err == nil {
			t.Error("a team token approved another server's request")
		}
		if _, err := d.Decide(t.Context(), admin, a.CallKey, dispatch.Decision{Approve: true}); err != nil {
			t.Fatal(err)
		}
		w = watchEnd(t, d, w.ID, 30*time.Second)
		if w.State != dispatch.WatchCompleted || !strings.Contains(w.Answer, `refund: "refunded"`) {
			t.Errorf("watch %s %q (%s), want the approved call's output", w.State, w.Answer, w.Error)
		}
	})
}
