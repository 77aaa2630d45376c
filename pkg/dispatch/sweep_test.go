package dispatch_test

import (
	"context"
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/toolrelay/toolrelay/internal/platformsim"
	"github.com/toolrelay/toolrelay/internal/provision"
	"github.com/toolrelay/toolrelay/internal/testutil"
	"github.com/toolrelay/toolrelay/pkg/dispatch"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// A closed turn's timer is removed by roll-up markers that expire a second
// later, and until then the sweep sees the turn among the open ones. It
// must take them for what they are: not re-mark the turn (which wrote a
// marker on its fired-timer subject too) and not hand markers to the
// timers' consumer as if a deadline had fired. Under load every sweep
// used to do that for each turn closed in the last second.
func TestTheSweepLeavesTheMarkersOfClosedTurnsAlone(t *testing.T) {
	t.Parallel()
	var scenarios []platformsim.Scenario
	for i := range 5 {
		scenarios = append(scenarios, weatherScenario("w"+strconv.Itoa(i), "weather "+strconv.Itoa(i), `{"location":"Oslo"}`))
	}
	e := newEnv(t, scenarios...)
	e.register("geo", "get_weather", `{"type":"object"}`)
	e.serve("geo", []string{"get_weather"}, func(*protocol.Call) (string, bool) { return "sunny", false })
	d, _ := e.dispatcher(dispatch.Options{SweepInterval: 50 * time.Millisecond})
	for i := range 5 {
		if w := finish(t, d, e.response("weather "+strconv.Itoa(i)), 10*time.Second); w.Answer != "weather: sunny" {
			t.Fatalf("turn %d: answer %q (%s)", i, w.Answer, w.Error)
		}
	}
	ctx := context.Background()
	timers, err := e.js.Stream(ctx, provision.TimerStream)
	if err != nil {
		t.Fatal(err)
	}
	// Sweeps run every 50 ms while the markers live (a second or two);
	// poll until they are gone, checking that no sweep wrote on a fired
	// timer's subject or woke the timers' consumer.
	testutil.WaitForWhat(t, 10*time.Second, "the closed turns' roll-up markers to expire", func() bool {
		info, err := timers.Info(ctx, jetstream.WithSubjectFilter(provision.TimerSubjectPrefix+".fire.>"))
		if err != nil {
			t.Fatal(err)
		}
		if n := len(info.State.Subjects); n > 0 {
			t.Fatalf("%d fired-timer subjects written for turns whose timers never fired", n)
		}
		all, err := timers.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return all.State.Msgs == 0
	})
	c, err := timers.Consumer(ctx, "toolrelay_timers")
	if err != nil {
		t.Fatal(err)
	}
	if info, err := c.Info(ctx); err != nil || info.Delivered.Consumer != 0 {
		t.Fatalf("the timers' consumer was handed %d messages (%v), but no deadline fired", info.Delivered.Consumer, err)
	}
}

// A turn closed by another replica while this one waited for results it
// will never see leaves the index of open turns; the sweep must still let
// this replica forget it, or every such turn stays in memory for good.
func TestTheSweepForgetsATurnClosedElsewhere(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.register("geo", "get_weather", `{"type":"object"}`)
	e.serve("geo", []string{"get_weather"}, func(*protocol.Call) (string, bool) { return "", false }) // never answers
	d, _ := e.dispatcher(dispatch.Options{SweepInterval: 100 * time.Millisecond})
	ctx := context.Background()
	ref := dispatch.Ref{Platform: protocol.PlatformResponses, ResponseID: "resp_elsewhere"}
	turn, err := d.Intake(ctx, &dispatch.TurnRequest{Ref: ref, Scope: ref.ResponseID,
		Calls: []dispatch.CallRequest{{ID: "call_1", Name: "get_weather", Arguments: []byte(`{}`)}}})
	if err != nil {
		t.Fatal(err)
	}
	if !dispatch.Tracking(d, turn.Key) {
		t.Fatal("the replica that took the turn in does not gather for it")
	}
	// Another replica closes it: its record says submitted and its timer
	// is gone, as that replica's close leaves them.
	turns, err := e.js.KeyValue(ctx, provision.TurnBucket)
	if err != nil {
		t.Fatal(err)
	}
	entry, err := turns.Get(ctx, string(turn.Key))
	if err != nil {
		t.Fatal(err)
	}
	var record map[string]any
	if err := json.Unmarshal(entry.Value(), &record); err != nil {
		t.Fatal(err)
	}
	record["state"], record["submitted_at"] = "submitted", time.Now().Add(-time.Minute).UTC().Format(time.RFC3339Nano)
	b, _ := json.Marshal(record)
	if _, err := turns.Update(ctx, string(turn.Key), b, entry.Revision()); err != nil {
		t.Fatal(err)
	}
	timers, err := e.js.Stream(ctx, provision.TimerStream)
	if err != nil {
		t.Fatal(err)
	}
	if err := timers.Purge(ctx, jetstream.WithPurgeSubject(provision.TimerSubjectPrefix+".*."+string(turn.Key))); err != nil {
		t.Fatal(err)
	}
	// Once the turn is older than a stuck one would be (15 s), the sweep
	// looks it up and forgets it.
	testutil.WaitForWhat(t, 30*time.Second, "the sweep to forget the turn", func() bool { return !dispatch.Tracking(d, turn.Key) })
}

// Each sweep is timed in toolrelay.sweep.duration, the one at start marked
// as such: an operator sizing a fleet's open turns reads the sweep's cost
// there.
func TestTheSweepReportsItsDuration(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	reader := sdkmetric.NewManualReader()
	e.dispatcher(dispatch.Options{SweepInterval: 50 * time.Millisecond,
		MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))})
	sweeps := func() map[string]uint64 {
		return histogramCountBy(t, reader, "toolrelay.sweep.duration", "toolrelay.sweep.startup")
	}
	testutil.WaitForWhat(t, 20*time.Second, "the startup sweep and two more", func() bool {
		got := sweeps()
		return got["true"] == 1 && got["false"] >= 2
	})
	if got := sweeps(); got["true"] != 1 {
		t.Errorf("startup sweeps: %d; want exactly 1", got["true"])
	}
}
