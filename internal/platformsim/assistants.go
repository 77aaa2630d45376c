package platformsim

import (
	"encoding/json"
	"fmt"
	"net/http"
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
