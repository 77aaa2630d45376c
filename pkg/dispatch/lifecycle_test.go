package dispatch_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/toolrelay/toolrelay/internal/platformsim"
	"github.com/toolrelay/toolrelay/internal/provision"
	"github.com/toolrelay/toolrelay/internal/testutil"
	"github.com/toolrelay/toolrelay/pkg/dispatch"
	"github.com/toolrelay/toolrelay/pkg/dispatch/openaiplatform"
	"github.com/toolrelay/toolrelay/pkg/dispatch/watch"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// Run returns a startup failure at once, without waiting for its context:
// here the deadline timers' consumer exists with a filter toolrelay cannot
// use.
func TestRunReturnsAStartupErrorAtOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := t.Context()
	timers, err := provision.Stream(ctx, e.js, provision.TimerStreamConfig(provision.Options{}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := timers.CreateConsumer(ctx, jetstream.ConsumerConfig{Durable: "toolrelay_timers",
		FilterSubject: provision.TimerSubjectPrefix + ".fire.someone.>", AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		t.Fatal(err)
	}
	_, js := e.srv.Connect(t)
	d, err := dispatch.New(js, openaiplatform.New(e.client), dispatch.Options{Logger: testutil.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	watch.New(d, js)
	done := make(chan error, 1)
	go func() { done <- d.Run(context.Background()) }() // never cancelled
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "toolrelay_timers") {
			t.Fatalf("Run = %v, want the consumer's incompatibility", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return its startup error")
	}
}

// A dispatcher is refused a JetStream context bound to another domain or
// API prefix: its turn records are written to their bucket's subject, which
// would then miss the buckets the context reads.
func TestNewRefusesAnotherDomainOrAPIPrefix(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	nc, js := e.srv.Connect(t)
	if _, err := dispatch.New(js, nil, dispatch.Options{Logger: testutil.Logger(t)}); err != nil {
		t.Fatalf("the account's own JetStream: %v", err)
	}
	byDomain, err := jetstream.NewWithDomain(nc, "hub")
	if err != nil {
		t.Fatal(err)
	}
	byPrefix, err := jetstream.NewWithAPIPrefix(nc, "$JS.other.API")
	if err != nil {
		t.Fatal(err)
	}
	for name, js := range map[string]jetstream.JetStream{"a domain": byDomain, "an API prefix": byPrefix} {
		if _, err := dispatch.New(js, nil, dispatch.Options{Logger: testutil.Logger(t)}); err == nil {
			t.Errorf("New took a JetStream context with %s", name)
		}
	}
}

// Function names the model invents are counted under one label value, so
// that a model cannot grow the metrics without bound.
func TestInventedFunctionNamesShareOneLabel(t *testing.T) {
	t.Parallel()
	e := newEnv(t,
		platformsim.Scenario{Name: "ghost", Prompt: "ghost", Steps: []platformsim.Step{{{Name: "get_ghost"}}}, Answer: `{{out "get_ghost"}}`},
		platformsim.Scenario{Name: "phantom", Prompt: "phantom", Steps: []platformsim.Step{{{Name: "get_phantom"}}}, Answer: `{{out "get_phantom"}}`},
	)
	reader := sdkmetric.NewManualReader()
	d, _ := e.dispatcher(dispatch.Options{MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))})
	for _, prompt := range []string{"ghost", "phantom"} {
		if w := finish(t, d, e.response(prompt), 10*time.Second); !strings.Contains(w.Answer, "unknown_function") {
			t.Fatalf("%s: answer %q, want unknown_function", prompt, w.Answer)
		}
	}
	labels := counterBy(t, reader, "toolrelay.calls", "function")
	if len(labels) != 1 || labels["unknown"] != 2 {
		t.Fatalf("toolrelay.calls by function = %v, want only unknown=2", labels)
	}
}

// Unknown watches and turns are ErrNotFound, not a storage error.
func TestUnknownWatchAndTurnAreNotFound(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	d, _ := e.dispatcher(dispatch.Options{})
	if _, err := d.WatchStatus(t.Context(), "w_nope"); !errors.Is(err, dispatch.ErrNotFound) {
		t.Errorf("WatchStatus of an unknown id = %v, want ErrNotFound", err)
	}
	if _, err := d.WatchStatus(t.Context(), "not a key!"); !errors.Is(err, dispatch.ErrNotFound) {
		t.Errorf("WatchStatus of an invalid id = %v, want ErrNotFound", err)
	}
	if _, err := d.Turn(t.Context(), protocol.TurnKey("0123")); !errors.Is(err, dispatch.ErrNotFound) {
		t.Errorf("Turn of an unknown key = %v, want ErrNotFound", err)
	}
}

// An intake from a handler Run does not wait for (HTTP, webhooks) may
// still be under way when Run returns; the turn it records still gets its
// deadline timer (the timer subjects are the index the sweep reads: a
// turn without one is never closed). Here the timer's stream is gone while
// the intake arms it, so its arming is still being retried when Run
// returns.
func TestATurnRecordedAsRunReturnsStillGetsItsTimer(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.register("geo", "get_weather", weatherSchema)
	d, stop := e.dispatcher(dispatch.Options{})
	ctx := t.Context()
	if err := e.js.DeleteStream(ctx, provision.TimerStream); err != nil {
		t.Fatal(err)
	}
	req := &dispatch.TurnRequest{Ref: dispatch.Ref{Platform: protocol.PlatformResponses, ResponseID: "resp_late"}, Scope: "resp_late",
		Calls: []dispatch.CallRequest{{ID: "call_1", Name: "get_weather", Arguments: []byte(`{"location":"Oslo"}`)}}}
	done := make(chan error, 1)
	go func() {
		_, err := d.Intake(context.WithoutCancel(ctx), req)
		done <- err
	}()
	turns, err := e.js.KeyValue(ctx, provision.TurnBucket)
	if err != nil {
		t.Fatal(err)
	}
	testutil.WaitForWhat(t, 10*time.Second, "the turn to be recorded", func() bool { // the turn is recorded
		_, err := turns.Get(ctx, string(req.Key()))
		return err == nil
	})
	stop() // Run returns while the timer is being armed again
	if _, err := provision.Stream(ctx, e.js, provision.TimerStreamConfig(provision.Options{})); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("intake: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("intake still under way a minute later")
	}
	timers, err := e.js.Stream(ctx, provision.TimerStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := timers.Info(ctx)
	if err != nil || info.State.Msgs == 0 {
		t.Fatalf("timers after the intake: %+v, %v; want the turn's timer", info, err)
	}
}
