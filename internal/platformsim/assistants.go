package platformsim

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"
)

// Assistants (beta v2): assistants, threads, messages, runs and
// submit_tool_outputs, with runs that expire RunTTL after creation.

type thread struct {
	id        string
	createdAt int64
	metadata  map[string]any
	messages  []map[string]any
}

type run struct {
	id, threadID, assistantID string
	created                   time.Time
	expires                   time.Time
	status                    string
	startedAt, completedAt    *int64
	cancelledAt, failedAt     *int64
	expiredAt                 *int64
	model, instructions       string
	tools                     []map[string]any
	metadata                  map[string]any
	toolCalls                 []map[string]any
	script                    *script
}

// SimTTLMetadataKey, set in a run's metadata to a Go duration ("20s"),
// overrides Options.RunTTL for that run.
const SimTTLMetadataKey = "toolrelay_sim_ttl"

func (s *Server) routeAssistants() {
	s.mux.HandleFunc("POST /assistants", s.createAssistant)
	s.mux.HandleFunc("GET /assistants/{id}", s.getAssistant)
	s.mux.HandleFunc("POST /threads", s.createThread)
	s.mux.HandleFunc("GET /threads/{tid}", s.getThread)
	s.mux.HandleFunc("POST /threads/{tid}/messages", s.createMessage)
	s.mux.HandleFunc("GET /threads/{tid}/messages", s.listMessages)
	s.mux.HandleFunc("POST /threads/runs", s.createThreadAndRun)
	s.mux.HandleFunc("POST /threads/{tid}/runs", s.createRun)
	s.mux.HandleFunc("GET /threads/{tid}/runs", s.listRuns)
	s.mux.HandleFunc("GET /threads/{tid}/runs/{rid}", s.getRun)
	s.mux.HandleFunc("POST /threads/{tid}/runs/{rid}/submit_tool_outputs", s.submitToolOutputs)
	s.mux.HandleFunc("POST /threads/{tid}/runs/{rid}/cancel", s.cancelRun)
}

func (s *Server) createAssistant(w http.ResponseWriter, r *http.Request) {
	if !s.requireBeta(w, r, "assistants=v2") {
		return
	}
	var req struct {
		Model        string           `json:"model"`
		Name         *string          `json:"name"`
		Instructions *string          `json:"instructions"`
		Tools        []map[string]any `json:"tools"`
		Metadata     map[string]any   `json:"metadata"`
	}
	if _, ok := s.decode(w, r, &req); !ok {
		return
	}
	if req.Model == "" {
		s.badRequest(w, "Missing required parameter: 'model'.", "model")
		return
	}
	if req.Tools == nil {
		req.Tools = []map[string]any{}
	}
	if req.Metadata == nil {
		req.Metadata = map[string]any{}
	}
	a := map[string]any{"id": newID("asst_"), "object": "assistant", "created_at": unixNow(), "name": req.Name,
		"description": nil, "model": req.Model, "instructions": req.Instructions, "tools": req.Tools,
		"metadata": req.Metadata, "top_p": 1.0, "temperature": 1.0, "response_format": "auto", "tool_resources": map[string]any{}}
	b, _ := json.Marshal(a)
	s.mu.Lock()
	s.assistants[a["id"].(string)] = b
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, json.RawMessage(b))
}

func (s *Server) getAssistant(w http.ResponseWriter, r *http.Request) {
	if !s.requireBeta(w, r, "assistants=v2") {
		return
	}
	s.mu.Lock()
	a, ok := s.assistants[r.PathValue("id")]
	s.mu.Unlock()
	if !ok {
		s.notFound(w, "assistant", r.PathValue("id"))
		return
	}
	writeJSON(w, http.StatusOK, a)
}

