package platformsim

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
)

// Responses API and Conversations: a response that wants tools completes
// with function_call items; the client answers with a new response carrying
// function_call_output items and previous_response_id (or the same
// conversation).

type response struct {
	id           string
	createdAt    int64
	completedAt  *int64
	status       string
	background   bool
	model        string
	instructions any
	tools        []map[string]any
	metadata     map[string]any
	previousID   string
	conversation string
	output       []map[string]any
	script       *script
	// servers are the request's MCP tools, and mcpTools what each has
	// listed in this conversation so far (label → tools). approvals are
	// the calls this response asks the client to approve; answers are the
	// request's answers to answering, the previous response's approvals.
	servers   []*mcpServer
	mcpTools  map[string][]mcpTool
	approvals map[string]pendingApproval
	answering map[string]pendingApproval
	answers   []approvalAnswer
}

type conversation struct {
	id        string
	createdAt int64
	metadata  map[string]any
	items     []map[string]any
	last      *response
}

func (s *Server) routeResponses() {
	s.mux.HandleFunc("POST /responses", s.createResponse)
	s.mux.HandleFunc("GET /responses/{id}", s.getResponse)
	s.mux.HandleFunc("POST /responses/{id}/cancel", s.cancelResponse)
	s.mux.HandleFunc("POST /conversations", s.createConversation)
	s.mux.HandleFunc("GET /conversations/{id}", s.getConversation)
	s.mux.HandleFunc("GET /conversations/{id}/items", s.listConversationItems)
}

type responseRequest struct {
	Model              string           `json:"model"`
	Input              json.RawMessage  `json:"input"`
	Instructions       any              `json:"instructions"`
	Tools              []map[string]any `json:"tools"`
	PreviousResponseID string           `json:"previous_response_id"`
	Conversation       json.RawMessage  `json:"conversation"`
	AgentReference     json.RawMessage  `json:"agent_reference"`
	Agent              json.RawMessage  `json:"agent"`
	Background         bool             `json:"background"`
	Metadata           map[string]any   `json:"metadata"`
	Stream             bool             `json:"stream"`
}

type inputItem struct {
	Type    string          `json:"type"`
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
	CallID  string          `json:"call_id"`
	Output  json.RawMessage `json:"output"`
	// ApprovalRequestID and Approve answer an mcp_approval_request.
	ApprovalRequestID string `json:"approval_request_id"`
	Approve           *bool  `json:"approve"`
	Reason            string `json:"reason"`
	// Tools and Execution are a tool_search_output's.
	Tools     json.RawMessage `json:"tools"`
	Execution string          `json:"execution"`
}

// text is what the scripted model reads of an answer: a call's output,
// or the names of the tools a tool search loaded, joined by commas.
func (it inputItem) text() string {
	if it.Type != "tool_search_output" {
		return outputText(it.Output)
	}
	var tools []struct {
		Name string `json:"name"`
	}
	_ = json.Unmarshal(it.Tools, &tools)
	names := make([]string, len(tools))
	for i, t := range tools {
		names[i] = t.Name
	}
	return strings.Join(names, ",")
}

// checkSearchOutput validates a tool_search_output item as the platform
// does: loaded tools are tool definitions, a function one with a name.
func checkSearchOutput(it inputItem, i int) *apiError {
	at := func(field string) string { return fmt.Sprintf("input[%d].%s", i, field) }
	if it.CallID == "" {
		return invalid(fmt.Sprintf("Missing required parameter: '%s'.", at("call_id")), at("call_id"))
	}
	if it.Execution != "" && it.Execution != "client" && it.Execution != "server" {
		return invalid(fmt.Sprintf("Invalid value for '%s': must be 'server' or 'client'.", at("execution")), at("execution"))
	}
	var tools []map[string]any
	if json.Unmarshal(it.Tools, &tools) != nil || tools == nil {
		return invalid(fmt.Sprintf("Missing required parameter: '%s' (an array of tool definitions).", at("tools")), at("tools"))
	}
	for j, t := range tools {
		tf := fmt.Sprintf("tools[%d]", j)
		typ, _ := t["type"].(string)
		if typ == "" {
			return invalid(fmt.Sprintf("Missing required parameter: '%s'.", at(tf+".type")), at(tf+".type"))
		}
		if name, _ := t["name"].(string); (typ == "function" || typ == "custom") && name == "" {
			return invalid(fmt.Sprintf("Missing required parameter: '%s'.", at(tf+".name")), at(tf+".name"))
		}
		if _, ok := t["parameters"].(map[string]any); typ == "function" && !ok && t["parameters"] != nil {
			return invalid(fmt.Sprintf("Invalid value for '%s': expected a JSON Schema object.", at(tf+".parameters")), at(tf+".parameters"))
		}
	}
	return nil
}

