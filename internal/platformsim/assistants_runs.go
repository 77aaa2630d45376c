package platformsim

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"
)

// Assistants runs: start, step, expire, submit tool outputs, cancel.

type createRunRequest struct {
	AssistantID        string           `json:"assistant_id"`
	Model              string           `json:"model"`
	Instructions       string           `json:"instructions"`
	Tools              []map[string]any `json:"tools"`
	Metadata           map[string]any   `json:"metadata"`
	AdditionalMessages []messageParam   `json:"additional_messages"`
	Thread             *struct {
		Messages []messageParam `json:"messages"`
		Metadata map[string]any `json:"metadata"`
	} `json:"thread"`
	Stream bool `json:"stream"`
}

func (s *Server) createThreadAndRun(w http.ResponseWriter, r *http.Request) {
	if !s.requireBeta(w, r, "assistants=v2") {
		return
	}
	s.startRun(w, r, nil)
}

func (s *Server) createRun(w http.ResponseWriter, r *http.Request) {
	if t := s.lookupThread(w, r); t != nil {
		s.startRun(w, r, t)
	}
}

// startRun creates a run on t, or on a new thread when t is nil.
func (s *Server) startRun(w http.ResponseWriter, r *http.Request, t *thread) {
	var req createRunRequest
	if _, ok := s.decode(w, r, &req); !ok {
		return
	}
	if req.AssistantID == "" {
		s.badRequest(w, "Missing required parameter: 'assistant_id'.", "assistant_id")
		return
	}
	if req.Stream {
		s.badRequest(w, "Streaming runs are not supported by the toolrelay platform simulator; poll the run instead.", "stream")
		return
	}
	var initial []messageParam
	param := "additional_messages"
	if t == nil && req.Thread != nil {
		initial, param = req.Thread.Messages, "thread.messages"
	} else {
		initial = req.AdditionalMessages
	}
	texts, aerr := messageTexts(initial, param)
	if aerr != nil {
		s.writeAPIError(w, aerr)
		return
	}
	ttl := s.opts.RunTTL
	if v, ok := req.Metadata[SimTTLMetadataKey].(string); ok {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			s.badRequest(w, fmt.Sprintf("Invalid metadata %s: %q is not a positive duration.", SimTTLMetadataKey, v), "metadata")
			return
		}
		ttl = d
	}
	if req.Metadata == nil {
		req.Metadata = map[string]any{}
	}
	if req.Tools == nil {
		req.Tools = []map[string]any{}
	}
	if req.Model == "" {
		req.Model = "gpt-4o"
	}

	s.mu.Lock()
	if _, ok := s.assistants[req.AssistantID]; !ok {
		s.mu.Unlock()
		s.notFound(w, "assistant", req.AssistantID)
		return
	}
	if t == nil {
		var md map[string]any
		if req.Thread != nil {
			md = req.Thread.Metadata
		}
		t = s.newThread(md)
	}
	for i, m := range initial {
		s.addMessage(t, m.Role, texts[i], "", "")
	}
	prompt := ""
	for _, m := range slices.Backward(t.messages) {
		if m["role"] == "user" {
			prompt = m["content"].([]map[string]any)[0]["text"].(map[string]any)["value"].(string)
			break
		}
	}
	now := time.Now()
	ru := &run{
		id: newID("run_"), threadID: t.id, assistantID: req.AssistantID, created: now, expires: now.Add(ttl),
		status: "queued", model: req.Model, instructions: req.Instructions, tools: req.Tools,
		metadata: req.Metadata, script: s.model.start(prompt),
	}
	s.runs[ru.id] = ru
	body := s.runJSON(ru)
	s.mu.Unlock()
	s.later(func() { s.runStep(ru) })
	writeJSON(w, http.StatusOK, body)
}

// expire moves a run past its expiry to "expired". Caller holds s.mu.
func (s *Server) expire(ru *run) {
	switch ru.status {
	case "queued", "in_progress", "requires_action", "cancelling":
		if !time.Now().Before(ru.expires) {
			ru.status = "expired"
			ru.toolCalls = nil
			at := ru.expires.Unix()
			ru.expiredAt = &at
		}
	}
}

// runStep lets the model take its next step in ru.
func (s *Server) runStep(ru *run) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expire(ru)
	if ru.status != "queued" && ru.status != "in_progress" {
		return
	}
	now := unixNow()
	if ru.startedAt == nil {
		ru.startedAt = &now
	}
	ru.status = "in_progress"
	calls, answer, err := ru.script.next(func() string { return newID("call_") })
	s.calledAll("assistants", calls)
	if err != nil {
		s.log.Error("scenario failed", "err", err)
		ru.status = "failed"
		ru.failedAt = &now
		return
	}
	if len(calls) == 0 {
		s.addMessage(s.threads[ru.threadID], "assistant", answer, ru.assistantID, ru.id)
		ru.status = "completed"
		ru.completedAt = &now
		return
	}
	ru.toolCalls = nil
	for _, c := range calls {
		ru.toolCalls = append(ru.toolCalls, map[string]any{
			"id": c.ID, "type": "function", "function": map[string]any{"name": c.Name, "arguments": c.Arguments},
		})
	}
	ru.status = "requires_action"
}

func (s *Server) lookupRun(w http.ResponseWriter, r *http.Request) *run {
	t := s.lookupThread(w, r)
	if t == nil {
		return nil
	}
	s.mu.Lock()
	ru := s.runs[r.PathValue("rid")]
	s.mu.Unlock()
	if ru == nil || ru.threadID != t.id {
		s.notFound(w, "run", r.PathValue("rid"))
		return nil
	}
	return ru
}

