package openaiplatform

import (
	"cmp"
	"context"
	"strings"
	"time"

	"github.com/openai/openai-go/v3"

	"github.com/toolrelay/toolrelay/pkg/dispatch"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// Assistants drives OpenAI and Azure Assistants runs: it reads a run's
// requires_action and answers with one submit_tool_outputs carrying every
// output, before the run's expires_at.
type Assistants struct{ client openai.Client }

// NewAssistants returns the Assistants runs adapter.
func NewAssistants(client openai.Client) *Assistants { return &Assistants{client: client} }

// Name implements dispatch.Platform.
func (*Assistants) Name() protocol.Platform { return protocol.PlatformAssistants }

// Poll implements dispatch.Platform.
func (a *Assistants) Poll(ctx context.Context, ref dispatch.Ref) (*dispatch.Observation, error) {
	r, err := a.client.Beta.Threads.Runs.Get(ctx, ref.ThreadID, ref.RunID)
	if err != nil {
		return nil, classify("get run "+ref.ThreadID+"/"+ref.RunID, err)
	}
	switch r.Status {
	case "requires_action":
		turn := &dispatch.TurnRequest{Ref: ref, Scope: ref.ThreadID + "/" + ref.RunID}
		if r.ExpiresAt > 0 {
			turn.ExpiresAt = time.Unix(r.ExpiresAt, 0)
		}
		var unsupported []dispatch.UnsupportedItem
		if t := string(r.RequiredAction.Type); t != "submit_tool_outputs" {
			unsupported = append(unsupported, dispatch.UnsupportedItem{Type: cmp.Or(t, "(no type)")})
		}
		for _, tc := range r.RequiredAction.SubmitToolOutputs.ToolCalls {
			if tc.Type != "function" {
				unsupported = append(unsupported, dispatch.UnsupportedItem{Type: cmp.Or(string(tc.Type), "(no type)"), ID: tc.ID})
				continue
			}
			turn.Calls = append(turn.Calls, dispatch.CallRequest{ID: tc.ID, Name: tc.Function.Name, Arguments: []byte(tc.Function.Arguments)})
		}
		if len(unsupported) > 0 {
			// One submission answers every call of a run: with one that
			// toolrelay cannot answer, none can be submitted.
			return &dispatch.Observation{State: dispatch.ObjectUnsupported, Unsupported: unsupported}, nil
		}
		return &dispatch.Observation{State: dispatch.ObjectRequiresAction, Turn: turn}, nil
	case "completed":
		return &dispatch.Observation{State: dispatch.ObjectDone, Answer: a.lastAnswer(ctx, ref)}, nil
	case "failed", "cancelled", "expired", "incomplete":
		reason := "run " + string(r.Status)
		if r.LastError.Message != "" {
			reason += ": " + r.LastError.Message
		}
		return &dispatch.Observation{State: dispatch.ObjectFailed, Reason: reason}, nil
	}
	return &dispatch.Observation{State: dispatch.ObjectRunning}, nil
}

func (a *Assistants) lastAnswer(ctx context.Context, ref dispatch.Ref) string {
	page, err := a.client.Beta.Threads.Messages.List(ctx, ref.ThreadID, openai.BetaThreadMessageListParams{
		RunID: openai.String(ref.RunID), Limit: openai.Int(5),
	})
	if err != nil {
		return ""
	}
	for _, m := range page.Data {
		if m.Role == "assistant" {
			var b strings.Builder
			for _, c := range m.Content {
				b.WriteString(c.Text.Value)
			}
			return b.String()
		}
	}
	return ""
}

// Submit sends every output in one submit_tool_outputs. If the run refuses
// them because an earlier submission of this turn got through (the run went
// on, or waits for other calls: "do not accept tool outputs", "Expected tool
// outputs for call_ids ..."), the repeat counts as success; if it expired or
// was cancelled, or still waits for these calls, that is the error.
func (a *Assistants) Submit(ctx context.Context, turn *dispatch.Turn, outputs []dispatch.Output) (*dispatch.Submission, error) {
	params := openai.BetaThreadRunSubmitToolOutputsParams{}
	for _, o := range outputs {
		params.ToolOutputs = append(params.ToolOutputs, openai.BetaThreadRunSubmitToolOutputsParamsToolOutput{
			ToolCallID: openai.String(o.Call.ID),
			Output:     openai.String(modelOutput(o.Result, maxAssistantsOutput)),
		})
	}
	_, err := a.client.Beta.Threads.Runs.SubmitToolOutputs(ctx, turn.Ref.ThreadID, turn.Ref.RunID, params, submitOpts...)
	if status, _ := apiMessage(err); status == 400 {
		r, gerr := a.client.Beta.Threads.Runs.Get(ctx, turn.Ref.ThreadID, turn.Ref.RunID)
		if gerr == nil && a.alreadySubmitted(r, turn) {
			return &dispatch.Submission{}, nil
		}
	}
	return &dispatch.Submission{}, classify("submit tool outputs to run "+turn.Ref.ThreadID+"/"+turn.Ref.RunID, err)
}

// alreadySubmitted reports whether the run moved past this turn's
// required action on its own terms (not expired, cancelled or failed).
func (a *Assistants) alreadySubmitted(r *openai.Run, turn *dispatch.Turn) bool {
	switch r.Status {
	case "queued", "in_progress", "completed", "incomplete":
		return true
	case "requires_action":
		// A later step waits: our calls are no longer among those asked.
		for _, tc := range r.RequiredAction.SubmitToolOutputs.ToolCalls {
			for _, c := range turn.Calls {
				if c.ID == tc.ID {
					return false
				}
			}
		}
		return true
	}
	return false
}
