package dispatch_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/toolrelay/toolrelay/internal/apiauth"
	"github.com/toolrelay/toolrelay/internal/console"
	"github.com/toolrelay/toolrelay/internal/testutil"
	"github.com/toolrelay/toolrelay/pkg/dispatch"
	"github.com/toolrelay/toolrelay/pkg/dispatch/httpapi"
	"github.com/toolrelay/toolrelay/pkg/exec"
)

// The attacks of issue 39 on the HTTP and MCP listeners, each made and
// refused.

// openTokens writes a tokens file of names (see tokensFile) and opens it.
func openTokens(t *testing.T, names ...string) (*apiauth.File, map[string]string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tokens.txt")
	tokens := tokensFile(t, path, names...)
	file, err := apiauth.Open(path, apiauth.Options{Logger: testutil.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	return file, tokens
}

// mcpPost sends body to an /mcp as an MCP client would, with headers.
func mcpPost(t *testing.T, url, body string, header http.Header) (int, []byte) {
	t.Helper()
	resp, b := mcpExchange(t, url, body, header)
	return resp.StatusCode, b
}

// mcpRequest is a POST of body to an /mcp as an MCP client sends one, with
// headers.
func mcpRequest(t *testing.T, ctx context.Context, url, body string, header http.Header) *http.Request {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	for k, v := range header {
		req.Header[k] = v
	}
	return req
}

// mcpExchange is mcpPost returning the whole response (its body read).
func mcpExchange(t *testing.T, url, body string, header http.Header) (*http.Response, []byte) {
	t.Helper()
	resp, err := http.DefaultClient.Do(mcpRequest(t, context.Background(), url, body, header))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}

// A JSON-RPC batch of 3,000 tools/call in one POST is refused whole, with a
// JSON-RPC error, whatever protocol version the client names (the SDK
// itself takes batches from clients of 2025-03-26 and older, or that name
// none); nothing runs.
func TestMCPRefusesBatches(t *testing.T) {
	t.Parallel()
	f := &mcpFleet{e: newEnv(t), rec: tracetest.NewSpanRecorder()}
	f.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(f.rec))
	d, _ := f.e.dispatcher(dispatch.Options{})
	f.executor(t, "orders", exec.Function{Name: "echo", Parameters: json.RawMessage(echoSchema), Concurrency: 64,
		Handler: exec.HandlerFunc(func(_ context.Context, inv *exec.Invocation) ([]byte, error) {
			f.ran.Add(1)
			return inv.Call.Arguments, nil
		})})
	hs := httptest.NewServer(httpapi.New(d, httpapi.Options{Logger: testutil.Logger(t)}))
	t.Cleanup(hs.Close)

	calls := make([]string, 3000)
	for i := range calls {
		calls[i] = fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"echo","arguments":{"n":%d}}}`, i+1, i)
	}
	batch := "\n [" + strings.Join(calls, ",") + "]"
	for _, version := range []string{"", "2024-11-05", "2025-03-26", "2025-11-25"} {
		header := http.Header{}
		if version != "" {
			header.Set("Mcp-Protocol-Version", version)
		}
		status, body := mcpPost(t, hs.URL+"/mcp", batch, header)
		var reply struct {
			JSONRPC string          `json:"jsonrpc"`
			ID      json.RawMessage `json:"id"`
			Error   struct {
				Code    int64
				Message string
			}
		}
		if err := json.Unmarshal(body, &reply); err != nil || status != http.StatusBadRequest || reply.JSONRPC != "2.0" ||
			string(reply.ID) != "null" || reply.Error.Code != -32600 || !strings.Contains(reply.Error.Message, "batches are not accepted") {
			t.Errorf("batch (version %q): %d %.300s; want 400 with a JSON-RPC error -32600 (%v)", version, status, body, err)
		}
	}
	// One call in one POST still works, and none of the batch's ran.
	status, body := mcpPost(t, hs.URL+"/mcp", calls[0], nil)
	if status != http.StatusOK || !strings.Contains(string(body), `\"n\":0`) && !strings.Contains(string(body), `"n":0`) {
		t.Errorf("one call: %d %.300s", status, body)
	}
	if n := f.ran.Load(); n != 1 {
		t.Errorf("the executor ran %d calls; want the single call's 1", n)
	}
}

