package console_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/toolrelay/toolrelay/internal/apiauth"
	"github.com/toolrelay/toolrelay/internal/console"
	"github.com/toolrelay/toolrelay/internal/demo"
	"github.com/toolrelay/toolrelay/internal/natstest"
	"github.com/toolrelay/toolrelay/internal/platformsim"
	"github.com/toolrelay/toolrelay/internal/testutil"
	"github.com/toolrelay/toolrelay/pkg/dispatch"
	"github.com/toolrelay/toolrelay/pkg/dispatch/httpapi"
	"github.com/toolrelay/toolrelay/pkg/dispatch/openaiplatform"
	"github.com/toolrelay/toolrelay/pkg/dispatch/watch"
	"github.com/toolrelay/toolrelay/pkg/exec"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// The team of the stack's own functions, beside the demo team's seeds.
const reportsTeam = "reports"

// stack is a real dispatcher serving the console, real executors of two
// teams, the platform simulator and a JetStream server, all in-process.
//
// The reports team serves slow_report, which answers only once release
// is closed (turns stay open as long as a test wants), and flaky_export,
// which fails for good (a dead letter) until fixed is set, and
// purge_report, whose calls wait for approval. The demo team
// serves the seed functions.
type stack struct {
	url     string
	d       *dispatch.Dispatcher
	client  openai.Client
	tokens  map[string]string // by name: admin, reports, demo
	release chan struct{}
	once    sync.Once
	fixed   atomic.Bool
}

// releaseReports lets slow_report calls answer.
func (s *stack) releaseReports() { s.once.Do(func() { close(s.release) }) }

var slowReport = platformsim.Scenario{Name: "slow report", Prompt: "slow report",
	Steps: []platformsim.Step{{{Name: "slow_report", Arguments: `{"month":"2026-11"}`}}}, Answer: `{{out "slow_report"}}`}

var flakyExport = platformsim.Scenario{Name: "export", Prompt: "export",
	Steps: []platformsim.Step{{{Name: "flaky_export", Arguments: `{"format":"csv"}`}}}, Answer: `{{out "flaky_export"}}`}

