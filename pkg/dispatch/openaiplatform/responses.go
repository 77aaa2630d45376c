package openaiplatform

import (
	"cmp"
	"context"
	"encoding/json"
	"strings"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/conversations"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"

	"github.com/toolrelay/toolrelay/pkg/dispatch"
	"github.com/toolrelay/toolrelay/pkg/dispatch/tooldef"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// Responses drives the Responses API and Microsoft Foundry agents: a
// response whose output has function_call items is answered by a new
// response with function_call_output items and previous_response_id (or
// the same conversation); the loop goes on until a response has no calls.
type Responses struct{ client openai.Client }

// NewResponses returns the Responses adapter.
func NewResponses(client openai.Client) *Responses { return &Responses{client: client} }

// Name implements dispatch.Platform.
func (*Responses) Name() protocol.Platform { return protocol.PlatformResponses }

// Poll implements dispatch.Platform. A ref naming only a conversation is polled by
// its items: the function calls without an output are pending.
func (a *Responses) Poll(ctx context.Context, ref dispatch.Ref) (*dispatch.Observation, error) {
	if ref.ResponseID == "" {
		return a.pollConversation(ctx, ref)
	}
	r, err := a.client.Responses.Get(ctx, ref.ResponseID, responses.ResponseGetParams{})
	if err != nil {
		return nil, classify("get response "+ref.ResponseID, err)
	}
	switch r.Status {
	case "completed":
		turn := &dispatch.TurnRequest{Ref: ref, Scope: r.ID}
		if turn.Ref.Model == "" && ref.Agent == nil {
			turn.Ref.Model = r.Model
		}
		if turn.Ref.Conversation == "" && r.Conversation.ID != "" {
			turn.Ref.Conversation = r.Conversation.ID
		}
		turn.Ref.Background = r.Background
		var unsupported []dispatch.UnsupportedItem
		for _, it := range r.Output {
			switch call, served := outputCall(it); {
			case call != nil:
				turn.Calls = append(turn.Calls, *call)
			case !served:
				unsupported = append(unsupported, dispatch.UnsupportedItem{Type: cmp.Or(it.Type, "(no type)"), ID: cmp.Or(it.CallID, it.ID)})
			}
		}
		if len(unsupported) > 0 {
			// The continuation that would answer the calls must answer
			// these too: none is sent, and the watch says why.
			return &dispatch.Observation{State: dispatch.ObjectUnsupported, Unsupported: unsupported}, nil
		}
		if len(turn.Calls) == 0 {
			return &dispatch.Observation{State: dispatch.ObjectDone, Answer: r.OutputText()}, nil
		}
		return &dispatch.Observation{State: dispatch.ObjectRequiresAction, Turn: turn}, nil
	case "failed", "cancelled", "incomplete":
		reason := "response " + string(r.Status)
		if r.Error.Message != "" {
			reason += ": " + r.Error.Message
		}
		return &dispatch.Observation{State: dispatch.ObjectFailed, Reason: reason}, nil
	}
	return &dispatch.Observation{State: dispatch.ObjectRunning}, nil
}

// Submit creates the continuation: function_call_output items for every
// call, chained by previous_response_id (or the conversation), with the
// Foundry agent reference when there is one. The Idempotency-Key is stable
// per turn.
func (a *Responses) Submit(ctx context.Context, turn *dispatch.Turn, outputs []dispatch.Output) (*dispatch.Submission, error) {
	ref := turn.Ref
	if dispatch.Repeated(ctx) && ref.Conversation != "" {
		// A submission that may have gone through already: a second one
		// would continue the conversation twice. Its outputs in the
		// conversation say it did; the watch then follows the
		// conversation.
		if done, err := a.answered(ctx, ref.Conversation, outputs); err != nil {
			return nil, err
		} else if done {
			next := ref
			next.ResponseID = ""
			return &dispatch.Submission{Next: &next}, nil
		}
	}
	params := responses.ResponseNewParams{}
	if ref.Model != "" {
		params.Model = ref.Model
	}
	if ref.Conversation != "" {
		params.Conversation = responses.ResponseNewParamsConversationUnion{OfString: openai.String(ref.Conversation)}
	} else {
		params.PreviousResponseID = openai.String(ref.ResponseID)
	}

	if ref.Background {
		params.Background = openai.Bool(true)
	}
	items := make(responses.ResponseInputParam, 0, len(outputs))
	approvals := false
	for _, o := range outputs {
		if o.Call.ToolSearch {
			items = append(items, toolSearchOutput(o))
			continue
		}
		if o.Call.MCPServer != "" {
			items = append(items, mcpApprovalResponse(o))
			approvals = true
			continue
		}
		out := modelOutput(o.Result, maxResponsesOutput)
		if o.Call.Custom {
			items = append(items, responses.ResponseInputItemParamOfCustomToolCallOutput(o.Call.ID, out))
			continue
		}
		item := responses.ResponseInputItemParamOfFunctionCallOutput(out)
		item.OfFunctionCallOutput.CallID = openai.String(o.Call.ID)
		items = append(items, item)
	}
	params.Input = responses.ResponseNewParamsInputUnion{OfInputItemList: items}
	opts := append([]option.RequestOption{option.WithHeader("Idempotency-Key", "toolrelay-"+string(turn.Key))}, submitOpts...)
	if ref.Agent != nil {
		agent := map[string]any{"type": "agent_reference", "name": ref.Agent.Name}
		if ref.Agent.Version != "" {
			agent["version"] = ref.Agent.Version
		}
		opts = append(opts, option.WithJSONSet("agent_reference", agent))
	}
	if approvals && ref.Agent == nil && ref.ResponseID != "" {
		// The platform makes the approved MCP calls with the servers the
		// request names, and a continuation inherits no tools: it names
		// those of the response it continues. (A Foundry agent has its
		// own.)
		prev, err := a.client.Responses.Get(ctx, ref.ResponseID, responses.ResponseGetParams{})
		if err != nil {
			return nil, classify("get response "+ref.ResponseID, err)
		}
		if raw := prev.JSON.Tools.Raw(); raw != "" && raw != "null" && raw != "[]" {
			opts = append(opts, option.WithJSONSet("tools", json.RawMessage(raw)))
		}
	}
	r, err := a.client.Responses.New(ctx, params, opts...)
	if err != nil {
		return nil, classify("continue response "+ref.ResponseID, err)
	}
	next := ref
	next.ResponseID = r.ID
	return &dispatch.Submission{Next: &next}, nil
}

// Output items of a response, by what the dispatcher does with them (the
// table in docs/operations.md). The platform runs the hosted tools and
// finishes their items itself; the client must answer the others, and
// toolrelay answers function and custom tool calls.
var hostedItems = map[string]bool{
	"message": true, "reasoning": true, "compaction": true,
	"file_search_call": true, "web_search_call": true, "image_generation_call": true, "code_interpreter_call": true,
	"mcp_call": true, "mcp_list_tools": true, "mcp_approval_response": true,
	"program": true, "program_output": true, "additional_tools": true,
	// Outputs the client sent earlier, echoed back.
	"function_call_output": true, "custom_tool_call_output": true, "computer_call_output": true,
	"local_shell_call_output": true, "shell_call_output": true, "apply_patch_call_output": true,
	"tool_search_output": true,
}

// outputCall returns the call toolrelay answers for an output item, or
// nil; served reports whether the item needs nothing from toolrelay (a
// call it answers, or an item the platform finished). Anything else
// (computer_call, local_shell_call, shell_call, apply_patch_call, a type
// this SDK does not know) is unsupported. A client-executed
// tool_search_call is a call the dispatcher answers itself, from the
// registry, and an mcp_approval_request one it decides itself, by the
// approval policy.
func outputCall(it responses.ResponseOutputItemUnion) (call *dispatch.CallRequest, served bool) {
	switch it.Type {
	case "function_call":
		fc := it.AsFunctionCall()
		return &dispatch.CallRequest{ID: fc.CallID, Name: fc.Name, Arguments: []byte(fc.Arguments)}, true
	case "custom_tool_call":
		cc := it.AsCustomToolCall()
		return &dispatch.CallRequest{ID: cc.CallID, Name: cc.Name, Arguments: mustJSON(cc.Input), Custom: true}, true
	case "tool_search_call":
		ts := it.AsToolSearchCall()
		if ts.Execution != responses.ResponseToolSearchCallExecutionClient {
			return nil, true // the platform searched
		}
		return &dispatch.CallRequest{ID: ts.CallID, Name: "tool_search", Arguments: searchArguments(ts.JSON.Arguments.Raw()), ToolSearch: true}, true
	case "mcp_approval_request":
		ar := it.AsMcpApprovalRequest()
		return mcpApprovalCall(ar.ID, ar.ServerLabel, ar.Name, ar.Arguments), true
	}
	return nil, hostedItems[it.Type]
}

// mcpApprovalCall is the call an mcp_approval_request asks the dispatcher
// to decide; its ID is the request's. Arguments (a JSON string on the
// wire) that are not JSON are kept as text, which intake refuses.
func mcpApprovalCall(id, server, name, args string) *dispatch.CallRequest {
	if args == "" {
		args = "{}"
	}
	return &dispatch.CallRequest{ID: id, Name: name, Arguments: json.RawMessage(args), MCPServer: cmp.Or(server, "(no label)")}
}

// mcpApprovalResponse answers an mcp_approval_request with the
// dispatcher's decision: approved when the call's result is an output,
// denied when it is a failure; the reason is the output's text, or the
// failure's message.
func mcpApprovalResponse(o dispatch.Output) responses.ResponseInputItemUnionParam {
	approve := o.Result != nil && o.Result.OK()
	reason := "not decided"
	switch {
	case approve:
		if json.Unmarshal([]byte(o.Result.Output), &reason) != nil {
			reason = o.Result.Output
		}
	case o.Result != nil && o.Result.Error != nil:
		reason = o.Result.Error.Message
	}
	item := responses.ResponseInputItemParamOfMcpApprovalResponse(o.Call.ID, approve)
	item.OfMcpApprovalResponse.Reason = openai.String(truncate(reason, maxApprovalReason))
	return item
}

// maxApprovalReason bounds the reason of an mcp_approval_response.
const maxApprovalReason = 2048

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "")
}

