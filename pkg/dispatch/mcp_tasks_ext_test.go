package dispatch_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/toolrelay/toolrelay/internal/testutil"
	"github.com/toolrelay/toolrelay/pkg/dispatch/httpapi"
)

// extClient is a client of protocol 2026-07-28 as the Tasks extension
// (io.modelcontextprotocol/tasks) describes one: stateless, each request
// carrying its protocol version and capabilities in _meta, declaring the
// extension there when declares is set, with the routing headers.
type extClient struct {
	t        *testing.T
	header   http.Header // more headers (a token)
	declares bool
}

// rpc posts method with params (a JSON object) to url and decodes the
// answer.
func (c extClient) rpc(url, method, params string) rpcAnswer {
	c.t.Helper()
	_, a := c.exchange(url, method, params)
	return a
}

// exchange is rpc returning the HTTP status too.
func (c extClient) exchange(url, method, params string) (int, rpcAnswer) {
	c.t.Helper()
	var p map[string]any
	if err := json.Unmarshal([]byte(params), &p); err != nil {
		c.t.Fatal(err)
	}
	caps := map[string]any{}
	if c.declares {
		caps["extensions"] = map[string]any{"io.modelcontextprotocol/tasks": map[string]any{}}
	}
	p["_meta"] = map[string]any{"io.modelcontextprotocol/protocolVersion": "2026-07-28",
		"io.modelcontextprotocol/clientInfo": map[string]any{"name": "ext-test", "version": "1"}, "io.modelcontextprotocol/clientCapabilities": caps}
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": method, "params": p})
	h := http.Header{"Mcp-Protocol-Version": {"2026-07-28"}, "Mcp-Method": {method}}
	for k, v := range c.header {
		h[k] = v
	}
	if name, _ := p["name"].(string); name != "" {
		h.Set("Mcp-Name", name)
	}
	if id, _ := p["taskId"].(string); id != "" {
		h.Set("Mcp-Name", id)
	}
	resp, b := mcpExchange(c.t, url, string(body), h)
	return resp.StatusCode, decodeRPC(c.t, resp, b, string(body))
}

// create calls fn as a task and returns the task's id, or fails the test.
func (c extClient) create(url, fn, args string) string {
	c.t.Helper()
	r := c.rpc(url, "tools/call", `{"name":"`+fn+`","arguments":`+args+`}`)
	id, _ := r.Result["taskId"].(string)
	if r.Error != nil || r.Result["resultType"] != "task" || id == "" {
		c.t.Fatalf("tools/call %s: %v %v; want a CreateTaskResult", fn, r.Result, r.Error)
	}
	return id
}

// acknowledged reports whether r is the extension's empty result: a
// resultType of "complete" and nothing else but _meta.
func acknowledged(r rpcAnswer) bool {
	for k := range r.Result {
		if k != "resultType" && k != "_meta" {
			return false
		}
	}
	return r.Error == nil && r.Result["resultType"] == "complete"
}

