package dispatch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// Platform is an agent platform seen from the dispatcher: it can be polled
// for what it waits for, and it takes the outputs of a turn.
//
// Implementations must make Submit safe to repeat: a dispatcher that crashed
// after submitting repeats the submission with the same turn, and the
// platform's "already submitted" answer must count as success.
type Platform interface {
	Name() protocol.Platform
	// Poll reads the state of the object ref names.
	Poll(ctx context.Context, ref Ref) (*Observation, error)
	// Submit gives the platform every output of turn.
	Submit(ctx context.Context, turn *Turn, outputs []Output) (*Submission, error)
}

// Follower is a Platform that can push required actions as they happen (an
// event stream), so a watch learns of them within a second instead of at
// its next poll. Follow blocks until ctx ends or the stream closes, and
// tells ev what it hears.
type Follower interface {
	Follow(ctx context.Context, ref Ref, ev *FollowEvents) error
}

// FollowEvents is what a Follower tells the watch following an object.
type FollowEvents struct {
	// Open is called each time the stream is open, before any event of it:
	// a stream does not replay what came before, so the watch polls once
	// then for what it may have missed.
	Open func()
	// Found is called with each required action as it appears.
	Found func(*TurnRequest)
}

// Ref names what the dispatcher drives on a platform.
type Ref struct {
	Platform protocol.Platform `json:"platform"`
	// SessionID names an Agents session.
	SessionID string `json:"session_id,omitempty"`
	// ThreadID and RunID name an Assistants run.
	ThreadID string `json:"thread_id,omitempty"`
	RunID    string `json:"run_id,omitempty"`
	// ResponseID names a response; Conversation, Model and Agent are
	// carried into its continuations.
	ResponseID   string          `json:"response_id,omitempty"`
	Conversation string          `json:"conversation,omitempty"`
	Model        string          `json:"model,omitempty"`
	Agent        *AgentReference `json:"agent,omitempty"`
	Background   bool            `json:"background,omitempty"`
}

// AgentReference names a Microsoft Foundry agent, sent as agent_reference.
type AgentReference struct {
	Name    string `json:"name"`
	Version string `json:"version,omitempty"`
}

// Validate reports the first missing or malformed field, naming it.
func (r *Ref) Validate() error {
	need := func(field, v string) error {
		if v == "" {
			return &FieldError{Field: field, Message: fmt.Sprintf("%s is required for platform %q", field, r.Platform)}
		}
		if len(v) > 256 {
			return &FieldError{Field: field, Message: field + " is longer than 256 characters"}
		}
		return nil
	}
	switch r.Platform {
	case protocol.PlatformAgents:
		return need("session_id", r.SessionID)
	case protocol.PlatformAssistants:
		return errors.Join(need("thread_id", r.ThreadID), need("run_id", r.RunID))
	case protocol.PlatformResponses:
		if r.Agent != nil && r.Agent.Name == "" {
			return &FieldError{Field: "agent.name", Message: "agent.name is required when agent is given"}
		}
		if r.ResponseID == "" && r.Conversation != "" {
			if r.Model == "" && r.Agent == nil {
				return &FieldError{Field: "model", Message: "model (or agent) is required to continue a conversation watched without a response_id"}
			}
			return need("conversation", r.Conversation)
		}
		return need("response_id", r.ResponseID)
	case "":
		return &FieldError{Field: "platform", Message: "platform is required: agents, assistants or responses"}
	}
	return &FieldError{Field: "platform", Message: fmt.Sprintf("unknown platform %q: want agents, assistants or responses", r.Platform)}
}

// String names the object for logs.
func (r Ref) String() string {
	switch r.Platform {
	case protocol.PlatformAgents:
		return "agents session " + r.SessionID
	case protocol.PlatformAssistants:
		return "assistants run " + r.ThreadID + "/" + r.RunID
	case protocol.PlatformMCP:
		return "MCP call"
	default:
		return "response " + r.ResponseID
	}
}

// ObjectState is what a polled platform object is doing.
type ObjectState int

// States of a polled object.
const (
	// ObjectRunning: the model is working; poll again later.
	ObjectRunning ObjectState = iota
	// ObjectRequiresAction: the model waits for the calls of Observation.Turn.
	ObjectRequiresAction
	// ObjectDone: the object finished; Observation.Answer may hold its answer.
	ObjectDone
	// ObjectFailed: the object failed, was cancelled or expired; see Reason.
	ObjectFailed
	// ObjectUnsupported: the object waits on (an Agents session, an
	// Assistants run) or ended on (a response) items or actions toolrelay
	// does not serve, and on nothing it serves; Observation.Unsupported
	// names them. It is never read as done.
	ObjectUnsupported
)

