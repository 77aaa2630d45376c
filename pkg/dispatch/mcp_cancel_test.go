package dispatch_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolrelay/toolrelay/internal/testutil"
	"github.com/toolrelay/toolrelay/pkg/dispatch"
)

// A client that gives up on a call and says so with notifications/cancelled
// on a request of its own, which reaches the other replica, while the
// call's own request stays open (as the Python SDK leaves it), cancels the
// call on its executor: the command's process is killed.
func TestMCPCancelFromAnotherReplica(t *testing.T) {
	t.Parallel()
	forEachVersion(t, (*mcpFleet).cancelFromAnotherReplica)
}

func (f *mcpFleet) cancelFromAnotherReplica(t *testing.T, version protocolVersion) {
	rr := &roundRobin{urls: f.urls, version: version, keepOpen: true}
	s := connect(t, t.Context(), rr, nil)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := s.CallTool(ctx, &mcp.CallToolParams{Name: "sleepy", Arguments: map[string]any{}})
		done <- err
	}()
	pid := f.sleepyPID(t)
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled call: %v", err)
	}
	waitKilled(t, pid)
	call, cancelled := rr.replicaOf("tools/call"), rr.replicaOf("notifications/cancelled")
	if call < 0 || cancelled < 0 || call == cancelled {
		t.Errorf("tools/call reached replica %d and notifications/cancelled replica %d; want two different ones", call, cancelled)
	}
}

// forEachVersion runs check as a subtest per protocol version, on one
// fleet of two replicas.
func forEachVersion(t *testing.T, check func(f *mcpFleet, t *testing.T, version protocolVersion)) {
	t.Helper()
	f := newMCPFleet(t, 2, dispatch.Options{})
	for _, version := range protocolVersions {
		t.Run(version.String(), func(t *testing.T) { check(f, t, version) })
	}
}

// waitKilled waits for the process pid to be gone.
func waitKilled(t *testing.T, pid int) {
	t.Helper()
	testutil.WaitForWhat(t, 15*time.Second, "the command (pid "+strconv.Itoa(pid)+") to be killed", func() bool { return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) })
}

// sleepyPID waits for the sleepy command to start and returns its pid.
func (f *mcpFleet) sleepyPID(t *testing.T) int {
	t.Helper()
	pidFile := filepath.Join(f.marks, "sleepy.pid")
	t.Cleanup(func() { _ = os.Remove(pidFile) })
	var pid int
	testutil.WaitForWhat(t, 15*time.Second, "the sleepy command to write its pid", func() bool {
		b, err := os.ReadFile(pidFile)
		pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		return err == nil && pid > 0
	})
	if syscall.Kill(pid, 0) != nil {
		t.Fatalf("the command (pid %d) is not running", pid)
	}
	return pid
}

// What the TypeScript SDK sends when an AbortSignal ends a call: the
// tools/call's POST stays open on one replica, and notifications/cancelled
// naming its request id comes on a POST of its own to another. It cancels
// the call of its own caller only: another caller's call with the same
// request id runs on, until its own caller cancels it.
func TestMCPCancelNotificationMatchesTheCaller(t *testing.T) {
	t.Parallel()
	tf, header := newCallersFleet(t)
	// Both callers run a call with request id 7 on replica a.
	ends := map[string]<-chan string{}
	for _, caller := range []string{"orders", "admin"} {
		ends[caller] = mcpOpenPost(t, tf.a, `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"wait","arguments":{"tag":"`+caller+`"}}}`, header(caller, "2025-11-25"))
	}
	running := map[string]bool{}
	for range 2 {
		select {
		case tag := <-tf.started:
			running[tag] = true
		case <-time.After(15 * time.Second):
			t.Fatalf("the calls did not start: %v running", running)
		}
	}

	notify := func(caller string) {
		t.Helper()
		status, body := mcpPost(t, tf.b, `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":7,"reason":"AbortError: This operation was aborted"}}`, header(caller, "2025-11-25"))
		if status != http.StatusAccepted {
			t.Fatalf("notifications/cancelled from %s: %d %s; want 202", caller, status, body)
		}
	}
	notify("admin")
	tf.waitCancelled(t, "admin")
	select {
	case body := <-ends["admin"]:
		if !strings.Contains(body, `"id":7`) || !strings.Contains(body, "cancelled") {
			t.Errorf("admin's tools/call ended with %q; want an error saying it was cancelled", body)
		}
	case <-time.After(10 * time.Second):
		t.Error("admin's tools/call request is still open")
	}
	select {
	case tag := <-tf.cancelled:
		t.Fatalf("%s's call was cancelled by another caller's notification", tag)
	case body := <-ends["orders"]:
		t.Fatalf("orders' call ended on another caller's notification: %q", body)
	default:
	}

	notify("orders")
	tf.waitCancelled(t, "orders")
	select {
	case <-ends["orders"]:
	case <-time.After(10 * time.Second):
		t.Error("orders' tools/call request is still open")
	}
}

