package dispatch_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/modelcontextprotocol/go-sdk/oauthex"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/toolrelay/toolrelay/internal/lease"
	"github.com/toolrelay/toolrelay/internal/testutil"
	"github.com/toolrelay/toolrelay/pkg/dispatch"
	"github.com/toolrelay/toolrelay/pkg/dispatch/httpapi"
	"github.com/toolrelay/toolrelay/pkg/exec"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// newAPI starts a dispatcher and its HTTP API, without tokens.
func newAPI(t *testing.T) (*env, *dispatch.Dispatcher, *httptest.Server) {
	t.Helper()
	e := newEnv(t)
	d, _ := e.dispatcher(dispatch.Options{})
	hs := httptest.NewServer(httpapi.New(d, httpapi.Options{Logger: testutil.Logger(t)}))
	t.Cleanup(hs.Close)
	return e, d, hs
}

// jsonrpcReply is a JSON-RPC response as a client decodes it.
type jsonrpcReply struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Error   *struct {
		Code    int64  `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// A request /mcp cannot take is answered with the JSON-RPC error the
// specification names, carrying the request's id, whatever protocol
// version the client speaks: -32601 for a method nobody serves, -32600 for
// a request without its params, -32700 for a body that is not JSON.
func TestMCPAnswersJSONRPCErrors(t *testing.T) {
	t.Parallel()
	_, _, hs := newAPI(t)

	cases := []struct {
		name, body string
		id         string
		code       int64
	}{
		{"unknown method", `{"jsonrpc":"2.0","id":7,"method":"tools/frobnicate","params":{}}`, "7", -32601},
		{"unknown method, string id", `{"jsonrpc":"2.0","id":"a-1","method":"sampling/whatever"}`, `"a-1"`, -32601},
		{"call without params", `{"jsonrpc":"2.0","id":8,"method":"tools/call"}`, "8", -32600},
		{"not JSON", `{"jsonrpc":"2.0","id":9,"method":`, "null", -32700},
	}
	for _, version := range []string{"", "2025-03-26", "2025-11-25"} {
		for _, c := range cases {
			header := http.Header{}
			if version != "" {
				header.Set("Mcp-Protocol-Version", version)
			}
			status, body := mcpPost(t, hs.URL+"/mcp", c.body, header)
			var reply jsonrpcReply
			if err := json.Unmarshal(body, &reply); err != nil || status != http.StatusBadRequest || reply.JSONRPC != "2.0" ||
				reply.Error == nil || reply.Error.Code != c.code || string(reply.ID) != c.id || reply.Error.Message == "" {
				t.Errorf("%s (version %q): %d %.300s; want 400 with JSON-RPC error %d and id %s (%v)", c.name, version, status, body, c.code, c.id, err)
			}
		}
	}

	// What the SDK answers well passes through untouched: a known method.
	status, body := mcpPost(t, hs.URL+"/mcp", `{"jsonrpc":"2.0","id":1,"method":"ping"}`, nil)
	if status != http.StatusOK || !strings.Contains(string(body), `"result"`) {
		t.Errorf("ping: %d %.300s", status, body)
	}
}

// With tokens, /mcp is an OAuth protected resource as MCP clients expect:
// a request without a valid token gets 401 whose challenge names the
// resource's RFC 9728 metadata, which the SDK's own discovery reads and
// checks (the resource it names is the one asked for). Other paths'
// challenges name none, and without tokens there is no metadata.
func TestMCPAuthorizationDiscovery(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	d, _ := e.dispatcher(dispatch.Options{})
	file, tokens := openTokens(t, "orders")
	hs := httptest.NewServer(httpapi.New(d, httpapi.Options{Logger: testutil.Logger(t), Authenticator: file}))
	t.Cleanup(hs.Close)
	ctx := t.Context()

	for _, token := range []string{"", "not-a-token"} {
		header := http.Header{}
		if token != "" {
			header.Set("Authorization", "Bearer "+token)
		}
		status, challenge := postFor401(t, hs.URL+"/mcp", header)
		cs, err := oauthex.ParseWWWAuthenticate([]string{challenge})
		if status != http.StatusUnauthorized || err != nil || len(cs) != 1 || !strings.EqualFold(cs[0].Scheme, "bearer") {
			t.Fatalf("token %q: %d %q (%v); want 401 with one Bearer challenge", token, status, challenge, err)
		}
		metadataURL := cs[0].Params["resource_metadata"]
		if want := hs.URL + "/.well-known/oauth-protected-resource/mcp"; metadataURL != want {
			t.Errorf("token %q: resource_metadata %q; want %q", token, metadataURL, want)
		}
		if token != "" && cs[0].Params["error"] != "invalid_token" {
			t.Errorf("unknown token: challenge %q lacks error=invalid_token", challenge)
		}
	}
	prm, err := oauthex.GetProtectedResourceMetadata(ctx, hs.URL+"/.well-known/oauth-protected-resource/mcp", hs.URL+"/mcp", hs.Client())
	if err != nil || len(prm.BearerMethodsSupported) != 1 || prm.BearerMethodsSupported[0] != "header" {
		t.Errorf("/mcp's metadata: %+v, %v", prm, err)
	}
	if _, err := oauthex.GetProtectedResourceMetadata(ctx, hs.URL+"/.well-known/oauth-protected-resource", hs.URL, hs.Client()); err != nil {
		t.Errorf("the root metadata: %v", err)
	}
	// A token still works, and /v1's challenge names no MCP metadata.
	status, body := mcpPost(t, hs.URL+"/mcp", `{"jsonrpc":"2.0","id":1,"method":"ping"}`, http.Header{"Authorization": {"Bearer " + tokens["orders"]}})
	if status != http.StatusOK {
		t.Errorf("ping with a token: %d %.300s", status, body)
	}
	if status, challenge := postFor401(t, hs.URL+"/v1/watch", nil); status != http.StatusUnauthorized || strings.Contains(challenge, "resource_metadata") {
		t.Errorf("/v1/watch without a token: %d %q; want 401 naming no MCP metadata", status, challenge)
	}

	// The public address and the authorization servers, when set, are the
	// ones named.
	const public, issuer = "https://tools.example.com", "https://login.example.com/tenant"
	hs2 := httptest.NewServer(httpapi.New(d, httpapi.Options{Logger: testutil.Logger(t), Authenticator: file,
		PublicURL: public + "/", AuthorizationServers: []string{issuer}}))
	t.Cleanup(hs2.Close)
	if _, challenge := postFor401(t, hs2.URL+"/mcp", nil); !strings.Contains(challenge, `resource_metadata="`+public+`/.well-known/oauth-protected-resource/mcp"`) {
		t.Errorf("challenge with a public address: %q", challenge)
	}
	resp, err := hs2.Client().Get(hs2.URL + "/.well-known/oauth-protected-resource/mcp")
	if err != nil {
		t.Fatal(err)
	}
	var md oauthex.ProtectedResourceMetadata
	err = json.NewDecoder(resp.Body).Decode(&md)
	resp.Body.Close()
	if err != nil || md.Resource != public+"/mcp" || len(md.AuthorizationServers) != 1 || md.AuthorizationServers[0] != issuer ||
		resp.Header.Get("Access-Control-Allow-Origin") != "*" {
		t.Errorf("metadata with a public address: %+v (%v), CORS %q", md, err, resp.Header.Get("Access-Control-Allow-Origin"))
	}

	// Without tokens: nothing to discover.
	hs3 := httptest.NewServer(httpapi.New(d, httpapi.Options{Logger: testutil.Logger(t)}))
	t.Cleanup(hs3.Close)
	resp, err = hs3.Client().Get(hs3.URL + "/.well-known/oauth-protected-resource/mcp")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("metadata without tokens: %d; want 404", resp.StatusCode)
	}
}

// postFor401 POSTs an empty JSON object to url and returns the status and
// the WWW-Authenticate header.
func postFor401(t *testing.T, url string, header http.Header) (int, string) {
	t.Helper()
	resp, _ := mcpExchange(t, url, "{}", header)
	return resp.StatusCode, resp.Header.Get("WWW-Authenticate")
}

// A fleet of 2,000 tools is listed in pages: the SDK's client follows
// nextCursor through both replicas in turn and gets every tool once, in
// name order; a page holds at most 500, and a made-up cursor is a JSON-RPC
// error -32602. The tools are declared as an executor declares them (the
// executors' consumers, one per function, are not what is tested here).
func TestMCPToolsListPages(t *testing.T) {
	t.Parallel()
	const n = 2000
	e := newEnv(t)
	var urls []string
	var ds []*dispatch.Dispatcher
	for range 2 {
		d, _ := e.dispatcher(dispatch.Options{})
		hs := httptest.NewServer(httpapi.New(d, httpapi.Options{Logger: testutil.Logger(t)}))
		t.Cleanup(hs.Close)
		urls, ds = append(urls, hs.URL+"/mcp"), append(ds, d)
	}
	nc, _ := e.srv.Connect(t)
	now := time.Now().UTC()
	decls := make([]*protocol.Declaration, n)
	for i := range decls {
		decls[i] = &protocol.Declaration{Version: protocol.Version, Instance: "lister", StartedAt: now,
			Spec: protocol.FunctionSpec{Version: protocol.Version, Name: fmt.Sprintf("tool_%04d", i), Team: "orders",
				Description: "A tool.", Parameters: json.RawMessage(`{"type":"object"}`), UpdatedAt: now}}
	}
	keeper, err := lease.Declare(t.Context(), nc, "orders", decls, testutil.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { keeper.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	// Each new name is a claim written to JetStream: 2,000 take a few
	// seconds alone, and over 30 s under -race beside CI's other packages.
	testutil.WaitForWhat(t, 2*time.Minute, "both replicas to serve all 2,000 tools", func() bool {
		for _, d := range ds {
			if len(d.ServedFunctions(func(string) bool { return true })) != n {
				return false
			}
		}
		return true
	})

	rr := &roundRobin{urls: urls}
	session := connect(t, t.Context(), rr, nil)
	var names []string
	for tool, err := range session.Tools(t.Context(), nil) {
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, tool.Name)
	}
	if len(names) != n || !slices.IsSorted(names) || len(slices.Compact(slices.Clone(names))) != n {
		t.Fatalf("listed %d tools (sorted: %v); want each of %d once", len(names), slices.IsSorted(names), n)
	}
	if rr.perReplica[0].Load() == 0 || rr.perReplica[1].Load() == 0 {
		t.Errorf("requests per replica %d and %d; want the pages from both", rr.perReplica[0].Load(), rr.perReplica[1].Load())
	}
	first, err := session.ListTools(t.Context(), nil)
	if err != nil || len(first.Tools) != 500 || first.NextCursor == "" {
		t.Fatalf("first page: %d tools, cursor %q, %v; want 500 and a cursor", len(first.Tools), first.NextCursor, err)
	}
	if _, err := session.ListTools(t.Context(), &mcp.ListToolsParams{Cursor: "not a cursor!"}); err == nil || !strings.Contains(err.Error(), "invalid cursor") {
		t.Errorf("a made-up cursor: %v; want an invalid cursor error", err)
	}
}

// A function's title, icons and output schema reach MCP clients in
// tools/list; an output that matches the schema is the call's
// structuredContent, and one that does not is a function error naming
// what is wrong, not structured content the client was not promised.
func TestMCPToolMetadataAndStructuredOutput(t *testing.T) {
	t.Parallel()
	e, _, hs := newAPI(t)
	f := &mcpFleet{e: e, tp: sdktrace.NewTracerProvider()}
	const out = `{"type":"object","properties":{"temperature":{"type":"number"}},"required":["temperature"]}`
	icon := protocol.Icon{Src: "https://icons.example.com/weather.svg", MIMEType: "image/svg+xml", Sizes: []string{"any"}, Theme: "light"}
	f.executor(t, "orders", exec.Function{Name: "weather", Title: "Weather now", Description: "The weather at a place.",
		Icons: []protocol.Icon{icon}, OutputSchema: json.RawMessage(out),
		Handler: exec.HandlerFunc(func(_ context.Context, inv *exec.Invocation) ([]byte, error) {
			var args struct {
				Place string `json:"place"`
			}
			_ = json.Unmarshal(inv.Call.Arguments, &args)
			if args.Place == "nowhere" {
				return []byte(`{"temperature":"warm"}`), nil // not what the schema says
			}
			return []byte(`{"temperature":21.5}`), nil
		})})

	// An executor of another language is checked by the dispatcher: an
	// output schema that is not a valid JSON Schema is refused by name.
	nc, _ := e.srv.Connect(t)
	now := time.Now().UTC()
	_, err := lease.Declare(t.Context(), nc, "orders", []*protocol.Declaration{{Version: protocol.Version, Instance: "other", StartedAt: now,
		Spec: protocol.FunctionSpec{Version: protocol.Version, Name: "forecast", Team: "orders", Parameters: json.RawMessage(`{"type":"object"}`),
			OutputSchema: json.RawMessage(`{"type":"object","properties":{"t":{"type":"nonsense"}}}`), UpdatedAt: now}}}, testutil.Logger(t))
	var refused *lease.RefusedError
	if !errors.As(err, &refused) || refused.Refusals[0].Function != "forecast" || !strings.Contains(refused.Refusals[0].Reason, "output schema of forecast") {
		t.Errorf("a declaration with a broken output schema: %v; want it refused, naming the schema's mistake", err)
	}

	session := connect(t, t.Context(), &roundRobin{urls: []string{hs.URL + "/mcp"}}, nil)
	list, err := session.ListTools(t.Context(), nil)
	if err != nil || len(list.Tools) != 1 {
		t.Fatalf("tools/list: %+v, %v", list, err)
	}
	tool := list.Tools[0]
	schema, _ := json.Marshal(tool.OutputSchema)
	if tool.Title != "Weather now" || len(tool.Icons) != 1 || tool.Icons[0].Source != icon.Src || tool.Icons[0].MIMEType != icon.MIMEType ||
		string(tool.Icons[0].Theme) != "light" || !strings.Contains(string(schema), `"temperature"`) {
		t.Errorf("tool %+v (output schema %s); want its title, icon and output schema", tool, schema)
	}

	res, err := session.CallTool(t.Context(), &mcp.CallToolParams{Name: "weather", Arguments: map[string]any{"place": "Paris"}})
	if err != nil || res.IsError || res.StructuredContent == nil {
		t.Fatalf("a matching output: %+v, %v; want structured content", res, err)
	}
	got, _ := json.Marshal(res.StructuredContent)
	if string(got) != `{"temperature":21.5}` {
		t.Errorf("structured content %s", got)
	}
	res, err = session.CallTool(t.Context(), &mcp.CallToolParams{Name: "weather", Arguments: map[string]any{"place": "nowhere"}})
	if err != nil || !res.IsError || res.StructuredContent != nil || !strings.Contains(text(res), "does not match its declared output schema") ||
		!strings.Contains(text(res), "/temperature") || res.Meta["io.toolrelay/error_type"] != "function_error" {
		t.Errorf("an output breaking the schema: %+v (%q), %v; want a function error naming /temperature", res, text(res), err)
	}
}
