package platformsim

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// Agents sessions (beta): sessions, their event stream, tool results.

type session struct {
	id          string
	agent       map[string]any
	createdAt   int64
	lastActive  int64
	status      string // idle | in_progress | requires_action | failed
	err         *string
	metadata    map[string]any
	environment json.RawMessage
	required    []map[string]any
	items       []map[string]any
	turns       []*agentTurn
	current     *agentTurn
	subs        map[chan []byte]struct{}
	eventSeq    int
}

type agentTurn struct {
	id          string
	status      string // queued | in_progress | waiting | completed | failed | cancelled
	createdAt   int64
	startedAt   *int64
	completedAt *int64
	script      *script
	outputIndex int
}

func (s *Server) routeAgents() {
	s.mux.HandleFunc("POST /agents/sessions", s.createSession)
	s.mux.HandleFunc("GET /agents/sessions/{id}", s.getSession)
	s.mux.HandleFunc("POST /agents/sessions/{id}/events", s.postSessionEvents)
	s.mux.HandleFunc("GET /agents/sessions/{id}/events", s.streamSessionEvents)
	s.mux.HandleFunc("GET /agents/sessions/{id}/items", s.listSessionItems)
	s.mux.HandleFunc("GET /agents/sessions/{id}/turns", s.listSessionTurns)
	s.mux.HandleFunc("GET /agents/sessions/{id}/turns/{turn}", s.getSessionTurn)
}

type createSessionRequest struct {
	Environment json.RawMessage `json:"environment"`
	AgentID     string          `json:"agent_id"`
	Input       json.RawMessage `json:"input"`
	Agent       *struct {
		Instructions string           `json:"instructions"`
		Model        string           `json:"model"`
		Tools        []map[string]any `json:"tools"`
	} `json:"agent"`
	Metadata map[string]any `json:"metadata"`
	Stream   bool           `json:"stream"`
}

func (s *Server) createSession(w http.ResponseWriter, r *http.Request) {
	if !s.requireBeta(w, r, "agents=v1") {
		return
	}
	var req createSessionRequest
	if _, ok := s.decode(w, r, &req); !ok {
		return
	}
	var env struct {
		Type string `json:"type"`
	}
	if len(req.Environment) == 0 || json.Unmarshal(req.Environment, &env) != nil || env.Type == "" {
		s.badRequest(w, "Missing required parameter: 'environment'.", "environment")
		return
	}
	prompt, hasInput, err := agentInputText(req.Input)
	if err != nil {
		s.badRequest(w, err.Error(), "input")
		return
	}
	if !hasInput && env.Type == "none" {
		s.badRequest(w, "'input' is required when the environment type is 'none'.", "input")
		return
	}
	if req.Agent != nil {
		if aerr := checkTools(req.Agent.Tools, "agent.tools", true); aerr != nil {
			s.writeAPIError(w, aerr)
			return
		}
	}
	now := unixNow()
	agent := map[string]any{
		"id": newID("agent_"), "name": nil, "instructions": "", "model": "gpt-5.5", "service_tier": "auto",
		"multi_agent": map[string]any{"enabled": false, "max_concurrent_subagents": nil},
		"reasoning":   map[string]any{"effort": nil, "summary": nil},
		"text":        map[string]any{"format": map[string]any{"type": "text"}, "verbosity": "medium"},
		"tools":       []map[string]any{},
		"compaction":  map[string]any{"async": false}, "experimental": map[string]any{"time_awareness": false},
	}
	if req.AgentID != "" {
		agent["id"] = req.AgentID
	}
	if a := req.Agent; a != nil {
		agent["instructions"] = a.Instructions
		if a.Model != "" {
			agent["model"] = a.Model
		}
		var tools []map[string]any
		for _, t := range a.Tools {
			if t["type"] == "function" {
				if _, ok := t["defer_loading"]; !ok {
					t["defer_loading"] = false
				}
			}
			tools = append(tools, t)
		}
		if tools != nil {
			agent["tools"] = tools
		}
	}
	if req.Metadata == nil {
		req.Metadata = map[string]any{}
	}
	sess := &session{
		id: newID("as_"), agent: agent, createdAt: now, lastActive: now, status: "idle",
		metadata: req.Metadata, environment: req.Environment, subs: map[chan []byte]struct{}{},
	}

	s.mu.Lock()
	s.sessions[sess.id] = sess
	var sub chan []byte
	if req.Stream {
		sub = s.subscribe(sess)
		s.emit(sess, map[string]any{"type": "agent.session.created", "session": s.sessionJSON(sess)})
	}
	if hasInput {
		s.startAgentTurn(sess, prompt)
	}
	body := s.sessionJSON(sess)
	s.mu.Unlock()

	if req.Stream {
		s.serveFrames(w, r, sess, sub, true)
		return
	}
	writeJSON(w, http.StatusOK, body)
}