func (s *Server) createResponse(w http.ResponseWriter, r *http.Request) {
	var req responseRequest
	if _, ok := s.decode(w, r, &req); !ok {
		return
	}
	if req.Stream {
		s.badRequest(w, "Streaming is not supported by the toolrelay platform simulator.", "stream")
		return
	}
	hasAgent := len(req.AgentReference) > 0 || len(req.Agent) > 0
	if req.Model == "" && !hasAgent {
		s.badRequest(w, "Missing required parameter: 'model'.", "model")
		return
	}
	convID, err := conversationID(req.Conversation)
	if err != nil {
		s.badRequest(w, err.Error(), "conversation")
		return
	}
	if convID != "" && req.PreviousResponseID != "" {
		s.badRequest(w, "Mutually exclusive parameters: 'previous_response_id' and 'conversation'. Use one of them.", "conversation")
		return
	}
	prompt, outputs, aerr := parseInput(req.Input)
	if aerr == nil {
		aerr = checkTools(req.Tools, "tools", false)
	}
	if aerr != nil {
		s.writeAPIError(w, aerr)
		return
	}
	servers, aerr := mcpServers(req.Tools)
	if aerr != nil {
		s.writeAPIError(w, aerr)
		return
	}

	s.mu.Lock()
	if prev, seen := s.idemResponse(r); seen {
		s.stats.ResponseReplays++
		out := s.responseJSON(prev)
		s.mu.Unlock()
		writeJSON(w, http.StatusOK, out)
		return
	}
	resp, aerr := s.newResponse(&req, convID, prompt, outputs)
	if aerr != nil {
		s.mu.Unlock()
		s.writeAPIError(w, aerr)
		return
	}
	resp.servers = servers
	s.rememberResponse(r, resp)
	withMCP := len(resp.servers) > 0 || len(resp.answers) > 0
	switch {
	case resp.background:
	case withMCP:
		// The platform calls the MCP servers before it answers.
		resp.status = "in_progress"
		s.mu.Unlock()
		outcome := s.playMCP(r.Context(), resp)
		s.mu.Lock()
		s.finishResponse(resp, outcome)
	default:
		s.completeResponse(resp)
	}
	out := s.responseJSON(resp)
	s.mu.Unlock()
	if resp.background {
		s.later(func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			if resp.status != "queued" {
				return // cancelled meanwhile
			}
			if withMCP {
				resp.status = "in_progress"
				s.mu.Unlock()
				ctx, stop := s.runContext()
				outcome := s.playMCP(ctx, resp)
				stop()
				s.mu.Lock()
				if resp.status != "in_progress" {
					return
				}
				s.finishResponse(resp, outcome)
				return
			}
			s.completeResponse(resp)
		})
	}
	writeJSON(w, http.StatusOK, out)
}

// idemResponse returns the response an Idempotency-Key produced before.
// Caller holds s.mu.
func (s *Server) idemResponse(r *http.Request) (*response, bool) {
	key := r.Header.Get("Idempotency-Key")
	if key == "" {
		return nil, false
	}
	id, ok := s.idemResponses[key]
	if !ok {
		return nil, false
	}
	return s.responses[id], true
}

func (s *Server) rememberResponse(r *http.Request, resp *response) {
	if key := r.Header.Get("Idempotency-Key"); key != "" {
		s.idemResponses[key] = resp.id
	}
}

