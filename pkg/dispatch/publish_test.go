package dispatch_test

import (
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/toolrelay/toolrelay/internal/platformsim"
	"github.com/toolrelay/toolrelay/pkg/dispatch"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// Turns with more calls than the publishing limiter has slots, taken in at
// once, all get their calls out: a turn that runs out of slots settles its
// own publications before it waits, so no turn waits on slots another
// waiting turn holds.
func TestTurnsLargerThanThePublishingLimitAllGetTheirCallsOut(t *testing.T) {
	t.Parallel()
	step := platformsim.Step{}
	for i := range 8 {
		step = append(step, platformsim.CallSpec{Name: "get_weather", Arguments: `{"location":"city ` + strconv.Itoa(i) + `"}`})
	}
	var scenarios []platformsim.Scenario
	for i := range 6 {
		scenarios = append(scenarios, platformsim.Scenario{Name: "eight-" + strconv.Itoa(i), Prompt: "eight calls " + strconv.Itoa(i),
			Steps: []platformsim.Step{step}, Answer: "done"})
	}
	e := newEnv(t, scenarios...)
	e.register("geo", "get_weather", `{"type":"object"}`)
	ran := e.serve("geo", []string{"get_weather"}, func(*protocol.Call) (string, bool) { return "sunny", false })
	d, _ := e.dispatcher(dispatch.Options{MaxInFlightPublishes: 3, MaxInFlightPerTeam: 2})
	var wg sync.WaitGroup
	for i := range 6 {
		ref := e.response("eight calls " + strconv.Itoa(i))
		wg.Go(func() {
			if w := finish(t, d, ref, 20*time.Second); w.Answer != "done" {
				t.Errorf("conversation %d: answer %q (%s)", i, w.Answer, w.Error)
			}
		})
	}
	wg.Wait()
	if n := ran.Load(); n != 48 {
		t.Errorf("the executor ran %d calls, want 48", n)
	}
}
