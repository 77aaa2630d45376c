package demo

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/responses"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/toolrelay/toolrelay/internal/platformsim"
	"github.com/toolrelay/toolrelay/pkg/dispatch"
	"github.com/toolrelay/toolrelay/pkg/exec"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// The demo's MCP approval: the platform calls the fleet through /mcp with
// require_approval "always", so it stops on an mcp_approval_request for
// issue_refund. The dispatcher, driving the conversation, holds it by
// issue_refund's policy (refunds over 100 wait for a person), an admin
// approves it, and the dispatcher answers mcp_approval_response: the
// platform makes the call and the conversation goes on.

// refundPrompt selects refundScenario.
const refundPrompt = "Refund order A-1001: the parcel never arrived."

// refundScenario refunds one order over MCP.
var refundScenario = platformsim.Scenario{
	Name: "refund", Prompt: "refund order a-1001",
	Steps:  []platformsim.Step{{{Name: "issue_refund", Arguments: `{"order":"A-1001","amount":250}`}}},
	Answer: `Done: {{out "issue_refund"}}`,
}

// refundFunction refunds an order; a refund over 100 waits for a person.
func refundFunction() exec.Function {
	return exec.Function{
		Name:        "issue_refund",
		Description: "Refund an order to the customer's card.",
		Parameters:  schema(`{"order":{"type":"string","description":"The order's ID"},"amount":{"type":"number","description":"The amount to refund"}}`, "order", "amount"),
		SideEffects: true,
		Approval:    &protocol.ApprovalPolicy{When: "args.amount > 100"},
		Handler: typed(func(ctx context.Context, a struct {
			Order  string  `json:"order"`
			Amount float64 `json:"amount"`
		}) (any, error) {
			return fmt.Sprintf("refunded %.2f for order %s", a.Amount, a.Order), nil
		}),
	}
}

// playMCPApproval serves issue_refund, plays refundScenario with the
// dispatcher's /mcp as the platform's MCP server, approves the request as
// an admin would, and prints each step.
func playMCPApproval(ctx context.Context, out *lockedWriter, wg *sync.WaitGroup, natsURL string, client openai.Client, d *dispatch.Dispatcher,
	mcpURL string, tp *sdktrace.TracerProvider, opts Options) error {
	ctx, cancel := context.WithTimeout(ctx, opts.Timeout)
	defer cancel()
	nc, js, err := connect(natsURL, "toolrelay-demo-refund-executor")
	if err != nil {
		return err
	}
	ex, err := exec.New(js, Team, exec.Options{Logger: opts.Logger, Middleware: []exec.Middleware{announce(out)}, TracerProvider: tp})
	if err == nil {
		err = ex.Register(refundFunction())
	}
	if err != nil {
		nc.Close()
		return err
	}
	wg.Go(func() { _ = ex.Run(ctx); nc.Close() })
	if err := waitServed(ctx, d, js, "issue_refund"); err != nil {
		return err
	}

	out.printf("[mcp approval] Responses API asking before it calls the fleet through /mcp\n  user: %s\n", refundPrompt)
	out.printf("  tools: {\"type\":\"mcp\",\"server_label\":\"toolrelay\",\"server_url\":%q,\"require_approval\":\"always\"}\n", mcpURL)
	out.printf("  policy: issue_refund approval: {when: \"args.amount > 100\"}\n")
	r, err := client.Responses.New(ctx, responses.ResponseNewParams{
		Model: "gpt-5.5", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String(refundPrompt)},
		Tools: []responses.ToolUnionParam{{OfMcp: &responses.ToolMcpParam{ServerLabel: "toolrelay", ServerURL: openai.String(mcpURL),
			RequireApproval: responses.ToolMcpRequireApprovalUnionParam{OfMcpToolApprovalSetting: openai.String("always")}}}},
	})
	if err != nil {
		return fmt.Errorf("create response: %w", err)
	}
	for _, it := range r.Output {
		if it.Type == "mcp_approval_request" {
			a := it.AsMcpApprovalRequest()
			out.printf("  platform: mcp_approval_request %s%s on %s\n", a.Name, a.Arguments, a.ServerLabel)
		}
	}
	w, err := d.Watch(ctx, dispatch.Ref{Platform: protocol.PlatformResponses, ResponseID: r.ID})
	if err != nil {
		return err
	}
	admin := dispatch.Caller{Name: "alice", Admin: true}
	held, err := awaitHeld(ctx, d, admin)
	if err != nil {
		return err
	}
	out.printf("  toolrelay: %s awaiting_approval by %s, denied automatically in %s\n", held.Function,
		strings.Join(held.Approvers, " or "), time.Until(held.AutoDenyAt).Round(time.Minute))
	const reason = "the carrier confirmed the loss"
	if _, err := d.Decide(ctx, admin, held.CallKey, dispatch.Decision{Approve: true, Reason: reason}); err != nil {
		return err
	}
	out.printf("  alice approves %s: %q\n", held.CallKey, reason)
	if w, err = awaitWatch(ctx, d, w.ID); err != nil {
		return err
	}
	last, err := client.Responses.Get(ctx, w.Current.ResponseID, responses.ResponseGetParams{})
	if err != nil {
		return fmt.Errorf("get response %s: %w", w.Current.ResponseID, err)
	}
	for _, it := range last.Output {
		if it.Type == "mcp_call" {
			c := it.AsMcpCall()
			out.printf("  platform: mcp_approval_response approve=true, then mcp_call %s -> %s\n", c.Name, c.Output)
		}
	}
	out.printf("  answer: %s\n\n", w.Answer)
	if !strings.Contains(w.Answer, "refunded 250.00 for order A-1001") {
		return fmt.Errorf("the answer %q does not tell of the refund", w.Answer)
	}
	return nil
}

// awaitHeld waits for the one call caller may decide.
func awaitHeld(ctx context.Context, d *dispatch.Dispatcher, caller dispatch.Caller) (*dispatch.Approval, error) {
	for {
		held, err := d.Approvals(ctx, caller, dispatch.ApprovalQuery{})
		if err == nil && len(held) > 0 {
			return held[0], nil
		}
		select {
		case <-ctx.Done():
			return nil, errors.New("the MCP approval request was not held")
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// awaitWatch waits for the watch id to end; it returns it completed.
func awaitWatch(ctx context.Context, d *dispatch.Dispatcher, id string) (*dispatch.Watch, error) {
	for {
		w, err := d.WatchStatus(ctx, id)
		if err != nil {
			return nil, err
		}
		switch w.State {
		case dispatch.WatchActive:
		case dispatch.WatchCompleted:
			return w, nil
		default:
			return nil, fmt.Errorf("watch %s: %s", w.State, w.Error)
		}
		select {
		case <-ctx.Done():
			return nil, errors.New("the conversation did not go on")
		case <-time.After(10 * time.Millisecond):
		}
	}
}
