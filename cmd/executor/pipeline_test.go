package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"

	"github.com/toolrelay/toolrelay/internal/natstest"
	"github.com/toolrelay/toolrelay/internal/platformsim"
	"github.com/toolrelay/toolrelay/pkg/dispatch"
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

func waitFor(t testing.TB, within time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %s", within)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestCommandAndHTTPFunctionsAnswerThroughThePipeline(t *testing.T) {
	srv := natstest.Start(t)
	_, js := srv.Connect(t)
	eta := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "eta for %s: 2026-01-03", body)
	}))
	defer eta.Close()
	cfg := writeFile(t, fmt.Sprintf(`functions:
  - name: get_order_status
    owner: orders
    parameters: {type: object, properties: {order_id: {type: string}}, required: [order_id], additionalProperties: false}
    command: ["sh", "-c", "read a; echo \"status of $a: shipped\""]
  - name: get_shipping_eta
    owner: orders
    parameters: {type: object, properties: {order_id: {type: string}}, required: [order_id]}
    http: {url: %q}
`, eta.URL))
	t.Setenv("NATS_URL", srv.ClientURL())
	t.Setenv("TOOLRELAY_LOG_LEVEL", "error")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"-config", cfg}, io.Discard, io.Discard) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("executor: %v", err)
		}
	}()

	sim := platformsim.New(platformsim.Options{Model: &platformsim.Model{Scenarios: []platformsim.Scenario{{
		Name: "orders", Prompt: "order A-1",
		Steps: []platformsim.Step{
			{{Name: "get_order_status", Arguments: `{"order_id":"A-1"}`}, {Name: "get_shipping_eta", Arguments: `{"order_id":"A-1"}`}},
			{{Name: "get_order_status", Arguments: `{"order_id":7}`, As: "bad"}}, // a schema violation
		},
		Answer: `{{out "get_order_status"}} | {{out "get_shipping_eta"}} | {{out "bad"}}`,
	}}}})
	hs := httptest.NewServer(sim)
	defer func() { hs.CloseClientConnections(); sim.Close(); hs.Close() }()
	client := openai.NewClient(option.WithBaseURL(hs.URL+"/v1"), option.WithAPIKey("k"))
	d, err := dispatch.New(js, dispatch.NewPlatforms(client), dispatch.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	dctx, dcancel := context.WithCancel(context.Background())
	ddone := make(chan error, 1)
	go func() { ddone <- d.Run(dctx) }()
	defer func() { dcancel(); <-ddone }()
	waitFor(t, 10*time.Second, func() bool {
		specs, _ := dispatch.Functions(context.Background(), js)
		return d.Ready() && len(specs) == 2
	})

	r, err := client.Responses.New(context.Background(), responses.ResponseNewParams{
		Model: "m", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("where is order A-1")},
	})
	if err != nil {
		t.Fatal(err)
	}
	w, err := d.Watch(context.Background(), dispatch.Ref{Platform: protocol.PlatformResponses, ResponseID: r.ID})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, func() bool {
		w, err = d.WatchStatus(context.Background(), w.ID)
		return err == nil && w.State != dispatch.WatchActive
	})
	// The second step's bad arguments never reached the command: its
	// output is the validation error; the first step's outputs stand.
	for _, want := range []string{`status of {"order_id":"A-1"}: shipped`, `eta for {"order_id":"A-1"}: 2026-01-03`, `"type":"invalid_arguments"`} {
		if w.State != dispatch.WatchCompleted || !strings.Contains(w.Answer, want) {
			t.Errorf("watch %s answer %q (%s) lacks %q", w.State, w.Answer, w.Error, want)
		}
	}
}