// One caller holds MaxMCPCallsPerCaller calls running: one more fails at
// once, saying why, and the attack of issue 39 meanwhile (POSTs of 3,000
// tools/call, each 22 s of work when batches were taken, and calls past
// the limit) leaves another team's caller near its baseline: its median
// call during the attack within three times its median before, plus
// 250 ms. The attack is paced (20 POSTs a second), so that what the bound
// measures is the dispatcher's work for it, not the test's own clients
// taking both of a small machine's cores.
func TestMCPCallsPerCaller(t *testing.T) {
	t.Parallel()
	const limit = 4
	e := newEnv(t)
	file, tokens := openTokens(t, "orders", "billing")
	f := &mcpFleet{e: e, rec: tracetest.NewSpanRecorder()}
	f.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(f.rec))
	d, _ := e.dispatcher(dispatch.Options{})
	release := make(chan struct{})
	var running atomic.Int32
	f.executor(t, "orders", exec.Function{Name: "hold", Concurrency: 64,
		Handler: exec.HandlerFunc(func(ctx context.Context, _ *exec.Invocation) ([]byte, error) {
			running.Add(1)
			defer running.Add(-1)
			select {
			case <-release:
				return []byte(`"released"`), nil
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		})})
	f.executor(t, "billing", exec.Function{Name: "invoice",
		Handler: exec.HandlerFunc(func(context.Context, *exec.Invocation) ([]byte, error) { return []byte(`"invoice 7"`), nil })})
	hs := httptest.NewServer(httpapi.New(d, httpapi.Options{Authenticator: file, MaxMCPCallsPerCaller: limit, Logger: testutil.Logger(t)}))
	t.Cleanup(hs.Close)
	ctx := t.Context()
	session := func(team string) *mcp.ClientSession {
		return connect(t, ctx, &roundRobin{urls: []string{hs.URL + "/mcp"}, header: http.Header{"Authorization": {"Bearer " + tokens[team]}}}, nil)
	}
	orders, billing := session("orders"), session("billing")
	invoice := func() time.Duration {
		t.Helper()
		start := time.Now()
		res, err := billing.CallTool(ctx, &mcp.CallToolParams{Name: "invoice", Arguments: map[string]any{}})
		if err != nil || res.IsError {
			t.Fatalf("billing's call: %v %+v", err, res)
		}
		return time.Since(start)
	}
	median := func(ds []time.Duration) time.Duration { slices.Sort(ds); return ds[len(ds)/2] }

	var before []time.Duration
	for range 15 {
		before = append(before, invoice())
	}

	var held sync.WaitGroup
	for range limit {
		held.Go(func() {
			res, err := orders.CallTool(ctx, &mcp.CallToolParams{Name: "hold", Arguments: map[string]any{}})
			if err != nil || res.IsError || text(res) != `"released"` {
				t.Errorf("a held call: %v %+v", err, res)
			}
		})
	}
	testutil.WaitForWhat(t, 10*time.Second, fmt.Sprintf("%d of orders' calls to run", limit), func() bool { return running.Load() == limit })
	res, err := orders.CallTool(ctx, &mcp.CallToolParams{Name: "hold", Arguments: map[string]any{}})
	if err != nil || !res.IsError || !strings.Contains(text(res), "TOOLRELAY_MAX_MCP_CALLS_PER_CALLER") || res.Meta[metaErrorType] != "unavailable" {
		t.Fatalf("call %d of one caller: %v %+v; want a failed call naming the limit", limit+1, err, res)
	}

	// The flood, as the attack made it: orders posts batches of 3,000
	// tools/call (321 KB each) and single calls past its limit, on 8
	// connections, with a plain HTTP client (what it costs the server,
	// not an SDK client's own work, is what billing must not feel).
	single := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"hold","arguments":{}}}`
	calls := make([]string, 3000)
	for i := range calls {
		calls[i] = strings.Replace(single, `"id":1`, fmt.Sprintf(`"id":%d`, i+1), 1)
	}
	batch := "[" + strings.Join(calls, ",") + "]"
	fctx, stopFlood := context.WithCancel(ctx)
	var flood sync.WaitGroup
	var refused atomic.Int64
	for i := range 2 {
		body := single
		if i%2 == 0 {
			body = batch
		}
		flood.Go(func() {
			pace := time.NewTicker(100 * time.Millisecond)
			defer pace.Stop()
			for ; fctx.Err() == nil; <-pace.C {
				req, _ := http.NewRequestWithContext(fctx, http.MethodPost, hs.URL+"/mcp", strings.NewReader(body))
				req.Header.Set("Authorization", "Bearer "+tokens["orders"])
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Accept", "application/json, text/event-stream")
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					continue
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if strings.Contains(string(b), "batches are not accepted") || strings.Contains(string(b), "TOOLRELAY_MAX_MCP_CALLS_PER_CALLER") {
					refused.Add(1)
				}
			}
		})
	}
	testutil.WaitForWhat(t, 10*time.Second, "the flood to be refused", func() bool { return refused.Load() > 10 })
	var during []time.Duration
	for range 15 {
		during = append(during, invoice())
	}
	stopFlood()
	flood.Wait()
	close(release)
	held.Wait()

	bound := 3*median(before) + 250*time.Millisecond
	t.Logf("billing's median call: %v before, %v during a flood of %d refused calls (bound %v)", median(before), median(during), refused.Load(), bound)
	if median(during) > bound {
		t.Errorf("billing's median call during orders' flood: %v; want at most %v (3 × %v + 250 ms)", median(during), bound, median(before))
	}
	if n := running.Load(); n != 0 {
		t.Errorf("%d calls still running", n)
	}
}

// A caller holding MaxStreamsPerCaller event streams gets 429 for one more;
// another caller does not, and a closed stream frees its place.
func TestStreamsPerCaller(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	file, tokens := openTokens(t, "orders", "billing")
	d, _ := e.dispatcher(dispatch.Options{})
	hs := httptest.NewServer(httpapi.New(d, httpapi.Options{Authenticator: file, MaxStreamsPerCaller: 2, Logger: testutil.Logger(t)}))
	t.Cleanup(hs.Close)

	open := func(team string) (*http.Response, context.CancelFunc) {
		t.Helper()
		ctx, cancel := context.WithCancel(t.Context())
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, hs.URL+"/v1/turns/stream", nil)
		req.Header.Set("Authorization", "Bearer "+tokens[team])
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cancel(); resp.Body.Close() })
		return resp, cancel
	}
	snapshot := func(resp *http.Response) {
		t.Helper()
		line, err := bufio.NewReader(resp.Body).ReadString('\n')
		if resp.StatusCode != http.StatusOK || err != nil || !strings.HasPrefix(line, "retry:") {
			t.Fatalf("a stream: %d %q %v; want 200 and its first event", resp.StatusCode, line, err)
		}
	}
	first, closeFirst := open("orders")
	snapshot(first)
	second, _ := open("orders")
	snapshot(second)
	third, _ := open("orders")
	b, _ := io.ReadAll(third.Body)
	if third.StatusCode != http.StatusTooManyRequests || !strings.Contains(string(b), "TOOLRELAY_MAX_STREAMS_PER_CALLER") || third.Header.Get("Retry-After") == "" {
		t.Errorf("orders' third stream: %d %s; want 429 naming the limit, with Retry-After", third.StatusCode, b)
	}
	other, _ := open("billing")
	snapshot(other)

	closeFirst()
	testutil.WaitForWhat(t, 10*time.Second, "a closed stream to free its place", func() bool {
		resp, cancel := open("orders")
		defer cancel()
		return resp.StatusCode == http.StatusOK
	})
}

// A client that sends its body a byte at a time, or its headers, is cut off
// within the read timeout, on routes that need no caller.
func TestSlowRequestsAreCutOff(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	d, _ := e.dispatcher(dispatch.Options{})
	const timeout = 300 * time.Millisecond
	timeouts := httpapi.Timeouts{ReadHeader: timeout, Read: timeout}
	hs := httptest.NewUnstartedServer(nil)
	hs.Config = httpapi.NewServer(httpapi.New(d, httpapi.Options{Timeouts: timeouts, Logger: testutil.Logger(t)}), timeouts)
	hs.Start()
	t.Cleanup(hs.Close)

	for name, head := range map[string]string{
		"webhook body": "POST /webhooks/openai HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{",
		"mcp body": "POST /mcp HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n" +
			"Accept: application/json, text/event-stream\r\nContent-Length: 100000\r\n\r\n{",
		"headers": "POST /webhooks/openai HTTP/1.1\r\nHost: localhost\r\n",
	} {
		t.Run(name, func(t *testing.T) {
			conn, err := net.Dial("tcp", hs.Listener.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			start := time.Now()
			if _, err := io.WriteString(conn, head); err != nil {
				t.Fatal(err)
			}
			// Dribble a byte every 50 ms, as the attack did every 5 s.
			stop := make(chan struct{})
			var dribble sync.WaitGroup
			dribble.Go(func() {
				tick := time.NewTicker(50 * time.Millisecond)
				defer tick.Stop()
				for {
					select {
					case <-stop:
						return
					case <-tick.C:
						if _, err := conn.Write([]byte(" ")); err != nil {
							return
						}
					}
				}
			})
			defer func() { close(stop); dribble.Wait() }()
			_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
			answer, err := io.ReadAll(conn) // until the server closes
			elapsed := time.Since(start)
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				t.Fatalf("the connection was still open after %v", elapsed)
			}
			t.Logf("closed after %v: %.80q", elapsed, answer)
			if elapsed > 10*timeout {
				t.Errorf("closed after %v; want within about the read timeout (%v)", elapsed, timeout)
			}
		})
	}
}

// Without tokens, a web page cannot use a browser on the dispatcher's host:
// not by DNS rebinding (another Host), not from another origin, not with a
// form. /metrics, guarded, answers loopback clients only.
func TestLoopbackRefusesOtherSitesPages(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	d, _ := e.dispatcher(dispatch.Options{})
	metrics := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, `toolrelay_calls_total{team="billing",function="invoice"} 1`+"\n")
	})
	api := httpapi.New(d, httpapi.Options{Logger: testutil.Logger(t), Metrics: metrics, GuardMetrics: true})
	mux := http.NewServeMux()
	mux.Handle("/", api)
	ui, err := console.New(d, api, console.Options{Logger: testutil.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	ui.Mount(mux)
	hs := httptest.NewServer(mux)
	t.Cleanup(hs.Close)

	const watch = `{"platform":"responses","response_id":"resp_from_a_page"}`
	for _, tc := range []struct {
		name, method, path, body string
		header                   http.Header
		want                     int
	}{
		{"rebinding /v1/turns", "GET", "/v1/turns", "", http.Header{"Host": {"rebind.attacker.example"}}, http.StatusMisdirectedRequest},
		{"rebinding /v1/functions", "GET", "/v1/functions", "", http.Header{"Host": {"rebind.attacker.example:8080"}}, http.StatusMisdirectedRequest},
		{"rebinding /v1/deadletters", "GET", "/v1/deadletters", "", http.Header{"Host": {"rebind.attacker.example"}}, http.StatusMisdirectedRequest},
		{"rebinding /ui", "GET", "/ui", "", http.Header{"Host": {"rebind.attacker.example"}}, http.StatusMisdirectedRequest},
		{"rebinding /ui/turns", "GET", "/ui/turns", "", http.Header{"Host": {"rebind.attacker.example"}}, http.StatusMisdirectedRequest},
		{"rebinding /metrics", "GET", "/metrics", "", http.Header{"Host": {"rebind.attacker.example"}}, http.StatusMisdirectedRequest},
		{"rebinding /mcp", "POST", "/mcp", "{}", http.Header{"Host": {"rebind.attacker.example"}, "Content-Type": {"application/json"}}, http.StatusMisdirectedRequest},
		{"cross-site text/plain POST /v1/watch", "POST", "/v1/watch", watch,
			http.Header{"Content-Type": {"text/plain"}, "Origin": {"https://attacker.example"}, "Sec-Fetch-Site": {"cross-site"}, "Sec-Fetch-Mode": {"no-cors"}}, http.StatusForbidden},
		{"text/plain POST /v1/watch, Origin only", "POST", "/v1/watch", watch, http.Header{"Content-Type": {"text/plain"}, "Origin": {"null"}}, http.StatusForbidden},
		{"form POST /v1/watch, no Origin", "POST", "/v1/watch", watch, http.Header{"Content-Type": {"application/x-www-form-urlencoded"}, "Sec-Fetch-Site": {"same-origin"}, "Sec-Fetch-Mode": {"navigate"}}, http.StatusUnsupportedMediaType},
		{"cross-origin fetch of /v1/turns", "GET", "/v1/turns", "", http.Header{"Origin": {"http://localhost:9999"}}, http.StatusForbidden},
		{"cross-site fetch of /metrics", "GET", "/metrics", "", http.Header{"Sec-Fetch-Site": {"cross-site"}, "Sec-Fetch-Mode": {"cors"}}, http.StatusForbidden},
		// What still works: the dispatcher's own names, its own pages, a
		// link from elsewhere, non-browser clients, webhooks.
		{"/v1/turns as localhost", "GET", "/v1/turns", "", http.Header{"Host": {"localhost"}}, http.StatusOK},
		{"/v1/turns as ::1", "GET", "/v1/turns", "", http.Header{"Host": {"[::1]:8080"}}, http.StatusOK},
		{"a link to the console", "GET", "/ui/turns", "", http.Header{"Sec-Fetch-Site": {"cross-site"}, "Sec-Fetch-Mode": {"navigate"}}, http.StatusOK},
		{"/metrics", "GET", "/metrics", "", nil, http.StatusOK},
		{"the console's replay", "POST", "/v1/deadletters/replay", `{"keys":[]}`, http.Header{"X-Toolrelay-Console": {"1"}, "Sec-Fetch-Site": {"same-origin"}}, http.StatusBadRequest},
		{"a JSON POST /v1/watch, bad body", "POST", "/v1/watch", `{}`, http.Header{"Content-Type": {"application/json"}}, http.StatusBadRequest},
		{"curl -d: a form's type, no browser's headers, bad body", "POST", "/v1/watch", `{}`, http.Header{"Content-Type": {"application/x-www-form-urlencoded"}}, http.StatusBadRequest},
		{"a webhook under a public name", "POST", "/webhooks/openai", `{}`, http.Header{"Host": {"toolrelay.example.com"}}, http.StatusUnauthorized},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest(tc.method, hs.URL+tc.path, strings.NewReader(tc.body))
			for k, v := range tc.header {
				if k == "Host" {
					req.Host = v[0]
					continue
				}
				req.Header[k] = v
			}
			client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tc.want {
				t.Errorf("%s %s %v: %d %.300s; want %d", tc.method, tc.path, tc.header, resp.StatusCode, b, tc.want)
			}
			if tc.want >= 400 && !strings.Contains(string(b), `"message"`) {
				t.Errorf("%s %s: %.300s; want a JSON error saying why", tc.method, tc.path, b)
			}
		})
	}
	if ws, err := d.InspectWatches(t.Context(), dispatch.Caller{Admin: true}); err != nil || len(ws) != 0 {
		t.Errorf("watches after the refused requests: %v %v; want none", ws, err)
	}

	// From another host: 401, whatever it sends.
	req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
	req.RemoteAddr = "192.0.2.7:40000"
	req.Header.Set("X-Forwarded-For", "127.0.0.1")
	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, req)
	if rec.Code != http.StatusUnauthorized || strings.Contains(rec.Body.String(), "billing") {
		t.Errorf("GET /metrics from 192.0.2.7: %d %s; want 401", rec.Code, rec.Body)
	}
}

// /metrics is open by default, as /healthz is (DESIGN.md); guarded, with
// tokens, it needs an admin token.
func TestMetricsNeedAnAdminTokenWhenGuarded(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	file, tokens := openTokens(t, "admin", "orders")
	d, _ := e.dispatcher(dispatch.Options{})
	metrics := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "toolrelay_turns_open 0\n") })
	open := httptest.NewServer(httpapi.New(d, httpapi.Options{Authenticator: file, Metrics: metrics, Logger: testutil.Logger(t)}))
	t.Cleanup(open.Close)
	if got := do(t, http.MethodGet, open.URL+"/metrics", "", ""); got.status != http.StatusOK {
		t.Errorf("GET /metrics, not guarded, with no token: %d %s; want 200", got.status, got.body)
	}
	hs := httptest.NewServer(httpapi.New(d, httpapi.Options{Authenticator: file, Metrics: metrics, GuardMetrics: true, Logger: testutil.Logger(t)}))
	t.Cleanup(hs.Close)
	for token, want := range map[string]int{"": http.StatusUnauthorized, tokens["orders"]: http.StatusForbidden, tokens["admin"]: http.StatusOK} {
		if got := do(t, http.MethodGet, hs.URL+"/metrics", token, ""); got.status != want {
			t.Errorf("GET /metrics with %s: %d %s; want %d", map[bool]string{true: "no token", false: "a token"}[token == ""], got.status, got.body, want)
		}
	}
}
