package dispatch_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

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
	testutil.WaitFor(t, 10*time.Second, func() bool {
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
