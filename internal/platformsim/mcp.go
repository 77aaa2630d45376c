package platformsim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// The Responses API's remote MCP tool: a request whose tools include
// {"type":"mcp","server_label":...,"server_url":...} has the platform list
// that server's tools (an mcp_list_tools item, once per conversation) and
// call those the model picks itself (mcp_call items), within the one
// response. A call that needs approval (require_approval, "always" by
// default) stops the response with an mcp_approval_request item; the next
// request answers it with an mcp_approval_response input item, and the
// platform then makes (or skips) the call and carries on.

// mcpServer is one {"type":"mcp"} tool of a request.
type mcpServer struct {
	label   string
	url     string
	headers map[string]string
	// allowed, when not nil, names the tools the model may use; readOnly
	// keeps only tools annotated read-only.
	allowed  []string
	readOnly bool
	approval approvalRule
}

// approvalRule is require_approval: "always", "never", or lists of tool
// names for each; a tool in neither list needs approval.
type approvalRule struct {
	never       bool
	alwaysNames []string
	neverNames  []string
}

func (a approvalRule) required(name string) bool {
	switch {
	case slices.Contains(a.alwaysNames, name):
		return true
	case slices.Contains(a.neverNames, name):
		return false
	}
	return !a.never
}

// mcpTool is a tool an MCP server listed.
type mcpTool struct {
	server string
	tool   *mcp.Tool
}

// pendingApproval is a call waiting for the client's approval.
type pendingApproval struct {
	server string
	call   modelCall
}

// approvalAnswer is an mcp_approval_response input item.
type approvalAnswer struct {
	requestID string
	approve   bool
	reason    string
}

// mcpServers reads the mcp tools of a request; the first malformed one is
// an error naming its field.
func mcpServers(tools []map[string]any) ([]*mcpServer, *apiError) {
	var out []*mcpServer
	for i, t := range tools {
		if t["type"] != "mcp" {
			continue
		}
		b, _ := json.Marshal(t)
		var p struct {
			ServerLabel     string            `json:"server_label"`
			ServerURL       string            `json:"server_url"`
			ConnectorID     string            `json:"connector_id"`
			TunnelID        string            `json:"tunnel_id"`
			Authorization   string            `json:"authorization"`
			Headers         map[string]string `json:"headers"`
			AllowedTools    json.RawMessage   `json:"allowed_tools"`
			RequireApproval json.RawMessage   `json:"require_approval"`
		}
		field := func(name string) string { return fmt.Sprintf("tools[%d].%s", i, name) }
		if err := json.Unmarshal(b, &p); err != nil {
			return nil, invalid(fmt.Sprintf("Invalid 'tools[%d]': %v.", i, err), fmt.Sprintf("tools[%d]", i))
		}
		switch {
		case p.ServerLabel == "":
			return nil, invalid(fmt.Sprintf("Missing required parameter: '%s'.", field("server_label")), field("server_label"))
		case p.ConnectorID != "" || p.TunnelID != "":
			return nil, invalid("Connectors and tunnels are not supported by the toolrelay platform simulator; give a server_url.", field("server_url"))
		case p.ServerURL == "":
			return nil, invalid(fmt.Sprintf("Missing required parameter: '%s' (or connector_id).", field("server_url")), field("server_url"))
		}
		for _, s := range out {
			if s.label == p.ServerLabel {
				return nil, invalid(fmt.Sprintf("Duplicate MCP server_label %q.", p.ServerLabel), field("server_label"))
			}
		}
		srv := &mcpServer{label: p.ServerLabel, url: p.ServerURL, headers: map[string]string{}}
		for k, v := range p.Headers {
			srv.headers[k] = v
		}
		if p.Authorization != "" {
			srv.headers["Authorization"] = "Bearer " + p.Authorization
		}
		if len(p.AllowedTools) > 0 && string(p.AllowedTools) != "null" {
			var filter struct {
				ToolNames []string `json:"tool_names"`
				ReadOnly  bool     `json:"read_only"`
			}
			if json.Unmarshal(p.AllowedTools, &srv.allowed) != nil {
				if err := json.Unmarshal(p.AllowedTools, &filter); err != nil {
					return nil, invalid("Invalid 'allowed_tools': expected a list of tool names or {\"tool_names\":[...],\"read_only\":bool}.", field("allowed_tools"))
				}
				srv.allowed, srv.readOnly = filter.ToolNames, filter.ReadOnly
			}
		}
		if len(p.RequireApproval) > 0 && string(p.RequireApproval) != "null" {
			var setting string
			if json.Unmarshal(p.RequireApproval, &setting) == nil {
				switch setting {
				case "always":
				case "never":
					srv.approval.never = true
				default:
					return nil, invalid(fmt.Sprintf("Invalid value for 'require_approval': %q (want \"always\", \"never\" or a filter).", setting), field("require_approval"))
				}
			} else {
				var filter struct {
					Always struct {
						ToolNames []string `json:"tool_names"`
					} `json:"always"`
					Never struct {
						ToolNames []string `json:"tool_names"`
					} `json:"never"`
				}
				if err := json.Unmarshal(p.RequireApproval, &filter); err != nil {
					return nil, invalid("Invalid 'require_approval': expected \"always\", \"never\" or {\"always\":{\"tool_names\":[...]},\"never\":{\"tool_names\":[...]}}.", field("require_approval"))
				}
				srv.approval.alwaysNames, srv.approval.neverNames = filter.Always.ToolNames, filter.Never.ToolNames
			}
		}
		out = append(out, srv)
	}
	return out, nil
}

