package dispatch_test

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/toolrelay/toolrelay/internal/natstest"
	"github.com/toolrelay/toolrelay/internal/provision"
	"github.com/toolrelay/toolrelay/internal/testutil"
	"github.com/toolrelay/toolrelay/pkg/dispatch"
	"github.com/toolrelay/toolrelay/pkg/exec"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// queueOnly makes team's call stream without a consumer: calls published
// to it stay queued, as they do for an executor that stopped pulling.
func (e *env) queueOnly(team string) {
	e.t.Helper()
	if _, err := provision.Stream(context.Background(), e.js, provision.CallStreamConfig(team, provision.Options{})); err != nil {
		e.t.Fatal(err)
	}
}

// takenIn watches a Responses conversation started with prompt and waits
// until its turn is taken in (its call published).
func (e *env) takenIn(d *dispatch.Dispatcher, prompt string) *dispatch.Watch {
	e.t.Helper()
	w, err := d.Watch(context.Background(), e.response(prompt))
	if err != nil {
		e.t.Fatal(err)
	}
	testutil.WaitForWhat(e.t, 10*time.Second, "the turn to be taken in", func() bool {
		w, err = d.WatchStatus(context.Background(), w.ID)
		return err == nil && len(w.Turns) == 1
	})
	return w
}

// ended waits for the watch to end and returns it.
func ended(t *testing.T, d *dispatch.Dispatcher, w *dispatch.Watch, within time.Duration, what string) *dispatch.Watch {
	t.Helper()
	var err error
	testutil.WaitForWhat(t, within, what, func() bool {
		w, err = d.WatchStatus(context.Background(), w.ID)
		return err == nil && w.State != dispatch.WatchActive
	})
	return w
}

// The only executor of a function stops (it withdraws its declaration)
// while a call waits for it: the call fails as unavailable once the grace
// has passed, not at the run's deadline ten minutes later.
func TestQueuedCallFailsWhenTheLastExecutorStops(t *testing.T) {
	t.Parallel()
	e := newEnv(t, weatherScenario("stopped", "weather, stopped", `{"location":"Oslo"}`))
	e.queueOnly("geo")
	stop := e.declare("geo", "get_weather", weatherSchema, "test-executor", uuid.NewString())
	d, _ := e.dispatcher(dispatch.Options{ServeGrace: time.Second})
	w := e.takenIn(d, "weather, stopped")
	stop()
	gone := time.Now()
	w = ended(t, d, w, 15*time.Second, "the queued call to fail as unavailable")
	if !strings.Contains(w.Answer, `"type":"unavailable"`) || !strings.Contains(w.Answer, "no executor is serving it") {
		t.Fatalf("answer = %q, want an unavailable error", w.Answer)
	}
	t.Logf("failed %s after the executor stopped (grace 1s)", time.Since(gone).Round(time.Millisecond))
	if took := time.Since(gone); took < time.Second || took > 8*time.Second {
		t.Errorf("failed %s after the executor stopped; want after the 1s grace and within seconds", took.Round(time.Millisecond))
	}
}

// The only executor is killed (its connection closes, nothing is
// withdrawn) while it runs a call: once its lease lapses and the grace has
// passed, the call fails as unavailable, well before its deadline.
func TestRunningCallFailsWhenTheLastExecutorIsKilled(t *testing.T) {
	t.Parallel()
	e := newEnv(t, weatherScenario("killed", "weather, killed", `{"location":"Oslo"}`))
	d, _ := e.dispatcher(dispatch.Options{ServeGrace: time.Second})
	_, js := e.srv.Connect(t)
	x, err := exec.New(js, "geo", exec.Options{Logger: testutil.Logger(t), ShutdownTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan struct{}, 1)
	if err := x.Register(exec.Function{Name: "get_weather", Parameters: []byte(weatherSchema), Timeout: time.Hour,
		Handler: exec.HandlerFunc(func(ctx context.Context, _ *exec.Invocation) ([]byte, error) {
			started <- struct{}{}
			<-ctx.Done() // never answers
			return nil, ctx.Err()
		})}); err != nil {
		t.Fatal(err)
	}
	runServing(t, x, d)
	w := e.takenIn(d, "weather, killed")
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("the executor did not start the call")
	}
	js.Conn().Close() // killed: no withdrawal
	killed := time.Now()
	// A lease that lapsed unrenewed is waited for as long as a failover
	// (the dispatcher's 10 s), not only the grace: the process may be cut
	// off, not gone.
	const failover = 10 * time.Second
	w = ended(t, d, w, protocol.LeaseTTL+failover+15*time.Second, "the call of the killed executor to fail as unavailable")
	if !strings.Contains(w.Answer, `"type":"unavailable"`) {
		t.Fatalf("answer = %q, want an unavailable error", w.Answer)
	}
	t.Logf("failed %s after the kill (lease %s, then %s)", time.Since(killed).Round(time.Millisecond), protocol.LeaseTTL, failover)
	if took := time.Since(killed); took > protocol.LeaseTTL+failover+5*time.Second {
		t.Errorf("failed %s after the kill; want within the lease (%s) and the failover wait (%s)", took.Round(time.Millisecond), protocol.LeaseTTL, failover)
	}
}

