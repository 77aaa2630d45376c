package demo

import (
	"context"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/toolrelay/toolrelay/internal/natstest"
	"github.com/toolrelay/toolrelay/internal/platformsim"
	"github.com/toolrelay/toolrelay/internal/testutil"
	"github.com/toolrelay/toolrelay/pkg/dispatch"
	"github.com/toolrelay/toolrelay/pkg/dispatch/openaiplatform"
	"github.com/toolrelay/toolrelay/pkg/dispatch/watch"
	"github.com/toolrelay/toolrelay/pkg/exec"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// On a three-node cluster with every stream and bucket replicated three
// times, losing a node mid-run loses nothing: every turn is submitted once.
func TestClusterSurvivesANodeLoss(t *testing.T) {
	if testing.Short() {
		t.Skip("three-node cluster")
	}
	c := natstest.StartCluster(t)
	quiet := testutil.Logger(t)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	for i := range 2 {
		_, js := c.Connect(t)
		ex, err := exec.New(js, Team, exec.Options{Logger: quiet, Replicas: 3, Name: "exec-" + string(rune('a'+i))})
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range Functions() {
			if err := ex.Register(f); err != nil {
				t.Fatal(err)
			}
		}
		wg.Go(func() { _ = ex.Run(ctx) })
	}
	sim := platformsim.New(platformsim.Options{Model: &platformsim.Model{Scenarios: []platformsim.Scenario{platformsim.FavoriteCityScenario}}})
	hs := httptest.NewServer(sim)
	t.Cleanup(func() { hs.CloseClientConnections(); sim.Close(); hs.Close() })
	client := openai.NewClient(option.WithBaseURL(hs.URL+"/v1"), option.WithAPIKey("k"))
	_, js := c.Connect(t)
	d, err := dispatch.New(js, openaiplatform.New(client), dispatch.Options{Logger: quiet, Replicas: 3})
	if err != nil {
		t.Fatal(err)
	}
	watch.New(d, js)
	wg.Go(func() { _ = d.Run(ctx) })
	testutil.WaitForWhat(t, 60*time.Second, "the dispatcher to be ready and the demo functions registered", func() bool { return d.Ready() && registered(context.Background(), js) })

	// Every stream toolrelay created is replicated three times.
	names := js.StreamNames(context.Background())
	for n := range names.Name() {
		s, err := js.Stream(context.Background(), n)
		if err != nil {
			t.Fatal(err)
		}
		if r := s.CachedInfo().Config.Replicas; r != 3 {
			t.Errorf("stream %s has %d replicas, want 3", n, r)
		}
	}

	const runs = 10
	var watches []*dispatch.Watch
	for i := range runs {
		r, err := platformsim.StartAssistantsRun(context.Background(), client, "my favorite city", nil)
		if err != nil {
			t.Fatal(err)
		}
		w, err := d.Watch(context.Background(), dispatch.Ref{Platform: protocol.PlatformAssistants, ThreadID: r.ThreadID, RunID: r.ID})
		if err != nil {
			t.Fatal(err)
		}
		watches = append(watches, w)
		if i == runs/2 {
			c.Servers[1].Shutdown() // a node goes away mid-run
		}
	}
	for _, w := range watches {
		id := w.ID
		testutil.WaitForWhat(t, 90*time.Second, "watch "+id+" to end", func() bool {
			got, err := d.WatchStatus(context.Background(), id)
			if err != nil || got.State == dispatch.WatchActive {
				return false
			}
			w = got
			return true
		})
		if w.State != dispatch.WatchCompleted || !strings.Contains(w.Answer, "The Emerald City") {
			t.Errorf("watch %s: %s %q %s", id, w.State, w.Answer, w.Error)
		}
	}
	if n := sim.Stats().SubmitToolOutputs; n != 2*runs {
		t.Errorf("accepted submissions = %d, want exactly %d", n, 2*runs)
	}
}