// headerTransport adds a server's headers to each request.
type headerTransport map[string]string

func (h headerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	for k, v := range h {
		r.Header.Set(k, v)
	}
	return http.DefaultTransport.RoundTrip(r)
}

// mcpRun is the MCP side of one response being completed: its servers'
// sessions, opened as needed.
type mcpRun struct {
	servers []*mcpServer

	mu       sync.Mutex // calls of one step run in parallel
	sessions map[string]*mcp.ClientSession
}

func (m *mcpRun) session(ctx context.Context, label string) (*mcp.ClientSession, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if s := m.sessions[label]; s != nil {
		return s, nil
	}
	i := slices.IndexFunc(m.servers, func(s *mcpServer) bool { return s.label == label })
	if i < 0 {
		return nil, fmt.Errorf("no MCP server labelled %q in this request's tools", label)
	}
	srv := m.servers[i]
	client := mcp.NewClient(&mcp.Implementation{Name: "toolrelay-platformsim", Version: "1"}, nil)
	s, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: srv.url,
		HTTPClient: &http.Client{Transport: headerTransport(srv.headers)}, DisableStandaloneSSE: true}, nil)
	if err != nil {
		return nil, err
	}
	m.sessions[label] = s
	return s, nil
}

func (m *mcpRun) close() {
	for _, s := range m.sessions {
		_ = s.Close()
	}
}

// list lists the tools of srv the request allows, as an mcp_list_tools
// item.
func (m *mcpRun) list(ctx context.Context, srv *mcpServer) ([]mcpTool, map[string]any) {
	item := map[string]any{"id": newID("mcpl_"), "type": "mcp_list_tools", "server_label": srv.label, "tools": []any{}, "error": nil}
	s, err := m.session(ctx, srv.label)
	var tools []mcpTool
	if err == nil {
		for t, lerr := range s.Tools(ctx, nil) {
			if lerr != nil {
				err = lerr
				break
			}
			if srv.allowed != nil && !slices.Contains(srv.allowed, t.Name) ||
				srv.readOnly && (t.Annotations == nil || !t.Annotations.ReadOnlyHint) {
				continue
			}
			tools = append(tools, mcpTool{server: srv.label, tool: t})
		}
	}
	if err != nil {
		item["error"] = fmt.Sprintf("Error retrieving tool list from MCP server: '%s'. %v", srv.label, err)
		return nil, item
	}
	listed := make([]any, 0, len(tools))
	for _, t := range tools {
		var ann any
		if t.tool.Annotations != nil {
			ann = t.tool.Annotations
		}
		listed = append(listed, map[string]any{"name": t.tool.Name, "description": t.tool.Description,
			"input_schema": t.tool.InputSchema, "annotations": ann})
	}
	item["tools"] = listed
	return tools, item
}

// call makes one call on an MCP server and returns its mcp_call item and
// what the model reads of it.
func (m *mcpRun) call(ctx context.Context, server string, c modelCall, approvalID string) (item map[string]any, output string) {
	item = map[string]any{"id": newID("mcp_"), "type": "mcp_call", "server_label": server, "name": c.Name,
		"arguments": c.Arguments, "output": nil, "error": nil, "status": "completed", "approval_request_id": nil}
	if approvalID != "" {
		item["approval_request_id"] = approvalID
	}
	fail := func(e map[string]any, text string) (map[string]any, string) {
		item["error"], item["status"] = e, "failed"
		return item, text
	}
	s, err := m.session(ctx, server)
	if err != nil {
		return fail(map[string]any{"type": "http_error", "code": 0, "message": err.Error()}, err.Error())
	}
	res, err := s.CallTool(ctx, &mcp.CallToolParams{Name: c.Name, Arguments: json.RawMessage(c.Arguments)})
	if err != nil {
		var rpc *jsonrpc.Error
		if errors.As(err, &rpc) {
			return fail(map[string]any{"type": "mcp_protocol_error", "code": rpc.Code, "message": rpc.Message}, rpc.Message)
		}
		return fail(map[string]any{"type": "http_error", "code": 0, "message": err.Error()}, err.Error())
	}
	var text strings.Builder
	content := []any{}
	for _, part := range res.Content {
		if t, ok := part.(*mcp.TextContent); ok {
			text.WriteString(t.Text)
			content = append(content, map[string]any{"type": "text", "text": t.Text})
		}
	}
	if res.IsError {
		return fail(map[string]any{"type": "mcp_tool_execution_error", "content": content}, text.String())
	}
	item["output"] = text.String()
	return item, text.String()
}

