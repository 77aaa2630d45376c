package main

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/toolrelay/toolrelay/internal/platformsim"
	"github.com/toolrelay/toolrelay/internal/testutil"
	"github.com/toolrelay/toolrelay/pkg/dispatch"
	"github.com/toolrelay/toolrelay/pkg/dispatch/httpapi"
)

// An operator decides held calls with the CLI, against the built
// dispatcher and an executor serving a functions file whose function
// needs approval: approvals lists them, approve runs one, deny (which
// wants a reason) fails the other with it, and audit prints the trail as
// a table and as JSON lines. A team token of another team decides nothing.
func TestApprovalCommands(t *testing.T) {
	w := newWorld(t, platformsim.Scenario{Name: "wipes", Prompt: "wipe two disks",
		Steps: []platformsim.Step{{
			{Name: "wipe_disk", As: "first", Arguments: `{"disk":"d-1"}`},
			{Name: "wipe_disk", As: "second", Arguments: `{"disk":"d-2"}`},
		}},
		Answer: `first: {{out "first"}} / second: {{out "second"}}`})
	cfg := filepath.Join(w.dir, "functions.yaml")
	if err := os.WriteFile(cfg, []byte(`functions:
  - name: wipe_disk
    owner: ops
    side_effects: true
    timeout: 5s
    approval: required
    parameters: {type: object, properties: {disk: {type: string}}, required: [disk]}
    command: ["cat"]
`), 0o644); err != nil {
		t.Fatal(err)
	}
	tokens := filepath.Join(w.dir, "tokens.txt")
	token := func(args ...string) string { t.Helper(); return newToken(t, tokens, args...) }
	ops, shipping := token("-name", "ops-oncall", "-teams", "ops"), token("-name", "shipping", "-teams", "shipping")
	d := w.dispatcher("dispatcher", "TOOLRELAY_API_TOKENS_FILE="+tokens)
	w.executor("exec-1", "-config", cfg)
	addr := "http://" + d.addr
	t.Setenv(APIURLEnv, addr)

	thread, runID := w.assistantsRun("wipe two disks", nil)
	watchWith(t, d, ops, `{"platform":"assistants","thread_id":"`+thread+`","run_id":"`+runID+`"}`)
	t.Setenv(APITokenEnv, ops)
	var list struct{ Approvals []httpapi.ApprovalView }
	testutil.WaitForWhat(t, 30*time.Second, "two wipes awaiting approval", func() bool {
		if err := json.Unmarshal([]byte(inspect(t, "approvals", "-json")), &list); err != nil {
			t.Fatal(err)
		}
		return len(list.Approvals) == 2
	})
	disk := func(a httpapi.ApprovalView) string {
		var args struct{ Disk string }
		_ = json.Unmarshal(a.Arguments, &args)
		return args.Disk
	}
	first, second := list.Approvals[0], list.Approvals[1]
	if disk(first) != "d-1" {
		first, second = second, first
	}
	if table := inspect(t, "approvals"); !strings.Contains(table, string(first.CallKey)) || !strings.Contains(table, "awaiting_approval") || !strings.Contains(table, `"d-2"`) {
		t.Errorf("approvals table:\n%s", table)
	}

	t.Setenv(APITokenEnv, shipping)
	if out := inspect(t, "approvals"); !strings.Contains(out, "no calls await approval") {
		t.Errorf("the shipping team sees ops' held calls:\n%s", out)
	}
	if _, err := inspectErr(t, "approve", string(first.CallKey)); err == nil || !strings.Contains(err.Error(), "404") {
		t.Errorf("the shipping team approving ops' call: %v, want 404", err)
	}
	t.Setenv(APITokenEnv, ops)
	if _, err := inspectErr(t, "deny", string(second.CallKey)); err == nil || !strings.Contains(err.Error(), "-reason") {
		t.Errorf("deny without a reason: %v, want it asked for", err)
	}
	if out := inspect(t, "approve", string(first.CallKey)); !strings.Contains(out, "approved by ops-oncall") {
		t.Errorf("approve: %s", out)
	}
	if out := inspect(t, "deny", string(second.CallKey), "-reason", "d-2 holds the backups"); !strings.Contains(out, "denied by ops-oncall") {
		t.Errorf("deny: %s", out)
	}
	testutil.WaitForWhat(t, 30*time.Second, "the run to complete", func() bool { return w.runStatus(thread, runID) == "completed" })

	var kinds []string
	testutil.WaitForWhat(t, 10*time.Second, "the audit trail to hold two requests, two decisions and the run", func() bool {
		kinds = kinds[:0]
		sc := bufio.NewScanner(strings.NewReader(inspect(t, "audit", "-json")))
		for sc.Scan() {
			var e dispatch.AuditEntry
			if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
				t.Fatalf("audit -json line %q: %v", sc.Text(), err)
			}
			kinds = append(kinds, e.Kind)
		}
		return strings.Count(strings.Join(kinds, " "), "requested") == 2 && strings.Contains(strings.Join(kinds, " "), "approved") &&
			strings.Contains(strings.Join(kinds, " "), "denied") && strings.Contains(strings.Join(kinds, " "), "run")
	})
	table := inspect(t, "audit", "-team", "ops")
	for _, want := range []string{"KIND", "requested", "approved", "ops-oncall", "d-2 holds the backups", "run", "wipe_disk"} {
		if !strings.Contains(table, want) {
			t.Errorf("audit table lacks %q:\n%s", want, table)
		}
	}
	t.Setenv(APITokenEnv, shipping)
	if _, err := inspectErr(t, "audit", "-team", "ops"); err == nil || !strings.Contains(err.Error(), "403") {
		t.Errorf("the shipping team reading ops' audit trail: %v, want 403", err)
	}
}
