package exec_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/toolrelay/toolrelay/internal/natsembed"
	"github.com/toolrelay/toolrelay/internal/testutil"
	"github.com/toolrelay/toolrelay/pkg/exec"
)

// logBuffer collects log lines for a test to wait on.
type logBuffer struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	onWrite func(line string) // optional
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.onWrite != nil {
		b.onWrite(string(p))
	}
	return b.buf.Write(p)
}

func (b *logBuffer) count(s string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.Count(b.buf.String(), s)
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// An executor started before NATS waits for it, and once connected rides
// out a server restart.
func TestConnectWaitsForNATSAndReconnects(t *testing.T) {
	addr, dir := freeAddr(t), t.TempDir()
	logs := &logBuffer{}
	type conn struct {
		err  error
		done func()
	}
	got := make(chan conn, 1)
	go func() {
		nc, js, err := exec.Connect(t.Context(), "nats://"+addr, exec.ConnectOptions{Logger: slog.New(slog.NewTextHandler(logs, nil))})
		if err == nil {
			_, err = js.AccountInfo(t.Context())
		}
		got <- conn{err: err, done: func() {
			if nc != nil {
				nc.Close()
			}
		}}
	}()
	testutil.WaitForWhat(t, 10*time.Second, "two \"NATS not reachable yet\" logs", func() bool { return logs.count("NATS not reachable yet") >= 2 })
	srv, err := natsembed.Start(natsembed.Options{Listen: addr, StoreDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // the server running when the test ends
		if srv != nil {
			srv.Shutdown()
			srv.WaitForShutdown()
		}
	})
	c := <-got
	t.Cleanup(c.done) // before the server shuts down
	if c.err != nil {
		t.Fatalf("Connect = %v", c.err)
	}

	srv.Shutdown()
	srv.WaitForShutdown()
	testutil.WaitForWhat(t, 10*time.Second, "the executor to log its disconnection", func() bool { return logs.count("disconnected from NATS") >= 1 })
	if srv, err = natsembed.Start(natsembed.Options{Listen: addr, StoreDir: dir}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitForWhat(t, 10*time.Second, "the executor to log its reconnection", func() bool { return logs.count("reconnected to NATS") == 1 })
}

func TestConnectGivesUpWhenTheContextEnds(t *testing.T) {
	addr := freeAddr(t)
	stopped := errors.New("shutting down")
	ctx, cancel := context.WithCancelCause(t.Context())
	logs := &logBuffer{onWrite: func(line string) {
		if strings.Contains(line, "NATS not reachable yet") {
			cancel(stopped) // after one failed attempt
		}
	}}
	nc, js, err := exec.Connect(ctx, "nats://"+addr, exec.ConnectOptions{Logger: slog.New(slog.NewTextHandler(logs, nil))})
	if nc != nil || js != nil || !errors.Is(err, stopped) || !strings.HasPrefix(err.Error(), "exec: connect to NATS at nats://"+addr) {
		t.Fatalf("Connect = %v, %v, %v; want an exec: error wrapping the cause", nc, js, err)
	}
}

// A malformed URL is a typo, not a server that is down: Connect refuses it
// at once instead of retrying a DNS lookup of "nats" for ever.
func TestConnectRefusesAMalformedURL(t *testing.T) {
	for _, url := range []string{"nats//127.0.0.1:4222", "http://127.0.0.1:4222", "nats://127.0.0.1:42x22", "nats://127.0.0.1:4222,", "nats://:4222"} {
		_, _, err := exec.Connect(t.Context(), url, exec.ConnectOptions{Logger: testutil.Logger(t)})
		if !errors.Is(err, exec.ErrBadURL) || !strings.Contains(err.Error(), "nats://host:port") {
			t.Errorf("Connect(%q) = %v; want ErrBadURL saying what a URL looks like", url, err)
		}
	}
	for _, url := range []string{"nats://127.0.0.1:4222", "127.0.0.1:4222", "tls://a.example:4222, nats://b.example", "localhost"} {
		if err := exec.CheckServerURLs(url); err != nil {
			t.Errorf("%q refused: %v", url, err)
		}
	}
}
