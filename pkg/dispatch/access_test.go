package dispatch_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/toolrelay/toolrelay/internal/apiauth"
	"github.com/toolrelay/toolrelay/internal/platformsim"
	"github.com/toolrelay/toolrelay/internal/testutil"
	"github.com/toolrelay/toolrelay/pkg/dispatch"
	"github.com/toolrelay/toolrelay/pkg/dispatch/httpapi"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// apiCall is one request to the HTTP API and what came back.
type apiCall struct {
	status    int
	challenge string // WWW-Authenticate
	body      []byte
}

// message is the error message of a JSON error body.
func (c apiCall) message() string {
	var b struct{ Error struct{ Message string } }
	_ = json.Unmarshal(c.body, &b)
	return b.Error.Message
}

// do sends a request to base with token as its bearer token (none if
// empty).
func do(t testing.TB, method, url, token, body string) apiCall {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return apiCall{status: resp.StatusCode, challenge: resp.Header.Get("WWW-Authenticate"), body: b}
}

// tokensFile writes a tokens file (replacing it whole, by a rename) with
// one new token per name: "admin" gets the admin scope, any other name the
// team named so. It returns the tokens by name.
func tokensFile(t *testing.T, path string, names ...string) map[string]string {
	t.Helper()
	tokens := map[string]string{}
	var lines []string
	for _, name := range names {
		tok := apiauth.NewToken()
		admin, teams := name == "admin", []string{name}
		if admin {
			teams = nil
		}
		e, err := apiauth.NewEntry(name, admin, teams, tok)
		if err != nil {
			t.Fatal(err)
		}
		tokens[name] = string(tok)
		lines = append(lines, e.String())
	}
	writeFile(t, path, strings.Join(lines, "\n")+"\n")
	return tokens
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path+".tmp", []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		t.Fatal(err)
	}
}