func conversationID(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var id string
	if json.Unmarshal(raw, &id) == nil {
		return id, nil
	}
	var obj struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(raw, &obj); err != nil || obj.ID == "" {
		return "", fmt.Errorf("Invalid 'conversation': expected an ID or an object with an 'id'.")
	}
	return obj.ID, nil
}

// parseInput splits the input into the user's text and the answers to the
// previous response: function call outputs and MCP approval responses, in
// order.
func parseInput(raw json.RawMessage) (prompt string, outputs []inputItem, aerr *apiError) {
	if len(raw) == 0 {
		return "", nil, invalid("Missing required parameter: 'input'.", "input")
	}
	if json.Unmarshal(raw, &prompt) == nil {
		return prompt, nil, nil
	}
	var items []inputItem
	if err := json.Unmarshal(raw, &items); err != nil {
		return "", nil, invalid("Invalid 'input': expected a string or an array of input items.", "input")
	}
	var texts []string
	for i, it := range items {
		switch {
		case it.Type == "function_call_output" || it.Type == "custom_tool_call_output":
			if it.CallID == "" {
				return "", nil, invalid(fmt.Sprintf("Missing required parameter: 'input[%d].call_id'.", i), fmt.Sprintf("input[%d].call_id", i))
			}
			outputs = append(outputs, it)
		case it.Type == "tool_search_output":
			if aerr := checkSearchOutput(it, i); aerr != nil {
				return "", nil, aerr
			}
			outputs = append(outputs, it)
		case it.Type == "message" || it.Type == "" && it.Role != "":
			t, err := messageParam{Role: it.Role, Content: it.Content}.text()
			if err != nil {
				return "", nil, invalid(err.Error(), fmt.Sprintf("input[%d].content", i))
			}
			texts = append(texts, t)
		case it.Type == "mcp_approval_response":
			if it.ApprovalRequestID == "" || it.Approve == nil {
				field := "approval_request_id"
				if it.ApprovalRequestID != "" {
					field = "approve"
				}
				return "", nil, invalid(fmt.Sprintf("Missing required parameter: 'input[%d].%s'.", i, field), fmt.Sprintf("input[%d].%s", i, field))
			}
			outputs = append(outputs, it)
		case it.Type == "function_call", it.Type == "custom_tool_call", it.Type == "tool_search_call", it.Type == "reasoning", it.Type == "mcp_list_tools", it.Type == "mcp_call",
			it.Type == "mcp_approval_request":
			// Echoed history: ignored by the scripted model.
		default:
			return "", nil, invalid(fmt.Sprintf("Invalid value for 'input[%d].type': %q is not supported.", i, it.Type), fmt.Sprintf("input[%d].type", i))
		}
	}
	return strings.Join(texts, "\n"), outputs, nil
}

