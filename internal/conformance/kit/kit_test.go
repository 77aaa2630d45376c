package kit_test

import (
	"bytes"
	"context"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/toolrelay/toolrelay/internal/conformance/kit"
	"github.com/toolrelay/toolrelay/internal/natstest"
	"github.com/toolrelay/toolrelay/internal/testutil"
	"github.com/toolrelay/toolrelay/pkg/dispatch"
)

// TestGoExecutorPassesTheKit runs every case of the kit against pkg/exec:
// the kit's checks are docs/protocol.md's statements, so this is also the
// test that the Go executor does what the document says.
func TestGoExecutorPassesTheKit(t *testing.T) {
	srv := natstest.Start(t)
	_, djs := srv.Connect(t)
	d, err := dispatch.New(djs, nil, dispatch.Options{Logger: testutil.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	runErr := make(chan error, 1)
	go func() { runErr <- d.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-runErr; err != nil {
			t.Errorf("dispatcher Run: %v", err)
		}
	})
	testutil.WaitForWhat(t, 10*time.Second, "the dispatcher to be ready", d.Ready)

	nc, js := srv.Connect(t)
	var out bytes.Buffer
	start := time.Now()
	rep, err := kit.Run(t.Context(), nc, &kit.GoTarget{JS: js, Team: "kit", Logger: testutil.Logger(t)}, kit.Options{Team: "kit"}, &out)
	t.Logf("kit report (%s):\n%s", time.Since(start).Round(time.Millisecond), out.String())
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK() || rep.Skipped > 0 {
		t.Errorf("the Go executor failed %d and skipped %d of the kit's cases", rep.Failed, rep.Skipped)
	}
}

// TestShellStopsTheExecutorNotTheShell: -exec's command runs under sh -c,
// and dash does not exec it; SIGTERM must still reach the executor, the
// kit must wait for it to stop, and its exit status must be the command's.
func TestShellStopsTheExecutorNotTheShell(t *testing.T) {
	pidFile := t.TempDir() + "/pid"
	// The "executor" is a shell that is not exec'd, with a graceful stop.
	// Its pid is written once its trap is set: the test stops it as soon as
	// it reads the pid, and a SIGTERM before the trap would kill it.
	executor := `sh -c 'trap "sleep 0.3; echo stopped; exit 0" TERM; echo $$ > ` + pidFile + `; while :; do sleep 0.05; done'; echo after`
	var out testutil.Buffer
	c := kit.Shell(executor, nil, &out)
	if err := c.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	var pid int
	testutil.WaitForWhat(t, 5*time.Second, "the executor to start", func() bool {
		b, err := os.ReadFile(pidFile)
		if err == nil && len(b) > 0 && b[len(b)-1] == '\n' {
			pid, err = strconv.Atoi(strings.TrimSpace(string(b)))
			return err == nil
		}
		return false
	})
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := c.Stop(ctx); err != nil {
		t.Fatalf("Stop: %v (output %q)", err, out.String())
	}
	if got := out.String(); !strings.HasSuffix(got, "stopped\nafter\n") {
		t.Errorf("expected the executor to stop gracefully before the shell exited, saw output %q", got)
	}
	if err := syscall.Kill(pid, 0); err == nil {
		t.Errorf("the executor (pid %d) outlived Stop", pid)
	}
	if err := c.Stop(ctx); err != nil {
		t.Errorf("a second Stop: %v", err)
	}
}

// TestOperationsDocShowsTheEchoSchema keeps the schema teams copy from
// docs/operations.md the one the kit's Go functions declare.
func TestOperationsDocShowsTheEchoSchema(t *testing.T) {
	doc, err := os.ReadFile("../../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(doc, []byte("```json\n"+kit.EchoSchema+"\n```")) {
		t.Errorf("docs/operations.md (Conformance kit) does not show kit.EchoSchema:\n%s", kit.EchoSchema)
	}
}