// The Tasks extension across two replicas: server/discover advertises
// it; a declaring client's quick call is answered with its result, a long
// one with a task, once it is durably created; the other replica answers
// tasks/get (the result inlined once done), tasks/update and tasks/cancel,
// also after the creating replica stopped and a new one took its place.
func TestMCPTasksExtensionAcrossReplicas(t *testing.T) {
	t.Parallel()
	tf := newTaskFleet(t, httpapi.Options{})
	c := extClient{t: t, declares: true}

	d := c.rpc(tf.b, "server/discover", `{}`)
	if field(d.Result, "capabilities", "extensions", "io.modelcontextprotocol/tasks") == nil || field(d.Result, "capabilities", "tasks") != nil {
		t.Errorf("server/discover: %v %v; want the extension in capabilities.extensions, and no experimental tasks", d.Result, d.Error)
	}
	quick := c.rpc(tf.a, "tools/call", `{"name":"echo","arguments":{"n":1}}`)
	if content, _ := quick.Result["content"].([]any); quick.Error != nil || quick.Result["resultType"] != "complete" || len(content) != 1 {
		t.Errorf("a quick call: %v %v; want its tool result", quick.Result, quick.Error)
	}

	id, refused := c.create(tf.a, "gate", `{}`), c.create(tf.a, "refuse", `{}`)
	created := c.rpc(tf.b, "tasks/get", `{"taskId":"`+id+`"}`)
	if created.Result["resultType"] != "complete" || created.Result["status"] != "working" || created.Result["ttlMs"] != float64(time.Hour.Milliseconds()) ||
		created.Result["pollIntervalMs"] != float64(2000) || created.Result["createdAt"] == nil || created.Result["lastUpdatedAt"] == nil {
		t.Errorf("tasks/get on the other replica: %v %v; want the working task with ttlMs and pollIntervalMs", created.Result, created.Error)
	}
	if u := c.rpc(tf.b, "tasks/update", `{"taskId":"`+id+`","inputResponses":{"name":{"action":"accept","content":{"input":"x"}}}}`); !acknowledged(u) {
		t.Errorf("tasks/update: %v %v; want an empty acknowledgement (no input is outstanding, so it is ignored)", u.Result, u.Error)
	}
	if u := c.rpc(tf.b, "tasks/update", `{"taskId":"`+id+`"}`); u.Error == nil || u.Error.Code != -32602 {
		t.Errorf("tasks/update without inputResponses: %v %v; want -32602", u.Result, u.Error)
	}

	tf.restartA(t)
	close(tf.release)
	var done rpcAnswer
	testutil.WaitForWhat(t, 30*time.Second, "the task to complete", func() bool {
		done = c.rpc(tf.b, "tasks/get", `{"taskId":"`+id+`"}`)
		return done.Result["status"] != "working"
	})
	content, _ := field(done.Result, "result", "content").([]any)
	if done.Result["status"] != "completed" || len(content) != 1 || field(content[0].(map[string]any), "text") != `{"opened":true}` ||
		field(done.Result, "result", "structuredContent", "opened") != true || field(done.Result, "result", "resultType") != "complete" {
		t.Errorf("tasks/get of the ended task: %v %v; want completed with the tool result inlined", done.Result, done.Error)
	}
	if got := c.rpc(tf.a, "tasks/get", `{"taskId":"`+id+`"}`); got.Result["status"] != "completed" {
		t.Errorf("tasks/get on the restarted replica: %v %v; want completed", got.Result, got.Error)
	}
	// A function's failure is a tool result with isError: completed in
	// the extension (failed is for JSON-RPC errors), failed in the
	// experimental form, which says so of isError results.
	testutil.WaitForWhat(t, 30*time.Second, "the refused task to end", func() bool {
		done = c.rpc(tf.b, "tasks/get", `{"taskId":"`+refused+`"}`)
		return done.Result["status"] != "working"
	})
	if done.Result["status"] != "completed" || field(done.Result, "result", "isError") != true {
		t.Errorf("tasks/get of a task whose function failed: %v %v; want completed, its result isError", done.Result, done.Error)
	}
	if got := mcpRPC(t, tf.b, "2025-11-25", `{"jsonrpc":"2.0","id":1,"method":"tasks/get","params":{"taskId":"`+refused+`"}}`); got.Result["status"] != "failed" {
		t.Errorf("tasks/get (2025-11-25) of a task whose function failed: %v %v; want failed", got.Result, got.Error)
	}
	if r := c.rpc(tf.a, "tasks/cancel", `{"taskId":"`+id+`"}`); !acknowledged(r) {
		t.Errorf("tasks/cancel of a completed task: %v %v; want an acknowledgement", r.Result, r.Error)
	}

	id = c.create(tf.a, "wait", `{"tag":"x"}`)
	if r := c.rpc(tf.b, "tasks/cancel", `{"taskId":"`+id+`"}`); !acknowledged(r) {
		t.Fatalf("tasks/cancel on the other replica: %v %v; want an empty acknowledgement", r.Result, r.Error)
	}
	tf.waitCancelled(t, "x")
	if got := c.rpc(tf.a, "tasks/get", `{"taskId":"`+id+`"}`); got.Result["status"] != "cancelled" {
		t.Errorf("tasks/get of a cancelled task: %v %v", got.Result, got.Error)
	}

	for _, bad := range []struct{ method, params string }{
		{"tasks/get", `{"taskId":"0123456789abcdef0123456789abcdef"}`},
		{"tasks/get", `{}`},
		{"tasks/get", `{"taskId":5}`},
		{"tasks/update", `{"taskId":"0123456789abcdef0123456789abcdef","inputResponses":[]}`},
		{"tasks/update", `{"taskId":"0123456789abcdef0123456789abcdef","inputResponses":{}}`},
		{"tasks/cancel", `{"taskId":"nope"}`},
	} {
		if r := c.rpc(tf.b, bad.method, bad.params); r.Error == nil || r.Error.Code != -32602 {
			t.Errorf("%s %s: %v %v; want -32602", bad.method, bad.params, r.Result, r.Error)
		}
	}
	for _, gone := range []string{"tasks/result", "tasks/list"} {
		if r := c.rpc(tf.b, gone, `{"taskId":"`+id+`"}`); r.Error == nil || r.Error.Code != -32601 {
			t.Errorf("%s (2026-07-28): %v %v; want -32601, a method the extension removed", gone, r.Result, r.Error)
		}
	}
}