// newResponse validates a request against the conversation so far and
// creates the response. Caller holds s.mu.
func (s *Server) newResponse(req *responseRequest, convID, prompt string, outputs []inputItem) (*response, *apiError) {
	var prev *response
	var conv *conversation
	switch {
	case req.PreviousResponseID != "":
		prev = s.responses[req.PreviousResponseID]
		if prev == nil {
			return nil, &apiError{status: http.StatusBadRequest, typ: "invalid_request_error", code: "previous_response_not_found",
				message: fmt.Sprintf("Previous response with id '%s' not found.", req.PreviousResponseID), param: "previous_response_id"}
		}
	case convID != "":
		conv = s.conversations[convID]
		if conv == nil {
			return nil, &apiError{status: http.StatusNotFound, typ: "invalid_request_error", code: "not_found",
				message: fmt.Sprintf("Conversation with id '%s' not found.", convID), param: "conversation"}
		}
		prev = conv.last
	}
	var sc *script
	if prev != nil && prev.status != "completed" {
		return nil, invalid(fmt.Sprintf("Response '%s' is %s; wait until it completes before continuing it.", prev.id, prev.status), "previous_response_id")
	}
	outputs, answers, aerr := approvalAnswers(prev, outputs)
	if aerr != nil {
		return nil, aerr
	}
	pending := pendingCalls(prev)
	if len(pending) > 0 || len(answers) > 0 {
		for _, o := range outputs {
			// An output answers a call of its own kind only: a
			// custom_tool_call_output a custom_tool_call.
			if !slices.ContainsFunc(pending, func(p pendingCall) bool { return p.id == o.CallID && answerTypes[p.typ] == o.Type }) {
				return nil, invalid(fmt.Sprintf("No tool call found for %s with call_id %s.", words(o.Type), o.CallID), "input")
			}
		}
		for _, p := range pending {
			if !slices.ContainsFunc(outputs, func(o inputItem) bool { return o.CallID == p.id }) {
				return nil, invalid(fmt.Sprintf("No tool output found for %s %s.", words(p.typ), p.id), "input")
			}
		}
		sc = prev.script.clone()
		for _, o := range outputs {
			sc.answer(o.CallID, o.text())
			if o.Type == "tool_search_output" {
				s.answered(o.CallID, string(o.Tools)) // the definitions, as sent
			} else {
				s.answered(o.CallID, outputText(o.Output))
			}
		}
		s.stats.FunctionCallOutputs += len(outputs)
	} else {
		if len(outputs) > 0 {
			return nil, invalid(fmt.Sprintf("No tool call found for %s with call_id %s.", words(outputs[0].Type), outputs[0].CallID), "input")
		}
		sc = s.model.start(prompt)
	}
	if req.Metadata == nil {
		req.Metadata = map[string]any{}
	}
	if req.Tools == nil {
		req.Tools = []map[string]any{}
	}
	model := req.Model
	if model == "" {
		model = "agent"
	}
	resp := &response{
		id: newID("resp_"), createdAt: unixNow(), status: "queued", background: req.Background, model: model,
		instructions: req.Instructions, tools: req.Tools, metadata: req.Metadata,
		previousID: req.PreviousResponseID, conversation: convID, script: sc,
		mcpTools: map[string][]mcpTool{}, approvals: map[string]pendingApproval{}, answers: answers,
	}
	if prev != nil {
		maps.Copy(resp.mcpTools, prev.mcpTools)
		resp.answering = prev.approvals
	}
	s.responses[resp.id] = resp
	if conv != nil {
		for _, o := range outputs {
			if o.Type == "tool_search_output" {
				conv.items = append(conv.items, map[string]any{"id": newID("tso_"), "type": o.Type, "call_id": o.CallID,
					"execution": cmpOr(o.Execution, "client"), "tools": o.Tools, "status": "completed"})
				continue
			}
			conv.items = append(conv.items, map[string]any{"id": newID("fco_"), "type": cmpOr(o.Type, "function_call_output"),
				"call_id": o.CallID, "output": outputText(o.Output), "status": "completed"})
		}
		for _, a := range answers {
			conv.items = append(conv.items, map[string]any{"id": newID("mcpa_"), "type": "mcp_approval_response",
				"approval_request_id": a.requestID, "approve": a.approve, "reason": a.reason})
		}
		if prompt != "" {
			conv.items = append(conv.items, map[string]any{"id": newID("msg_"), "type": "message", "role": "user", "status": "completed",
				"content": []map[string]any{{"type": "input_text", "text": prompt}}})
		}
		conv.last = resp
	}
	return resp, nil
}

// approvalAnswers takes the mcp_approval_response items out of outputs:
// each must answer an approval request of prev, and every request of prev
// must be answered.
func approvalAnswers(prev *response, outputs []inputItem) (rest []inputItem, answers []approvalAnswer, aerr *apiError) {
	for _, o := range outputs {
		if o.Type != "mcp_approval_response" {
			rest = append(rest, o)
			continue
		}
		if prev == nil || prev.approvals[o.ApprovalRequestID].server == "" {
			return nil, nil, invalid(fmt.Sprintf("No MCP approval request found with id %s.", o.ApprovalRequestID), "input")
		}
		answers = append(answers, approvalAnswer{requestID: o.ApprovalRequestID, approve: *o.Approve, reason: o.Reason})
	}
	if prev != nil {
		for id := range prev.approvals {
			if !slices.ContainsFunc(answers, func(a approvalAnswer) bool { return a.requestID == id }) {
				return nil, nil, invalid(fmt.Sprintf("No approval response found for MCP approval request %s.", id), "input")
			}
		}
	}
	return rest, answers, nil
}

