package exec_test

import (
	"context"
	"testing"
	"time"

	"github.com/toolrelay/toolrelay/internal/natstest"
	"github.com/toolrelay/toolrelay/internal/testutil"
	"github.com/toolrelay/toolrelay/pkg/exec"
)

// An executor told to stop while NATS is away (the embedded server of a
// dispatcher stopping first, a partition) stops well within its shutdown
// timeout: its consumers cannot be drained, so they are stopped, and its
// calls are redelivered when their ack wait ends.
func TestStopWhileNATSIsAway(t *testing.T) {
	srv := natstest.Start(t)
	nc, js := srv.Connect(t)
	registrar(t, js)
	e, err := exec.New(js, "team-a", exec.Options{Logger: testutil.Logger(t), ShutdownTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Register(echo()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	h := &harness{t: t, srv: srv, js: js}
	testutil.WaitForWhat(t, 10*time.Second, "the declaration of echo", func() bool { return len(h.declarations("echo")) == 1 })

	srv.Shutdown()
	srv.WaitForShutdown()
	testutil.WaitForWhat(t, 10*time.Second, "the executor's connection to drop", func() bool { return !nc.IsConnected() })
	start := time.Now()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run = %v, want nil", err)
		}
		// The withdrawal's own bound, and a moment for the consumers.
		t.Logf("stopped in %s", time.Since(start).Round(time.Millisecond))
		if took := time.Since(start); took > 5*time.Second {
			t.Errorf("Run took %s to stop with NATS away; want a few seconds", took.Round(time.Millisecond))
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not stop")
	}
}