// agentInputText extracts the user's text from a string or message array.
func agentInputText(raw json.RawMessage) (text string, ok bool, err error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", false, nil
	}
	if err := json.Unmarshal(raw, &text); err == nil {
		return text, true, nil
	}
	var msgs []struct {
		Role    string `json:"role"`
		Content []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		} `json:"content"`
	}
	if err := json.Unmarshal(raw, &msgs); err != nil {
		return "", false, fmt.Errorf("Invalid 'input': expected a string or an array of messages.")
	}
	var parts []string
	for _, m := range msgs {
		for _, c := range m.Content {
			if c.Type == "input_text" {
				parts = append(parts, c.Text)
			}
		}
	}
	return strings.Join(parts, "\n"), true, nil
}

func (s *Server) requireBeta(w http.ResponseWriter, r *http.Request, want string) bool {
	if !strings.Contains(r.Header.Get("OpenAI-Beta"), want) {
		s.badRequest(w, fmt.Sprintf("You must provide the 'OpenAI-Beta: %s' header to access this API.", want), "")
		return false
	}
	return true
}

func (s *Server) lookupSession(w http.ResponseWriter, r *http.Request) *session {
	if !s.requireBeta(w, r, "agents=v1") {
		return nil
	}
	id := r.PathValue("id")
	s.mu.Lock()
	sess := s.sessions[id]
	s.mu.Unlock()
	if sess == nil {
		s.notFound(w, "session", id)
	}
	return sess
}

func (s *Server) getSession(w http.ResponseWriter, r *http.Request) {
	sess := s.lookupSession(w, r)
	if sess == nil {
		return
	}
	s.mu.Lock()
	body := s.sessionJSON(sess)
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, body)
}

// startAgentTurn begins a turn for a user message. Caller holds s.mu.
func (s *Server) startAgentTurn(sess *session, prompt string) {
	t := &agentTurn{id: newID("turn_"), status: "queued", createdAt: unixNow(), script: s.model.start(prompt)}
	sess.turns = append(sess.turns, t)
	sess.current = t
	sess.status = "in_progress"
	sess.required = nil
	sess.lastActive = unixNow()
	sess.items = append(sess.items, map[string]any{
		"id": newID("item_msg_"), "type": "message", "role": "user", "phase": nil, "status": "completed",
		"turn_id": t.id, "content": []map[string]any{{"type": "input_text", "text": prompt}},
	})
	s.emit(sess, map[string]any{"type": "agent.session.in_progress", "session": s.sessionJSON(sess)})
	s.emit(sess, map[string]any{"type": "agent.session.turn.created", "session_id": sess.id, "turn_id": t.id, "turn": s.turnJSON(sess, t)})
	s.later(func() { s.agentStep(sess, t) })
}

// agentStep lets the model take its next step in turn t.
func (s *Server) agentStep(sess *session, t *agentTurn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sess.current != t || t.status == "cancelled" {
		return
	}
	if t.startedAt == nil {
		now := unixNow()
		t.startedAt = &now
		t.status = "in_progress"
		s.emit(sess, map[string]any{"type": "agent.session.turn.in_progress", "session_id": sess.id, "turn_id": t.id, "turn": s.turnJSON(sess, t)})
	}
	t.status = "in_progress"
	calls, answer, err := t.script.next(func() string { return newID("call_") })
	s.calledAll("agents", calls)
	if err != nil {
		s.log.Error("scenario failed", "err", err)
		s.finishAgentTurn(sess, t, "failed", "")
		return
	}
	if len(calls) == 0 {
		s.finishAgentTurn(sess, t, "completed", answer)
		return
	}
	var required []map[string]any
	for _, c := range calls {
		item := map[string]any{
			"id": newID("item_fc_"), "type": "function_call", "turn_id": t.id, "call_id": c.ID,
			"name": c.Name, "arguments": json.RawMessage(c.Arguments), "status": "in_progress",
		}
		idx := t.outputIndex
		t.outputIndex++
		s.emit(sess, map[string]any{"type": "agent.session.turn.item.added", "session_id": sess.id, "turn_id": t.id, "output_index": idx, "item": item})
		done := cloneMap(item)
		done["status"] = "completed"
		s.emit(sess, map[string]any{"type": "agent.session.turn.item.done", "session_id": sess.id, "turn_id": t.id, "output_index": idx, "item": done})
		sess.items = append(sess.items, done)
		required = append(required, map[string]any{
			"type": "function_call", "turn_id": t.id, "call_id": c.ID, "name": c.Name, "arguments": json.RawMessage(c.Arguments),
		})
	}
	t.status = "waiting"
	sess.required = required
	sess.status = "requires_action"
	sess.lastActive = unixNow()
	s.emit(sess, map[string]any{"type": "agent.session.requires_action", "session": s.sessionJSON(sess)})
	s.notify("agent.session.action_required", map[string]any{"id": sess.id, "required_action": map[string]any{"type": "function_call"}})
}

