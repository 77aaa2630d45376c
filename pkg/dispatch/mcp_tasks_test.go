package dispatch_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/toolrelay/toolrelay/internal/testutil"
	"github.com/toolrelay/toolrelay/pkg/dispatch"
	"github.com/toolrelay/toolrelay/pkg/dispatch/httpapi"
	"github.com/toolrelay/toolrelay/pkg/dispatch/openaiplatform"
	"github.com/toolrelay/toolrelay/pkg/exec"
)

// rpcAnswer is a JSON-RPC response with its result kept as a map.
type rpcAnswer struct {
	Result map[string]any `json:"result"`
	Error  *struct {
		Code    int64          `json:"code"`
		Message string         `json:"message"`
		Data    map[string]any `json:"data"`
	} `json:"error"`
}

// mcpRPC posts one JSON-RPC request to url as a client of protocol
// version speaks after initializing, and decodes the answer, whether it
// comes as JSON or as an event stream.
func mcpRPC(t *testing.T, url, version, body string) rpcAnswer {
	t.Helper()
	header := http.Header{}
	if version != "" {
		header.Set("Mcp-Protocol-Version", version)
	}
	return mcpRPCWith(t, url, header, body)
}

// mcpRPCWith is mcpRPC with the given headers.
func mcpRPCWith(t *testing.T, url string, header http.Header, body string) rpcAnswer {
	t.Helper()
	resp, b := mcpExchange(t, url, body, header)
	return decodeRPC(t, resp, b, body)
}

// decodeRPC decodes the answer b of resp to the request body, whether it
// comes as JSON or as an event stream.
func decodeRPC(t *testing.T, resp *http.Response, b []byte, body string) rpcAnswer {
	t.Helper()
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		var last []byte
		sc := bufio.NewScanner(bytes.NewReader(b))
		for sc.Scan() {
			if data, ok := bytes.CutPrefix(sc.Bytes(), []byte("data: ")); ok && bytes.Contains(data, []byte(`"id"`)) {
				last = append([]byte(nil), data...)
			}
		}
		b = last
	}
	var a rpcAnswer
	if err := json.Unmarshal(b, &a); err != nil {
		t.Fatalf("%s: %d %q: %v", body, resp.StatusCode, b, err)
	}
	return a
}

func field(m map[string]any, path ...string) any {
	var v any = m
	for _, p := range path {
		o, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = o[p]
	}
	return v
}

// taskFleet is two dispatcher replicas serving /mcp, a and b, and an
// executor of team orders serving gate (it ends when release is closed),
// refuse (it fails when release is closed), wait (it says it started on started, waits to be cancelled, then says so
// on cancelled, each with its arguments' tag) and echo. Replica a can be killed (its NATS connection
// cut, nothing released) or stopped and replaced by a new replica of its
// name.
type taskFleet struct {
	e         *env
	a, b      string // each replica's /mcp
	release   chan struct{}
	started   chan string
	cancelled chan string
	// over is closed as the test ends: handlers still running return,
	// so that the executor stops without waiting for them.
	over chan struct{}

	hopts    httpapi.Options
	handlerA atomic.Pointer[http.Handler]
	ncA      *nats.Conn
	stopA    func()
}

