package dispatch_test

import (
	"context"
	"encoding/json"
	"maps"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/toolrelay/toolrelay/internal/apiauth"
	"github.com/toolrelay/toolrelay/internal/testutil"
	"github.com/toolrelay/toolrelay/pkg/dispatch"
	"github.com/toolrelay/toolrelay/pkg/dispatch/httpapi"
	"github.com/toolrelay/toolrelay/pkg/dispatch/tooldef"
	"github.com/toolrelay/toolrelay/pkg/exec"
)

// Whose words each tool holds, and which tools a token sees: the tools
// export (GET /v1/tools) and MCP's tools/list give each tool's team; an
// agent's token (scope tools:) lists and calls its teams' tools and
// reaches nothing else of the API; a team or admin token exports the
// tools of the teams it sees, and asking for a team out of scope is 403.
func TestToolSetsAndOwners(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	path := filepath.Join(t.TempDir(), "tokens.txt")
	tokens := map[string]string{}
	var lines []string
	for _, tc := range []struct {
		name  string
		entry func(apiauth.Token) (apiauth.Entry, error)
	}{
		{"admin", func(tok apiauth.Token) (apiauth.Entry, error) { return apiauth.NewEntry("admin", true, nil, tok) }},
		{"orders", func(tok apiauth.Token) (apiauth.Entry, error) {
			return apiauth.NewEntry("orders", false, []string{"orders"}, tok)
		}},
		{"agent", func(tok apiauth.Token) (apiauth.Entry, error) {
			return apiauth.NewToolsEntry("agent", []string{"orders"}, tok)
		}},
	} {
		tok := apiauth.NewToken()
		entry, err := tc.entry(tok)
		if err != nil {
			t.Fatal(err)
		}
		tokens[tc.name] = string(tok)
		lines = append(lines, entry.String())
	}
	writeFile(t, path, strings.Join(lines, "\n")+"\n")
	if !strings.Contains(lines[2], " tools:orders ") {
		t.Fatalf("tools-only token's line %q: want scope tools:orders", lines[2])
	}
	file, err := apiauth.Open(path, apiauth.Options{Logger: testutil.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	f := &mcpFleet{e: e, rec: tracetest.NewSpanRecorder()}
	f.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(f.rec))
	d, _ := e.dispatcher(dispatch.Options{})
	f.executor(t, "orders", exec.Function{Name: "echo", Description: "Echoes its arguments.", Parameters: json.RawMessage(echoSchema),
		Handler: exec.HandlerFunc(func(_ context.Context, inv *exec.Invocation) ([]byte, error) { return inv.Call.Arguments, nil })})
	f.executor(t, "billing", exec.Function{Name: "invoice", Description: "Finds an invoice.",
		Handler: exec.HandlerFunc(func(context.Context, *exec.Invocation) ([]byte, error) { return []byte(`"invoice 7"`), nil })})
	hs := httptest.NewServer(httpapi.New(d, httpapi.Options{Authenticator: file}))
	t.Cleanup(hs.Close)

	// The agent's token over MCP: its team's tool, with the team in _meta.
	ctx := t.Context()
	rr := &roundRobin{urls: []string{hs.URL + "/mcp"}, header: http.Header{"Authorization": {"Bearer " + tokens["agent"]}}}
	s := connect(t, ctx, rr, nil)
	list, err := s.ListTools(ctx, nil)
	if err != nil || len(list.Tools) != 1 || list.Tools[0].Name != "echo" || list.Tools[0].Meta["io.toolrelay/team"] != "orders" {
		t.Fatalf("the agent's token lists %+v (%v); want only echo, of team orders in _meta", list, err)
	}
	if res, err := s.CallTool(ctx, &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"n": 3}}); err != nil || res.IsError {
		t.Errorf("the agent's token calling its team's tool: %v %+v", err, res)
	}
	if _, err := s.CallTool(ctx, &mcp.CallToolParams{Name: "invoice", Arguments: map[string]any{}}); err == nil || !strings.Contains(err.Error(), "unknown tool") {
		t.Errorf("the agent's token calling another team's tool: %v; want unknown tool", err)
	}

	type export struct {
		Platform string
		Tools    []tooldef.Tool
	}
	tools := func(token, query string) (int, export, string) {
		t.Helper()
		got := do(t, http.MethodGet, hs.URL+"/v1/tools"+query, token, "")
		var x export
		if got.status == http.StatusOK {
			if err := json.Unmarshal(got.body, &x); err != nil {
				t.Fatalf("GET /v1/tools%s: %v in %s", query, err, got.body)
			}
		}
		return got.status, x, got.message()
	}
	owners := func(x export) map[string]string {
		out := map[string]string{}
		for _, tool := range x.Tools {
			var def struct{ Name, Description string }
			if err := json.Unmarshal(tool.Definition, &def); err != nil || def.Name != tool.Function || tool.DefinitionDigest == "" {
				t.Errorf("exported %+v: its definition does not name its function, or it has no digest", tool)
			}
			out[tool.Function] = tool.Team
		}
		return out
	}
	for _, tc := range []struct {
		name, token, query string
		status             int
		want               map[string]string // function → team
	}{
		{"the agent's token", tokens["agent"], "", http.StatusOK, map[string]string{"echo": "orders"}},
		{"a team token", tokens["orders"], "?platform=agents", http.StatusOK, map[string]string{"echo": "orders"}},
		{"the admin token", tokens["admin"], "", http.StatusOK, map[string]string{"echo": "orders", "invoice": "billing"}},
		{"the admin token, one team", tokens["admin"], "?team=billing", http.StatusOK, map[string]string{"invoice": "billing"}},
		{"a team out of scope", tokens["agent"], "?team=orders,billing", http.StatusForbidden, nil},
		{"an unknown platform", tokens["admin"], "?platform=mcp", http.StatusBadRequest, nil},
	} {
		status, x, msg := tools(tc.token, tc.query)
		if status != tc.status {
			t.Errorf("%s: GET /v1/tools%s = %d (%s), want %d", tc.name, tc.query, status, msg, tc.status)
			continue
		}
		if tc.want != nil && !maps.Equal(owners(x), tc.want) {
			t.Errorf("%s: GET /v1/tools%s exports %v, want %v", tc.name, tc.query, owners(x), tc.want)
		}
	}

	// Nothing else of the API answers the agent's token.
	for _, p := range []string{"/v1/functions", "/v1/turns", "/v1/watches", "/v1/deadletters", "/ui/functions"} {
		if got := do(t, http.MethodGet, hs.URL+p, tokens["agent"], ""); got.status != http.StatusForbidden || !strings.Contains(got.message(), "tools") {
			t.Errorf("GET %s with the agent's token: %d %q, want 403 saying it may reach tools only", p, got.status, got.message())
		}
	}
	if got := do(t, http.MethodPost, hs.URL+"/v1/watch", tokens["agent"], `{}`); got.status != http.StatusForbidden {
		t.Errorf("POST /v1/watch with the agent's token: %d, want 403", got.status)
	}
}