// searchArguments are a tool_search_call's arguments as a call carries
// them: JSON (an object, whatever the tool_search's parameters say).
func searchArguments(raw string) json.RawMessage {
	if raw == "" || raw == "null" || !json.Valid([]byte(raw)) {
		return json.RawMessage("{}")
	}
	return json.RawMessage(raw)
}

// toolSearchOutput answers a client-executed tool_search_call with the
// tool definitions of the functions the dispatcher found (the call's
// result holds their specs), rendered as `dispatcher tools` exports them
// for Responses. A search that failed finds nothing.
func toolSearchOutput(o dispatch.Output) responses.ResponseInputItemUnionParam {
	var specs []*protocol.FunctionSpec
	if o.Result != nil && o.Result.OK() {
		_ = json.Unmarshal([]byte(o.Result.Output), &specs)
	}
	tools := []responses.ResponseToolSearchOutputItemParamToolUnion{}
	defs, _ := tooldef.Definitions(specs, protocol.PlatformResponses)
	for _, def := range defs {
		var tool responses.ResponseToolSearchOutputItemParamToolUnion
		if json.Unmarshal(def, &tool) != nil || tool.OfToolSearch != nil {
			continue // the tool_search Definitions adds after deferred functions
		}
		tools = append(tools, tool)
	}
	item := responses.ResponseInputItemParamOfToolSearchOutput(tools)
	item.OfToolSearchOutput.CallID = openai.String(o.Call.ID)
	item.OfToolSearchOutput.Execution = responses.ResponseToolSearchOutputItemParamExecutionClient
	item.OfToolSearchOutput.Status = responses.ResponseToolSearchOutputItemParamStatusCompleted
	return item
}