type messageParam struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// text returns the text of a message's content (string or text parts).
func (m messageParam) text() (string, error) {
	var s string
	if json.Unmarshal(m.Content, &s) == nil {
		return s, nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(m.Content, &parts); err != nil {
		return "", fmt.Errorf("Invalid 'content': expected a string or an array of content parts.")
	}
	var b strings.Builder
	for _, p := range parts {
		b.WriteString(p.Text)
	}
	return b.String(), nil
}

// newThread creates a thread. Caller holds s.mu.
func (s *Server) newThread(metadata map[string]any) *thread {
	if metadata == nil {
		metadata = map[string]any{}
	}
	t := &thread{id: newID("thread_"), createdAt: unixNow(), metadata: metadata}
	s.threads[t.id] = t
	return t
}

// addMessage appends a message. Caller holds s.mu.
func (s *Server) addMessage(t *thread, role, text, assistantID, runID string) map[string]any {
	now := unixNow()
	m := map[string]any{
		"id": newID("msg_"), "object": "thread.message", "created_at": now, "thread_id": t.id, "role": role,
		"content":      []map[string]any{{"type": "text", "text": map[string]any{"value": text, "annotations": []any{}}}},
		"assistant_id": nullable(assistantID), "run_id": nullable(runID), "attachments": []any{}, "metadata": map[string]any{},
		"status": "completed", "completed_at": now, "incomplete_at": nil, "incomplete_details": nil,
	}
	t.messages = append(t.messages, m)
	return m
}

func threadJSON(t *thread) map[string]any {
	return map[string]any{"id": t.id, "object": "thread", "created_at": t.createdAt, "metadata": t.metadata, "tool_resources": nil}
}

func (s *Server) createThread(w http.ResponseWriter, r *http.Request) {
	if !s.requireBeta(w, r, "assistants=v2") {
		return
	}
	var req struct {
		Messages []messageParam `json:"messages"`
		Metadata map[string]any `json:"metadata"`
	}
	if _, ok := s.decode(w, r, &req); !ok {
		return
	}
	texts, aerr := messageTexts(req.Messages, "messages")
	if aerr != nil {
		s.writeAPIError(w, aerr)
		return
	}
	s.mu.Lock()
	t := s.newThread(req.Metadata)
	for i, m := range req.Messages {
		s.addMessage(t, m.Role, texts[i], "", "")
	}
	body := threadJSON(t)
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, body)
}

func messageTexts(msgs []messageParam, param string) ([]string, *apiError) {
	texts := make([]string, len(msgs))
	for i, m := range msgs {
		if m.Role != "user" && m.Role != "assistant" {
			return nil, invalid(fmt.Sprintf("Invalid value for '%s[%d].role': must be 'user' or 'assistant'.", param, i), fmt.Sprintf("%s[%d].role", param, i))
		}
		t, err := m.text()
		if err != nil {
			return nil, invalid(err.Error(), fmt.Sprintf("%s[%d].content", param, i))
		}
		texts[i] = t
	}
	return texts, nil
}

func (s *Server) lookupThread(w http.ResponseWriter, r *http.Request) *thread {
	if !s.requireBeta(w, r, "assistants=v2") {
		return nil
	}
	s.mu.Lock()
	t := s.threads[r.PathValue("tid")]
	s.mu.Unlock()
	if t == nil {
		s.notFound(w, "thread", r.PathValue("tid"))
	}
	return t
}

func (s *Server) getThread(w http.ResponseWriter, r *http.Request) {
	if t := s.lookupThread(w, r); t != nil {
		s.mu.Lock()
		body := threadJSON(t)
		s.mu.Unlock()
		writeJSON(w, http.StatusOK, body)
	}
}

func (s *Server) createMessage(w http.ResponseWriter, r *http.Request) {
	t := s.lookupThread(w, r)
	if t == nil {
		return
	}
	var req messageParam
	if _, ok := s.decode(w, r, &req); !ok {
		return
	}
	texts, aerr := messageTexts([]messageParam{req}, "message")
	if aerr != nil {
		s.writeAPIError(w, aerr)
		return
	}
	s.mu.Lock()
	m := s.addMessage(t, req.Role, texts[0], "", "")
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, m)
}

func (s *Server) listMessages(w http.ResponseWriter, r *http.Request) {
	t := s.lookupThread(w, r)
	if t == nil {
		return
	}
	s.mu.Lock()
	body, err := paginate(r.URL.Query(), t.messages)
	s.mu.Unlock()
	s.writePage(w, body, err)
}

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