func (s ObjectState) String() string {
	switch s {
	case ObjectRunning:
		return "running"
	case ObjectRequiresAction:
		return "requires_action"
	case ObjectDone:
		return "done"
	case ObjectUnsupported:
		return "unsupported"
	}
	return "failed"
}

// Observation is the result of polling.
type Observation struct {
	State  ObjectState
	Turn   *TurnRequest
	Answer string
	Reason string
	// Unsupported lists what the object waits on that toolrelay does not
	// serve: with ObjectUnsupported, or beside the calls of an
	// ObjectRequiresAction (an Agents session waiting on a function call
	// and on an environment connection at once).
	Unsupported []UnsupportedItem
}

// UnsupportedItem is an output item of a response, or a required action of
// a session or run, that toolrelay does not serve.
type UnsupportedItem struct {
	// Type is the platform's type of it: "computer_call",
	// "environment_connection", or one toolrelay does not know at all.
	Type string `json:"type"`
	// ID is its ID on the platform (the item, call, request or
	// environment), when it has one.
	ID string `json:"id,omitempty"`
}

// TurnRequest is a required action: the calls a model waits for.
type TurnRequest struct {
	Ref Ref
	// Scope identifies the platform object within the platform: session and
	// turn, thread and run, or response.
	Scope string
	// TurnID is the platform's turn ID (Agents), needed to answer.
	TurnID string
	Calls  []CallRequest
	// ExpiresAt is when the platform expires the run; zero if it gives
	// none, and then the dispatcher's RunTTL applies.
	ExpiresAt time.Time
	// Deadline, when set, is when the dispatcher submits whatever it has
	// (it must be before ExpiresAt). Zero: ExpiresAt minus the submit
	// margin.
	Deadline time.Time
	// Channel is how the dispatcher learned of it (poll, stream, webhook),
	// for metrics and logs.
	Channel string
}

// CallRequest is one function call the model asked for.
type CallRequest struct {
	ID        string          `json:"id"`
	Name      string          `json:"name"`
	Arguments json.RawMessage `json:"arguments"`
	// Custom marks a call of a custom tool (Responses custom_tool_call):
	// Arguments is then a JSON string holding the model's raw input, and
	// the output is submitted as a custom_tool_call_output.
	Custom bool `json:"custom,omitempty"`
	// ToolSearch marks a client-executed tool search (Responses
	// tool_search_call with execution "client"): the dispatcher answers it
	// itself from the registry, and runs it nowhere. Arguments are the
	// call's arguments (JSON; the query is read from their strings); the
	// result's output is the JSON array of the matching functions'
	// [protocol.FunctionSpec]s, which the adapter submits as a
	// tool_search_output of their tool definitions.
	ToolSearch bool `json:"tool_search,omitempty"`
	// MCPServer, when set, makes this an MCP approval request (Responses
	// mcp_approval_request): the platform asks the client whether it may
	// call the MCP tool Name with Arguments on the server so labelled. ID
	// is the request's ID. The dispatcher decides it itself
	// (mcpapproval.go), and runs it nowhere: the result is the decision,
	// an output to approve, a failure (its message the reason) to deny.
	MCPServer string `json:"mcp_server,omitempty"`
}

// Key is the turn's key.
func (r *TurnRequest) Key() protocol.TurnKey {
	ids := make([]string, len(r.Calls))
	for i, c := range r.Calls {
		ids[i] = c.ID
	}
	return protocol.NewTurnKey(r.Ref.Platform, r.Scope, ids)
}

// Output is the result of one call of a turn, ready to submit.
type Output struct {
	Call   TurnCall
	Result *protocol.Result
}

// Submission is what a platform answered to a submission.
type Submission struct {
	// Next is the object to drive next, when the submission created one
	// (a Responses continuation); nil otherwise.
	Next *Ref
}

type repeatedKey struct{}

// Repeated reports, to a [Platform]'s Submit, whether a submission of the
// turn may have reached the platform before: an earlier attempt of this
// replica, or one of a replica whose lease lapsed. An adapter that can
// look the outputs up on the platform does so before submitting again
// (docs/turns.md).
func Repeated(ctx context.Context) bool {
	v, _ := ctx.Value(repeatedKey{}).(bool)
	return v
}

// WithRepeated returns ctx marked as that of a repeated submission, as the
// dispatcher marks it (and an adapter's tests may).
func WithRepeated(ctx context.Context) context.Context {
	return context.WithValue(ctx, repeatedKey{}, true)
}
