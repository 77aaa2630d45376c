package openaiplatform

import (
	"context"
	"encoding/json"
	"strings"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/conversations"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"

	"github.com/toolrelay/toolrelay/pkg/dispatch"
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
		for _, it := range r.Output {
			if it.Type == "function_call" {
				fc := it.AsFunctionCall()
				turn.Calls = append(turn.Calls, dispatch.CallRequest{ID: fc.CallID, Name: fc.Name, Arguments: []byte(fc.Arguments)})
			}
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
	for _, o := range outputs {
		item := responses.ResponseInputItemParamOfFunctionCallOutput(modelOutput(o.Result, maxResponsesOutput))
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
	r, err := a.client.Responses.New(ctx, params, opts...)
	if err != nil {
		return nil, classify("continue response "+ref.ResponseID, err)
	}
	next := ref
	next.ResponseID = r.ID
	return &dispatch.Submission{Next: &next}, nil
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
		if it.Type == "function_call_output" {
			delete(want, it.CallID)
		}
	}
	return len(want) == 0, nil
}

// pollConversation finds the function calls of a conversation that have no
// output yet, paging through its items oldest first.
func (a *Responses) pollConversation(ctx context.Context, ref dispatch.Ref) (*dispatch.Observation, error) {
	pending := map[string]dispatch.CallRequest{}
	var order []string
	answer := ""
	iter := a.client.Conversations.Items.ListAutoPaging(ctx, ref.Conversation, conversations.ItemListParams{Order: "asc", Limit: openai.Int(100)})
	for iter.Next() {
		it := iter.Current()
		switch it.Type {
		case "function_call":
			raw := it.JSON.Arguments.Raw()
			var args string
			if json.Unmarshal([]byte(raw), &args) != nil {
				args = raw
			}
			pending[it.CallID] = dispatch.CallRequest{ID: it.CallID, Name: it.Name, Arguments: []byte(args)}
			order = append(order, it.CallID)
		case "function_call_output":
			delete(pending, it.CallID)
		case "message":
			if it.Role == "assistant" {
				answer = messageText(it.RawJSON())
			}
		}
	}
	if err := iter.Err(); err != nil {
		return nil, classify("list conversation items "+ref.Conversation, err)
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
