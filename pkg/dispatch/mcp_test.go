package dispatch_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/toolrelay/toolrelay/internal/apiauth"
	"github.com/toolrelay/toolrelay/internal/testutil"
	"github.com/toolrelay/toolrelay/pkg/dispatch"
	"github.com/toolrelay/toolrelay/pkg/dispatch/httpapi"
	"github.com/toolrelay/toolrelay/pkg/exec"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// These tests drive /mcp with the official MCP Go SDK's client against real
// dispatchers and real executors (pkg/exec) on an embedded JetStream
// server.

// mcpFleet is a JetStream server, executors of two teams and dispatcher
// replicas, each serving its HTTP API, all tracing into one recorder.
type mcpFleet struct {
	e     *env
	rec   *tracetest.SpanRecorder
	tp    *sdktrace.TracerProvider
	urls  []string // each replica's /mcp
	ran   atomic.Int32
	marks string // where the command functions leave their marks

	mu sync.Mutex
	// takenIn and submitted name the replica that took each turn in (the
	// one the request reached) and the one that submitted it.
	takenIn, submitted map[protocol.TurnKey]string
}

// handedOver counts the turns one replica took in and another submitted:
// the request's replica learned the outcome from the turn record.
func (f *mcpFleet) handedOver() (n, total int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for key, by := range f.submitted {
		if f.takenIn[key] != by {
			n++
		}
	}
	return n, len(f.submitted)
}

// metaErrorType is where a failed call's result names its error type.
const metaErrorType = "io.toolrelay/error_type"

// Schemas of the test functions.
const (
	echoSchema   = `{"type":"object","properties":{"n":{"type":"integer"}},"required":["n"],"additionalProperties":false}`
	citySchema   = `{"type":"object","properties":{"city":{"type":"string","minLength":2}},"required":["city"],"additionalProperties":false}`
	sleepySchema = `{"type":"object","properties":{}}`
)

func newMCPFleet(t *testing.T, replicas int, opts dispatch.Options) *mcpFleet {
	t.Helper()
	f := &mcpFleet{e: newEnv(t), rec: tracetest.NewSpanRecorder(), marks: t.TempDir()}
	f.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(f.rec))
	t.Cleanup(func() { _ = f.tp.Shutdown(context.Background()) })

	mark := filepath.Join(f.marks, "city-ran")
	city, err := exec.CommandHandler([]string{"sh", "-c", `cat > "$1"; echo '"Seattle is the Emerald City"'`, "sh", mark})
	if err != nil {
		t.Fatal(err)
	}
	sleepy, err := exec.CommandHandler([]string{"sh", "-c", `echo $$ > "$1.tmp" && mv "$1.tmp" "$1"; exec sleep 60`, "sh", filepath.Join(f.marks, "sleepy.pid")})
	if err != nil {
		t.Fatal(err)
	}
	opts.TracerProvider = f.tp
	f.takenIn, f.submitted = map[protocol.TurnKey]string{}, map[protocol.TurnKey]string{}
	for i := range replicas {
		o := opts
		o.Name = fmt.Sprintf("replica-%d", i)
		o.OnEvent = func(e dispatch.Event) {
			f.mu.Lock()
			defer f.mu.Unlock()
			switch e.Kind {
			case dispatch.EventTurnStarted:
				f.takenIn[e.Turn.Key] = o.Name
			case dispatch.EventTurnSubmitted:
				f.submitted[e.Turn.Key] = e.Turn.Outcome().Owner
			}
		}
		d, _ := f.e.dispatcher(o)
		hs := httptest.NewServer(httpapi.New(d, httpapi.Options{TracerProvider: f.tp}))
		t.Cleanup(hs.Close)
		f.urls = append(f.urls, hs.URL+"/mcp")
	}
	// Executors declare their functions to a dispatcher: they start after.
	f.executor(t, "orders",
		exec.Function{Name: "echo", Description: "Echoes n.", Parameters: json.RawMessage(echoSchema), Concurrency: 64,
			Handler: exec.HandlerFunc(func(_ context.Context, inv *exec.Invocation) ([]byte, error) {
				f.ran.Add(1)
				return fmt.Appendf(nil, `{"echo":%s,"executor":%q}`, inv.Call.Arguments, "orders"), nil
			})},
		exec.Function{Name: "city_nickname", Description: "The nickname of a city.", Parameters: json.RawMessage(citySchema), Handler: city},
		exec.Function{Name: "sleepy", Description: "Sleeps a minute.", Parameters: json.RawMessage(sleepySchema), Handler: sleepy, SideEffects: true},
		exec.Function{Name: "slow", Description: "Takes a while.", Timeout: time.Second,
			Handler: exec.HandlerFunc(func(ctx context.Context, _ *exec.Invocation) ([]byte, error) {
				<-ctx.Done()
				return nil, ctx.Err()
			})},
	)
	f.executor(t, "billing", exec.Function{Name: "invoice", Description: "An invoice.",
		Handler: exec.HandlerFunc(func(context.Context, *exec.Invocation) ([]byte, error) { return []byte(`"invoice 7"`), nil })})

	return f
}