// unservedItem is an output item of a kind the client must answer that
// the scenario asks for and no one answers: an MCP approval request, a
// computer call, or a type the SDK does not know.
func unservedItem(c modelCall) map[string]any {
	switch c.Kind {
	case "mcp_approval_request":
		return map[string]any{"id": newID("mcpr_"), "type": c.Kind, "server_label": "sim", "name": c.Name, "arguments": cmpOr(c.Arguments, "{}")}
	case "computer_call":
		return map[string]any{"id": newID("cu_"), "type": c.Kind, "call_id": c.ID, "status": "completed",
			"action": map[string]any{"type": "screenshot"}, "pending_safety_checks": []any{}}
	}
	return map[string]any{"id": newID("item_"), "type": c.Kind, "call_id": c.ID, "status": "completed"}
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// answerTypes maps the type of each item the client answers to the type
// of its answer.
var answerTypes = map[string]string{
	"function_call": "function_call_output", "custom_tool_call": "custom_tool_call_output", "tool_search_call": "tool_search_output",
}

// pendingCall is an item of a response that the client must answer.
type pendingCall struct {
	id  string // call_id
	typ string // item type, a key of answerTypes
}

// pendingCalls lists prev's function calls, custom tool calls and client
// tool searches, in order.
func pendingCalls(prev *response) []pendingCall {
	if prev == nil {
		return nil
	}
	var calls []pendingCall
	for _, it := range prev.output {
		typ, _ := it["type"].(string)
		if answerTypes[typ] != "" && (typ != "tool_search_call" || it["execution"] == "client") {
			calls = append(calls, pendingCall{id: it["call_id"].(string), typ: typ})
		}
	}
	return calls
}

// words spells an item type in an error message: "function call output".
func words(typ string) string { return strings.ReplaceAll(typ, "_", " ") }

// completeResponse runs the model's step. Caller holds s.mu.
func (s *Server) completeResponse(resp *response) {
	calls, answer, err := resp.script.next(func() string { return newID("call_") })
	s.finishResponse(resp, turnOutcome{calls: calls, answer: answer, final: len(calls) == 0, err: err})
}

// finishResponse records how the model's turn ended and completes the
// response. Caller holds s.mu.
func (s *Server) finishResponse(resp *response, o turnOutcome) {
	s.calledAll("responses", o.calls)
	now := unixNow()
	if o.err != nil {
		s.log.Error("scenario failed", "err", o.err)
		resp.status = "failed"
		return
	}
	resp.output = append(resp.output, o.items...)
	calls, answer := o.calls, o.answer
	for _, c := range calls {
		switch c.Kind {
		case KindFunction:
			resp.output = append(resp.output, map[string]any{"id": newID("fc_"), "type": "function_call", "status": "completed",
				"call_id": c.ID, "name": c.Name, "arguments": c.Arguments})
		case KindCustom:
			resp.output = append(resp.output, map[string]any{"id": newID("ctc_"), "type": "custom_tool_call", "status": "completed",
				"call_id": c.ID, "name": c.Name, "input": c.Arguments})
		case KindToolSearch:
			resp.output = append(resp.output, map[string]any{"id": newID("tsc_"), "type": "tool_search_call", "status": "completed",
				"call_id": c.ID, "execution": "client", "arguments": json.RawMessage(c.Arguments)})
		default:
			resp.output = append(resp.output, unservedItem(c))
		}
	}
	if o.final {
		resp.output = append(resp.output, map[string]any{"id": newID("msg_"), "type": "message", "status": "completed", "role": "assistant",
			"content": []map[string]any{{"type": "output_text", "text": answer, "annotations": []any{}, "logprobs": []any{}}}})
	}
	resp.status = "completed"
	resp.completedAt = &now
	if resp.background {
		s.notify("response.completed", map[string]any{"id": resp.id})
	}
	if conv := s.conversations[resp.conversation]; conv != nil {
		conv.items = append(conv.items, resp.output...)
	}
}

// runContext is a context that ends when the server closes.
func (s *Server) runContext() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		select {
		case <-s.closed:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

func (s *Server) getResponse(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	resp := s.responses[r.PathValue("id")]
	var body map[string]any
	if resp != nil {
		body = s.responseJSON(resp)
	}
	s.mu.Unlock()
	if resp == nil {
		s.notFound(w, "response", r.PathValue("id"))
		return
	}
	writeJSON(w, http.StatusOK, body)
}

func (s *Server) cancelResponse(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	resp := s.responses[r.PathValue("id")]
	var aerr *apiError
	var body map[string]any
	switch {
	case resp == nil:
		aerr = &apiError{status: http.StatusNotFound, typ: "invalid_request_error", code: "not_found", message: fmt.Sprintf("No response found with id '%s'.", r.PathValue("id"))}
	case !resp.background:
		aerr = invalid("Only background responses can be cancelled.", "")
	default:
		if resp.status == "queued" || resp.status == "in_progress" {
			resp.status = "cancelled"
		}
		body = s.responseJSON(resp)
	}
	s.mu.Unlock()
	if aerr != nil {
		s.writeAPIError(w, aerr)
		return
	}
	writeJSON(w, http.StatusOK, body)
}

func (s *Server) responseJSON(resp *response) map[string]any {
	output := resp.output
	if output == nil {
		output = []map[string]any{}
	}
	var conv, prev, u any
	if resp.conversation != "" {
		conv = map[string]any{"id": resp.conversation}
	}
	if resp.previousID != "" {
		prev = resp.previousID
	}
	if resp.status == "completed" {
		u = map[string]any{"input_tokens": 120, "input_tokens_details": map[string]any{"cached_tokens": 0},
			"output_tokens": 40, "output_tokens_details": map[string]any{"reasoning_tokens": 0}, "total_tokens": 160}
	}
	return map[string]any{
		"id": resp.id, "object": "response", "created_at": resp.createdAt, "status": resp.status,
		"background": resp.background, "completed_at": resp.completedAt, "error": nil, "incomplete_details": nil,
		"instructions": resp.instructions, "max_output_tokens": nil, "max_tool_calls": nil, "model": resp.model,
		"output": output, "parallel_tool_calls": true, "previous_response_id": prev, "conversation": conv,
		"prompt_cache_key": nil, "reasoning": map[string]any{"effort": nil, "summary": nil}, "safety_identifier": nil,
		"service_tier": "default", "store": true, "temperature": 1.0,
		"text":        map[string]any{"format": map[string]any{"type": "text"}, "verbosity": "medium"},
		"tool_choice": "auto", "tools": resp.tools, "top_logprobs": 0, "top_p": 1.0, "truncation": "disabled",
		"usage": u, "user": nil, "metadata": resp.metadata,
	}
}

func (s *Server) createConversation(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Metadata map[string]any `json:"metadata"`
	}
	if _, ok := s.decode(w, r, &req); !ok {
		return
	}
	if req.Metadata == nil {
		req.Metadata = map[string]any{}
	}
	c := &conversation{id: newID("conv_"), createdAt: unixNow(), metadata: req.Metadata}
	s.mu.Lock()
	s.conversations[c.id] = c
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, conversationJSON(c))
}

func conversationJSON(c *conversation) map[string]any {
	return map[string]any{"id": c.id, "object": "conversation", "created_at": c.createdAt, "metadata": c.metadata}
}

func (s *Server) getConversation(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	c := s.conversations[r.PathValue("id")]
	s.mu.Unlock()
	if c == nil {
		s.notFound(w, "conversation", r.PathValue("id"))
		return
	}
	writeJSON(w, http.StatusOK, conversationJSON(c))
}

func (s *Server) listConversationItems(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	c := s.conversations[r.PathValue("id")]
	var body map[string]any
	var err error
	if c != nil {
		body, err = paginate(r.URL.Query(), c.items)
	}
	s.mu.Unlock()
	if c == nil {
		s.notFound(w, "conversation", r.PathValue("id"))
		return
	}
	s.writePage(w, body, err)
}