// finishAgentTurn ends a turn with an answer (or none). Caller holds s.mu.
func (s *Server) finishAgentTurn(sess *session, t *agentTurn, status, answer string) {
	if status == "completed" {
		idx := t.outputIndex
		t.outputIndex++
		msgID := newID("item_msg_")
		item := map[string]any{"id": msgID, "type": "message", "role": "assistant", "phase": "final_answer",
			"status": "in_progress", "turn_id": t.id, "content": []any{}}
		s.emit(sess, map[string]any{"type": "agent.session.turn.item.added", "session_id": sess.id, "turn_id": t.id, "output_index": idx, "item": item})
		part := map[string]any{"type": "output_text", "text": ""}
		base := func(typ string) map[string]any {
			return map[string]any{"type": typ, "session_id": sess.id, "turn_id": t.id, "item_id": msgID, "output_index": idx, "content_index": 0}
		}
		f := base("agent.session.turn.content_part.added")
		f["part"] = part
		s.emit(sess, f)
		f = base("agent.session.turn.output_text.delta")
		f["delta"] = answer
		s.emit(sess, f)
		f = base("agent.session.turn.output_text.done")
		f["text"] = answer
		s.emit(sess, f)
		f = base("agent.session.turn.content_part.done")
		f["part"] = map[string]any{"type": "output_text", "text": answer}
		s.emit(sess, f)
		done := cloneMap(item)
		done["status"] = "completed"
		done["content"] = []map[string]any{{"type": "output_text", "text": answer}}
		s.emit(sess, map[string]any{"type": "agent.session.turn.item.done", "session_id": sess.id, "turn_id": t.id, "output_index": idx, "item": done})
		sess.items = append(sess.items, done)
	}
	now := unixNow()
	t.status = status
	t.completedAt = &now
	sess.current = nil
	sess.required = nil
	sess.status = "idle"
	sess.lastActive = now
	s.emit(sess, map[string]any{"type": "agent.session.turn." + status, "session_id": sess.id, "turn_id": t.id,
		"turn": s.turnJSON(sess, t), "usage": usage()})
	s.emit(sess, map[string]any{"type": "agent.session.idle", "session": s.sessionJSON(sess)})
}

type sessionEvent struct {
	Type    string          `json:"type"`
	TurnID  string          `json:"turn_id"`
	CallID  string          `json:"call_id"`
	Success *bool           `json:"success"`
	Output  json.RawMessage `json:"output"`
	Error   *string         `json:"error"`
	Input   json.RawMessage `json:"input"`
}

func (s *Server) postSessionEvents(w http.ResponseWriter, r *http.Request) {
	sess := s.lookupSession(w, r)
	if sess == nil {
		return
	}
	var req struct {
		Events []sessionEvent `json:"events"`
	}
	body, ok := s.decode(w, r, &req)
	if !ok {
		return
	}
	scope := "agents-events/" + sess.id
	replay, conflict := s.replayed(w, r, scope, body)
	if conflict {
		return
	}
	if replay {
		w.WriteHeader(http.StatusAccepted)
		return
	}
	if len(req.Events) == 0 {
		s.forget(r, scope)
		s.badRequest(w, "Missing required parameter: 'events'.", "events")
		return
	}

	s.mu.Lock()
	aerr := s.validateSessionEvents(sess, req.Events)
	if aerr == nil {
		for _, ev := range req.Events {
			switch ev.Type {
			case "agent.session.input.tool_result":
				s.acceptToolResult(sess, ev)
			case "agent.session.input.message":
				text, _, _ := agentInputText(ev.Input)
				s.startAgentTurn(sess, text)
			case "agent.session.input.cancel":
				if t := sess.current; t != nil {
					s.finishAgentTurn(sess, t, "cancelled", "")
				}
			}
		}
	}
	s.mu.Unlock()
	if aerr != nil {
		s.forget(r, scope)
		s.writeAPIError(w, aerr)
		return
	}
	w.WriteHeader(http.StatusAccepted)
}