// An executor that comes back within the grace runs the queued call.
func TestAnExecutorBackWithinTheGraceRunsTheQueuedCall(t *testing.T) {
	t.Parallel()
	e := newEnv(t, weatherScenario("back", "weather, back", `{"location":"Oslo"}`))
	e.queueOnly("geo")
	stop := e.declare("geo", "get_weather", weatherSchema, "test-executor", uuid.NewString())
	d, _ := e.dispatcher(dispatch.Options{ServeGrace: 5 * time.Second})
	w := e.takenIn(d, "weather, back")
	stop()
	e.declare("geo", "get_weather", weatherSchema, "test-executor", uuid.NewString())
	e.serve("geo", []string{"get_weather"}, func(*protocol.Call) (string, bool) { return "sunny", false })
	w = ended(t, d, w, 15*time.Second, "the call to run on the executor that came back")
	if w.Answer != "weather: sunny" {
		t.Fatalf("answer = %q, want the call run", w.Answer)
	}
}

// partition is a TCP proxy to the NATS server that can cut every
// connection through it (and refuse new ones) until healed.
type partition struct {
	ln    net.Listener
	to    string
	mu    sync.Mutex
	cut   bool
	conns []net.Conn
}

func newPartition(t *testing.T, to string) *partition {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &partition{ln: ln, to: to}
	t.Cleanup(func() { ln.Close(); p.sever() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			if p.cut {
				p.mu.Unlock()
				c.Close()
				continue
			}
			s, err := net.Dial("tcp", to)
			if err != nil {
				p.mu.Unlock()
				c.Close()
				continue
			}
			p.conns = append(p.conns, c, s)
			p.mu.Unlock()
			go func() { _, _ = io.Copy(s, c); s.Close() }()
			go func() { _, _ = io.Copy(c, s); c.Close() }()
		}
	}()
	return p
}

func (p *partition) url() string { return "nats://" + p.ln.Addr().String() }

// sever cuts every connection through the proxy; set says whether new
// ones are refused from now on.
func (p *partition) set(cut bool) {
	p.mu.Lock()
	p.cut = cut
	p.mu.Unlock()
	if cut {
		p.sever()
	}
}

func (p *partition) sever() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// The only executor is cut off from NATS (a partition) while a call of its
// function is queued: its lease lapses, and after the grace the call fails
// as unavailable. When the partition heals, the executor serves again but
// does not run the call the model was already told failed.
func TestAPartitionedExecutorsQueuedCallFailsAndIsNotRunLater(t *testing.T) {
	t.Parallel()
	e := newEnv(t, weatherScenario("partition", "weather, partitioned", `{"location":"Oslo"}`),
		weatherScenario("after", "weather, after the partition", `{"location":"Bergen"}`))
	d, _ := e.dispatcher(dispatch.Options{ServeGrace: time.Second})
	p := newPartition(t, strings.TrimPrefix(e.srv.ClientURL(), "nats://"))
	_, js := natstest.Connect(t, p.url())
	x, err := exec.New(js, "geo", exec.Options{Logger: testutil.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	var ran sync.Map // location → true
	if err := x.Register(exec.Function{Name: "get_weather", Parameters: []byte(weatherSchema),
		Handler: exec.HandlerFunc(func(_ context.Context, inv *exec.Invocation) ([]byte, error) {
			var args struct{ Location string }
			_ = json.Unmarshal(inv.Call.Arguments, &args)
			ran.Store(args.Location, true)
			return []byte("sunny"), nil
		})}); err != nil {
		t.Fatal(err)
	}
	runServing(t, x, d)

	p.set(true) // the executor is cut off; its lease is still current
	cutAt := time.Now()
	w := e.takenIn(d, "weather, partitioned")
	w = ended(t, d, w, protocol.LeaseTTL+15*time.Second, "the queued call to fail as unavailable")
	if !strings.Contains(w.Answer, `"type":"unavailable"`) {
		t.Fatalf("answer = %q, want an unavailable error", w.Answer)
	}
	t.Logf("failed %s after the partition began", time.Since(cutAt).Round(time.Millisecond))

	p.set(false)
	testutil.WaitForWhat(t, 30*time.Second, "the executor to declare get_weather again", func() bool { return dispatch.LiveSchemas(d, "get_weather") == 1 })
	if w := finish(t, d, e.response("weather, after the partition"), 20*time.Second); w.Answer != "weather: sunny" {
		t.Fatalf("after the partition: answer %q, want the call served", w.Answer)
	}
	// The failed call was in the queue all along: by now the executor
	// has been given it, found its result recorded, and skipped it.
	testutil.WaitForWhat(t, 10*time.Second, "the executor to take the stale call off the queue", func() bool {
		s, err := e.js.Stream(context.Background(), protocol.CallStream("geo"))
		return err == nil && s.CachedInfo().State.Msgs == 0
	})
	if _, ok := ran.Load("Oslo"); ok {
		t.Error("the executor ran the call the model was told failed")
	}
}

// runServing runs x until the test ends, once d counts its get_weather
// served.
func runServing(t *testing.T, x *exec.Executor, d *dispatch.Dispatcher) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- x.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	testutil.WaitForWhat(t, 10*time.Second, "get_weather to be served", func() bool { return dispatch.LiveSchemas(d, "get_weather") == 1 })
}