// executor runs an executor of team serving fns until the test ends (or
// stop is called), and waits until the registry shows them served.
func (f *mcpFleet) executor(t *testing.T, team string, fns ...exec.Function) (stop func()) {
	t.Helper()
	_, js := f.e.srv.Connect(t)
	ex, err := exec.New(js, team, exec.Options{Logger: testutil.Logger(t), TracerProvider: f.tp})
	if err != nil {
		t.Fatal(err)
	}
	for _, fn := range fns {
		if err := ex.Register(fn); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ex.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("executor %s: %v", team, err)
			}
		})
	}
	t.Cleanup(stop)
	testutil.WaitForWhat(t, 10*time.Second, team+"'s functions to be served", func() bool {
		specs, err := dispatch.Functions(context.Background(), js)
		served := 0
		for _, s := range specs {
			for _, fn := range fns {
				if s.Name == fn.Name {
					served++
				}
			}
		}
		return err == nil && served == len(fns)
	})
	return stop
}

// protocolVersion is the MCP protocol version the test clients ask for;
// empty: the SDK's newest (sessionless) one. Tests that depend on how a
// request ends run with both that and the last one with an initialize
// handshake, which the platforms' clients still speak.
type protocolVersion string

var protocolVersions = []protocolVersion{"", "2025-11-25"}

func (v protocolVersion) String() string {
	if v == "" {
		return "newest protocol"
	}
	return "protocol " + string(v)
}

// roundRobin sends each request to the next replica in turn, and notes any
// request that carries a session ID: a stateless server needs none.
type roundRobin struct {
	urls       []string
	version    protocolVersion
	next       atomic.Int64
	perReplica []atomic.Int64
	sessions   atomic.Int64
	header     http.Header // set on every request
	host       string      // when set, the Host of every request
	// keepOpen keeps a request open when the client gives up on it, as the
	// Python SDK does: the server hears of a cancelled call only from a
	// notifications/cancelled.
	keepOpen bool

	mu     sync.Mutex
	method map[string]int // the replica the last request of each method reached
}

func (rr *roundRobin) RoundTrip(req *http.Request) (*http.Response, error) {
	i := int(rr.next.Add(1)-1) % len(rr.urls)
	rr.perReplica[i].Add(1)
	if req.Header.Get("Mcp-Session-Id") != "" {
		rr.sessions.Add(1)
	}
	if req.Body != nil && req.GetBody != nil {
		if body, err := req.GetBody(); err == nil {
			var msg struct{ Method string }
			_ = json.NewDecoder(body).Decode(&msg)
			rr.mu.Lock()
			if rr.method == nil {
				rr.method = map[string]int{}
			}
			rr.method[msg.Method] = i
			rr.mu.Unlock()
		}
	}
	r := req.Clone(req.Context())
	if rr.keepOpen {
		r = req.Clone(context.WithoutCancel(req.Context()))
	}
	target, err := http.NewRequest(req.Method, rr.urls[i], nil)
	if err != nil {
		return nil, err
	}
	r.URL, r.Host = target.URL, target.URL.Host
	if rr.host != "" {
		r.Host = rr.host
	}
	for k, v := range rr.header {
		r.Header[k] = v
	}
	if rr.keepOpen {
		return keepOpen(req.Context(), r)
	}
	return http.DefaultTransport.RoundTrip(r)
}