func (s *Server) getRun(w http.ResponseWriter, r *http.Request) {
	if ru := s.lookupRun(w, r); ru != nil {
		s.mu.Lock()
		s.expire(ru)
		body := s.runJSON(ru)
		s.mu.Unlock()
		writeJSON(w, http.StatusOK, body)
	}
}

func (s *Server) listRuns(w http.ResponseWriter, r *http.Request) {
	t := s.lookupThread(w, r)
	if t == nil {
		return
	}
	s.mu.Lock()
	var runs []map[string]any
	for _, ru := range s.runs {
		if ru.threadID == t.id {
			s.expire(ru)
			runs = append(runs, s.runJSON(ru))
		}
	}
	s.mu.Unlock()
	slices.SortFunc(runs, func(a, b map[string]any) int { return int(a["created_at"].(int64) - b["created_at"].(int64)) })
	body, err := paginate(r.URL.Query(), runs)
	s.writePage(w, body, err)
}

func (s *Server) submitToolOutputs(w http.ResponseWriter, r *http.Request) {
	ru := s.lookupRun(w, r)
	if ru == nil {
		return
	}
	var req struct {
		ToolOutputs []struct {
			ToolCallID string  `json:"tool_call_id"`
			Output     *string `json:"output"`
		} `json:"tool_outputs"`
		Stream bool `json:"stream"`
	}
	if _, ok := s.decode(w, r, &req); !ok {
		return
	}
	if req.Stream {
		s.badRequest(w, "Streaming is not supported by the toolrelay platform simulator.", "stream")
		return
	}
	s.mu.Lock()
	s.expire(ru)
	var aerr *apiError
	var body map[string]any
	if ru.status != "requires_action" {
		aerr = invalid(fmt.Sprintf("Runs in status %q do not accept tool outputs.", ru.status), "")
	} else {
		want := ru.script.waiting()
		var got []string
		for _, o := range req.ToolOutputs {
			got = append(got, o.ToolCallID)
		}
		if !sameSet(want, got) {
			aerr = invalid(fmt.Sprintf("Expected tool outputs for call_ids %s, got %s", pyList(want), pyList(got)), "")
		}
	}
	if aerr == nil {
		for _, o := range req.ToolOutputs {
			out := ""
			if o.Output != nil {
				out = *o.Output
			}
			ru.script.answer(o.ToolCallID, out)
			s.answered(o.ToolCallID, out)
		}
		s.stats.SubmitToolOutputs++
		ru.status = "queued"
		ru.toolCalls = nil
		body = s.runJSON(ru)
	}
	s.mu.Unlock()
	if aerr != nil {
		s.writeAPIError(w, aerr)
		return
	}
	s.later(func() { s.runStep(ru) })
	writeJSON(w, http.StatusOK, body)
}

func (s *Server) cancelRun(w http.ResponseWriter, r *http.Request) {
	ru := s.lookupRun(w, r)
	if ru == nil {
		return
	}
	s.mu.Lock()
	s.expire(ru)
	var aerr *apiError
	switch ru.status {
	case "queued", "in_progress", "requires_action":
		now := unixNow()
		ru.status = "cancelled"
		ru.cancelledAt = &now
		ru.toolCalls = nil
	default:
		aerr = invalid(fmt.Sprintf("Cannot cancel run with status '%s'.", ru.status), "")
	}
	body := s.runJSON(ru)
	s.mu.Unlock()
	if aerr != nil {
		s.writeAPIError(w, aerr)
		return
	}
	writeJSON(w, http.StatusOK, body)
}

// CancelRun cancels a run as if the user had, for tests of cancellation.
func (s *Server) CancelRun(runID string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ru := s.runs[runID]; ru != nil && ru.status != "completed" {
		now := unixNow()
		ru.status, ru.cancelledAt, ru.toolCalls = "cancelled", &now, nil
	}
}

func (s *Server) runJSON(ru *run) map[string]any {
	var required any
	if ru.status == "requires_action" {
		required = map[string]any{"type": "submit_tool_outputs", "submit_tool_outputs": map[string]any{"tool_calls": ru.toolCalls}}
	}
	var u any
	if ru.status == "completed" {
		u = map[string]any{"prompt_tokens": 120, "completion_tokens": 40, "total_tokens": 160}
	}
	var expiresAt any = ru.expires.Unix()
	switch ru.status {
	case "completed", "failed", "cancelled", "expired", "incomplete":
		expiresAt = nil
	}
	return map[string]any{
		"id": ru.id, "object": "thread.run", "created_at": ru.created.Unix(), "assistant_id": ru.assistantID,
		"thread_id": ru.threadID, "status": ru.status, "started_at": ru.startedAt, "expires_at": expiresAt,
		"cancelled_at": ru.cancelledAt, "failed_at": ru.failedAt, "completed_at": ru.completedAt,
		"required_action": required, "last_error": nil, "model": ru.model, "instructions": ru.instructions,
		"tools": ru.tools, "metadata": ru.metadata, "incomplete_details": nil, "usage": u,
		"temperature": 1.0, "top_p": 1.0, "max_prompt_tokens": nil, "max_completion_tokens": nil,
		"truncation_strategy": map[string]any{"type": "auto", "last_messages": nil}, "response_format": "auto",
		"tool_choice": "auto", "parallel_tool_calls": true,
	}
}

func sameSet(want, got []string) bool {
	if len(want) != len(got) {
		return false
	}
	w := slices.Clone(want)
	g := slices.Clone(got)
	slices.Sort(w)
	slices.Sort(g)
	return slices.Equal(w, g)
}

// pyList formats IDs as the live API's messages do: ['a', 'b'].
func pyList(ids []string) string {
	q := make([]string, len(ids))
	for i, id := range ids {
		q[i] = "'" + id + "'"
	}
	return "[" + strings.Join(q, ", ") + "]"
}
