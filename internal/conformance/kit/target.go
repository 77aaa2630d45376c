package kit

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	osexec "os/exec"
	"sync"
	"syscall"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolrelay/toolrelay/pkg/exec"
)

// Command is an executor process the kit starts and stops: Argv run with
// the kit's environment plus Env, its output copied to Output, in a process
// group of its own. Stop sends SIGTERM to the group and waits; an exit
// status other than 0, or no exit before the context ends (then the group
// is killed), is an error.
type Command struct {
	Argv   []string
	Env    []string
	Output io.Writer

	mu   sync.Mutex
	cmd  *osexec.Cmd
	done chan error
}

var _ Target = (*Command)(nil)

// Shell is the Command of a command line run by sh -c, as `dispatcher
// conformance -exec` runs it. SIGTERM must reach the executor whether or
// not the shell execs it (dash, Debian's sh, stays as its parent): the
// signal goes to the process group, and the shell traps it as a no-op, so
// it waits for the executor to stop and exits with its status.
func Shell(command string, env []string, out io.Writer) *Command {
	return &Command{Argv: []string{"sh", "-c", "trap : TERM\n" + command}, Env: env, Output: out}
}

// Start starts the process.
func (c *Command) Start(context.Context) error {
	if len(c.Argv) == 0 {
		return errors.New("conformance: no executor command")
	}
	cmd := osexec.Command(c.Argv[0], c.Argv[1:]...)
	cmd.Env = append(os.Environ(), c.Env...)
	cmd.Stdout, cmd.Stderr = c.Output, c.Output
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("conformance: start %s: %w", c.Argv[0], err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	c.mu.Lock()
	c.cmd, c.done = cmd, done
	c.mu.Unlock()
	return nil
}

// Stop sends SIGTERM to the process group and waits for the process to
// exit.
func (c *Command) Stop(ctx context.Context) error {
	c.mu.Lock()
	cmd, done := c.cmd, c.done
	c.cmd = nil
	c.mu.Unlock()
	if cmd == nil {
		return nil
	}
	pgid := cmd.Process.Pid // Setpgid: the group is the process's own
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("conformance: the executor exited: %w", err)
		}
		return nil
	case <-ctx.Done():
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		<-done
		return fmt.Errorf("conformance: the executor did not exit after SIGTERM: %w", context.Cause(ctx))
	}
}

// GoTarget serves GoFunctions on pkg/exec in-process as team: the
// reference executor. Stop cancels Run's context, as SIGTERM does to
// cmd/executor.
type GoTarget struct {
	JS     jetstream.JetStream
	Team   string
	Logger *slog.Logger

	cancel context.CancelFunc
	done   chan error
}

var _ Target = (*GoTarget)(nil)

// Start registers the functions on a new executor and runs it.
func (g *GoTarget) Start(ctx context.Context) error {
	e, err := exec.New(g.JS, g.Team, exec.Options{Name: "go-reference", Logger: g.Logger})
	if err != nil {
		return err
	}
	for _, fn := range GoFunctions() {
		if err := e.Register(fn); err != nil {
			return err
		}
	}
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	g.cancel, g.done = cancel, make(chan error, 1)
	go func() { g.done <- e.Run(rctx) }()
	return nil
}

// Stop stops the executor and waits for Run to return.
func (g *GoTarget) Stop(ctx context.Context) error {
	if g.cancel == nil {
		return nil
	}
	g.cancel()
	select {
	case err := <-g.done:
		return err
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// Running is the target of an executor already running, which the kit
// cannot stop or start: run it with Options.NoRestart.
type Running struct{}

// Start does nothing.
func (Running) Start(context.Context) error { return nil }

// Stop does nothing.
func (Running) Stop(context.Context) error { return nil }