func newTaskFleet(t *testing.T, hopts httpapi.Options) *taskFleet {
	t.Helper()
	tf := &taskFleet{e: newEnv(t), hopts: hopts, release: make(chan struct{}), started: make(chan string, 8), cancelled: make(chan string, 8),
		over: make(chan struct{})}
	tf.startA(t)
	srvA := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { (*tf.handlerA.Load()).ServeHTTP(w, r) }))
	t.Cleanup(srvA.Close)
	dB, _ := tf.e.dispatcher(dispatch.Options{Name: "replica-b"})
	srvB := httptest.NewServer(httpapi.New(dB, hopts))
	t.Cleanup(srvB.Close)
	tf.a, tf.b = srvA.URL+"/mcp", srvB.URL+"/mcp"

	f := &mcpFleet{e: tf.e, tp: sdktrace.NewTracerProvider()}
	f.executor(t, "orders",
		exec.Function{Name: "gate", Description: "Ends when the test says.", Timeout: time.Minute,
			Handler: exec.HandlerFunc(func(ctx context.Context, _ *exec.Invocation) ([]byte, error) {
				select {
				case <-tf.release:
					return []byte(`{"opened":true}`), nil
				case <-tf.over:
					return nil, errors.New("the test is over")
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			})},
		exec.Function{Name: "refuse", Description: "Fails when the test says.", Timeout: time.Minute,
			Handler: exec.HandlerFunc(func(ctx context.Context, _ *exec.Invocation) ([]byte, error) {
				select {
				case <-tf.release:
					return nil, errors.New("no report for that quarter")
				case <-tf.over:
					return nil, errors.New("the test is over")
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			})},
		exec.Function{Name: "wait", Description: "Waits to be cancelled.", Timeout: time.Minute,
			Parameters: json.RawMessage(`{"type":"object","properties":{"tag":{"type":"string"}}}`),
			Handler: exec.HandlerFunc(func(ctx context.Context, inv *exec.Invocation) ([]byte, error) {
				var args struct{ Tag string }
				_ = json.Unmarshal(inv.Call.Arguments, &args)
				tf.started <- args.Tag
				select {
				case <-ctx.Done():
					tf.cancelled <- args.Tag
					return nil, ctx.Err()
				case <-tf.over:
					return nil, errors.New("the test is over")
				}
			})},
		exec.Function{Name: "echo", Description: "Echoes its arguments.", Concurrency: 16,
			Handler: exec.HandlerFunc(func(_ context.Context, inv *exec.Invocation) ([]byte, error) { return inv.Call.Arguments, nil })})
	t.Cleanup(func() { close(tf.over) }) // before the executor stops
	return tf
}

// newCallersFleet is a taskFleet behind a tokens file of two callers,
// orders (a team) and admin; header is a caller's headers as a client of
// protocol version (none: no version header) sends them.
func newCallersFleet(t *testing.T) (tf *taskFleet, header func(caller, version string) http.Header) {
	t.Helper()
	file, tokens := openTokens(t, "orders", "admin")
	tf = newTaskFleet(t, httpapi.Options{Authenticator: file, Logger: testutil.Logger(t)})
	return tf, func(caller, version string) http.Header {
		h := http.Header{"Authorization": {"Bearer " + tokens[caller]}}
		if version != "" {
			h.Set("Mcp-Protocol-Version", version)
		}
		return h
	}
}

// startA starts replica a on a connection of its own and serves it.
func (tf *taskFleet) startA(t *testing.T) {
	t.Helper()
	nc, js := tf.e.srv.Connect(t)
	d, err := dispatch.New(js, openaiplatform.New(tf.e.client), dispatch.Options{Name: "replica-a", Logger: testutil.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- d.Run(ctx) }()
	stopped := false
	tf.stopA = func() {
		if !stopped {
			stopped = true
			cancel()
			<-ran
		}
	}
	t.Cleanup(tf.stopA)
	testutil.WaitForWhat(t, 10*time.Second, "replica a to be ready", d.Ready)
	var h http.Handler = httpapi.New(d, tf.hopts)
	tf.handlerA.Store(&h)
	tf.ncA = nc
}

// restartA stops replica a and starts a new one in its place.
func (tf *taskFleet) restartA(t *testing.T) {
	t.Helper()
	tf.stopA()
	tf.startA(t)
}

// killA cuts replica a off NATS: it releases no lease and answers nothing.
func (tf *taskFleet) killA() { tf.ncA.Close() }

// waitCancelled waits for the handler of a wait call tagged tag to be
// cancelled.
func (tf *taskFleet) waitCancelled(t *testing.T, tag string) {
	t.Helper()
	select {
	case got := <-tf.cancelled:
		if got != tag {
			t.Errorf("the handler of the call tagged %q was cancelled; want %q", got, tag)
		}
	case <-time.After(15 * time.Second):
		t.Errorf("the handler of the call tagged %q was not cancelled", tag)
	}
}

// taskID is the id of the task a task-augmented tools/call (2025-11-25)
// created, or fails the test.
func taskID(t *testing.T, created rpcAnswer) string {
	t.Helper()
	id, _ := field(created.Result, "task", "taskId").(string)
	if id == "" {
		t.Fatalf("task-augmented tools/call: %v %v; want a task", created.Result, created.Error)
	}
	return id
}

// A tools/call asking for a task (protocol 2025-11-25) is answered at once
// with the task; any replica answers tasks/get, tasks/result and
// tasks/cancel from JetStream, also after the replica that created the
// task was stopped and a new one started in its place. Only clients of
// that revision are offered tasks.
func TestMCPTasksAcrossReplicas(t *testing.T) {
	t.Parallel()
	tf := newTaskFleet(t, httpapi.Options{})
	a, b := tf.a, tf.b

	const v = "2025-11-25"
	init := mcpRPC(t, a, "", `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`)
	if field(init.Result, "capabilities", "tasks", "requests", "tools", "call") == nil || field(init.Result, "capabilities", "tasks", "cancel") == nil ||
		field(init.Result, "capabilities", "tasks", "list") == nil || field(init.Result, "capabilities", "tools") == nil ||
		field(init.Result, "capabilities", "extensions") != nil {
		t.Errorf("initialize (2025-11-25): capabilities %v; want tasks with requests.tools.call, list and cancel, beside tools, and no extensions", field(init.Result, "capabilities"))
	}
	old := mcpRPC(t, a, "", `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`)
	if field(old.Result, "capabilities", "tasks") != nil {
		t.Errorf("initialize (2025-06-18): capabilities %v; want no tasks", field(old.Result, "capabilities"))
	}
	list := mcpRPC(t, b, v, `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`)
	tools, _ := list.Result["tools"].([]any)
	if len(tools) == 0 || field(tools[0].(map[string]any), "execution", "taskSupport") != "optional" {
		t.Errorf("tools/list (2025-11-25): %v; want each tool with execution.taskSupport optional", tools)
	}

	// A task created on A, read on B.
	created := mcpRPC(t, a, v, `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"gate","arguments":{},"task":{"ttl":60000}}}`)
	id := taskID(t, created)
	if field(created.Result, "task", "status") != "working" || field(created.Result, "task", "ttl") != float64(time.Hour.Milliseconds()) {
		t.Fatalf("task-augmented tools/call: %+v %v; want a working task with a ttl of an hour", created.Result, created.Error)
	}
	got := mcpRPC(t, b, v, `{"jsonrpc":"2.0","id":3,"method":"tasks/get","params":{"taskId":"`+id+`"}}`)
	if got.Result["status"] != "working" || got.Result["taskId"] != id || got.Result["createdAt"] != field(created.Result, "task", "createdAt") || got.Result["lastUpdatedAt"] == nil {
		t.Errorf("tasks/get on the other replica: %v %v; want the working task, created when tools/call said", got.Result, got.Error)
	}

	// A stops; a new replica takes its place; the call ends meanwhile.
	tf.restartA(t)
	close(tf.release)
	res := mcpRPC(t, b, v, `{"jsonrpc":"2.0","id":4,"method":"tasks/result","params":{"taskId":"`+id+`"}}`)
	content, _ := res.Result["content"].([]any)
	if res.Error != nil || len(content) != 1 || field(content[0].(map[string]any), "text") != `{"opened":true}` ||
		field(res.Result, "_meta", "io.modelcontextprotocol/related-task", "taskId") != id {
		t.Errorf("tasks/result: %v %v; want the output, tied to the task", res.Result, res.Error)
	}
	if got := mcpRPC(t, a, v, `{"jsonrpc":"2.0","id":5,"method":"tasks/get","params":{"taskId":"`+id+`"}}`); got.Result["status"] != "completed" {
		t.Errorf("tasks/get on the restarted replica: %v %v; want completed", got.Result, got.Error)
	}

	// A task created on the new A, cancelled on B.
	id = taskID(t, mcpRPC(t, a, v, `{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"wait","arguments":{"tag":"b"},"task":{}}}`))
	start := time.Now()
	c := mcpRPC(t, b, v, `{"jsonrpc":"2.0","id":7,"method":"tasks/cancel","params":{"taskId":"`+id+`"}}`)
	if c.Error != nil || c.Result["status"] != "cancelled" {
		t.Fatalf("tasks/cancel on the other replica: %v %v; want the task cancelled", c.Result, c.Error)
	}
	t.Logf("tasks/cancel took %s", time.Since(start))
	tf.waitCancelled(t, "b")
	if got := mcpRPC(t, a, v, `{"jsonrpc":"2.0","id":8,"method":"tasks/get","params":{"taskId":"`+id+`"}}`); got.Result["status"] != "cancelled" {
		t.Errorf("tasks/get of a cancelled task: %v %v", got.Result, got.Error)
	}
	if again := mcpRPC(t, a, v, `{"jsonrpc":"2.0","id":9,"method":"tasks/cancel","params":{"taskId":"`+id+`"}}`); again.Error == nil || again.Error.Code != -32602 {
		t.Errorf("tasks/cancel of a cancelled task: %v %v; want -32602", again.Result, again.Error)
	}
	if r := mcpRPC(t, b, v, `{"jsonrpc":"2.0","id":10,"method":"tasks/result","params":{"taskId":"`+id+`"}}`); r.Error == nil || !strings.Contains(r.Error.Message, "cancelled") {
		t.Errorf("tasks/result of a cancelled task: %v %v; want the JSON-RPC error the call would have got", r.Result, r.Error)
	}
	if r := mcpRPC(t, b, v, `{"jsonrpc":"2.0","id":11,"method":"tasks/get","params":{"taskId":"0123456789abcdef0123456789abcdef"}}`); r.Error == nil || r.Error.Code != -32602 {
		t.Errorf("tasks/get of no task: %v %v; want -32602", r.Result, r.Error)
	}
	if r := mcpRPC(t, b, v, `{"jsonrpc":"2.0","id":12,"method":"tasks/update","params":{"taskId":"`+id+`","inputResponses":{}}}`); r.Error == nil || r.Error.Code != -32601 {
		t.Errorf("tasks/update (2025-11-25): %v %v; want -32601, a method of the extension only", r.Result, r.Error)
	}
}

// A task outlives the replica that created it being killed (its NATS
// connection cut, its leases not released): the other replica gathers
// the result once the lease lapses and answers tasks/result (and
// tasks/get, for a task of the extension), and cancels another task on
// its executor.
func TestMCPTaskOutlivesAKilledReplica(t *testing.T) {
	t.Parallel()
	tf := newTaskFleet(t, httpapi.Options{})
	const v = "2025-11-25"
	gate := taskID(t, mcpRPC(t, tf.a, v, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"gate","arguments":{},"task":{}}}`))
	wait := taskID(t, mcpRPC(t, tf.a, v, `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"wait","arguments":{"tag":"w"},"task":{}}}`))
	ext := extClient{t: t, declares: true}
	extGate := ext.create(tf.a, "gate", `{}`)
	tf.killA()
	close(tf.release)

	start := time.Now()
	res := mcpRPC(t, tf.b, v, `{"jsonrpc":"2.0","id":3,"method":"tasks/result","params":{"taskId":"`+gate+`"}}`)
	content, _ := res.Result["content"].([]any)
	if res.Error != nil || len(content) != 1 || field(content[0].(map[string]any), "text") != `{"opened":true}` {
		t.Errorf("tasks/result on the surviving replica: %v %v; want the output", res.Result, res.Error)
	}
	t.Logf("tasks/result answered after %s", time.Since(start))
	var got rpcAnswer
	testutil.WaitForWhat(t, 30*time.Second, "the extension's task to end", func() bool {
		got = ext.rpc(tf.b, "tasks/get", `{"taskId":"`+extGate+`"}`)
		return got.Result["status"] != "working"
	})
	if got.Result["status"] != "completed" || field(got.Result, "result", "structuredContent", "opened") != true {
		t.Errorf("tasks/get (extension) on the surviving replica: %v %v; want completed with the output", got.Result, got.Error)
	}
	c := mcpRPC(t, tf.b, v, `{"jsonrpc":"2.0","id":4,"method":"tasks/cancel","params":{"taskId":"`+wait+`"}}`)
	if c.Error != nil || c.Result["status"] != "cancelled" {
		t.Fatalf("tasks/cancel on the surviving replica: %v %v", c.Result, c.Error)
	}
	tf.waitCancelled(t, "w")
}

// A caller may have TOOLRELAY_MAX_MCP_CALLS_PER_CALLER tasks running,
// fleet-wide; one more is refused until one ends.
func TestMCPTasksPerCallerBound(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	d, _ := e.dispatcher(dispatch.Options{})
	hs := httptest.NewServer(httpapi.New(d, httpapi.Options{MaxMCPCallsPerCaller: 1}))
	t.Cleanup(hs.Close)
	f := &mcpFleet{e: e, tp: sdktrace.NewTracerProvider()}
	f.executor(t, "orders", exec.Function{Name: "wait", Timeout: time.Minute,
		Handler: exec.HandlerFunc(func(ctx context.Context, _ *exec.Invocation) ([]byte, error) { <-ctx.Done(); return nil, ctx.Err() })})
	const v, call = "2025-11-25", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"wait","arguments":{},"task":{}}}`
	id := taskID(t, mcpRPC(t, hs.URL+"/mcp", v, call))
	running := func(want int) func() bool {
		return func() bool { n, err := d.RunningStartedCalls(t.Context(), "loopback"); return err == nil && n == want }
	}
	testutil.WaitForWhat(t, 10*time.Second, "the task to be counted", running(1))
	if second := mcpRPC(t, hs.URL+"/mcp", v, call); second.Error == nil || !strings.Contains(second.Error.Message, "TOOLRELAY_MAX_MCP_CALLS_PER_CALLER") {
		t.Errorf("a task past the bound: %v %v; want an error naming the setting", second.Result, second.Error)
	}
	if c := mcpRPC(t, hs.URL+"/mcp", v, `{"jsonrpc":"2.0","id":2,"method":"tasks/cancel","params":{"taskId":"`+id+`"}}`); c.Result["status"] != "cancelled" {
		t.Fatalf("tasks/cancel: %v %v", c.Result, c.Error)
	}
	testutil.WaitForWhat(t, 10*time.Second, "the cancelled task to leave the count", running(0))
	taskID(t, mcpRPC(t, hs.URL+"/mcp", v, call))
}

