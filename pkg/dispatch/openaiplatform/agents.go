package openaiplatform

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/openai/openai-go/v3"
	"golang.org/x/sync/errgroup"

	"github.com/toolrelay/toolrelay/pkg/dispatch"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// Agents drives OpenAI Agents sessions: it reads a session's
// required_actions and answers each function call with an
// agent.session.input.tool_result event.
type Agents struct{ client openai.Client }

// NewAgents returns the Agents sessions adapter.
func NewAgents(client openai.Client) *Agents { return &Agents{client: client} }

// Name implements dispatch.Platform.
func (*Agents) Name() protocol.Platform { return protocol.PlatformAgents }

// Poll implements dispatch.Platform.
func (a *Agents) Poll(ctx context.Context, ref dispatch.Ref) (*dispatch.Observation, error) {
	s, err := a.client.Beta.Agents.Sessions.Get(ctx, ref.SessionID)
	if err != nil {
		return nil, classify("get agents session "+ref.SessionID, err)
	}
	return a.observe(ctx, ref, s)
}

func (a *Agents) observe(ctx context.Context, ref dispatch.Ref, s *openai.AgentSession) (*dispatch.Observation, error) {
	switch s.Status {
	case "requires_action":
		turn, unsupported := sessionActions(ref, s)
		if turn == nil {
			if len(unsupported) == 0 {
				return &dispatch.Observation{State: dispatch.ObjectRunning}, nil
			}
			// Only actions toolrelay does not run (computer use approvals,
			// environment connections): someone else answers them, and
			// until then the watch says what the session waits on.
			return &dispatch.Observation{State: dispatch.ObjectUnsupported, Unsupported: unsupported}, nil
		}
		return &dispatch.Observation{State: dispatch.ObjectRequiresAction, Turn: turn, Unsupported: unsupported}, nil
	case "idle":
		return &dispatch.Observation{State: dispatch.ObjectDone, Answer: a.lastAnswer(ctx, ref.SessionID)}, nil
	case "failed":
		return &dispatch.Observation{State: dispatch.ObjectFailed, Reason: "session failed: " + s.Error}, nil
	}
	return &dispatch.Observation{State: dispatch.ObjectRunning}, nil
}

// sessionActions collects the function calls of the first turn that has
// any, and names every other required action: toolrelay serves only
// function calls.
func sessionActions(ref dispatch.Ref, s *openai.AgentSession) (*dispatch.TurnRequest, []dispatch.UnsupportedItem) {
	var turn *dispatch.TurnRequest
	var unsupported []dispatch.UnsupportedItem
	for _, ra := range s.RequiredActions {
		switch ra.Type {
		case "function_call":
		case "computer_use_approval_request":
			unsupported = append(unsupported, dispatch.UnsupportedItem{Type: ra.Type, ID: ra.AsComputerUseApprovalRequest().RequestID})
			continue
		case "environment_connection":
			unsupported = append(unsupported, dispatch.UnsupportedItem{Type: ra.Type, ID: ra.AsEnvironmentConnection().EnvironmentID})
			continue
		default:
			unsupported = append(unsupported, dispatch.UnsupportedItem{Type: cmp.Or(ra.Type, "(no type)"), ID: cmp.Or(ra.CallID, ra.RequestID, ra.EnvironmentID)})
			continue
		}
		fc := ra.AsFunctionCall()
		if turn == nil {
			turn = &dispatch.TurnRequest{Ref: ref, Scope: s.ID + "/" + fc.TurnID, TurnID: fc.TurnID}
		}
		if fc.TurnID != turn.TurnID {
			continue
		}
		turn.Calls = append(turn.Calls, dispatch.CallRequest{ID: fc.CallID, Name: fc.Name, Arguments: agentArguments(fc)})
	}
	return turn, unsupported
}

