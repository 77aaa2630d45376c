package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
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
		ids[i] = postWatch(t, a, fmt.Sprintf(`{"platform":"responses","response_id":%q}`, r.ID))
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

// From the first-hour trial: a second dispatcher on a taken port said
// "listen on :8080" without naming the setting, after creating the
// embedded server's store; a taken NATS port did not say how to join the
// dispatcher already there.
func TestTakenPortsNameTheirSettings(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	data := filepath.Join(t.TempDir(), "toolrelay-data")
	t.Setenv("NATS_URL", "")
	t.Setenv("TOOLRELAY_DATA_DIR", data)
	t.Setenv("OPENAI_API_KEY", "sk-test")
	serve := func() error {
		var out, errOut bytes.Buffer
		return run(t.Context(), []string{"serve"}, &out, &errOut)
	}

	t.Setenv("TOOLRELAY_HTTP_ADDR", busy.Addr().String())
	t.Setenv("TOOLRELAY_NATS_LISTEN", freeAddr(t))
	if err := serve(); err == nil || !strings.Contains(err.Error(), "TOOLRELAY_HTTP_ADDR") {
		t.Errorf("HTTP port taken: %v; want an error naming TOOLRELAY_HTTP_ADDR", err)
	}
	if _, err := os.Stat(data); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the failed start created %s (%v)", data, err)
	}

	t.Setenv("TOOLRELAY_HTTP_ADDR", freeAddr(t))
	t.Setenv("TOOLRELAY_NATS_LISTEN", busy.Addr().String())
	err = serve()
	if err == nil || !strings.Contains(err.Error(), "TOOLRELAY_NATS_LISTEN") || !strings.Contains(err.Error(), "NATS_URL=nats://"+busy.Addr().String()) {
		t.Errorf("NATS port taken: %v; want an error naming TOOLRELAY_NATS_LISTEN and how to join with NATS_URL", err)
	}
}

// A public address or authorization server that is not an absolute URL, or
// authorization servers without tokens, stop the start with an error
// naming the setting, before anything is created.
func TestBadMCPAuthorizationSettingsAreRefused(t *testing.T) {
	data := filepath.Join(t.TempDir(), "toolrelay-data")
	t.Setenv("NATS_URL", "")
	t.Setenv("TOOLRELAY_DATA_DIR", data)
	t.Setenv("TOOLRELAY_HTTP_ADDR", freeAddr(t))
	t.Setenv("TOOLRELAY_NATS_LISTEN", freeAddr(t))
	tokens := filepath.Join(t.TempDir(), "tokens.txt")
	if err := os.WriteFile(tokens, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ public, servers, tokens, want string }{
		{"tools.example.com", "", "", "TOOLRELAY_PUBLIC_URL"},
		{"https://tools.example.com/?x=1", "", "", "TOOLRELAY_PUBLIC_URL"},
		{"", "https://login.example.com,ftp://x", tokens, "TOOLRELAY_MCP_AUTHORIZATION_SERVERS"},
		{"", "https://login.example.com", "", "without TOOLRELAY_API_TOKENS_FILE"},
	} {
		t.Setenv("TOOLRELAY_PUBLIC_URL", c.public)
		t.Setenv("TOOLRELAY_MCP_AUTHORIZATION_SERVERS", c.servers)
		t.Setenv("TOOLRELAY_API_TOKENS_FILE", c.tokens)
		var out, errOut bytes.Buffer
		if err := run(t.Context(), []string{"serve"}, &out, &errOut); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v; want an error naming %s", c, err, c.want)
		}
	}
	if _, err := os.Stat(data); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a refused start created %s (%v)", data, err)
	}
}