// turnOutcome is how the model's turn of a response ended: the items the
// platform produced on the way (MCP listings and calls, approval
// requests), then the calls for the client, or the answer, or an error.
type turnOutcome struct {
	items  []map[string]any
	calls  []modelCall
	answer string
	// final: the model answered (no calls wait, for the client or for
	// approval).
	final bool
	err   error
}

// playMCP plays the model's turn of resp, a response whose request gave
// MCP servers (or answers approvals of its predecessor): it lists the
// servers' tools not listed yet in the conversation, makes the approved
// calls, then plays the model's steps, calling MCP tools itself, until the
// model asks for a function the client serves, a call waits for approval,
// or it answers. It runs without s.mu (it waits on the servers): the
// response is in progress and nothing else touches its script or MCP
// state until finishResponse records the outcome.
func (s *Server) playMCP(ctx context.Context, resp *response) turnOutcome {
	run := &mcpRun{servers: resp.servers, sessions: map[string]*mcp.ClientSession{}}
	defer run.close()
	var out turnOutcome
	for _, srv := range resp.servers {
		if _, listed := resp.mcpTools[srv.label]; listed {
			continue
		}
		tools, item := run.list(ctx, srv)
		out.items = append(out.items, item)
		if item["error"] == nil {
			resp.mcpTools[srv.label] = tools
		}
	}
	for _, a := range resp.answers {
		p := resp.answering[a.requestID]
		output := fmt.Sprintf("The user did not approve the call to %s on %s.", p.call.Name, p.server)
		if a.reason != "" {
			output += " Reason: " + a.reason
		}
		if a.approve {
			var item map[string]any
			item, output = run.call(ctx, p.server, p.call, a.requestID)
			out.items = append(out.items, item)
		}
		resp.script.answer(p.call.ID, output)
	}
	// Each round is one step of the scenario; a scenario has few.
	for range maxMCPRounds {
		if len(resp.script.waiting()) > 0 {
			return out // calls of this step still wait for the client
		}
		calls, answer, err := resp.script.next(func() string { return newID("call_") })
		if err != nil {
			out.err = err
			return out
		}
		if len(calls) == 0 {
			out.answer, out.final = answer, true
			return out
		}
		// The step's items in the order of its calls; its MCP calls run in
		// parallel, as the model asked for them at once.
		slots := make([]map[string]any, len(calls))
		outputs := make([]string, len(calls))
		var made []int // calls made over MCP
		var wg sync.WaitGroup
		waiting := false
		for i, c := range calls {
			srv := resp.serverOf(c.Name)
			switch {
			case srv == nil:
				out.calls = append(out.calls, c) // a function the client serves
			case srv.approval.required(c.Name):
				id := newID("mcpr_")
				resp.approvals[id] = pendingApproval{server: srv.label, call: c}
				slots[i] = map[string]any{"id": id, "type": "mcp_approval_request", "server_label": srv.label,
					"name": c.Name, "arguments": c.Arguments}
				waiting = true
			default:
				made = append(made, i)
				wg.Go(func() { slots[i], outputs[i] = run.call(ctx, srv.label, c, "") })
			}
		}
		wg.Wait()
		for _, i := range made {
			resp.script.answer(calls[i].ID, outputs[i])
		}
		for _, item := range slots {
			if item != nil {
				out.items = append(out.items, item)
			}
		}
		if len(out.calls) > 0 || waiting {
			return out
		}
	}
	out.err = fmt.Errorf("platformsim: more than %d rounds of MCP calls in one response", maxMCPRounds)
	return out
}

// maxMCPRounds bounds the rounds of MCP calls one response makes.
const maxMCPRounds = 16

// serverOf returns the server of this request that lists a tool, or nil.
func (r *response) serverOf(name string) *mcpServer {
	for _, srv := range r.servers {
		for _, t := range r.mcpTools[srv.label] {
			if t.tool.Name == name {
				return srv
			}
		}
	}
	return nil
}