// mustJSON encodes a string as JSON (which cannot fail).
func mustJSON(s string) json.RawMessage {
	b, _ := json.Marshal(s)
	return b
}

// answered reports whether the conversation holds an output for every
// call of outputs, among its newest items.
func (a *Responses) answered(ctx context.Context, conversation string, outputs []dispatch.Output) (bool, error) {
	want := map[string]bool{}
	for _, o := range outputs {
		want[o.Call.ID] = true
	}
	page, err := a.client.Conversations.Items.List(ctx, conversation, conversations.ItemListParams{Order: "desc", Limit: openai.Int(100)})
	if err != nil {
		return false, classify("list conversation items "+conversation, err)
	}
	for _, it := range page.Data {
		switch it.Type {
		case "function_call_output", "custom_tool_call_output", "tool_search_output":
			delete(want, it.CallID)
		case "mcp_approval_response":
			delete(want, it.ApprovalRequestID)
		}
	}
	return len(want) == 0, nil
}

// pollConversation finds the function calls of a conversation that have no
// output yet, paging through its items oldest first.
func (a *Responses) pollConversation(ctx context.Context, ref dispatch.Ref) (*dispatch.Observation, error) {
	pending := map[string]dispatch.CallRequest{}
	var order []string
	// Items the client must answer that toolrelay does not, by the ID
	// their answer names, until it appears.
	waiting := map[string]dispatch.UnsupportedItem{}
	var waitOrder []string
	answer := ""
	iter := a.client.Conversations.Items.ListAutoPaging(ctx, ref.Conversation, conversations.ItemListParams{Order: "asc", Limit: openai.Int(100)})
	for iter.Next() {
		it := iter.Current()
		switch it.Type {
		case "function_call":
			args := stringArguments(it.JSON.Arguments.Raw())
			pending[it.CallID] = dispatch.CallRequest{ID: it.CallID, Name: it.Name, Arguments: []byte(args)}
			order = append(order, it.CallID)
		case "custom_tool_call":
			pending[it.CallID] = dispatch.CallRequest{ID: it.CallID, Name: it.Name, Arguments: mustJSON(it.Input), Custom: true}
			order = append(order, it.CallID)
		case "tool_search_call":
			if it.Execution == "client" {
				pending[it.CallID] = dispatch.CallRequest{ID: it.CallID, Name: "tool_search", Arguments: searchArguments(it.JSON.Arguments.Raw()), ToolSearch: true}
				order = append(order, it.CallID)
			}
		case "function_call_output", "custom_tool_call_output", "tool_search_output":
			delete(pending, it.CallID)
		case "computer_call", "local_shell_call", "shell_call", "apply_patch_call":
			waiting[it.CallID] = dispatch.UnsupportedItem{Type: it.Type, ID: it.CallID}
			waitOrder = append(waitOrder, it.CallID)
		case "computer_call_output", "local_shell_call_output", "shell_call_output", "apply_patch_call_output":
			delete(waiting, it.CallID)
		case "mcp_approval_request":
			pending[it.ID] = *mcpApprovalCall(it.ID, it.ServerLabel, it.Name, stringArguments(it.JSON.Arguments.Raw()))
			order = append(order, it.ID)
		case "mcp_approval_response":
			delete(pending, it.ApprovalRequestID)
		case "message":
			if it.Role == "assistant" {
				answer = messageText(it.RawJSON())
			}
		}
	}
	if err := iter.Err(); err != nil {
		return nil, classify("list conversation items "+ref.Conversation, err)
	}
	var unsupported []dispatch.UnsupportedItem
	for _, id := range waitOrder {
		if u, ok := waiting[id]; ok {
			unsupported = append(unsupported, u)
			delete(waiting, id)
		}
	}
	if len(unsupported) > 0 {
		return &dispatch.Observation{State: dispatch.ObjectUnsupported, Unsupported: unsupported}, nil
	}
	turn := &dispatch.TurnRequest{Ref: ref, Scope: ref.Conversation}
	for _, id := range order {
		if c, ok := pending[id]; ok {
			turn.Calls = append(turn.Calls, c)
		}
	}
	if len(turn.Calls) == 0 {
		return &dispatch.Observation{State: dispatch.ObjectDone, Answer: answer}, nil
	}
	return &dispatch.Observation{State: dispatch.ObjectRequiresAction, Turn: turn}, nil
}

// stringArguments reads an item's arguments, a JSON string on the wire.
func stringArguments(raw string) string {
	var args string
	if json.Unmarshal([]byte(raw), &args) != nil {
		return raw
	}
	return args
}

// messageText joins the text parts of a message item.
func messageText(raw string) string {
	var msg struct {
		Content []struct {
			Text string `json:"text"`
		} `json:"content"`
	}
	_ = json.Unmarshal([]byte(raw), &msg)
	var b strings.Builder
	for _, c := range msg.Content {
		b.WriteString(c.Text)
	}
	return b.String()
}
