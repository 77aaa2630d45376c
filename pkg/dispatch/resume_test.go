package dispatch_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/toolrelay/toolrelay/internal/crashpoint"
	"github.com/toolrelay/toolrelay/internal/platformsim"
	"github.com/toolrelay/toolrelay/internal/testutil"
	"github.com/toolrelay/toolrelay/pkg/dispatch"
	"github.com/toolrelay/toolrelay/pkg/dispatch/openaiplatform"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// A replica that stops right after recording a turn (SIGTERM during
// intake, a crash) has not yet recorded the failures of the calls it
// rejected; the replica that resumes the turn records them, so the turn
// closes at once with the reason instead of waiting for its deadline and
// telling the model the call timed out.
func TestRejectedCallsFailAfterIntakeWasCutShort(t *testing.T) {
	e := newEnv(t, platformsim.Scenario{Name: "unknown", Prompt: "unknown function",
		Steps: []platformsim.Step{{{Name: "no_such_function"}}}, Answer: `{{out "no_such_function"}}`})
	nc, js := e.srv.Connect(t)
	d1, err := dispatch.New(js, openaiplatform.New(e.client), dispatch.Options{Logger: testutil.Logger(t),
		RunTTL: 10 * time.Minute, ShutdownTimeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	// The first replica loses NATS the moment the turn is recorded.
	recorded := make(chan struct{})
	var once sync.Once
	crashpoint.Set(func(point, _ string) {
		if point == crashpoint.Intake {
			once.Do(func() { nc.Close(); close(recorded) })
		}
	})
	t.Cleanup(func() { crashpoint.Set(nil) })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d1.Run(ctx) }()
	testutil.WaitFor(t, 10*time.Second, d1.Ready)
	w, err := d1.Watch(context.Background(), e.response("unknown function"))
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-recorded:
	case <-time.After(10 * time.Second):
		t.Fatal("the turn was never recorded")
	}
	cancel()
	<-done // its error (the connection is closed) does not matter here
	crashpoint.Set(nil)

	d2, _ := e.dispatcher(dispatch.Options{RunTTL: 10 * time.Minute})
	testutil.WaitFor(t, 15*time.Second, func() bool {
		w, err = d2.WatchStatus(context.Background(), w.ID)
		return err == nil && w.State != dispatch.WatchActive
	})
	if !strings.Contains(w.Answer, `"type":"unknown_function"`) || !strings.Contains(w.Answer, "no_such_function") {
		t.Fatalf("answer = %q, want the unknown_function failure decided at intake", w.Answer)
	}
	turn, err := d2.Turn(context.Background(), w.Turns[0])
	if err != nil || turn.CutOff {
		t.Errorf("turn = %+v, %v; want it closed by its results, not cut off at the deadline", turn, err)
	}
}

// A replica that stops leaves the watches it drove to the others at once,
// not after the minute a silent driver is given: a rolling restart does not
// hold up the conversations in flight.
func TestAStoppingReplicaHandsItsWatchesOver(t *testing.T) {
	e := newEnv(t, weatherScenario("handover", "handover weather", `{"location":"Oslo"}`))
	e.register("geo", "get_weather", weatherSchema)
	release := make(chan struct{})
	e.serve("geo", []string{"get_weather"}, func(c *protocol.Call) (string, bool) {
		<-release // the result comes only after the first replica is gone
		return "sunny", false
	})
	d2, _ := e.dispatcher(dispatch.Options{SweepInterval: 200 * time.Millisecond})
	d1, stop1 := e.dispatcher(dispatch.Options{})
	w, err := d1.Watch(context.Background(), e.response("handover weather"))
	if err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, func() bool {
		w, err = d1.WatchStatus(context.Background(), w.ID)
		return err == nil && len(w.Turns) == 1
	})
	stop1()
	close(release)
	testutil.WaitFor(t, 15*time.Second, func() bool {
		w, err = d2.WatchStatus(context.Background(), w.ID)
		return err == nil && w.State != dispatch.WatchActive
	})
	if w.State != dispatch.WatchCompleted || w.Answer != "weather: sunny" {
		t.Fatalf("after the handover: watch %s %q %s", w.State, w.Answer, w.Error)
	}
}
