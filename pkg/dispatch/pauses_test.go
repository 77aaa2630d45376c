package dispatch_test

import (
	"testing"
	"time"

	"github.com/toolrelay/toolrelay/internal/platformsim"
	"github.com/toolrelay/toolrelay/internal/testutil"
	"github.com/toolrelay/toolrelay/pkg/dispatch"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// TestPausesToolrelayDoesNotServeAreReported: a platform object that
// waits on what toolrelay does not serve is reported so, naming the item,
// never taken for done. A response ending on an item type no SDK knows,
// or on a computer call beside a function call, ends its watch
// unsupported without answering the call (the continuation would have to
// answer both); an Agents session waiting on an environment connection
// beside a function call has the call answered and reads unsupported while
// it waits.
func TestPausesToolrelayDoesNotServeAreReported(t *testing.T) {
	t.Parallel()
	e := newEnv(t,
		platformsim.Scenario{Name: "unknown", Prompt: "new item", Steps: []platformsim.Step{{{Kind: "hologram_call"}}}},
		platformsim.Scenario{Name: "computer", Prompt: "needs a screen", Steps: []platformsim.Step{{
			{Name: "get_weather", Arguments: `{"location":"Oz"}`}, {Name: "screen", Kind: "computer_call"},
		}}},
		platformsim.Scenario{Name: "environment", Prompt: "connect env", Steps: []platformsim.Step{{
			{Name: "get_weather", Arguments: `{"location":"Oz"}`}, {Name: "env_1", Kind: "environment_connection"},
		}}},
	)
	e.register("geo", "get_weather", weatherSchema)
	ran := e.serve("geo", []string{"get_weather"}, func(*protocol.Call) (string, bool) { return "sunny", false })
	d, _ := e.dispatcher(dispatch.Options{})

	for _, tc := range []struct {
		ref      dispatch.Ref
		want     string // the unsupported item's type
		wantID   string // its ID, when known in advance
		answered int    // function calls run
	}{
		{e.response("a new item"), "hologram_call", "", 0},
		{e.response("this needs a screen"), "computer_call", "", 0},
		{e.session("connect env"), "environment_connection", "env_1", 1},
	} {
		before := ran.Load()
		w := finish(t, d, tc.ref, 20*time.Second)
		if w.State != dispatch.WatchUnsupported || len(w.Unsupported) != 1 || w.Unsupported[0].Type != tc.want ||
			w.Unsupported[0].ID == "" || tc.wantID != "" && w.Unsupported[0].ID != tc.wantID || w.Answer != "" {
			t.Errorf("%s: watch %s %+v (answer %q, %s); want unsupported naming one %s", tc.ref, w.State, w.Unsupported, w.Answer, w.Error, tc.want)
		}
		if n := ran.Load() - before; tc.answered == 0 && n != 0 {
			t.Errorf("%s: %d function calls ran; want none", tc.ref, n)
		}
	}

	// The platform's side: the session's function call answered once (its
	// submission may follow the report), the response's not at all.
	answered := func(l platformsim.Ledger, id string) int {
		if l.Calls[id] == "get_weather" && l.Platform[id] == "agents" {
			return 1
		}
		return 0
	}
	testutil.WaitForWhat(t, 10*time.Second, "the session's function call to be answered", func() bool {
		l := e.sim.Ledger()
		for id := range l.Calls {
			if answered(l, id) == 1 && len(l.Outputs[id]) == 1 {
				return true
			}
		}
		return false
	})
	l := e.sim.Ledger()
	for id, name := range l.Calls {
		if want := answered(l, id); len(l.Outputs[id]) != want {
			t.Errorf("%s call %s (%s) answered %d times, want %d", l.Platform[id], id, name, len(l.Outputs[id]), want)
		}
	}
	if n := ran.Load(); n != 1 {
		t.Errorf("get_weather ran %d times, want once (the session's)", n)
	}
}
