package dispatch_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

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
		Code    int64  `json:"code"`
		Message string `json:"message"`
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

// A tools/call asking for a task (protocol 2025-11-25) is answered at once
// with the task; any replica answers tasks/get, tasks/result and
// tasks/cancel from JetStream, also after the replica that created the
// task was stopped and a new one started in its place. Only clients of
// that revision are offered tasks.
func TestMCPTasksAcrossReplicas(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	serve := func(d *dispatch.Dispatcher) http.Handler { return httpapi.New(d, httpapi.Options{}) }
	dA, stopA := e.dispatcher(dispatch.Options{Name: "replica-a"})
	var handlerA atomic.Pointer[http.Handler]
	hA := serve(dA)
	handlerA.Store(&hA)
	srvA := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { (*handlerA.Load()).ServeHTTP(w, r) }))
	t.Cleanup(srvA.Close)
	dB, _ := e.dispatcher(dispatch.Options{Name: "replica-b"})
	srvB := httptest.NewServer(serve(dB))
	t.Cleanup(srvB.Close)
	a, b := srvA.URL+"/mcp", srvB.URL+"/mcp"

	release := make(chan struct{})
	cancelled := make(chan struct{}, 1)
	f := &mcpFleet{e: e, tp: sdktrace.NewTracerProvider()}
	f.executor(t, "orders",
		exec.Function{Name: "gate", Description: "Ends when the test says.", Timeout: time.Minute,
			Handler: exec.HandlerFunc(func(ctx context.Context, _ *exec.Invocation) ([]byte, error) {
				select {
				case <-release:
					return []byte(`{"opened":true}`), nil
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			})},
		exec.Function{Name: "wait", Description: "Waits to be cancelled.", Timeout: time.Minute,
			Handler: exec.HandlerFunc(func(ctx context.Context, _ *exec.Invocation) ([]byte, error) {
				<-ctx.Done()
				cancelled <- struct{}{}
				return nil, ctx.Err()
			})})

	const v = "2025-11-25"
	init := mcpRPC(t, a, "", `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`)
	if field(init.Result, "capabilities", "tasks", "requests", "tools", "call") == nil || field(init.Result, "capabilities", "tasks", "cancel") == nil ||
		field(init.Result, "capabilities", "tasks", "list") != nil || field(init.Result, "capabilities", "tools") == nil {
		t.Errorf("initialize (2025-11-25): capabilities %v; want tasks with requests.tools.call and cancel, not list, beside tools", field(init.Result, "capabilities"))
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
	id, _ := field(created.Result, "task", "taskId").(string)
	if id == "" || field(created.Result, "task", "status") != "working" || field(created.Result, "task", "ttl") != float64(time.Hour.Milliseconds()) {
		t.Fatalf("task-augmented tools/call: %+v %v; want a working task with a ttl of an hour", created.Result, created.Error)
	}
	got := mcpRPC(t, b, v, `{"jsonrpc":"2.0","id":3,"method":"tasks/get","params":{"taskId":"`+id+`"}}`)
	if got.Result["status"] != "working" || got.Result["taskId"] != id || got.Result["createdAt"] != field(created.Result, "task", "createdAt") || got.Result["lastUpdatedAt"] == nil {
		t.Errorf("tasks/get on the other replica: %v %v; want the working task, created when tools/call said", got.Result, got.Error)
	}

	// A stops; a new replica takes its place; the call ends meanwhile.
	stopA()
	dA2, _ := e.dispatcher(dispatch.Options{Name: "replica-a"})
	hA2 := serve(dA2)
	handlerA.Store(&hA2)
	close(release)
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
	created = mcpRPC(t, a, v, `{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"wait","arguments":{},"task":{}}}`)
	id, _ = field(created.Result, "task", "taskId").(string)
	if id == "" {
		t.Fatalf("task-augmented tools/call: %+v %v", created.Result, created.Error)
	}
	start := time.Now()
	c := mcpRPC(t, b, v, `{"jsonrpc":"2.0","id":7,"method":"tasks/cancel","params":{"taskId":"`+id+`"}}`)
	if c.Error != nil || c.Result["status"] != "cancelled" {
		t.Fatalf("tasks/cancel on the other replica: %v %v; want the task cancelled", c.Result, c.Error)
	}
	t.Logf("tasks/cancel took %s", time.Since(start))
	select {
	case <-cancelled:
	case <-time.After(15 * time.Second):
		t.Error("the cancelled task's handler was not cancelled")
	}
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
}

// A task outlives the replica that created it being killed (its NATS
// connection cut, its leases not released): the other replica gathers
// the result once the lease lapses and answers tasks/result, and cancels
// another task on its executor.
func TestMCPTaskOutlivesAKilledReplica(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	nc, js := e.srv.Connect(t)
	dA, err := dispatch.New(js, openaiplatform.New(e.client), dispatch.Options{Name: "replica-a", Logger: testutil.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- dA.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-ran })
	testutil.WaitForWhat(t, 10*time.Second, "replica a to be ready", dA.Ready)
	srvA := httptest.NewServer(httpapi.New(dA, httpapi.Options{}))
	t.Cleanup(srvA.Close)
	dB, _ := e.dispatcher(dispatch.Options{Name: "replica-b"})
	srvB := httptest.NewServer(httpapi.New(dB, httpapi.Options{}))
	t.Cleanup(srvB.Close)
	a, b := srvA.URL+"/mcp", srvB.URL+"/mcp"

	release := make(chan struct{})
	cancelled := make(chan struct{}, 1)
	f := &mcpFleet{e: e, tp: sdktrace.NewTracerProvider()}
	f.executor(t, "orders",
		exec.Function{Name: "gate", Timeout: time.Minute, Handler: exec.HandlerFunc(func(ctx context.Context, _ *exec.Invocation) ([]byte, error) {
			select {
			case <-release:
				return []byte(`"opened"`), nil
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		})},
		exec.Function{Name: "wait", Timeout: time.Minute, Handler: exec.HandlerFunc(func(ctx context.Context, _ *exec.Invocation) ([]byte, error) {
			<-ctx.Done()
			cancelled <- struct{}{}
			return nil, ctx.Err()
		})})

	const v = "2025-11-25"
	ids := map[string]string{}
	for i, fn := range []string{"gate", "wait"} {
		created := mcpRPC(t, a, v, `{"jsonrpc":"2.0","id":`+strconv.Itoa(i)+`,"method":"tools/call","params":{"name":"`+fn+`","arguments":{},"task":{}}}`)
		if ids[fn], _ = field(created.Result, "task", "taskId").(string); ids[fn] == "" {
			t.Fatalf("task-augmented tools/call of %s: %v %v", fn, created.Result, created.Error)
		}
	}
	nc.Close() // replica a is gone: no release of its leases, no answers
	close(release)

	start := time.Now()
	res := mcpRPC(t, b, v, `{"jsonrpc":"2.0","id":3,"method":"tasks/result","params":{"taskId":"`+ids["gate"]+`"}}`)
	content, _ := res.Result["content"].([]any)
	if res.Error != nil || len(content) != 1 || field(content[0].(map[string]any), "text") != `"opened"` {
		t.Errorf("tasks/result on the surviving replica: %v %v; want the output", res.Result, res.Error)
	}
	t.Logf("tasks/result answered after %s", time.Since(start))
	c := mcpRPC(t, b, v, `{"jsonrpc":"2.0","id":4,"method":"tasks/cancel","params":{"taskId":"`+ids["wait"]+`"}}`)
	if c.Error != nil || c.Result["status"] != "cancelled" {
		t.Fatalf("tasks/cancel on the surviving replica: %v %v", c.Result, c.Error)
	}
	select {
	case <-cancelled:
	case <-time.After(15 * time.Second):
		t.Error("the cancelled task's handler was not cancelled")
	}
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
	first := mcpRPC(t, hs.URL+"/mcp", v, call)
	id, _ := field(first.Result, "task", "taskId").(string)
	if id == "" {
		t.Fatalf("first task: %v %v", first.Result, first.Error)
	}
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
	if third := mcpRPC(t, hs.URL+"/mcp", v, call); field(third.Result, "task", "taskId") == nil {
		t.Errorf("a task once the first ended: %v %v", third.Result, third.Error)
	}
}