// validateSessionEvents checks every event before any is applied, so a
// request is accepted or refused whole. Caller holds s.mu.
func (s *Server) validateSessionEvents(sess *session, events []sessionEvent) *apiError {
	seen := map[string]bool{}
	for i, ev := range events {
		param := fmt.Sprintf("events[%d]", i)
		switch ev.Type {
		case "agent.session.input.tool_result":
			if ev.Success == nil {
				return invalid(fmt.Sprintf("Missing required parameter: '%s.success'.", param), param)
			}
			if !s.pendingCall(sess, ev.TurnID, ev.CallID) || seen[ev.CallID] {
				// The exact text and code the SDK's race retry matches.
				return &apiError{status: http.StatusBadRequest, typ: "invalid_request_error", code: "invalid_request_error",
					message: "Unknown pending tool call: " + ev.CallID}
			}
			seen[ev.CallID] = true
		case "agent.session.input.message":
			if sess.status != "idle" {
				return invalid(fmt.Sprintf("Session %s already has an active turn.", sess.id), param)
			}
		case "agent.session.input.cancel":
		default:
			return invalid(fmt.Sprintf("Invalid value for '%s.type': %q is not supported.", param, ev.Type), param)
		}
	}
	return nil
}

func (s *Server) pendingCall(sess *session, turnID, callID string) bool {
	t := sess.current
	if t == nil || t.id != turnID || sess.status != "requires_action" {
		return false
	}
	for _, id := range t.script.waiting() {
		if id == callID {
			return true
		}
	}
	return false
}

// acceptToolResult records one validated result. Caller holds s.mu.
func (s *Server) acceptToolResult(sess *session, ev sessionEvent) {
	t := sess.current
	output := outputText(ev.Output)
	var errField any
	status := "completed"
	if !*ev.Success {
		status = "failed"
		if ev.Error != nil {
			output = "error: " + *ev.Error
			errField = *ev.Error
		}
	}
	t.script.answer(ev.CallID, output)
	s.answered(ev.CallID, output)
	s.stats.ToolResults++
	item := map[string]any{"id": newID("item_fco_"), "type": "function_call_output", "turn_id": t.id, "call_id": ev.CallID,
		"status": status, "output": rawOrNull(ev.Output), "error": errField}
	sess.items = append(sess.items, item)
	idx := t.outputIndex
	t.outputIndex++
	s.emit(sess, map[string]any{"type": "agent.session.turn.item.added", "session_id": sess.id, "turn_id": t.id, "output_index": idx, "item": item})
	// Answered calls leave required_actions; the session stays
	// requires_action until every call of the step is answered. A new
	// slice, not a filter in place: session bodies already handed out
	// (encoded after the lock is released) share the old one.
	kept := make([]map[string]any, 0, len(sess.required))
	for _, a := range sess.required {
		if a["call_id"] != ev.CallID {
			kept = append(kept, a)
		}
	}
	sess.required = kept
	if len(t.script.waiting()) == 0 {
		sess.status = "in_progress"
		t.status = "in_progress"
		s.emit(sess, map[string]any{"type": "agent.session.in_progress", "session": s.sessionJSON(sess)})
		s.later(func() { s.agentStep(sess, t) })
	}
}

// outputText flattens a tool output (string, content parts or null).
func outputText(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if json.Unmarshal(raw, &parts) == nil {
		var b strings.Builder
		for _, p := range parts {
			b.WriteString(p.Text)
		}
		return b.String()
	}
	return ""
}

func rawOrNull(raw json.RawMessage) any {
	if len(raw) == 0 {
		return nil
	}
	return raw
}

func (s *Server) listSessionItems(w http.ResponseWriter, r *http.Request) {
	sess := s.lookupSession(w, r)
	if sess == nil {
		return
	}
	s.mu.Lock()
	body, err := paginate(r.URL.Query(), sess.items)
	s.mu.Unlock()
	s.writePage(w, body, err)
}

func (s *Server) listSessionTurns(w http.ResponseWriter, r *http.Request) {
	sess := s.lookupSession(w, r)
	if sess == nil {
		return
	}
	s.mu.Lock()
	turns := make([]map[string]any, 0, len(sess.turns))
	for _, t := range sess.turns {
		turns = append(turns, s.turnJSON(sess, t))
	}
	s.mu.Unlock()
	body, err := paginate(r.URL.Query(), turns)
	s.writePage(w, body, err)
}