// With a tokens file, /v1 needs a known bearer token; an admin sees a
// whole watch, a team token the calls of its team and only the function,
// team and status of the others' (no answer), and 403 for a watch that
// calls none of its functions. Changes to the file take effect without a
// restart; a malformed change is refused and the last good tokens stay.
func TestAPITokens(t *testing.T) {
	t.Parallel()
	e := newEnv(t, platformsim.Scenario{Name: "two teams", Prompt: "order and invoice",
		Steps:  []platformsim.Step{{{Name: "get_order"}, {Name: "get_invoice"}}},
		Answer: "order {{out \"get_order\"}}, invoice {{out \"get_invoice\"}}"})
	e.register("orders", "get_order", `{"type":"object"}`)
	e.register("billing", "get_invoice", `{"type":"object"}`)
	answer := func(c *protocol.Call) (string, bool) { return `"` + c.Function + ` of ` + c.Team + `"`, false }
	e.serve("orders", []string{"get_order"}, answer)
	e.serve("billing", []string{"get_invoice"}, answer)

	path := filepath.Join(t.TempDir(), "tokens.txt")
	tokens := tokensFile(t, path, "admin", "orders", "shipping")
	var logs testutil.Buffer
	file, err := apiauth.Open(path, apiauth.Options{Logger: slog.New(slog.NewTextHandler(&logs, nil)), Interval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	following := make(chan struct{})
	go func() { file.Run(ctx); close(following) }()
	t.Cleanup(func() { cancel(); <-following })

	d, _ := e.dispatcher(dispatch.Options{})
	hs := httptest.NewServer(httpapi.New(d, httpapi.Options{Authenticator: file}))
	t.Cleanup(hs.Close)
	ref := e.response("order and invoice")
	body := `{"platform":"responses","response_id":"` + ref.ResponseID + `"}`

	t.Run("without a known token: 401", func(t *testing.T) {
		for _, tc := range []struct{ name, method, path, token, body, challenge string }{
			{"no token, POST", http.MethodPost, "/v1/watch", "", body, `Bearer realm="toolrelay"`},
			{"no token, GET", http.MethodGet, "/v1/watch/w_x", "", "", `Bearer realm="toolrelay"`},
			{"no token, unknown route", http.MethodGet, "/v1/nothing", "", "", `Bearer realm="toolrelay"`},
			{"no token, MCP", http.MethodPost, "/mcp", "", "{}", `Bearer realm="toolrelay", resource_metadata="` + hs.URL + `/.well-known/oauth-protected-resource/mcp"`},
			{"unknown token", http.MethodPost, "/v1/watch", string(apiauth.NewToken()), body, `Bearer realm="toolrelay", error="invalid_token"`},
			{"the hash of a token", http.MethodGet, "/v1/watch/w_x", apiauth.Hash(apiauth.Token(tokens["admin"])), "", `Bearer realm="toolrelay", error="invalid_token"`},
		} {
			got := do(t, tc.method, hs.URL+tc.path, tc.token, tc.body)
			if got.status != http.StatusUnauthorized || got.challenge != tc.challenge || got.message() == "" {
				t.Errorf("%s: %d, WWW-Authenticate %q, message %q; want 401, %q and a message", tc.name, got.status, got.challenge, got.message(), tc.challenge)
			}
		}
		// Basic credentials are no bearer token.
		req, _ := http.NewRequest(http.MethodGet, hs.URL+"/v1/watch/w_x", nil)
		req.SetBasicAuth("admin", tokens["admin"])
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("basic auth: %d, want 401", resp.StatusCode)
		}
	})

	t.Run("open routes", func(t *testing.T) {
		for _, p := range []string{"/healthz", "/readyz"} {
			if got := do(t, http.MethodGet, hs.URL+p, "", ""); got.status != http.StatusOK {
				t.Errorf("GET %s without a token: %d, want 200", p, got.status)
			}
		}
		// The webhook is refused for its missing signature, not for a token.
		if got := do(t, http.MethodPost, hs.URL+"/webhooks/openai", "", "{}"); got.status != http.StatusUnauthorized || got.challenge != "" {
			t.Errorf("unsigned webhook: %d, WWW-Authenticate %q; want 401 from the signature check", got.status, got.challenge)
		}
	})

	// A team token may drive a platform object.
	got := do(t, http.MethodPost, hs.URL+"/v1/watch", tokens["orders"], body)
	var started struct{ ID, StatusURL string }
	if err := json.Unmarshal(got.body, &started); got.status != http.StatusAccepted || err != nil || started.ID == "" {
		t.Fatalf("POST /v1/watch with the orders token: %d %s; want 202", got.status, got.body)
	}
	statusURL := hs.URL + "/v1/watch/" + started.ID
	report := func(token string) (apiCall, watchJSON, map[string]any) {
		t.Helper()
		got := do(t, http.MethodGet, statusURL, token, "")
		var w watchJSON
		var raw map[string]any
		if got.status == http.StatusOK {
			if err := json.Unmarshal(got.body, &w); err != nil {
				t.Fatal(err)
			}
			_ = json.Unmarshal(got.body, &raw)
		}
		return got, w, raw
	}
	testutil.WaitForWhat(t, 20*time.Second, "the watch to end", func() bool {
		_, w, _ := report(tokens["admin"])
		return w.State != "" && w.State != string(dispatch.WatchActive)
	})
	calls := func(w watchJSON) map[string]callJSON {
		m := map[string]callJSON{}
		for _, tr := range w.TurnDetails {
			for _, c := range tr.Calls {
				m[c.Function] = c
			}
		}
		return m
	}

	t.Run("admin sees everything", func(t *testing.T) {
		got, w, _ := report(tokens["admin"])
		c := calls(w)
		if got.status != http.StatusOK || w.State != string(dispatch.WatchCompleted) || w.Answer == "" {
			t.Fatalf("%d, watch %s, answer %q; want 200, completed, an answer", got.status, w.State, w.Answer)
		}
		for _, fn := range []string{"get_order", "get_invoice"} {
			if c[fn].Output == nil || c[fn].Result != "ok" {
				t.Errorf("%s: %+v; want its output", fn, c[fn])
			}
		}
	})

	t.Run("a team sees its calls, and of the others' no results", func(t *testing.T) {
		got, w, raw := report(tokens["orders"])
		if got.status != http.StatusOK {
			t.Fatalf("%d %s; want 200", got.status, got.body)
		}
		c := calls(w)
		if o := c["get_order"]; o.Output == nil || *o.Output != `"get_order of orders"` || o.FinishedAt == "" {
			t.Errorf("its own call: %+v; want the whole result", o)
		}
		inv := c["get_invoice"]
		if inv.Team != "billing" || inv.Result != "ok" || inv.Output != nil || inv.OutputBytes != nil || inv.Executor != "" || inv.FinishedAt != "" {
			t.Errorf("billing's call: %+v; want its function, team and status only", inv)
		}
		if strings.Contains(string(got.body), "get_invoice of billing") {
			t.Errorf("billing's output shows: %s", got.body)
		}
		if w.Answer != "" || raw["answer_redacted"] != true {
			t.Errorf("answer %q, answer_redacted %v; want the answer left out (it draws on billing's result)", w.Answer, raw["answer_redacted"])
		}
		turns, _ := raw["turn_details"].([]any)
		if len(turns) != 1 || !strings.Contains(string(mustJSON(t, turns[0])), `"redacted":true`) {
			t.Errorf("billing's call is not marked redacted: %s", got.body)
		}
	})

	t.Run("a team with no call in the watch: 403", func(t *testing.T) {
		got, _, _ := report(tokens["shipping"])
		if got.status != http.StatusForbidden || !strings.Contains(got.message(), "shipping") {
			t.Errorf("%d %s; want 403 naming the token's teams", got.status, got.body)
		}
		if got := do(t, http.MethodGet, hs.URL+"/v1/watch/w_none", tokens["shipping"], ""); got.status != http.StatusNotFound {
			t.Errorf("an unknown watch: %d, want 404", got.status)
		}
	})

	t.Run("a changed file takes effect", func(t *testing.T) {
		old := tokens
		tokens = tokensFile(t, path, "admin", "billing")
		testutil.WaitForWhat(t, 10*time.Second, "the billing token to be known", func() bool {
			got, _, _ := report(tokens["billing"])
			return got.status == http.StatusOK
		})
		for _, name := range []string{"admin", "orders"} {
			if got, _, _ := report(old[name]); got.status != http.StatusUnauthorized {
				t.Errorf("the %s token taken out of the file: %d, want 401", name, got.status)
			}
		}
		if got, w, _ := report(tokens["billing"]); calls(w)["get_invoice"].Output == nil || calls(w)["get_order"].Output != nil {
			t.Errorf("billing's view: %s; want its call whole and orders' redacted", got.body)
		}
	})

	t.Run("a malformed file is refused; the last good tokens stay", func(t *testing.T) {
		newTok := apiauth.NewToken()
		entry, err := apiauth.NewEntry("newcomer", true, nil, newTok)
		if err != nil {
			t.Fatal(err)
		}
		writeFile(t, path, entry.String()+"\nbilling teams:billing\n")
		testutil.WaitForWhat(t, 10*time.Second, "the malformed line to be logged", func() bool { return strings.Contains(logs.String(), path+":2:") })
		if got, _, _ := report(tokens["admin"]); got.status != http.StatusOK {
			t.Errorf("the last good admin token: %d, want 200", got.status)
		}
		if got, _, _ := report(string(newTok)); got.status != http.StatusUnauthorized {
			t.Errorf("a token of the malformed file: %d, want 401", got.status)
		}
		if strings.Contains(logs.String(), string(newTok)) || strings.Contains(logs.String(), tokens["admin"]) {
			t.Error("a token was logged")
		}
	})
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Without an Authenticator, /v1 serves loopback clients only, judged by
// the connection's address, not by headers the client sends.
func TestAPIServesLoopbackOnlyWithoutTokens(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	d, _ := e.dispatcher(dispatch.Options{})
	h := httpapi.New(d, httpapi.Options{})
	serve := func(method, target, remote string, header http.Header) *httptest.ResponseRecorder {
		req := httptest.NewRequest(method, target, strings.NewReader(`{"platform":"agents","session_id":"sess_nope"}`))
		req.RemoteAddr = remote
		req.Host = "localhost:8080" // a loopback client's name for it
		for k, v := range header {
			req.Header[k] = v
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	for _, remote := range []string{"127.0.0.1:40000", "127.8.9.10:40000", "[::1]:40000", "[::ffff:127.0.0.1]:40000"} {
		// Past the guard: the watch is looked up and not found.
		if rec := serve(http.MethodGet, "/v1/watch/w_nope", remote, nil); rec.Code != http.StatusNotFound {
			t.Errorf("GET from %s: %d %s; want 404 (served)", remote, rec.Code, rec.Body)
		}
	}
	for _, tc := range []struct {
		remote string
		header http.Header
	}{
		{"10.1.2.3:40000", nil},
		{"[2001:db8::1]:40000", nil},
		{"192.0.2.7:40000", http.Header{"X-Forwarded-For": {"127.0.0.1"}, "X-Real-Ip": {"127.0.0.1"}}},
		{"192.0.2.7:40000", http.Header{"Authorization": {"Bearer anything"}}},
		{"", nil},
	} {
		for _, method := range []string{http.MethodGet, http.MethodPost} {
			target := "/v1/watch"
			if method == http.MethodGet {
				target = "/v1/watch/w_nope"
			}
			rec := serve(method, target, tc.remote, tc.header)
			var body struct{ Error struct{ Message string } }
			_ = json.Unmarshal(rec.Body.Bytes(), &body)
			if rec.Code != http.StatusUnauthorized || !strings.Contains(body.Error.Message, "TOOLRELAY_API_TOKENS_FILE") ||
				!strings.HasPrefix(rec.Header().Get("WWW-Authenticate"), "Bearer") {
				t.Errorf("%s %s from %q %v: %d %s; want 401 with a hint to set TOOLRELAY_API_TOKENS_FILE", method, target, tc.remote, tc.header, rec.Code, rec.Body)
			}
		}
	}
	if rec := serve(http.MethodGet, "/healthz", "10.1.2.3:40000", nil); rec.Code != http.StatusOK {
		t.Errorf("GET /healthz from a remote client: %d, want 200", rec.Code)
	}
}
