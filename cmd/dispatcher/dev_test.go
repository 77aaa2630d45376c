package main

import (
	"bytes"
	"encoding/json"
	"os"
	osexec "os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/toolrelay/toolrelay/internal/testutil"
	"github.com/toolrelay/toolrelay/pkg/dispatch"
	"github.com/toolrelay/toolrelay/pkg/dispatch/tooldef"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// runBin runs a built binary to completion and returns its stdout, stderr
// and exit code.
func runBin(t *testing.T, bin string, env []string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := osexec.Command(bin, args...)
	testutil.DieWithTest(cmd)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	cmd.Env = append(os.Environ(), env...)
	_ = cmd.Run()
	return out.String(), errOut.String(), cmd.ProcessState.ExitCode()
}

// A new team's loop with the built binary: dispatcher dev plays the
// example scenarios on its functions file, dispatcher call runs one
// function through it and prints the output and a trace ID the dev loop's
// turn carries, a failing call exits 1 with the model's message, tools
// -team prints the team's definitions with the deferred ones and one
// tool_search, and SIGTERM stops it all with 0.
func TestBuiltDevLoop(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"dev-functions.yaml", "scenarios.yaml"} {
		b, err := os.ReadFile(filepath.Join("../../testdata", name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	addr, natsAddr := freeAddr(t), freeAddr(t)
	dev := startProc(t, dir, "dev", bins["dispatcher"], []string{"dev", "-config", filepath.Join(dir, "dev-functions.yaml"),
		"-scenarios", filepath.Join(dir, "scenarios.yaml"), "-addr", addr, "-nats-listen", natsAddr})
	log := func() string {
		b, _ := os.ReadFile(filepath.Join(dir, "dev.log"))
		return string(b)
	}
	testutil.WaitForWhat(t, 60*time.Second, "the dev loop to print the refund's answer", func() bool { return strings.Contains(log(), "answer: refund of 500 cents issued") })
	for _, want := range []string{"answer: Order A-1001 is shipped with ups, arriving 2026-12-03.", "answer: A-1001 is shipped; A-1002 is packing.", "trace "} {
		if !strings.Contains(log(), want) {
			t.Errorf("dev output lacks %q", want)
		}
	}

	env := []string{"TOOLRELAY_API_TOKEN="}
	out, errOut, code := runBin(t, bins["dispatcher"], env, "call", "-addr", "http://"+addr, "get_order_status", `{"order_id":"A-1002"}`)
	if code != 0 || out != `{"status":"packing","carrier":"dhl"}`+"\n" {
		t.Fatalf("call: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	m := regexp.MustCompile(`trace ([0-9a-f]{32})`).FindStringSubmatch(errOut)
	if m == nil {
		t.Fatalf("call printed no trace ID: %q", errOut)
	}
	testutil.WaitForWhat(t, 10*time.Second, "the dev loop to print the MCP call's answer", func() bool { return strings.Contains(log(), "[mcp] get_order_status answered") })
	if !strings.Contains(log(), "trace "+m[1]) {
		t.Errorf("the dev loop's turn of the call is not in trace %s:\n%s", m[1], tail(log(), 1000))
	}

	// The call is a turn of platform mcp, which turns -platform mcp lists.
	out, errOut, code = runBin(t, bins["dispatcher"], env, "turns", "-addr", "http://"+addr, "-platform", "mcp", "-json")
	var mcpTurns dispatch.TurnList
	if code != 0 || json.Unmarshal([]byte(out), &mcpTurns) != nil || len(mcpTurns.Recent) == 0 || mcpTurns.Recent[0].Platform != protocol.PlatformMCP {
		t.Errorf("turns -platform mcp: exit %d, stdout %q, stderr %q; want the call's turn", code, out, errOut)
	}

	out, errOut, code = runBin(t, bins["dispatcher"], env, "call", "-addr", "http://"+addr, "-json", "get_order_status", `{"order_id":"B-7"}`)
	var res struct {
		Error   struct{ Type, Message string }
		TraceID string `json:"trace_id"`
	}
	if code != 1 || json.Unmarshal([]byte(out), &res) != nil || res.Error.Type != "invalid_arguments" ||
		!strings.Contains(res.Error.Message, "pattern") || len(res.TraceID) != 32 {
		t.Errorf("call with arguments the schema refuses: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	if _, errOut, code = runBin(t, bins["dispatcher"], env, "call", "-addr", "http://"+addr, "no_such_function"); code != 1 || !strings.Contains(errOut, `unknown tool "no_such_function"`) {
		t.Errorf("call of an unknown function: exit %d, stderr %q", code, errOut)
	}
	if _, errOut, code = runBin(t, bins["dispatcher"], env, "call", "-addr", "http://"+addr, "get_order_status", `[1]`); code != 1 || !strings.Contains(errOut, "JSON object") {
		t.Errorf("call with arguments that are not an object: exit %d, stderr %q", code, errOut)
	}

	natsEnv := []string{"NATS_URL=nats://" + natsAddr}
	out, errOut, code = runBin(t, bins["dispatcher"], natsEnv, "tools", "-platform", "agents", "-team", "orders")
	var defs []map[string]any
	if code != 0 || json.Unmarshal([]byte(out), &defs) != nil {
		t.Fatalf("tools -team orders: exit %d, %s %s", code, out, errOut)
	}
	var got []string
	for _, d := range defs {
		name, _ := d["name"].(string)
		if d["defer_loading"] == true {
			name += "(deferred)"
		}
		if d["type"] == "tool_search" {
			name = "tool_search"
		}
		got = append(got, name)
	}
	if want := "get_order_status,get_shipping_eta(deferred),issue_refund(deferred),tool_search"; strings.Join(got, ",") != want {
		t.Errorf("tools -team orders = %s, want %s", strings.Join(got, ","), want)
	}
	out, errOut, code = runBin(t, bins["dispatcher"], natsEnv, "tools", "-owners", "-team", "orders,billing")
	var owned []tooldef.Tool
	if code != 0 || json.Unmarshal([]byte(out), &owned) != nil || len(owned) != len(defs) || owned[0].Team != "orders" ||
		owned[0].Function != "get_order_status" || !strings.Contains(string(owned[0].Definition), `"name": "get_order_status"`) {
		t.Errorf("tools -owners -team orders,billing: exit %d, %s %s; want %d definitions, each with its team", code, out, errOut, len(defs))
	}
	if out, _, code = runBin(t, bins["dispatcher"], natsEnv, "tools", "-team", "billing"); code != 0 || strings.TrimSpace(out) != "[]" {
		t.Errorf("tools -team billing: exit %d, %q, want []", code, out)
	}
	if _, errOut, code = runBin(t, bins["dispatcher"], natsEnv, "tools", "-team", "Bad Team"); code != 1 || !strings.Contains(errOut, "-team") {
		t.Errorf("tools -team with a bad name: exit %d, %q", code, errOut)
	}

	_ = dev.cmd.Process.Signal(syscall.SIGTERM)
	if code := stopped(t, dev, 30*time.Second); code != 0 {
		t.Errorf("dev exited %d after SIGTERM, want 0", code)
	}
}

// Bad files stop simulator and dev before they serve anything, naming the
// file; dev needs a functions file.
func TestDevAndSimulatorRefuseBadFiles(t *testing.T) {
	bad := testutil.WriteFile(t, "scenarios.yaml", "scenarios:\n  - prompt: hi\n    calls: [{function: f, colour: red}]\n")
	var out, errOut bytes.Buffer
	if err := run(t.Context(), []string{"simulator", "-addr", "127.0.0.1:0", "-scenarios", bad}, &out, &errOut); err == nil ||
		!strings.Contains(err.Error(), bad) || !strings.Contains(err.Error(), "colour") {
		t.Errorf("simulator -scenarios with an unknown key: %v", err)
	}
	if err := run(t.Context(), []string{"dev", "-config", "../../testdata/dev-functions.yaml", "-scenarios", bad,
		"-addr", "127.0.0.1:0", "-nats-listen", "127.0.0.1:0"}, &out, &errOut); err == nil || !strings.Contains(err.Error(), bad) {
		t.Errorf("dev -scenarios with an unknown key: %v", err)
	}
	if err := run(t.Context(), []string{"dev"}, &out, &errOut); err == nil || !strings.Contains(err.Error(), "-config") {
		t.Errorf("dev without -config: %v", err)
	}
}
