package dispatch_test

import (
	"context"
	"testing"
	"time"

	"github.com/toolrelay/toolrelay/internal/testutil"
	"github.com/toolrelay/toolrelay/pkg/dispatch"
	"github.com/toolrelay/toolrelay/pkg/exec"
)

// The report: the dispatcher restarts on a fresh store (dev's
// embedded server without its data). The executor's stream and consumer
// are gone; it recreates them and serves again, instead of reporting
// missing heartbeats for ever while its declarations say it serves.
func TestAnExecutorServesAgainAfterTheStoreIsLost(t *testing.T) {
	t.Parallel()
	e := newEnv(t, weatherScenario("fresh", "weather, fresh store", `{"location":"Oslo"}`))
	d1, stop1 := e.dispatcher(dispatch.Options{})
	_, js := e.srv.Connect(t)
	x, err := exec.New(js, "geo", exec.Options{Logger: testutil.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := x.Register(exec.Function{Name: "get_weather", Parameters: []byte(weatherSchema),
		Handler: exec.HandlerFunc(func(context.Context, *exec.Invocation) ([]byte, error) { return []byte("sunny"), nil })}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- x.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	testutil.WaitForWhat(t, 10*time.Second, "get_weather to be served", func() bool { return dispatch.LiveSchemas(d1, "get_weather") == 1 })
	if w := finish(t, d1, e.response("weather, fresh store"), 15*time.Second); w.Answer != "weather: sunny" {
		t.Fatalf("before the restart: answer %q", w.Answer)
	}

	stop1()
	e.srv.RestartEmpty(t)
	d2, _ := e.dispatcher(dispatch.Options{})
	testutil.WaitForWhat(t, 20*time.Second, "the executor to declare get_weather to the new store", func() bool {
		return dispatch.LiveSchemas(d2, "get_weather") == 1
	})
	if w := finish(t, d2, e.response("weather, fresh store"), 30*time.Second); w.Answer != "weather: sunny" {
		t.Fatalf("after the restart on an empty store: answer %q, want the call served", w.Answer)
	}
}
