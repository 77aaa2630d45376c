package cliutil

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	osexec "os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// When TOOLRELAY_SIGNAL_CHILD is set, the test binary plays a command that
// takes ages to stop: it prints "stopping" once its context ends and then
// never returns by itself.
func TestMain(m *testing.M) {
	if os.Getenv("TOOLRELAY_SIGNAL_CHILD") != "" {
		ctx, stop := SignalContext(context.Background(), os.Stderr)
		defer stop()
		fmt.Println("ready")
		<-ctx.Done()
		fmt.Println("stopping:", context.Cause(ctx))
		select {}
	}
	os.Exit(m.Run())
}

// The first signal asks to stop (the context ends, naming the signal); a
// second one while stopping exits at once with 128+signal.
func TestSecondSignalExitsAtOnce(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM} {
		t.Run(sig.String(), func(t *testing.T) {
			cmd := osexec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), "TOOLRELAY_SIGNAL_CHILD=1")
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
			lines := bufio.NewScanner(out)
			expect := func(prefix string) {
				t.Helper()
				if !lines.Scan() || !strings.HasPrefix(lines.Text(), prefix) {
					t.Fatalf("child printed %q (%v), want %q", lines.Text(), lines.Err(), prefix)
				}
			}
			expect("ready")
			_ = cmd.Process.Signal(sig)
			expect("stopping: received " + sig.String())
			_ = cmd.Process.Signal(sig)
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			select {
			case err := <-done:
				var exit *osexec.ExitError
				if !errors.As(err, &exit) || exit.ExitCode() != 128+int(sig) {
					t.Fatalf("after the second %v: %v, want exit status %d", sig, err, 128+int(sig))
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("still running 10s after the second %v", sig)
			}
		})
	}
}
