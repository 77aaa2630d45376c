package platformsim

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
)

// Agents sessions (beta): sessions and their turns. The events clients
// post are in agents_events.go, the event stream in agents_stream.go.

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
	agent := sessionAgent(&req)
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

// sessionAgent is the agent object of a new session, with the defaults the
// platform fills in where the request leaves them out.
func sessionAgent(req *createSessionRequest) map[string]any {
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
	return agent
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
		if c.Kind != KindFunction {
			// An action toolrelay does not serve: it stays required.
			action := map[string]any{"type": c.Kind}
			switch c.Kind {
			case "environment_connection":
				action["environment_id"] = cmpOr(c.Name, "env_sim")
			case "computer_use_approval_request":
				action["turn_id"], action["request_id"] = t.id, c.ID
				action["request"] = map[string]any{"type": "browser_origin_access", "origin": cmpOr(c.Name, "https://example.com")}
			default:
				action["turn_id"], action["call_id"] = t.id, c.ID
			}
			required = append(required, action)
			continue
		}
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
	s.notify("agent.session.action_required", map[string]any{"id": sess.id, "required_action": map[string]any{"type": required[0]["type"]}})
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
