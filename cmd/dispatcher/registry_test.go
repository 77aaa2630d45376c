package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/toolrelay/toolrelay/internal/natstest"
	"github.com/toolrelay/toolrelay/internal/platformsim"
	"github.com/toolrelay/toolrelay/internal/testutil"
	"github.com/toolrelay/toolrelay/pkg/dispatch"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// searchDocsConfig writes a functions file serving search_docs with the
// given required property.
func searchDocsConfig(t *testing.T, dir, required string) string {
	t.Helper()
	path := filepath.Join(dir, "search-"+required+".yaml")
	body := fmt.Sprintf("functions:\n  - name: search_docs\n    owner: docs\n"+
		"    parameters: {type: object, properties: {%s: {type: string}}, required: [%s]}\n"+
		"    command: [\"sh\", \"-c\", \"echo found\"]\n", required, required)
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// The reproduction, with the built binaries: executors of the same
// team with another schema for search_docs run briefly beside the real
// one, one stopped with SIGTERM and one killed with SIGKILL. Their schema
// dies with them: the registry drops the first at once and the second when
// its lease lapses, and calls with the original arguments are answered.
func TestShortLivedExecutorsSchemaDiesWithIt(t *testing.T) {
	search := func(name, prompt string) platformsim.Scenario {
		return platformsim.Scenario{Name: name, Prompt: prompt,
			Steps: []platformsim.Step{{{Name: "search_docs", Arguments: `{"query":"nats"}`}}}, Answer: `{{out "search_docs"}}`}
	}
	w := newWorld(t, search("after", "search after it stopped"))
	w.executor("exec-v1", "-config", searchDocsConfig(t, w.dir, "query"))
	d := w.dispatcher("dispatcher")
	nc, js := natstest.Connect(t, w.natsURL)
	defer nc.Close()
	executors := func() []dispatch.ExecutorStatus {
		fns, err := dispatch.Registry(context.Background(), js)
		if err != nil || len(fns) != 1 {
			return nil
		}
		return fns[0].Executors
	}

	other := searchDocsConfig(t, w.dir, "q")
	stopped := w.start("exec-q-stopped", bins["executor"], []string{"-config", other}, "TOOLRELAY_EXECUTOR_NAME=exec-q-stopped")
	killed := w.start("exec-q-killed", bins["executor"], []string{"-config", other}, "TOOLRELAY_EXECUTOR_NAME=exec-q-killed")
	testutil.WaitForWhat(t, 30*time.Second, "three executors of get_weather to be registered", func() bool { return len(executors()) == 3 })
	out := toolsStatus(t, w)
	if !strings.Contains(out, "executors disagree on the schema") {
		t.Errorf("tools -status while the schemas differ:\n%s", out)
	}
	_ = stopped.cmd.Process.Signal(syscall.SIGTERM)
	_ = killed.cmd.Process.Kill()
	<-killed.done
	if code := stoppedCode(t, stopped); code != 0 {
		t.Fatalf("exec-q-stopped exited %d after SIGTERM, want 0", code)
	}
	// The stopped one withdrew at once; the killed one lapses with its lease.
	testutil.WaitForWhat(t, protocol.LeaseTTL+10*time.Second, "only exec-v1 to be left, the stopped and the killed executors gone", func() bool {
		ex := executors()
		return len(ex) == 1 && ex[0].Executor == "exec-v1"
	})
	r, err := w.client.Responses.New(context.Background(), responsesParams("search after it stopped"))
	if err != nil {
		t.Fatal(err)
	}
	st := awaitWatch(t, d, postWatch(t, d, fmt.Sprintf(`{"platform":"responses","response_id":%q}`, r.ID)), 30*time.Second)
	if a := st.Answer; strings.TrimSpace(a) != "found" {
		t.Fatalf("after the other executors stopped: answer %q, want the function's output", a)
	}
	out = toolsStatus(t, w)
	if !strings.Contains(out, "exec-v1") || strings.Contains(out, "exec-q") || strings.Contains(out, "disagree") {
		t.Errorf("tools -status after they stopped:\n%s", out)
	}
}

func stoppedCode(t *testing.T, p *proc) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		t.Fatalf("%s still running 20s after SIGTERM", p.name)
	}
	return p.cmd.ProcessState.ExitCode()
}

// toolsStatus runs the built "dispatcher tools -status".
func toolsStatus(t *testing.T, w *world) string {
	t.Helper()
	p := w.start(fmt.Sprintf("tools-%d", time.Now().UnixNano()), bins["dispatcher"], []string{"tools", "-status"})
	<-p.done
	b, err := os.ReadFile(filepath.Join(w.dir, p.name+".log"))
	if err != nil || p.cmd.ProcessState.ExitCode() != 0 {
		t.Fatalf("dispatcher tools -status: exit %d, %v\n%s", p.cmd.ProcessState.ExitCode(), err, b)
	}
	return string(b)
}