// mcpOpenPost posts body to url and returns at once; the channel gets the
// response's body once it ends.
func mcpOpenPost(t *testing.T, url, body string, header http.Header) <-chan string {
	t.Helper()
	req := mcpRequest(t, t.Context(), url, body, header)
	end := make(chan string, 1)
	var wg sync.WaitGroup
	t.Cleanup(wg.Wait)
	wg.Go(func() {
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			end <- "error: " + err.Error()
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		end <- string(b)
	})
	return end
}

// nodeSDK is node and the directory TOOLRELAY_MCP_TS_SDK names, where npm
// installed the official MCP packages (sdk/typescript after its npm ci,
// as .ci/run sets it); the test is skipped without either.
func nodeSDK(t *testing.T) (node, sdk string) {
	t.Helper()
	sdk = os.Getenv("TOOLRELAY_MCP_TS_SDK")
	node, err := osexec.LookPath("node")
	if sdk == "" || err != nil {
		t.Skip("set TOOLRELAY_MCP_TS_SDK to a directory where `npm ci` ran in sdk/typescript (the MCP SDK, ext-tasks and client packages), with node on PATH")
	}
	return node, sdk
}

// runNode runs the Node script of testdata with sdk and args, and calls
// onStep with each JSON line it prints (a step, named by its "step") and
// its standard input. It returns the steps by name once the script exited
// 0, and fails the test otherwise.
func runNode(t *testing.T, node, script, sdk string, args []string, onStep func(name string, step map[string]any, stdin io.WriteCloser)) map[string][]map[string]any {
	t.Helper()
	cmd := osexec.CommandContext(t.Context(), node, append([]string{"testdata/" + script, sdk}, args...)...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	steps := map[string][]map[string]any{}
	sc := bufio.NewScanner(out)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var step map[string]any
		if json.Unmarshal(sc.Bytes(), &step) != nil {
			continue
		}
		t.Logf("%s", sc.Bytes())
		name, _ := step["step"].(string)
		steps[name] = append(steps[name], step)
		onStep(name, step, in)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("%s: %v", script, err)
	}
	return steps
}

// The official TypeScript SDK's client against two replicas, its requests
// sent to each in turn: it runs a call as a task, and cancels a running
// call with an AbortSignal, which kills the command.
func TestMCPTypeScriptSDK(t *testing.T) {
	node, sdk := nodeSDK(t)
	t.Parallel()
	f := newMCPFleet(t, 2, dispatch.Options{})
	steps := runNode(t, node, "mcp-ts-client.mjs", sdk, f.urls, func(name string, _ map[string]any, stdin io.WriteCloser) {
		if name == "cancel" {
			// Before the client closes, and with it the call's request.
			b, err := os.ReadFile(filepath.Join(f.marks, "sleepy.pid"))
			pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
			if err != nil || pid <= 0 {
				t.Fatalf("the sleepy command left no pid (%v): it never ran", err)
			}
			waitKilled(t, pid)
			_, _ = stdin.Write([]byte("close\n"))
			_ = stdin.Close()
		}
	})
	if c := steps["connected"]; len(c) != 1 || c[0]["tasks"] == nil {
		t.Errorf("connected: %v; want the server's tasks capability", c)
	}
	if r := steps["result"]; len(steps["taskCreated"]) != 1 || len(r) != 1 || r[0]["text"] != `{"echo":{"n":41},"executor":"orders"}` {
		t.Errorf("task: created %v, result %v; want one task and its output", steps["taskCreated"], r)
	}
	if c := steps["cancel"]; len(c) != 1 || c[0]["aborted"] != true {
		t.Errorf("cancel: %v; want the call aborted", c)
	}
}