func newStack(t *testing.T) *stack {
	t.Helper()
	srv := natstest.Start(t)
	log := testutil.Logger(t)
	s := &stack{release: make(chan struct{}), tokens: map[string]string{}}
	t.Cleanup(s.releaseReports)

	// Tokens: admin, and one per team.
	var lines []string
	for _, name := range []string{"admin", reportsTeam, demo.Team} {
		tok := apiauth.NewToken()
		e, err := apiauth.NewEntry(name, name == "admin", map[bool][]string{true: nil, false: {name}}[name == "admin"], tok)
		if err != nil {
			t.Fatal(err)
		}
		s.tokens[name] = string(tok)
		lines = append(lines, e.String())
	}
	path := filepath.Join(t.TempDir(), "tokens.txt")
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tokens, err := apiauth.Open(path, apiauth.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	var running sync.WaitGroup
	t.Cleanup(func() { cancel(); running.Wait() })
	serve := func(team, name string, fns ...exec.Function) {
		_, js := srv.Connect(t)
		ex, err := exec.New(js, team, exec.Options{Logger: log, Name: name})
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range fns {
			if err := ex.Register(f); err != nil {
				t.Fatal(err)
			}
		}
		running.Go(func() { _ = ex.Run(ctx) })
	}
	obj := json.RawMessage(`{"type":"object","properties":{"month":{"type":"string"},"format":{"type":"string"}}}`)
	serve(reportsTeam, "reports-exec-1",
		exec.Function{Name: "slow_report", Description: "Builds the monthly report (slowly).", Parameters: obj,
			Handler: exec.HandlerFunc(func(ctx context.Context, inv *exec.Invocation) ([]byte, error) {
				select {
				case <-s.release:
					return []byte(`"report ready"`), nil
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			})},
		exec.Function{Name: "flaky_export", Description: "Exports the ledger.", Parameters: obj,
			Handler: exec.HandlerFunc(func(ctx context.Context, inv *exec.Invocation) ([]byte, error) {
				if !s.fixed.Load() {
					return nil, errors.New("the export bucket is not writable")
				}
				return []byte(`"exported 42 rows"`), nil
			})},
		exec.Function{Name: "purge_report", Description: "Deletes a month's report.", Parameters: obj, SideEffects: true,
			Approval: &protocol.ApprovalPolicy{Required: true},
			Handler: exec.HandlerFunc(func(ctx context.Context, inv *exec.Invocation) ([]byte, error) {
				return []byte(`"purged"`), nil
			})})
	serve(demo.Team, "demo-exec-1", demo.Functions()...)

	sim := platformsim.New(platformsim.Options{Model: &platformsim.Model{Scenarios: []platformsim.Scenario{
		slowReport, flakyExport, platformsim.HoroscopeScenario}}})
	simHTTP := httptest.NewServer(sim)
	t.Cleanup(func() { simHTTP.CloseClientConnections(); sim.Close(); simHTTP.Close() })
	s.client = openai.NewClient(option.WithBaseURL(simHTTP.URL+"/v1"), option.WithAPIKey("sk-test"))

	_, js := srv.Connect(t)
	// A short run TTL so that a bar of time left visibly shrinks.
	// A tracer, so that turns have trace ids to link.
	tp := sdktrace.NewTracerProvider()
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	d, err := dispatch.New(js, openaiplatform.New(s.client), dispatch.Options{Logger: log, RunTTL: 40 * time.Second,
		TracerProvider: tp})
	if err != nil {
		t.Fatal(err)
	}
	watch.New(d, js)
	s.d = d
	api := httpapi.New(d, httpapi.Options{Logger: log, Authenticator: tokens})
	ui, err := console.New(d, api, console.Options{Logger: log, TraceURL: "https://traces.example/trace/{trace_id}"})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/", api)
	ui.Mount(mux)
	hs := httptest.NewServer(mux)
	t.Cleanup(hs.Close) // after the dispatcher stops, which ends event streams
	s.url = hs.URL
	dctx, stopDispatcher := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(dctx) }()
	t.Cleanup(func() {
		stopDispatcher()
		if err := <-done; err != nil {
			t.Errorf("dispatcher Run: %v", err)
		}
	})
	admin := dispatch.Caller{Name: "test", Admin: true}
	testutil.WaitForWhat(t, 20*time.Second, "the dispatcher to be ready with every function served", func() bool {
		if !d.Ready() {
			return false
		}
		fns := d.InspectFunctions(context.Background(), admin)
		for _, f := range fns {
			if len(f.Executors) == 0 {
				return false
			}
		}
		return len(fns) == 3+len(demo.Functions())
	})
	return s
}

// session starts an Agents session with prompt and has the dispatcher
// drive it; it returns the watch.
func (s *stack) session(t *testing.T, prompt string) *dispatch.Watch {
	t.Helper()
	sess, err := s.client.Beta.Agents.Sessions.New(context.Background(), openai.BetaAgentSessionNewParams{
		Environment: openai.EnvironmentParamUnion{OfParamNone: &openai.EnvironmentParamNone{}},
		Input:       openai.BetaAgentSessionNewParamsInputUnion{OfString: openai.String(prompt)},
	})
	if err != nil {
		t.Fatal(err)
	}
	w, err := s.d.Watch(context.Background(), dispatch.Ref{Platform: protocol.PlatformAgents, SessionID: sess.ID})
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// deadLetters reads GET /v1/deadletters with token.
func (s *stack) deadLetters(t *testing.T, token string) (int, []console.DeadLetter) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, s.url+"/v1/deadletters", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body struct {
		DeadLetters []console.DeadLetter `json:"dead_letters"`
	}
	if resp.StatusCode == http.StatusOK {
		if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
			t.Fatal(fmt.Errorf("decode dead letters: %w", err))
		}
	}
	return resp.StatusCode, body.DeadLetters
}