// keepOpen sends r, whose context does not end, and returns its response
// or ctx's error, whichever comes first. The request stays open after ctx
// ends, and after its response's body is closed, until the server ends it.
func keepOpen(ctx context.Context, r *http.Request) (*http.Response, error) {
	type answer struct {
		resp *http.Response
		err  error
	}
	answered := make(chan answer, 1)
	go func() {
		resp, err := http.DefaultTransport.RoundTrip(r)
		if resp != nil {
			resp.Body = drainOnClose{resp.Body}
		}
		answered <- answer{resp, err}
	}()
	select {
	case a := <-answered:
		return a.resp, a.err
	case <-ctx.Done():
		go func() {
			if a := <-answered; a.resp != nil {
				_ = a.resp.Body.Close()
			}
		}()
		return nil, ctx.Err()
	}
}

// drainOnClose reads the rest of a body when it is closed, in the
// background: the request stays open until the server ends it.
type drainOnClose struct{ io.ReadCloser }

func (b drainOnClose) Close() error {
	go func() {
		_, _ = io.Copy(io.Discard, b.ReadCloser)
		_ = b.ReadCloser.Close()
	}()
	return nil
}

// replicaOf is the replica the last request of method reached, or -1.
func (rr *roundRobin) replicaOf(method string) int {
	rr.mu.Lock()
	defer rr.mu.Unlock()
	if i, ok := rr.method[method]; ok {
		return i
	}
	return -1
}

