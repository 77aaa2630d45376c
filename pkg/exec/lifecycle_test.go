package exec_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/toolrelay/toolrelay/internal/testutil"
	"github.com/toolrelay/toolrelay/pkg/exec"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// declared returns the live declarations of team's function.
func (h *harness) declared(team, function string) []*protocol.Declaration {
	h.t.Helper()
	kv, err := h.js.KeyValue(context.Background(), protocol.DeclarationBucket)
	if err != nil {
		h.t.Fatal(err)
	}
	keys, err := kv.ListKeysFiltered(context.Background(), team+"."+function+".*")
	if err != nil {
		h.t.Fatal(err)
	}
	var out []*protocol.Declaration
	for k := range keys.Keys() {
		if e, err := kv.Get(context.Background(), k); err == nil {
			if d, err := protocol.DecodeDeclaration(e.Value()); err == nil {
				out = append(out, d)
			}
		}
	}
	return out
}

// declarations lists the live declarations of function, by executor name.
func (h *harness) declarations(function string) []string {
	h.t.Helper()
	kv, err := h.js.KeyValue(context.Background(), protocol.DeclarationBucket)
	if err != nil {
		return nil
	}
	keys, err := kv.ListKeysFiltered(context.Background(), "*."+function+".*")
	if err != nil {
		h.t.Fatal(err)
	}
	var names []string
	for k := range keys.Keys() {
		e, err := kv.Get(context.Background(), k)
		if err != nil {
			continue
		}
		d, err := protocol.DecodeDeclaration(e.Value())
		if err != nil {
			h.t.Fatalf("declaration %s: %v", k, err)
		}
		names = append(names, d.Executor)
	}
	return names
}

// Each running executor declares what it serves; one that stops withdraws
// its declaration at once.
func TestRunningExecutorsDeclareAndStoppedOnesWithdraw(t *testing.T) {
	h := start(t, "team-a", exec.Options{Name: "first"}, echo())
	stopSecond := h.run("team-a", exec.Options{Name: "second"}, echo())
	testutil.WaitForWhat(t, 5*time.Second, "both executors' declarations of echo", func() bool { return len(h.declarations("echo")) == 2 })
	stopSecond()
	if got := h.declarations("echo"); len(got) != 1 || got[0] != "first" {
		t.Fatalf("declarations after the second stopped = %v, want [first]", got)
	}
	h.stopFirst()
	if got := h.declarations("echo"); len(got) != 0 {
		t.Fatalf("declarations after both stopped = %v, want none", got)
	}
}

// An executor whose connection is closed under it (nothing can heal that)
// does not go on in silence: Run ends with an error naming the function.
// A deleted consumer is recreated instead (heal_test.go).
func TestRunEndsWhenItsConnectionCloses(t *testing.T) {
	h := start(t, "team-a", exec.Options{}, echo())
	_, js := h.srv.Connect(t)
	e, err := exec.New(js, "team-b", exec.Options{Logger: testutil.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	other := echo()
	other.Name = "echo_b"
	if err := e.Register(other); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- e.Run(t.Context()) }()
	testutil.WaitForWhat(t, 10*time.Second, "echo_b to be declared", func() bool { return len(h.declarations("echo_b")) == 1 })
	js.Conn().Close()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "echo_b") {
			t.Fatalf("Run = %v, want an error naming echo_b", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run went on after its connection closed")
	}
}

// With every worker busy, a closed connection still ends Run within its
// shutdown timeout, not when the running call ends (its deadline, maybe
// minutes away).
func TestRunEndsWhenItsConnectionClosesWhileBusy(t *testing.T) {
	h := start(t, "team-a", exec.Options{}, echo())
	_, js := h.srv.Connect(t)
	e, err := exec.New(js, "team-a", exec.Options{Logger: testutil.Logger(t), ShutdownTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan struct{}, 1)
	if err := e.Register(exec.Function{Name: "busy", Concurrency: 1, Handler: exec.HandlerFunc(func(ctx context.Context, _ *exec.Invocation) ([]byte, error) {
		started <- struct{}{}
		<-ctx.Done()
		return nil, ctx.Err()
	})}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- e.Run(t.Context()) }()
	testutil.WaitForWhat(t, 10*time.Second, "busy to be declared", func() bool { return len(h.declarations("busy")) == 1 })
	h.call("team-a", "busy", `{}`, time.Now().Add(10*time.Minute))
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("the call did not start")
	}
	js.Conn().Close()
	closed := time.Now()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "busy") {
			t.Fatalf("Run = %v, want an error naming busy", err)
		}
		if took := time.Since(closed); took > 5*time.Second {
			t.Errorf("Run took %s after the connection closed; want about its 1s shutdown timeout", took.Round(time.Millisecond))
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run went on after its connection closed, waiting for the busy call")
	}
}