// tasks/list (2025-11-25) lists the caller's tasks, ended and running, a
// page of 100 at a time, from any replica, also after the one that
// created half of them was replaced; a cursor that is not one is -32602.
func TestMCPTasksList(t *testing.T) {
	t.Parallel()
	tf := newTaskFleet(t, httpapi.Options{})
	const v = "2025-11-25"
	waiting := taskID(t, mcpRPC(t, tf.a, v, `{"jsonrpc":"2.0","id":0,"method":"tools/call","params":{"name":"wait","arguments":{"tag":"l"},"task":{}}}`))
	ids := make([]string, 100)
	created := time.Now()
	var wg sync.WaitGroup
	for w := range 4 {
		url := []string{tf.a, tf.b}[w%2]
		wg.Go(func() {
			for i := w; i < len(ids); i += 4 {
				r := mcpRPC(t, url, v, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"n":`+strconv.Itoa(i)+`},"task":{}}}`)
				ids[i], _ = field(r.Result, "task", "taskId").(string)
			}
		})
	}
	wg.Wait()
	for i, id := range ids {
		if id == "" {
			t.Fatalf("the task of echo %d was not created", i)
		}
	}
	t.Logf("tasks created in %s", time.Since(created))
	tf.restartA(t)

	// listAll lists every page, and counts them.
	listAll := func() (map[string]string, int) {
		got := map[string]string{}
		cursor, pages := "", 0
		for {
			params := `{}`
			if cursor != "" {
				params = `{"cursor":"` + cursor + `"}`
			}
			r := mcpRPC(t, tf.b, v, `{"jsonrpc":"2.0","id":2,"method":"tasks/list","params":`+params+`}`)
			tasks, ok := r.Result["tasks"].([]any)
			if r.Error != nil || !ok {
				t.Fatalf("tasks/list page %d: %v %v", pages, r.Result, r.Error)
			}
			pages++
			for _, task := range tasks {
				m := task.(map[string]any)
				got[m["taskId"].(string)], _ = m["status"].(string)
			}
			if cursor, _ = r.Result["nextCursor"].(string); cursor == "" {
				return got, pages
			}
		}
	}
	var got map[string]string
	var pages int
	testutil.WaitForWhat(t, 30*time.Second, "the echo tasks to be listed as completed", func() bool {
		got, pages = listAll()
		for _, id := range ids {
			if got[id] != "completed" {
				return false
			}
		}
		return true
	})
	t.Logf("listed after %s", time.Since(created))
	if pages != 2 || len(got) != len(ids)+1 || got[waiting] != "working" {
		t.Errorf("tasks/list: %d tasks in %d pages, the running one %q; want %d in 2, it working", len(got), pages, got[waiting], len(ids)+1)
	}
	if r := mcpRPC(t, tf.a, v, `{"jsonrpc":"2.0","id":3,"method":"tasks/list","params":{"cursor":"nope"}}`); r.Error == nil || r.Error.Code != -32602 {
		t.Errorf("tasks/list with a bad cursor: %v %v; want -32602", r.Result, r.Error)
	}
	if r := mcpRPC(t, tf.a, "2025-06-18", `{"jsonrpc":"2.0","id":4,"method":"tasks/list","params":{}}`); r.Error == nil || r.Error.Code != -32601 {
		t.Errorf("tasks/list (2025-06-18): %v %v; want -32601", r.Result, r.Error)
	}
}