// connect opens an MCP client session through rr.
func connect(t *testing.T, ctx context.Context, rr *roundRobin, copts *mcp.ClientOptions) *mcp.ClientSession {
	t.Helper()
	rr.perReplica = make([]atomic.Int64, len(rr.urls))
	client := mcp.NewClient(&mcp.Implementation{Name: "toolrelay-test", Version: "1"}, copts)
	s, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: rr.urls[0], HTTPClient: &http.Client{Transport: rr}},
		&mcp.ClientSessionOptions{ProtocolVersion: string(rr.version)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func text(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// Two replicas answer alternately with no session ID: the tools are the
// live registry's with their schemas and annotations, and calls succeed
// whichever replica takes them and whichever gathers their results.
func TestMCPListAndCallAcrossReplicas(t *testing.T) {
	t.Parallel()
	forEachVersion(t, (*mcpFleet).listAndCall)
}

func (f *mcpFleet) listAndCall(t *testing.T, version protocolVersion) {
	ctx := t.Context()
	rr := &roundRobin{urls: f.urls, version: version}
	s := connect(t, ctx, rr, nil)

	for range 2 { // once through each replica
		list, err := s.ListTools(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		byName := map[string]*mcp.Tool{}
		for _, tool := range list.Tools {
			names = append(names, tool.Name)
			byName[tool.Name] = tool
		}
		if want := []string{"city_nickname", "echo", "invoice", "sleepy", "slow"}; !slices.Equal(names, want) {
			t.Fatalf("tools/list: %v, want %v", names, want)
		}
		schema, _ := json.Marshal(byName["echo"].InputSchema)
		if !jsonEqual(t, schema, []byte(echoSchema)) || byName["echo"].Description != "Echoes n." {
			t.Errorf("echo listed as %s %q; want its declared schema and description", schema, byName["echo"].Description)
		}
		if a := byName["sleepy"].Annotations; a == nil || a.DestructiveHint == nil || !*a.DestructiveHint || a.IdempotentHint || a.ReadOnlyHint {
			t.Errorf("a side-effect function's annotations: %+v; want destructive, not idempotent, not read-only", a)
		}
		if a := byName["echo"].Annotations; a == nil || !a.IdempotentHint || a.ReadOnlyHint {
			t.Errorf("a function without side effects: %+v; want idempotent, and no read-only claim", a)
		}
	}
	for i := range 6 {
		res, err := s.CallTool(ctx, &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"n": i}})
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		want := fmt.Sprintf(`{"echo":{"n":%d},"executor":"orders"}`, i)
		if res.IsError || text(res) != want {
			t.Fatalf("call %d: isError %v, %q; want %q", i, res.IsError, text(res), want)
		}
		sc, _ := json.Marshal(res.StructuredContent)
		if !jsonEqual(t, sc, []byte(want)) {
			t.Errorf("call %d: structuredContent %s, want the output object", i, sc)
		}
	}
	res, err := s.CallTool(ctx, &mcp.CallToolParams{Name: "invoice", Arguments: map[string]any{}})
	if err != nil || res.IsError || text(res) != `"invoice 7"` || res.StructuredContent != nil {
		t.Errorf("invoice: %v %+v; want the text and no structured content (the output is not an object)", err, res)
	}
	if rr.sessions.Load() != 0 {
		t.Errorf("%d requests carried a session ID; a stateless server sets none", rr.sessions.Load())
	}
	for i := range rr.perReplica {
		if n := rr.perReplica[i].Load(); n < 4 {
			t.Errorf("replica %d answered %d requests; want both to take turns", i, n)
		}
	}

	_, err = s.CallTool(ctx, &mcp.CallToolParams{Name: "no_such_tool", Arguments: map[string]any{}})
	if err == nil || !strings.Contains(err.Error(), `unknown tool "no_such_tool"`) {
		t.Errorf("unknown tool: %v; want a JSON-RPC error naming it", err)
	}
}

func jsonEqual(t *testing.T, a, b []byte) bool {
	t.Helper()
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	return fmt.Sprint(x) == fmt.Sprint(y)
}

// A hundred calls at once through two replicas each get their own result.
// Each turn is submitted by the replica that owns it, the one that took it
// in, whichever replica its result reaches; the request's replica learns
// the outcome from the turn record.
func TestMCPConcurrentCalls(t *testing.T) {
	t.Parallel()
	metrics := sdkmetric.NewManualReader()
	f := newMCPFleet(t, 2, dispatch.Options{MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(metrics))})
	ctx := t.Context()
	s := connect(t, ctx, &roundRobin{urls: f.urls}, nil)
	const n = 100
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			res, err := s.CallTool(ctx, &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"n": i}})
			switch {
			case err != nil:
				errs <- fmt.Errorf("call %d: %w", i, err)
			case res.IsError || !strings.Contains(text(res), `{"n":`+strconv.Itoa(i)+`}`):
				errs <- fmt.Errorf("call %d: isError %v, %q", i, res.IsError, text(res))
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if got := f.ran.Load(); got != n {
		t.Errorf("the function ran %d times for %d calls", got, n)
	}
	if got := counterBy(t, metrics, "toolrelay.turns.taken_in", "channel")["mcp"]; got != n {
		t.Errorf("turns taken in on channel mcp: %d, want %d", got, n)
	}
	// A turn is reported submitted just after its record says so, which
	// is what released its request.
	testutil.WaitForWhat(t, 5*time.Second, "every turn to be reported submitted", func() bool { _, total := f.handedOver(); return total == n })
	handed, total := f.handedOver()
	switch {
	case total != n:
		t.Errorf("%d of %d turns submitted", total, n)
	case handed != 0:
		t.Errorf("%d of %d turns submitted by the replica that did not take them in; want each by its owner", handed, total)
	default:
		t.Logf("%d of %d calls were submitted by the other replica", handed, total)
	}
}

// Arguments that break the schema are an isError result with the message
// the platforms get, and the command never runs. A function's own timeout
// bounds the call.
func TestMCPFailedCalls(t *testing.T) {
	t.Parallel()
	f := newMCPFleet(t, 1, dispatch.Options{})
	ctx := t.Context()
	s := connect(t, ctx, &roundRobin{urls: f.urls}, nil)

	for _, args := range []map[string]any{{}, {"city": 7}, {"city": "x"}, {"city": "Paris", "extra": true}} {
		res, err := s.CallTool(ctx, &mcp.CallToolParams{Name: "city_nickname", Arguments: args})
		if err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		if !res.IsError || !strings.Contains(text(res), "city_nickname") || res.Meta[metaErrorType] != "invalid_arguments" {
			t.Errorf("%v: isError %v, %q, meta %v; want an invalid_arguments failure naming the function", args, res.IsError, text(res), res.Meta)
		}
	}
	if _, err := os.Stat(filepath.Join(f.marks, "city-ran")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the command ran for invalid arguments (stat: %v)", err)
	}
	res, err := s.CallTool(ctx, &mcp.CallToolParams{Name: "city_nickname", Arguments: map[string]any{"city": "Seattle"}})
	if err != nil || res.IsError || strings.TrimSpace(text(res)) != `"Seattle is the Emerald City"` {
		t.Fatalf("valid arguments: %v %+v", err, res)
	}

	start := time.Now()
	res, err = s.CallTool(ctx, &mcp.CallToolParams{Name: "slow", Arguments: map[string]any{}})
	if err != nil {
		t.Fatal(err)
	}
	if !res.IsError || !strings.Contains(text(res), "timed out") || res.Meta[metaErrorType] != "timeout" {
		t.Errorf("slow: isError %v, %q, meta %v; want a timeout failure", res.IsError, text(res), res.Meta)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("a function with a 1s timeout took %s to fail", took)
	}
}

