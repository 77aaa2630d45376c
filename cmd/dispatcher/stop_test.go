package main

import (
	"context"
	"fmt"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/toolrelay/toolrelay/internal/platformsim"
)

// stopped waits for p to exit after a signal and returns its exit code.
func stopped(t *testing.T, p *proc, within time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(within):
		t.Fatalf("%s still running %s after SIGTERM", p.name, within)
	}
	return p.cmd.ProcessState.ExitCode()
}

// The built dispatcher, with its embedded JetStream server, stops on
// SIGTERM while turns are open: it exits 0 within its shutdown timeout and
// frees its ports, a restart on the same data directory is ready within
// seconds, and the restarted dispatcher finishes every turn, each
// submitted exactly once. The executor stops on SIGTERM too, with 0.
func TestBuiltDispatcherStopsOnSIGTERMAndRestartsOnItsData(t *testing.T) {
	listen := freeAddr(t)
	w := newWorldOn(t, "nats://"+listen, platformsim.HoroscopeScenario)
	embedded := []string{"NATS_URL=", "TOOLRELAY_NATS_LISTEN=" + listen, "TOOLRELAY_DATA_DIR=" + t.TempDir(),
		"TOOLRELAY_SHUTDOWN_TIMEOUT=5s"}
	a := w.dispatcher("dispatcher-a", embedded...)
	ex := w.executor("exec-1", "-demo")

	const turns = 20
	ids := make([]string, turns)
	for i := range ids {
		r, err := w.client.Responses.New(context.Background(), responsesParams("What is my horoscope? I am an Aquarius."))
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = watch(t, a, fmt.Sprintf(`{"platform":"responses","response_id":%q}`, r.ID))
	}
	if err := a.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := stopped(t, a, 15*time.Second); code != 0 {
		t.Fatalf("dispatcher exited %d after SIGTERM, want 0", code)
	}
	for _, addr := range []string{listen, a.addr} {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatalf("%s still taken after the dispatcher exited: %v", addr, err)
		}
		ln.Close()
	}

	restart := time.Now()
	b := w.dispatcher("dispatcher-b", embedded...)
	if took := time.Since(restart); took > 20*time.Second {
		t.Errorf("the restart on the same data was ready after %s", took)
	}
	for i, id := range ids {
		st := awaitWatch(t, b, id, 60*time.Second)
		if st.State != "completed" || !strings.Contains(st.Answer, "baby otter") {
			t.Fatalf("watch %d after the restart: %s %q %s", i, st.State, st.Answer, st.Error)
		}
	}
	if n := w.sim.Stats().FunctionCallOutputs; n != turns {
		t.Errorf("outputs accepted = %d, want exactly %d (one per turn)", n, turns)
	}

	if err := ex.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := stopped(t, ex, 15*time.Second); code != 0 {
		t.Fatalf("executor exited %d after SIGTERM, want 0", code)
	}
	if err := b.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if code := stopped(t, b, 15*time.Second); code != 0 {
		t.Fatalf("dispatcher exited %d after SIGINT, want 0", code)
	}
}