func (s *Server) getSessionTurn(w http.ResponseWriter, r *http.Request) {
	sess := s.lookupSession(w, r)
	if sess == nil {
		return
	}
	id := r.PathValue("turn")
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, t := range sess.turns {
		if t.id == id {
			writeJSON(w, http.StatusOK, s.turnJSON(sess, t))
			return
		}
	}
	s.notFound(w, "turn", id)
}

func (s *Server) sessionJSON(sess *session) map[string]any {
	required := sess.required
	if required == nil {
		required = []map[string]any{}
	}
	return map[string]any{
		"id": sess.id, "object": "agent.session", "agent": sess.agent, "created_at": sess.createdAt,
		"environment": sess.environment, "error": sess.err, "last_active_at": sess.lastActive,
		"metadata": sess.metadata, "required_actions": required, "status": sess.status,
		"usage": nil, "vault_ids": []string{}, "prompt_cache_options": nil,
	}
}

func (s *Server) turnJSON(sess *session, t *agentTurn) map[string]any {
	var u any
	if t.status == "completed" {
		u = usage()
	}
	return map[string]any{
		"id": t.id, "object": "agent.session.turn", "agent_id": sess.agent["id"], "session_id": sess.id,
		"subagent_id": nil, "status": t.status, "created_at": t.createdAt, "started_at": t.startedAt,
		"completed_at": t.completedAt, "error": nil, "usage": u, "prompt_cache_options": nil,
	}
}

func usage() map[string]any {
	return map[string]any{"input_tokens": 120, "input_tokens_details": map[string]any{"cached_tokens": 0},
		"output_tokens": 40, "output_tokens_details": map[string]any{"reasoning_tokens": 0}, "total_tokens": 160}
}

func cloneMap(m map[string]any) map[string]any {
	c := make(map[string]any, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}

// Event stream.

// subscribe registers a live subscriber. Caller holds s.mu.
func (s *Server) subscribe(sess *session) chan []byte {
	ch := make(chan []byte, 1024)
	sess.subs[ch] = struct{}{}
	return ch
}

// emit sends a frame to the session's live subscribers; a subscriber too
// slow to keep 1024 frames is dropped (its stream ends). Caller holds s.mu.
func (s *Server) emit(sess *session, frame map[string]any) {
	sess.eventSeq++
	frame["event_id"] = fmt.Sprintf("evt_%s_%06d", sess.id[3:11], sess.eventSeq)
	b, err := json.Marshal(frame)
	if err != nil {
		s.log.Error("encode frame", "err", err)
		return
	}
	for ch := range sess.subs {
		select {
		case ch <- b:
		default:
			delete(sess.subs, ch)
			close(ch)
		}
	}
}

func (s *Server) unsubscribe(sess *session, ch chan []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := sess.subs[ch]; ok {
		delete(sess.subs, ch)
		close(ch)
	}
}

func (s *Server) streamSessionEvents(w http.ResponseWriter, r *http.Request) {
	sess := s.lookupSession(w, r)
	if sess == nil {
		return
	}
	s.mu.Lock()
	sub := s.subscribe(sess)
	s.mu.Unlock()
	s.serveFrames(w, r, sess, sub, false)
}

// serveFrames writes live frames as SSE until the client leaves or the
// server closes. With untilIdle it also ends after the session goes idle
// once a turn ended (the creation stream).
func (s *Server) serveFrames(w http.ResponseWriter, r *http.Request, sess *session, sub chan []byte, untilIdle bool) {
	defer s.unsubscribe(sess, sub)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	flusher, _ := w.(http.Flusher)
	if flusher != nil {
		flusher.Flush()
	}
	keepalive := time.NewTicker(15 * time.Second)
	defer keepalive.Stop()
	turnEnded := false
	for {
		select {
		case b, ok := <-sub:
			if !ok {
				return
			}
			if _, err := fmt.Fprintf(w, "data: %s\n\n", b); err != nil {
				return
			}
			if flusher != nil {
				flusher.Flush()
			}
			if untilIdle {
				var f struct{ Type string }
				_ = json.Unmarshal(b, &f)
				switch {
				case strings.HasPrefix(f.Type, "agent.session.turn.") && (strings.HasSuffix(f.Type, ".completed") || strings.HasSuffix(f.Type, ".failed") || strings.HasSuffix(f.Type, ".cancelled")):
					turnEnded = true
				case f.Type == "agent.session.idle" && turnEnded, f.Type == "agent.session.failed":
					return
				}
			}
		case <-keepalive.C:
			if _, err := fmt.Fprint(w, ": keepalive\n\n"); err != nil {
				return
			}
			if flusher != nil {
				flusher.Flush()
			}
		case <-r.Context().Done():
			return
		case <-s.closed:
			return
		}
	}
}