// The tools are what live executors serve: once a function's only
// executor stops, it leaves tools/list, and a call of it (a name still
// owned) fails at once as unavailable, without a JSON-RPC error.
func TestMCPToolsFollowTheLiveFleet(t *testing.T) {
	t.Parallel()
	f := newMCPFleet(t, 1, dispatch.Options{ServeGrace: 100 * time.Millisecond})
	stop := f.executor(t, "reports", exec.Function{Name: "report", Description: "A report.",
		Handler: exec.HandlerFunc(func(context.Context, *exec.Invocation) ([]byte, error) { return []byte(`"ok"`), nil })})
	ctx := t.Context()
	s := connect(t, ctx, &roundRobin{urls: f.urls}, nil)
	listed := func() bool {
		list, err := s.ListTools(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		return slices.ContainsFunc(list.Tools, func(tool *mcp.Tool) bool { return tool.Name == "report" })
	}
	if !listed() {
		t.Fatal("a served function is not listed")
	}
	stop()
	testutil.WaitForWhat(t, 10*time.Second, "report to leave tools/list", func() bool { return !listed() })
	res, err := s.CallTool(ctx, &mcp.CallToolParams{Name: "report", Arguments: map[string]any{}})
	if err != nil {
		t.Fatalf("a call of a function nobody serves now: %v; want an isError result", err)
	}
	if !res.IsError || res.Meta[metaErrorType] != "unavailable" || !strings.Contains(text(res), "report") {
		t.Errorf("isError %v, %q, meta %v; want an unavailable failure naming the function", res.IsError, text(res), res.Meta)
	}
}

// A client that gives up on a call cancels it on its executor: the
// command's process is killed. Progress is reported while it runs.
func TestMCPCancelKillsTheCommand(t *testing.T) {
	t.Parallel()
	forEachVersion(t, (*mcpFleet).cancelKillsTheCommand)
}

func (f *mcpFleet) cancelKillsTheCommand(t *testing.T, version protocolVersion) {
	progress := make(chan *mcp.ProgressNotificationParams, 16)
	s := connect(t, t.Context(), &roundRobin{urls: f.urls, version: version}, &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, r *mcp.ProgressNotificationClientRequest) {
			select {
			case progress <- r.Params:
			default:
			}
		}})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	params := &mcp.CallToolParams{Name: "sleepy", Arguments: map[string]any{}}
	params.SetProgressToken("sleepy-1")
	done := make(chan error, 1)
	go func() {
		_, err := s.CallTool(ctx, params)
		done <- err
	}()
	pid := f.sleepyPID(t)
	select {
	case p := <-progress:
		if p.ProgressToken != "sleepy-1" || p.Progress <= 0 {
			t.Errorf("progress %+v; want the call's token and time run", p)
		}
	case <-time.After(10 * time.Second):
		t.Error("no progress notification while the call ran")
	}
	if syscall.Kill(pid, 0) != nil {
		t.Fatalf("the command (pid %d) is not running before the cancel", pid)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled call: %v", err)
	}
	waitKilled(t, pid)
}

