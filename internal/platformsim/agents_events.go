package platformsim

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
)

// Agents sessions: the events a client posts (tool results).

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
	// An action toolrelay does not serve (an environment connection, say)
	// stays required after the step's function calls are answered: the
	// session waits on it, as the platform's does.
	if len(t.script.waiting()) == 0 && len(sess.required) == 0 {
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
