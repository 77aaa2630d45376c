package dispatch_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

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
	testutil.Await(e.t, 10*time.Second, "the turn to be taken in", func() bool {
		w, err = d.WatchStatus(context.Background(), w.ID)
		return err == nil && len(w.Turns) == 1
	})
	return w
}

// ended waits for the watch to end and returns it.
func ended(t *testing.T, d *dispatch.Dispatcher, w *dispatch.Watch, within time.Duration, what string) *dispatch.Watch {
	t.Helper()
	var err error
	testutil.Await(t, within, what, func() bool {
		w, err = d.WatchStatus(context.Background(), w.ID)
		return err == nil && w.State != dispatch.WatchActive
	})
	return w
}

// The only executor of a function stops (it withdraws its declaration)
// while a call waits for it: the call fails as unavailable once the grace
// has passed, not at the run's deadline ten minutes later.
func TestQueuedCallFailsWhenTheLastExecutorStops(t *testing.T) {
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
	if took := time.Since(gone); took < time.Second || took > 8*time.Second {
		t.Errorf("failed %s after the executor stopped; want after the 1s grace and within seconds", took.Round(time.Millisecond))
	}
}

// The only executor is killed (its connection closes, nothing is
// withdrawn) while it runs a call: once its lease lapses and the grace has
// passed, the call fails as unavailable, well before its deadline.
func TestRunningCallFailsWhenTheLastExecutorIsKilled(t *testing.T) {
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
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- x.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	testutil.Await(t, 10*time.Second, "get_weather to be served", func() bool { return dispatch.LiveSchemas(d, "get_weather") == 1 })
	w := e.takenIn(d, "weather, killed")
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("the executor did not start the call")
	}
	js.Conn().Close() // killed: no withdrawal
	killed := time.Now()
	w = ended(t, d, w, protocol.LeaseTTL+15*time.Second, "the call of the killed executor to fail as unavailable")
	if !strings.Contains(w.Answer, `"type":"unavailable"`) {
		t.Fatalf("answer = %q, want an unavailable error", w.Answer)
	}
	if took := time.Since(killed); took > protocol.LeaseTTL+5*time.Second {
		t.Errorf("failed %s after the kill; want within the lease (%s) and the grace", took.Round(time.Millisecond), protocol.LeaseTTL)
	}
}

// An executor that comes back within the grace runs the queued call.
func TestAnExecutorBackWithinTheGraceRunsTheQueuedCall(t *testing.T) {
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