// The call's spans join the client's trace, whether the traceparent comes
// in _meta or as an HTTP header, from the MCP server span through the
// turn to the executor's run.
func TestMCPTraceJoinsTheClients(t *testing.T) {
	t.Parallel()
	f := newMCPFleet(t, 1, dispatch.Options{})
	client := sdktrace.NewTracerProvider().Tracer("client")
	for _, via := range []string{"_meta", "header"} {
		t.Run(via, func(t *testing.T) {
			ctx, span := client.Start(t.Context(), "agent step")
			carrier := propagation.MapCarrier{}
			propagation.TraceContext{}.Inject(ctx, carrier)
			rr := &roundRobin{urls: f.urls}
			params := &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"n": 1}}
			if via == "header" {
				rr.header = http.Header{"Traceparent": {carrier["traceparent"]}}
			} else {
				params.Meta = mcp.Meta{"traceparent": carrier["traceparent"]}
			}
			s := connect(t, ctx, rr, nil)
			res, err := s.CallTool(ctx, params)
			span.End()
			if err != nil || res.IsError {
				t.Fatalf("call: %v %+v", err, res)
			}
			want := span.SpanContext().TraceID()
			var server trace.SpanContext
			testutil.WaitForWhat(t, 5*time.Second, "the server, turn and executor spans of the client's trace", func() bool {
				var names []string
				for _, s := range f.rec.Ended() {
					if s.SpanContext().TraceID() != want {
						continue
					}
					names = append(names, s.Name())
					if s.Name() == "tools/call echo" {
						server = s.Parent()
					}
				}
				return slices.Contains(names, "tools/call echo") && slices.Contains(names, "turn mcp") &&
					slices.Contains(names, "execute_tool echo")
			})
			if server.SpanID() != span.SpanContext().SpanID() {
				t.Errorf("the server span's parent is %s; want the client's span %s", server.SpanID(), span.SpanContext().SpanID())
			}
		})
	}
}

// With a tokens file, a team's token lists and calls only its teams'
// functions: another team's is unknown to it. The requests come through a
// "reverse proxy" on the same host (a public Host on a loopback address),
// which a token makes acceptable.
func TestMCPTeamTokens(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	path := filepath.Join(t.TempDir(), "tokens.txt")
	tokens := tokensFile(t, path, "orders")
	file, err := apiauth.Open(path, apiauth.Options{Logger: testutil.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	f := &mcpFleet{e: e, rec: tracetest.NewSpanRecorder()}
	f.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(f.rec))
	d, _ := e.dispatcher(dispatch.Options{})
	f.executor(t, "orders", exec.Function{Name: "echo", Parameters: json.RawMessage(echoSchema),
		Handler: exec.HandlerFunc(func(_ context.Context, inv *exec.Invocation) ([]byte, error) { return inv.Call.Arguments, nil })})
	f.executor(t, "billing", exec.Function{Name: "invoice",
		Handler: exec.HandlerFunc(func(context.Context, *exec.Invocation) ([]byte, error) { return []byte(`"invoice 7"`), nil })})
	hs := httptest.NewServer(httpapi.New(d, httpapi.Options{Authenticator: file}))
	t.Cleanup(hs.Close)

	ctx := t.Context()
	rr := &roundRobin{urls: []string{hs.URL + "/mcp"}, header: http.Header{"Authorization": {"Bearer " + tokens["orders"]}},
		host: "toolrelay.example.com"}
	s := connect(t, ctx, rr, nil)
	list, err := s.ListTools(ctx, nil)
	if err != nil || len(list.Tools) != 1 || list.Tools[0].Name != "echo" {
		t.Fatalf("an orders token lists %v (%v); want only echo", list, err)
	}
	if res, err := s.CallTool(ctx, &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"n": 3}}); err != nil || res.IsError {
		t.Errorf("own team's function: %v %+v", err, res)
	}
	if _, err := s.CallTool(ctx, &mcp.CallToolParams{Name: "invoice", Arguments: map[string]any{}}); err == nil || !strings.Contains(err.Error(), "unknown tool") {
		t.Errorf("another team's function: %v; want unknown tool", err)
	}

	client := mcp.NewClient(&mcp.Implementation{Name: "anonymous", Version: "1"}, nil)
	if _, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: hs.URL + "/mcp"}, nil); err == nil {
		t.Error("a client without a token connected")
	}
}
