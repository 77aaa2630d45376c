package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolrelay/toolrelay/internal/natstest"
	"github.com/toolrelay/toolrelay/internal/testutil"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// These tests run the built executor binary as separate processes and kill
// them with SIGKILL mid-call.

type cluster struct {
	t   *testing.T
	srv *natstest.Server
	js  jetstream.JetStream
	dir string
}

func newCluster(t *testing.T) *cluster {
	srv := natstest.Start(t)
	_, js := srv.Connect(t)
	return &cluster{t: t, srv: srv, js: js, dir: t.TempDir()}
}

// executor starts the binary serving cfg under name.
func (c *cluster) executor(name, cfg string) *osexec.Cmd {
	c.t.Helper()
	cmd := osexec.Command(executorBin, "-config", cfg)
	testutil.DieWithTest(cmd)
	log, err := os.Create(filepath.Join(c.dir, name+".log"))
	if err != nil {
		c.t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = log, log
	cmd.Env = append(os.Environ(), "NATS_URL="+c.srv.ClientURL(), "TOOLRELAY_EXECUTOR_NAME="+name,
		"TOOLRELAY_ACK_WAIT=1s", "TOOLRELAY_LOG_LEVEL=info")
	if err := cmd.Start(); err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait(); log.Close() })
	return cmd
}

func (c *cluster) waitServing(team, fn string) {
	c.t.Helper()
	testutil.WaitForWhat(c.t, 20*time.Second, team+"'s consumer of "+fn+" to exist", func() bool {
		s, err := c.js.Stream(context.Background(), protocol.CallStream(team))
		if err != nil {
			return false
		}
		_, err = s.Consumer(context.Background(), fn)
		return err == nil
	})
}

func (c *cluster) call(team, fn string) *protocol.Call {
	c.t.Helper()
	return c.callIn("as_kill/turn_1", team, fn)
}

// callIn queues a call of fn in the turn scope names.
func (c *cluster) callIn(scope, team, fn string) *protocol.Call {
	c.t.Helper()
	turn := protocol.NewTurnKey(protocol.PlatformAgents, scope, []string{"call_1"})
	call := &protocol.Call{Version: protocol.Version, Key: turn.Call("call_1"), Platform: protocol.PlatformAgents,
		Scope: scope, CallID: "call_1", Team: team, Function: fn, Arguments: json.RawMessage(`{}`),
		Deadline: time.Now().Add(time.Minute), CreatedAt: time.Now()}
	data, err := protocol.EncodeCall(call)
	if err != nil {
		c.t.Fatal(err)
	}
	if _, err := c.js.Publish(context.Background(), call.Subject(), data, jetstream.WithMsgID(string(call.Key))); err != nil {
		c.t.Fatal(err)
	}
	return call
}

func (c *cluster) result(call *protocol.Call) *protocol.Result {
	c.t.Helper()
	var res *protocol.Result
	testutil.WaitForWhat(c.t, 30*time.Second, "the result of call "+string(call.Key)+" to be recorded", func() bool {
		s, err := c.js.Stream(context.Background(), protocol.ResultStream(call.Team))
		if err != nil {
			return false
		}
		m, err := s.GetLastMsgForSubject(context.Background(), call.ResultSubject())
		if err != nil {
			return false
		}
		res, err = protocol.DecodeResult(m.Data)
		return err == nil
	})
	return res
}

func (c *cluster) results(call *protocol.Call) uint64 {
	s, err := c.js.Stream(context.Background(), protocol.ResultStream(call.Team))
	if err != nil {
		c.t.Fatal(err)
	}
	info, err := s.Info(context.Background(), jetstream.WithSubjectFilter(call.ResultSubject()))
	if err != nil {
		c.t.Fatal(err)
	}
	return info.State.Msgs
}

func lines(t *testing.T, path string) int {
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(b), "\n")
}

func slowConfig(t *testing.T, dir, marker string, sideEffects bool) string {
	return writeFile(t, fmt.Sprintf(`functions:
  - name: slow_job
    owner: ops
    side_effects: %v
    command: ["sh", "-c", "echo run >> %s; sleep 2; echo done"]
`, sideEffects, marker))
}

func TestKilledExecutorsCallIsRedeliveredAndAnsweredOnce(t *testing.T) {
	c := newCluster(t)
	marker := filepath.Join(c.dir, "runs")
	cfg := slowConfig(t, c.dir, marker, false)
	a := c.executor("exec-a", cfg)
	c.waitServing("ops", "slow_job")
	call := c.call("ops", "slow_job")
	testutil.WaitForWhat(t, 10*time.Second, "the slow job to start", func() bool { return lines(t, marker) == 1 })
	if err := a.Process.Kill(); err != nil { // SIGKILL mid-call
		t.Fatal(err)
	}
	_ = a.Wait()
	c.executor("exec-b", cfg)
	res := c.result(call)
	if !res.OK() || res.Output != "done\n" || res.Executor != "exec-b" || res.Attempt < 2 {
		t.Fatalf("result = %+v; want exec-b's output on a redelivery", res)
	}
	if n := c.results(call); n != 1 {
		t.Errorf("%d results recorded for one call", n)
	}
	if n := lines(t, marker); n != 2 {
		t.Errorf("the function ran %d times; want 2 (the killed run and the redelivery)", n)
	}
}

func TestKilledExecutorsSideEffectIsNotRepeated(t *testing.T) {
	c := newCluster(t)
	marker := filepath.Join(c.dir, "effects")
	cfg := slowConfig(t, c.dir, marker, true)
	a := c.executor("exec-a", cfg)
	c.waitServing("ops", "slow_job")
	call := c.call("ops", "slow_job")
	testutil.WaitForWhat(t, 10*time.Second, "the slow job to start", func() bool { return lines(t, marker) == 1 })
	if err := a.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = a.Wait()
	c.executor("exec-b", cfg)
	res := c.result(call)
	if res.OK() || res.Error.Code != protocol.CodeUnavailable || !strings.Contains(res.Error.Message, "may have run") {
		t.Fatalf("result = %+v; want a 'may have run' failure", res)
	}
	if n := c.results(call); n != 1 {
		t.Errorf("%d results recorded for one call", n)
	}
	if n := lines(t, marker); n != 1 {
		t.Errorf("the side effect happened %d times", n)
	}
}