// A client of 2026-07-28 that does not declare the extension gets -32021,
// naming it, for the extension's methods, a tools/call asking for a task
// and a subscriptions/listen asking for tasks' notifications; its other
// calls are answered with their results, never a task.
func TestMCPTasksExtensionUndeclared(t *testing.T) {
	t.Parallel()
	tf := newTaskFleet(t, httpapi.Options{})
	id := extClient{t: t, declares: true}.create(tf.a, "gate", `{}`)
	c := extClient{t: t}
	for _, req := range []struct{ method, params string }{
		{"tasks/get", `{"taskId":"` + id + `"}`},
		{"tasks/update", `{"taskId":"` + id + `","inputResponses":{}}`},
		{"tasks/cancel", `{"taskId":"` + id + `"}`},
		{"tools/call", `{"name":"echo","arguments":{},"task":{"ttl":1000}}`},
		{"subscriptions/listen", `{"notifications":{"taskIds":["` + id + `"]}}`},
	} {
		status, r := c.exchange(tf.b, req.method, req.params)
		if status != http.StatusBadRequest || r.Error == nil || r.Error.Code != -32021 || field(r.Error.Data, "requiredCapabilities", "extensions", "io.modelcontextprotocol/tasks") == nil {
			t.Errorf("%s from a client not declaring the extension: %d %v %v; want 400 and -32021 naming it", req.method, status, r.Result, r.Error)
		}
	}
	r := c.rpc(tf.b, "tools/call", `{"name":"echo","arguments":{"n":2}}`)
	if content, _ := r.Result["content"].([]any); r.Error != nil || r.Result["resultType"] == "task" || len(content) != 1 {
		t.Errorf("tools/call from a client not declaring the extension: %v %v; want its result", r.Result, r.Error)
	}
	close(tf.release)
}

// A task is its caller's, in either dialect and on either replica:
// another caller (an admin too) neither reads, updates, cancels nor lists
// it, and is answered as for no task (-32602); its own caller cancels it.
func TestMCPTasksBelongToTheirCaller(t *testing.T) {
	t.Parallel()
	tf, header := newCallersFleet(t)
	ext := func(caller string) extClient { return extClient{t: t, header: header(caller, ""), declares: true} }
	ordersTask := taskID(t, mcpRPCWith(t, tf.a, header("orders", "2025-11-25"), `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"wait","arguments":{"tag":"orders"},"task":{}}}`))
	adminTask := ext("admin").create(tf.a, "wait", `{"tag":"admin"}`)

	for _, owner := range []struct{ task, other string }{{ordersTask, "admin"}, {adminTask, "orders"}} {
		for _, method := range []string{"tasks/get", "tasks/cancel", "tasks/result"} {
			if r := mcpRPCWith(t, tf.b, header(owner.other, "2025-11-25"), `{"jsonrpc":"2.0","id":2,"method":"`+method+`","params":{"taskId":"`+owner.task+`"}}`); r.Error == nil || r.Error.Code != -32602 {
				t.Errorf("%s by %s of another caller's task: %v %v; want -32602, as for no task", method, owner.other, r.Result, r.Error)
			}
		}
		for _, req := range []struct{ method, params string }{
			{"tasks/get", `{"taskId":"` + owner.task + `"}`},
			{"tasks/update", `{"taskId":"` + owner.task + `","inputResponses":{}}`},
			{"tasks/cancel", `{"taskId":"` + owner.task + `"}`},
		} {
			if r := ext(owner.other).rpc(tf.b, req.method, req.params); r.Error == nil || r.Error.Code != -32602 {
				t.Errorf("%s (extension) by %s of another caller's task: %v %v; want -32602, as for no task", req.method, owner.other, r.Result, r.Error)
			}
		}
		r := mcpRPCWith(t, tf.b, header(owner.other, "2025-11-25"), `{"jsonrpc":"2.0","id":3,"method":"tasks/list","params":{}}`)
		tasks, _ := r.Result["tasks"].([]any)
		for _, task := range tasks {
			if task.(map[string]any)["taskId"] == owner.task {
				t.Errorf("tasks/list by %s lists another caller's task %s", owner.other, owner.task)
			}
		}
		if r.Error != nil || len(tasks) != 1 {
			t.Errorf("tasks/list by %s: %v %v; want its own task only", owner.other, r.Result, r.Error)
		}
	}
	select {
	case tag := <-tf.cancelled:
		t.Fatalf("the task of %s was cancelled by another caller", tag)
	default:
	}
	if r := ext("admin").rpc(tf.b, "tasks/cancel", `{"taskId":"`+adminTask+`"}`); !acknowledged(r) {
		t.Errorf("tasks/cancel by its caller: %v %v", r.Result, r.Error)
	}
	tf.waitCancelled(t, "admin")
	if r := mcpRPCWith(t, tf.b, header("orders", "2025-11-25"), `{"jsonrpc":"2.0","id":4,"method":"tasks/cancel","params":{"taskId":"`+ordersTask+`"}}`); r.Error != nil || r.Result["status"] != "cancelled" {
		t.Errorf("tasks/cancel by its caller: %v %v", r.Result, r.Error)
	}
	tf.waitCancelled(t, "orders")
}

