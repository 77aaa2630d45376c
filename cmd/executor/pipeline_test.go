package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	osexec "os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolrelay/toolrelay/internal/natstest"
	"github.com/toolrelay/toolrelay/internal/platformsim"
	"github.com/toolrelay/toolrelay/internal/testutil"
	"github.com/toolrelay/toolrelay/pkg/dispatch"
	"github.com/toolrelay/toolrelay/pkg/dispatch/openaiplatform"
	"github.com/toolrelay/toolrelay/pkg/dispatch/watch"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

var executorBin string

// TestMain builds the executor binary for the multi-process tests.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "toolrelay-executor-bin-")
	if err != nil {
		panic(err)
	}
	executorBin = filepath.Join(dir, "executor")
	if out, err := osexec.Command("go", "build", "-o", executorBin, ".").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "building the executor: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// pipeline is a JetStream server, the executor command serving a functions
// file in-process, the platform simulator and a dispatcher.
type pipeline struct {
	js     jetstream.JetStream
	sim    *platformsim.Server
	client openai.Client
	d      *dispatch.Dispatcher
}

func newPipeline(t *testing.T, config string, scenarios ...platformsim.Scenario) *pipeline {
	t.Helper()
	srv := natstest.Start(t)
	_, js := srv.Connect(t)
	t.Setenv("NATS_URL", srv.ClientURL())
	t.Setenv("TOOLRELAY_LOG_LEVEL", "error")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"-config", writeFile(t, config)}, io.Discard, io.Discard) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("executor: %v", err)
		}
	})

	sim := platformsim.New(platformsim.Options{Model: &platformsim.Model{Scenarios: scenarios}})
	hs := httptest.NewServer(sim)
	t.Cleanup(func() { hs.CloseClientConnections(); sim.Close(); hs.Close() })
	client := openai.NewClient(option.WithBaseURL(hs.URL+"/v1"), option.WithAPIKey("k"))
	d, err := dispatch.New(js, openaiplatform.New(client), dispatch.Options{Logger: testutil.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	watch.New(d, js)
	dctx, dcancel := context.WithCancel(context.Background())
	ddone := make(chan error, 1)
	go func() { ddone <- d.Run(dctx) }()
	t.Cleanup(func() { dcancel(); <-ddone })
	return &pipeline{js: js, sim: sim, client: client, d: d}
}

func (p *pipeline) waitServing(t *testing.T, functions int) {
	t.Helper()
	testutil.WaitForWhat(t, 10*time.Second, "the dispatcher to be ready and the functions served", func() bool {
		specs, _ := dispatch.Functions(context.Background(), p.js)
		return p.d.Ready() && len(specs) == functions
	})
}

func (p *pipeline) finish(t *testing.T, ref dispatch.Ref) *dispatch.Watch {
	t.Helper()
	w, err := p.d.Watch(context.Background(), ref)
	if err != nil {
		t.Fatal(err)
	}
	testutil.WaitForWhat(t, 30*time.Second, "watch "+w.ID+" to end", func() bool {
		w, err = p.d.WatchStatus(context.Background(), w.ID)
		return err == nil && w.State != dispatch.WatchActive
	})
	return w
}

func TestCommandAndHTTPFunctionsAnswerThroughThePipeline(t *testing.T) {
	eta := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "eta for %s: 2026-01-03", body)
	}))
	defer eta.Close()
	p := newPipeline(t, fmt.Sprintf(`functions:
  - name: get_order_status
    owner: orders
    parameters: {type: object, properties: {order_id: {type: string}}, required: [order_id], additionalProperties: false}
    command: ["sh", "-c", "read a; echo \"status of $a: shipped\""]
  - name: get_shipping_eta
    owner: orders
    parameters: {type: object, properties: {order_id: {type: string}}, required: [order_id]}
    http: {url: %q}
`, eta.URL), platformsim.Scenario{
		Name: "orders", Prompt: "order A-1",
		Steps: []platformsim.Step{
			{{Name: "get_order_status", Arguments: `{"order_id":"A-1"}`}, {Name: "get_shipping_eta", Arguments: `{"order_id":"A-1"}`}},
			{{Name: "get_order_status", Arguments: `{"order_id":7}`, As: "bad"}}, // a schema violation
		},
		Answer: `{{out "get_order_status"}} | {{out "get_shipping_eta"}} | {{out "bad"}}`,
	})
	p.waitServing(t, 2)
	r, err := p.client.Responses.New(context.Background(), responses.ResponseNewParams{
		Model: "m", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("where is order A-1")},
	})
	if err != nil {
		t.Fatal(err)
	}
	w := p.finish(t, dispatch.Ref{Platform: protocol.PlatformResponses, ResponseID: r.ID})
	// The second step's bad arguments never reached the command: its
	// output is the validation error; the first step's outputs stand.
	for _, want := range []string{`status of {"order_id":"A-1"}: shipped`, `eta for {"order_id":"A-1"}: 2026-01-03`, `"type":"invalid_arguments"`} {
		if w.State != dispatch.WatchCompleted || !strings.Contains(w.Answer, want) {
			t.Errorf("watch %s answer %q (%s) lacks %q", w.State, w.Answer, w.Error, want)
		}
	}
}