// agentArguments returns the arguments as JSON: the platform sends an
// object, and the SDK also accepts a string that encodes one.
func agentArguments(fc openai.AgentSessionRequiredActionFunctionCall) json.RawMessage {
	raw := json.RawMessage(fc.JSON.Arguments.Raw())
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return json.RawMessage(s)
	}
	return raw
}

func (a *Agents) lastAnswer(ctx context.Context, sessionID string) string {
	page, err := a.client.Beta.Agents.Sessions.Items.List(ctx, sessionID, openai.BetaAgentSessionItemListParams{Limit: openai.Int(10)})
	if err != nil {
		return ""
	}
	for _, it := range page.Data {
		if it.Type == "message" && it.Role == "assistant" {
			var msg struct {
				Content []struct {
					Type string `json:"type"`
					Text string `json:"text"`
				} `json:"content"`
			}
			_ = json.Unmarshal([]byte(it.RawJSON()), &msg)
			var b strings.Builder
			for _, c := range msg.Content {
				b.WriteString(c.Text)
			}
			return b.String()
		}
	}
	return ""
}

// Submit posts one tool_result event per call, each with a deterministic
// Idempotency-Key, so a repeated submission is recognised by the platform.
// A call the platform no longer waits for counts as already answered.
func (a *Agents) Submit(ctx context.Context, turn *dispatch.Turn, outputs []dispatch.Output) (*dispatch.Submission, error) {
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(8)
	for _, o := range outputs {
		g.Go(func() error { return a.submitOne(gctx, turn, o) })
	}
	return &dispatch.Submission{}, g.Wait()
}

func (a *Agents) submitOne(ctx context.Context, turn *dispatch.Turn, o dispatch.Output) error {
	ev := openai.AgentSessionInputParamOfParamAgentSessionInputToolResult(o.Call.ID, o.Result.OK(), turn.TurnID)
	if o.Result.OK() {
		ev.OfParamAgentSessionInputToolResult.Output = openai.AgentFunctionCallOutputParamUnion{
			OfString: openai.String(protocol.Truncate(o.Result.Output, maxAgentsOutput)),
		}
	} else {
		ev.OfParamAgentSessionInputToolResult.Error = openai.String(protocol.Truncate(o.Result.Error.Message, maxAgentsOutput))
	}
	err := a.client.Beta.Agents.Sessions.Events.New(ctx, turn.Ref.SessionID, openai.BetaAgentSessionEventNewParams{
		Events:         []openai.AgentSessionInputParamUnion{ev},
		IdempotencyKey: openai.String(idempotencyKey(o.Call.Key)),
	}, submitOpts...)
	if status, msg := apiMessage(err); status == 400 && msg == "Unknown pending tool call: "+o.Call.ID {
		return nil // answered before (a repeated submission)
	}
	return classify(fmt.Sprintf("submit tool result %s to session %s", o.Call.ID, turn.Ref.SessionID), err)
}

// idempotencyKey is stable per call, so every repeat of a submission
// carries the same key.
func idempotencyKey(key protocol.CallKey) string {
	return "toolrelay-" + strings.ReplaceAll(string(key), ".", "-")
}

// Follow reads the session's live event stream and reports each required
// action as it appears, until ctx ends or the stream closes (then the error
// says why; nil on a clean end).
func (a *Agents) Follow(ctx context.Context, ref dispatch.Ref, ev *dispatch.FollowEvents) error {
	// The request is made here: once it returns, the platform streams the
	// session's events to it.
	stream := a.client.Beta.Agents.Sessions.Events.StreamStreaming(ctx, ref.SessionID)
	defer stream.Close()
	if stream.Err() != nil {
		return stream.Err()
	}
	ev.Open()
	for stream.Next() {
		e := stream.Current()
		if e.Type != "agent.session.requires_action" {
			continue
		}
		s := e.Session
		if turn, _ := sessionActions(ref, &s); turn != nil {
			ev.Found(turn)
		}
	}
	return stream.Err()
}