// A declaring client that goes away before its call is answered, with its
// result or its task, leaves no task running: nobody knows its id.
func TestMCPTasksExtensionClientGone(t *testing.T) {
	t.Parallel()
	tf := newTaskFleet(t, httpapi.Options{})
	body := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"wait","arguments":{"tag":"gone"},"_meta":{` +
		`"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{"extensions":{"io.modelcontextprotocol/tasks":{}}}}}}`
	ctx, cancel := context.WithCancel(t.Context())
	req := mcpRequest(t, ctx, tf.a, body, http.Header{"Mcp-Protocol-Version": {"2026-07-28"}, "Mcp-Method": {"tools/call"}, "Mcp-Name": {"wait"}})
	done := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	select {
	case <-tf.started:
	case <-time.After(15 * time.Second):
		t.Fatal("the call did not start")
	}
	cancel()
	if err := <-done; err == nil {
		t.Fatal("the request was answered before the client went away")
	}
	tf.waitCancelled(t, "gone")
}

// The official client of the Tasks extension, @modelcontextprotocol/ext-tasks
// (see nodeSDK), against two replicas.
// As a client of 2026-07-28 it starts a task on one replica, hands off its
// reference and closes; a new session resumes the task on the other replica,
// after the first was stopped and replaced, and settles it. It cancels
// another task there, which cancels its handler. As a client of 2025-11-25 it
// runs a call as a task and finds it in tasks/list.
func TestMCPTasksExtensionOfficialClient(t *testing.T) {
	node, sdk := nodeSDK(t)
	t.Parallel()
	tf := newTaskFleet(t, httpapi.Options{})
	steps := runNode(t, node, "mcp-ext-tasks-client.mjs", sdk, []string{tf.a, tf.b}, func(name string, _ map[string]any, _ io.WriteCloser) {
		if name == "handedOff" {
			tf.restartA(t)
			close(tf.release)
		}
	})
	called := steps["called"]
	if len(called) != 3 || called[0]["kind"] != "task" || called[1]["kind"] != "task" || called[2]["kind"] != "task" {
		t.Errorf("called: %v; want each call answered with a task", called)
	}
	if r := steps["result"]; len(r) != 2 || r[0]["text"] != `{"opened":true}` || r[1]["text"] != `{"n":7}` {
		t.Errorf("result: %v; want the gate's output, resumed on the other replica, and the echo", r)
	}
	if len(steps["cancelled"]) != 1 {
		t.Errorf("cancelled: %v", steps["cancelled"])
	}
	tf.waitCancelled(t, "ts")
	if l := steps["listed"]; len(l) != 1 || len(called) != 3 || !slices.Contains(l[0]["taskIds"].([]any), called[2]["taskId"]) || l[0]["inventory"] != "server-list" {
		t.Errorf("listed: %v; want the server's list with the echo's task", l)
	}
	var resumed bool
	for _, s := range steps["sent"] {
		sent, _ := s["sent"].([]any)
		for _, x := range sent {
			if m := x.(map[string]any); m["method"] == "tasks/get" && m["replica"] == "b" && m["status"] == "completed" {
				resumed = true
			}
		}
	}
	if !resumed {
		t.Errorf("sent: %v; want the completed task read by tasks/get on replica b", steps["sent"])
	}
}