// TestCustomToolsFromAFunctionsFile: functions declared with format: text
// and a regex grammar: in a file take the model's text as it is, a
// command on stdin and an HTTP endpoint as a text/plain body, and answer
// custom tool calls; an input the grammar refuses reaches neither.
func TestCustomToolsFromAFunctionsFile(t *testing.T) {
	var mu sync.Mutex
	var bodies []string // what the endpoint was posted, with its content type
	dates := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		bodies = append(bodies, r.Header.Get("Content-Type")+": "+string(body))
		mu.Unlock()
		fmt.Fprintf(w, "dates of %s", body)
	}))
	defer dates.Close()
	const raw = "it's \"raw\"\nline two"
	p := newPipeline(t, fmt.Sprintf(`functions:
  - name: shout
    owner: astro
    format: text
    command: ["tr", "a-z", "A-Z"]
  - name: get_sign_dates
    owner: astro
    grammar: {syntax: regex, definition: "Aquarius|Pisces"}
    http: {url: %q}
`, dates.URL), platformsim.Scenario{
		Name: "custom", Prompt: "sign dates",
		Steps: []platformsim.Step{{
			{Name: "shout", Kind: platformsim.KindCustom, Arguments: raw},
			{Name: "get_sign_dates", Kind: platformsim.KindCustom, Arguments: "Pisces"},
			{Name: "get_sign_dates", Kind: platformsim.KindCustom, Arguments: "Ophiuchus", As: "refused"},
		}},
		Answer: `{{out "shout"}} | {{out "get_sign_dates"}} | {{out "refused"}}`,
	})
	p.waitServing(t, 2)
	r, err := p.client.Responses.New(context.Background(), responses.ResponseNewParams{
		Model: "m", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("sign dates")},
	})
	if err != nil {
		t.Fatal(err)
	}
	w := p.finish(t, dispatch.Ref{Platform: protocol.PlatformResponses, ResponseID: r.ID})
	parts := strings.Split(w.Answer, " | ")
	if w.State != dispatch.WatchCompleted || len(parts) != 3 {
		t.Fatalf("watch %s %q (%s), want a completed answer of 3 parts", w.State, w.Answer, w.Error)
	}
	if parts[0] != strings.ToUpper(raw) || parts[1] != "dates of Pisces" ||
		!strings.Contains(parts[2], `"type":"invalid_arguments"`) || !strings.Contains(parts[2], "does not match its grammar") {
		t.Errorf("answers %q; want the command's output of the raw text, the endpoint's, and an invalid_arguments error", parts)
	}
	mu.Lock()
	defer mu.Unlock()
	if want := []string{"text/plain; charset=utf-8: Pisces"}; !slices.Equal(bodies, want) {
		t.Errorf("the endpoint was posted %q, want %q", bodies, want)
	}
}

func TestCancelledRunStopsItsCalls(t *testing.T) {
	p := newPipeline(t, `functions:
  - name: long_report
    owner: reports
    command: ["sleep", "60"]
`, platformsim.Scenario{Name: "report", Prompt: "report", Steps: []platformsim.Step{{{Name: "long_report"}}}, Answer: `{{out "long_report"}}`})
	p.waitServing(t, 1)
	ctx := context.Background()
	run, err := platformsim.StartAssistantsRun(ctx, p.client, "the report", nil)
	if err != nil {
		t.Fatal(err)
	}
	ref := dispatch.Ref{Platform: protocol.PlatformAssistants, ThreadID: run.ThreadID, RunID: run.ID}
	w, err := p.d.Watch(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	var turn *dispatch.Turn
	testutil.WaitForWhat(t, 10*time.Second, "the watch's turn to be recorded", func() bool {
		w, _ = p.d.WatchStatus(ctx, w.ID)
		if len(w.Turns) != 1 {
			return false
		}
		turn, err = p.d.Turn(ctx, w.Turns[0]) // listed just before it is taken in
		return err == nil
	})
	p.sim.CancelRun(run.ID) // the user cancels the run while the report runs
	testutil.WaitForWhat(t, 30*time.Second, "the cancelled run's watch to end", func() bool {
		w, _ = p.d.WatchStatus(ctx, w.ID)
		return w.State != dispatch.WatchActive
	})
	if w.State != dispatch.WatchFailed || !strings.Contains(w.Error, "cancelled") {
		t.Fatalf("watch %s %q, want failed because the run was cancelled", w.State, w.Error)
	}
	// The executor stopped the running command and recorded why.
	s, _ := p.js.Stream(ctx, protocol.ResultStream("reports"))
	var res *protocol.Result
	testutil.WaitForWhat(t, 10*time.Second, "the stopped report's result to be recorded", func() bool {
		m, err := s.GetLastMsgForSubject(ctx, protocol.ResultSubject("reports", turn.Calls[0].Key))
		if err != nil {
			return false
		}
		res, err = protocol.DecodeResult(m.Data)
		return err == nil
	})
	if res.OK() || !strings.Contains(res.Error.Message, "cancelled") || res.FinishedAt.Sub(res.StartedAt) > 30*time.Second {
		t.Errorf("result = %+v; want the call cancelled well before its 60s", res)
	}
	if n := p.sim.Stats().SubmitToolOutputs; n != 0 {
		t.Errorf("%d submissions to a cancelled run", n)
	}
}
