package dispatch_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/toolrelay/toolrelay/internal/platformsim"
	"github.com/toolrelay/toolrelay/pkg/dispatch"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// From the hostile review of the lease (it held): three replicas on one JetStream, Responses runs chained by
// previous_response_id (a repeat is a second continuation: the strict
// platform), two parallel calls per turn whose results land at random
// moments, on every replica; one
// replica stopped cleanly (SIGTERM) mid-way and another started. Every
// watch must complete, each turn submitted once: no replay of a
// continuation and exactly two outputs per turn.
func TestLeaseReplicasSubmitEachTurnOnce(t *testing.T) {
	t.Parallel()
	const runs = 24
	sc := platformsim.Scenario{Name: "pair", Prompt: "pair weather",
		Steps: []platformsim.Step{{
			{Name: "get_weather", Arguments: `{"location":"Oslo"}`},
			{Name: "get_weather", Arguments: `{"location":"Rome"}`, As: "w2"},
		}},
		Answer: `weather: {{out "get_weather"}} {{out "w2"}}`}
	e := newEnv(t, sc)
	e.register("geo", "get_weather", weatherSchema)
	var mu sync.Mutex
	rng := rand.New(rand.NewPCG(1, 2))
	e.serve("geo", []string{"get_weather"}, func(c *protocol.Call) (string, bool) {
		mu.Lock()
		d := time.Duration(rng.IntN(1500)) * time.Millisecond
		mu.Unlock()
		time.Sleep(d)
		return "sunny", false
	})
	opts := dispatch.Options{SweepInterval: 500 * time.Millisecond}
	d1, stop1 := e.dispatcher(opts)
	d2, _ := e.dispatcher(opts)
	d3, _ := e.dispatcher(opts)
	ds := []*dispatch.Dispatcher{d1, d2, d3}
	ids := make([]string, runs)
	for i := range runs {
		w, err := ds[i%3].Watch(context.Background(), e.response("pair weather "+fmt.Sprint(i)))
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = w.ID
		time.Sleep(40 * time.Millisecond)
		if i == runs/2 {
			stop1()
			d4, _ := e.dispatcher(opts)
			ds[0] = d4
		}
	}
	for _, id := range ids {
		w := awaitWatch(t, ds[1], id, 90*time.Second)
		if w.State != dispatch.WatchCompleted {
			t.Errorf("watch %s: %s %s", id, w.State, w.Error)
		}
	}
	st := e.sim.Stats()
	t.Logf("stats: %+v", st)
	if st.ResponseReplays != 0 || st.FunctionCallOutputs != 2*runs {
		t.Errorf("continuations replayed %d, function_call_outputs %d (want 0, %d)", st.ResponseReplays, st.FunctionCallOutputs, 2*runs)
	}
}

// From the hostile review of the lease (it held): a slow platform (answers 20 s after taking a continuation, past
// LeaseFor) while two other replicas sweep every 200 ms and the deadline
// timers fire: the owner keeps its lease while it waits, nobody else
// submits.
func TestLeaseSlowPlatformIsNotSubmittedTwice(t *testing.T) {
	t.Parallel()
	const runs = 3
	e := newEnv(t, weatherScenario("slow", "slow weather", `{"location":"Oslo"}`))
	e.register("geo", "get_weather", weatherSchema)
	e.serve("geo", []string{"get_weather"}, func(c *protocol.Call) (string, bool) { return "sunny", false })
	slow := openai.NewClient(option.WithBaseURL(e.simURL+"/v1"), option.WithAPIKey("sk-test"),
		option.WithMiddleware(func(r *http.Request, next option.MiddlewareNext) (*http.Response, error) {
			res, err := next(r)
			if r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/responses") {
				time.Sleep(20 * time.Second) // taken; the answer is slow
			}
			return res, err
		}))
	opts := dispatch.Options{SweepInterval: 200 * time.Millisecond}
	d1, _ := e.dispatcherOn(slow, opts)
	d2, _ := e.dispatcherOn(slow, opts)
	d3, _ := e.dispatcherOn(slow, opts)
	ds := []*dispatch.Dispatcher{d1, d2, d3}
	var ids []string
	for i := range runs {
		w, err := ds[i].Watch(context.Background(), e.response("slow weather "+fmt.Sprint(i)))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, w.ID)
	}
	for _, id := range ids {
		w := awaitWatch(t, d2, id, 120*time.Second)
		if w.State != dispatch.WatchCompleted {
			t.Errorf("watch %s: %s %s", id, w.State, w.Error)
		}
	}
	st := e.sim.Stats()
	t.Logf("stats: %+v", st)
	if st.ResponseReplays != 0 || st.FunctionCallOutputs != runs {
		t.Errorf("continuations replayed %d, function_call_outputs %d (want 0, %d)", st.ResponseReplays, st.FunctionCallOutputs, runs)
	}
}
