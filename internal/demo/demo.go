package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/toolrelay/toolrelay/internal/natsembed"
	"github.com/toolrelay/toolrelay/internal/platformsim"
	"github.com/toolrelay/toolrelay/pkg/dispatch"
	"github.com/toolrelay/toolrelay/pkg/dispatch/httpapi"
	"github.com/toolrelay/toolrelay/pkg/dispatch/openaiplatform"
	"github.com/toolrelay/toolrelay/pkg/dispatch/watch"
	"github.com/toolrelay/toolrelay/pkg/exec"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// Options configures the demo. The zero value runs everything in-process on
// an embedded server storing in a temporary directory.
type Options struct {
	// Out receives the demo's story. Default: os.Stdout.
	Out io.Writer
	// Logger receives warnings and errors. Default: discard.
	Logger *slog.Logger
	// NATSURL, when set, is used instead of an embedded server.
	NATSURL string
	// DataDir is where the embedded server stores. Default: a temporary
	// directory, removed afterwards.
	DataDir string
	// ExternalExecutors skips the in-process executors: the seed functions
	// must be served by `executor -demo` processes on the same NATS.
	ExternalExecutors bool
	// Timeout bounds each scenario. Default: 60s.
	Timeout time.Duration
}

// scenario is one platform's example and what its answer must say.
type scenario struct {
	platform protocol.Platform
	title    string
	prompt   string
	expect   []string
}

var scenarios = []scenario{
	{protocol.PlatformAgents, "OpenAI Agents session", "Tell me about customer 123 and the weather in Paris.",
		[]string{"Example Customer", "pro plan"}},
	{protocol.PlatformAssistants, "Azure OpenAI Assistants run", "What's the weather like in my favorite city?",
		[]string{"Seattle, WA", "The Emerald City", "70f"}},
	{protocol.PlatformResponses, "Responses API (and Foundry agents)", "What is my horoscope? I am an Aquarius.",
		[]string{"Aquarius: Next Tuesday you will befriend a baby otter.", "Aquarius birthdays fall between January 20 and February 18."}},
	// The platform itself calls the fleet, through the dispatcher's MCP
	// front door: no watch, no function_call items for the client.
	{protocol.PlatformMCP, "Responses API with the fleet as its remote MCP server (/mcp)", "What's the weather like in my favorite city?",
		[]string{"Seattle, WA", "The Emerald City", "70f"}},
}

// horoscopeScenario is the Responses API guide's horoscope, with a custom
// tool call beside the function call: the model writes the sign as text
// for get_sign_dates, whose regex grammar the dispatcher checks. Only the
// demo plays it, on the Responses API: the simulator plays a scenario on
// every platform, and only the Responses API has custom tools.
var horoscopeScenario = platformsim.Scenario{
	Name: "horoscope", Prompt: "horoscope",
	Steps: []platformsim.Step{{
		{Name: "get_horoscope", Arguments: `{"sign":"Aquarius"}`},
		{Name: "get_sign_dates", Kind: platformsim.KindCustom, Arguments: "Aquarius"},
	}},
	Answer: `Your horoscope: {{out "get_horoscope"}} {{out "get_sign_dates"}}`,
}

// Run plays one scenario per platform through a real JetStream server, the
// platform simulator, the seed executors and the dispatcher, printing each
// call as it runs, each turn's latency and the final answers, then an MCP
// client's call that outlasts its patience as a task across two replicas
// (mcptask.go). It returns an error naming what failed.
func Run(ctx context.Context, opts Options) (err error) {
	if opts.Out == nil {
		opts.Out = os.Stdout
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Timeout <= 0 {
		opts.Timeout = 60 * time.Second
	}
	out := &lockedWriter{w: opts.Out}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Spans are kept in memory and printed as each turn's trace tree.
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer func() { _ = tp.Shutdown(context.Background()) }()

	natsURL, stopNATS, err := startNATS(opts)
	if err != nil {
		return err
	}
	defer stopNATS()

	baseURL, stopSim, err := startSimulator(opts.Logger)
	if err != nil {
		return err
	}
	defer stopSim()
	out.printf("toolrelay demo\n  JetStream: %s\n  platform:  simulator at %s\n\n", natsURL, baseURL)

	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()

	var executors *running // nil: executors in other processes
	if !opts.ExternalExecutors {
		var err error
		if executors, err = startExecutors(ctx, &wg, natsURL, out, tp, opts.Logger); err != nil {
			return err
		}
		defer func() {
			cancel()
			if rerr := executors.wait(); rerr != nil && err == nil {
				err = rerr
			}
		}()
	}

	nc, js, err := connect(natsURL, "toolrelay-demo-dispatcher")
	if err != nil {
		return err
	}
	defer nc.Close()
	client := openai.NewClient(option.WithBaseURL(baseURL), option.WithAPIKey("sk-demo"))
	report := reportTurns(out)
	mcpTurns := &turnLog{}
	d, err := dispatch.New(js, openaiplatform.New(client), dispatch.Options{
		Logger: opts.Logger, TracerProvider: tp,
		OnEvent: func(e dispatch.Event) {
			report(e)
			if e.Kind == dispatch.EventTurnSubmitted && e.Turn.Ref.Platform == protocol.PlatformMCP {
				mcpTurns.add(e.Turn.Key)
			}
		},
	})
	if err != nil {
		return err
	}
	watch.New(d, js)
	derr := make(chan error, 1)
	wg.Go(func() { derr <- d.Run(ctx) })
	if err := waitReady(ctx, d, js, derr, executors); err != nil {
		return err
	}
	// The dispatcher's HTTP API, for its MCP front door; loopback clients
	// need no token.
	api, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("demo: listen for the dispatcher's HTTP API: %w", err)
	}
	apiServer := httpapi.NewServer(httpapi.New(d, httpapi.Options{Logger: opts.Logger, TracerProvider: tp}), httpapi.Timeouts{})
	go func() { _ = apiServer.Serve(api) }()
	defer func() { _ = apiServer.Close() }()
	mcpURL := "http://" + api.Addr().String() + "/mcp"

	for _, sc := range scenarios {
		var err error
		if sc.platform == protocol.PlatformMCP {
			err = playMCP(ctx, out, client, mcpURL, mcpTurns, rec, sc, opts.Timeout)
		} else {
			err = play(ctx, out, client, d, rec, sc, opts.Timeout)
		}
		if err != nil {
			return fmt.Errorf("demo: %s: %w", sc.title, err)
		}
	}
	if err := playMCPApproval(ctx, out, &wg, natsURL, client, d, mcpURL, tp, opts); err != nil {
		return fmt.Errorf("demo: MCP approval: %w", err)
	}
	r2, err := startTaskReplica(ctx, &wg, natsURL, client, out, tp, opts)
	if err != nil {
		return fmt.Errorf("demo: MCP task: %w", err)
	}
	defer r2.stop()
	if err := playMCPTask(ctx, out, mcpURL, r2, opts.Timeout); err != nil {
		return fmt.Errorf("demo: MCP task: %w", err)
	}
	return nil
}

// simTimeouts bound the platform simulator's listener: its event streams
// last as long as a run, so it has no write timeout.
var simTimeouts = httpapi.Timeouts{Write: -1}

// startSimulator serves the platform simulator on a loopback port until
// stop is called.
func startSimulator(logger *slog.Logger) (baseURL string, stop func(), err error) {
	sim := platformsim.New(platformsim.Options{
		// The first scenario a prompt matches wins: the demo's horoscope
		// before the seed one.
		Model:  &platformsim.Model{Scenarios: append([]platformsim.Scenario{horoscopeScenario, refundScenario}, platformsim.SeedScenarios()...)},
		APIKey: "sk-demo", Logger: logger,
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		sim.Close()
		return "", nil, fmt.Errorf("demo: listen for the platform simulator: %w", err)
	}
	hs := httpapi.NewServer(sim, simTimeouts)
	done := make(chan struct{})
	go func() { defer close(done); _ = hs.Serve(ln) }()
	return "http://" + ln.Addr().String() + "/v1", func() { sim.Close(); _ = hs.Close(); <-done }, nil
}

// running is a Run in its own goroutine: done closes once it returned err.
type running struct {
	done chan struct{}
	err  error
}

// wait waits for Run to return and returns its error.
func (r *running) wait() error {
	<-r.done
	return r.err
}

// startExecutors serves the seed functions in this process, on their own
// connection, until ctx ends or their Run fails.
func startExecutors(ctx context.Context, wg *sync.WaitGroup, natsURL string, out *lockedWriter, tp *sdktrace.TracerProvider, logger *slog.Logger) (*running, error) {
	nc, js, err := connect(natsURL, "toolrelay-demo-executor")
	if err != nil {
		return nil, err
	}
	ex, err := exec.New(js, Team, exec.Options{Logger: logger, Middleware: []exec.Middleware{announce(out)}, TracerProvider: tp})
	if err == nil {
		for _, f := range Functions() {
			if err = ex.Register(f); err != nil {
				break
			}
		}
	}
	if err != nil {
		nc.Close()
		return nil, err
	}
	r := &running{done: make(chan struct{})}
	wg.Go(func() {
		defer close(r.done)
		r.err = ex.Run(ctx)
		nc.Close()
	})
	return r, nil
}

func startNATS(opts Options) (url string, stop func(), err error) {
	if opts.NATSURL != "" {
		return opts.NATSURL, func() {}, nil
	}
	dir := opts.DataDir
	cleanup := func() {}
	if dir == "" {
		if dir, err = os.MkdirTemp("", "toolrelay-demo-"); err != nil {
			return "", nil, fmt.Errorf("demo: temporary directory: %w", err)
		}
		cleanup = func() { _ = os.RemoveAll(dir) }
	}
	s, err := natsembed.Start(natsembed.Options{StoreDir: dir, Listen: "127.0.0.1:0"})
	if err != nil {
		cleanup()
		return "", nil, err
	}
	return s.ClientURL(), func() { s.Shutdown(); s.WaitForShutdown(); cleanup() }, nil
}

func connect(url, name string) (*nats.Conn, jetstream.JetStream, error) {
	nc, err := nats.Connect(url, nats.Name(name), nats.MaxReconnects(-1))
	if err != nil {
		return nil, nil, fmt.Errorf("demo: connect to %s: %w", url, err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc, js, nil
}

// waitReady waits for the dispatcher and for every seed function to be
// served by a live executor; executors, when not nil, are the in-process
// ones, whose failure ends the wait.
func waitReady(ctx context.Context, d *dispatch.Dispatcher, js jetstream.JetStream, derr <-chan error, executors *running) error {
	deadline := time.Now().Add(30 * time.Second)
	var stopped chan struct{} // nil: never ready
	if executors != nil {
		stopped = executors.done
	}
	for {
		select {
		case err := <-derr:
			return fmt.Errorf("demo: dispatcher stopped: %w", err)
		case <-stopped:
			if executors.err == nil {
				return errors.New("demo: the executors stopped before they served every function")
			}
			return fmt.Errorf("demo: the executors stopped: %w", executors.err)
		default:
		}
		if d.Ready() && registered(ctx, js) {
			return nil
		}
		if time.Now().After(deadline) {
			return errors.New("demo: the seed functions were not announced within 30s (are executors running?)")
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// registered reports whether live executors serve every seed function.
func registered(ctx context.Context, js jetstream.JetStream) bool {
	specs, err := dispatch.Functions(ctx, js)
	if err != nil {
		return false
	}
	served := map[string]bool{}
	for _, s := range specs {
		served[s.Name] = true
	}
	for _, f := range Functions() {
		if !served[f.Name] {
			return false
		}
	}
	return true
}

// play starts the scenario on the platform, asks the dispatcher to drive
// it, and prints the answer.
func play(ctx context.Context, out *lockedWriter, client openai.Client, d *dispatch.Dispatcher, rec *tracetest.SpanRecorder, sc scenario, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	out.printf("[%s] %s\n  user: %s\n", sc.platform, sc.title, sc.prompt)
	ref, err := start(ctx, client, sc)
	if err != nil {
		return err
	}
	w, err := d.Watch(ctx, ref)
	if err != nil {
		return err
	}
	for {
		w, err = d.WatchStatus(ctx, w.ID)
		if err != nil {
			return err
		}
		if w.State != dispatch.WatchActive {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("no answer within %s", timeout)
		case <-time.After(10 * time.Millisecond):
		}
	}
	if w.State == dispatch.WatchFailed {
		return errors.New(w.Error)
	}
	out.printf("  answer: %s\n", w.Answer)
	for i, key := range w.Turns {
		if spans := traceOf(rec, key, time.Second); spans != nil {
			out.printf("  turn %d, %s\n", i+1, strings.Repeat("-", 40))
			printTree(out, spans, "  ")
		}
	}
	out.printf("\n")
	for _, want := range sc.expect {
		if !strings.Contains(w.Answer, want) {
			return fmt.Errorf("the answer does not mention %q", want)
		}
	}
	return nil
}

// playMCP asks the platform for a response with the dispatcher's /mcp as
// a remote MCP server: the platform lists the fleet's functions and calls
// them itself, each call a turn of its own on the fleet. It prints what
// the platform did, the answer and each call's trace.
func playMCP(ctx context.Context, out *lockedWriter, client openai.Client, mcpURL string, turns *turnLog,
	rec *tracetest.SpanRecorder, sc scenario, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	out.printf("[%s] %s\n  user: %s\n  tools: {\"type\":\"mcp\",\"server_label\":\"toolrelay\",\"server_url\":%q}\n", sc.platform, sc.title, sc.prompt, mcpURL)
	before := turns.len()
	r, err := client.Responses.New(ctx, responses.ResponseNewParams{
		Model: "gpt-5.5", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String(sc.prompt)},
		Tools: []responses.ToolUnionParam{{OfMcp: &responses.ToolMcpParam{ServerLabel: "toolrelay", ServerURL: openai.String(mcpURL),
			RequireApproval: responses.ToolMcpRequireApprovalUnionParam{OfMcpToolApprovalSetting: openai.String("never")}}}},
	})
	if err != nil {
		return fmt.Errorf("create response: %w", err)
	}
	calls := 0
	for _, it := range r.Output {
		switch it.Type {
		case "mcp_list_tools":
			l := it.AsMcpListTools()
			if l.Error != "" {
				return fmt.Errorf("the platform could not list the tools: %s", l.Error)
			}
			out.printf("  platform: mcp_list_tools, %d tools from %s\n", len(l.Tools), l.ServerLabel)
		case "mcp_call":
			c := it.AsMcpCall()
			calls++
			if c.Error.Type != "" {
				return fmt.Errorf("mcp_call %s failed: %s", c.Name, c.Error.RawJSON())
			}
			out.printf("  platform: mcp_call %s%s -> %s\n", c.Name, c.Arguments, c.Output)
		}
	}
	answer := r.OutputText()
	out.printf("  answer: %s\n", answer)
	// Each call's turn is reported once submitted, which may be just
	// after the platform had its result.
	deadline := time.Now().Add(time.Second)
	for turns.len()-before < calls && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	for i, key := range turns.since(before) {
		if spans := traceOf(rec, key, time.Second); spans != nil {
			out.printf("  call %d, %s\n", i+1, strings.Repeat("-", 40))
			printTree(out, spans, "  ")
		}
	}
	out.printf("\n")
	for _, want := range sc.expect {
		if !strings.Contains(answer, want) {
			return fmt.Errorf("the answer does not mention %q", want)
		}
	}
	return nil
}

// turnLog keeps turn keys in the order they were added.
type turnLog struct {
	mu   sync.Mutex
	keys []protocol.TurnKey
}

func (l *turnLog) add(k protocol.TurnKey) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.keys = append(l.keys, k)
}

func (l *turnLog) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.keys)
}

func (l *turnLog) since(i int) []protocol.TurnKey {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]protocol.TurnKey(nil), l.keys[i:]...)
}

// start creates the conversation on the platform, the way an application
// would, and returns what the dispatcher should watch.
func start(ctx context.Context, client openai.Client, sc scenario) (dispatch.Ref, error) {
	switch sc.platform {
	case protocol.PlatformAgents:
		s, err := client.Beta.Agents.Sessions.New(ctx, openai.BetaAgentSessionNewParams{
			Environment: openai.EnvironmentParamUnion{OfParamNone: &openai.EnvironmentParamNone{}},
			Agent:       openai.BetaAgentSessionNewParamsAgent{Model: openai.String("gpt-5.5")},
			Input:       openai.BetaAgentSessionNewParamsInputUnion{OfString: openai.String(sc.prompt)},
		})
		if err != nil {
			return dispatch.Ref{}, fmt.Errorf("create session: %w", err)
		}
		return dispatch.Ref{Platform: sc.platform, SessionID: s.ID}, nil
	case protocol.PlatformAssistants:
		r, err := platformsim.StartAssistantsRun(ctx, client, sc.prompt, nil)
		if err != nil {
			return dispatch.Ref{}, err
		}
		return dispatch.Ref{Platform: sc.platform, ThreadID: r.ThreadID, RunID: r.ID}, nil
	default:
		r, err := client.Responses.New(ctx, responses.ResponseNewParams{
			Model: "gpt-5.5", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String(sc.prompt)},
		})
		if err != nil {
			return dispatch.Ref{}, fmt.Errorf("create response: %w", err)
		}
		return dispatch.Ref{Platform: sc.platform, ResponseID: r.ID}, nil
	}
}

// announce prints "Calling <name>..." as each call starts, and a custom
// tool's text input after it.
func announce(out *lockedWriter) exec.Middleware {
	return func(next exec.Handler) exec.Handler {
		return exec.HandlerFunc(func(ctx context.Context, inv *exec.Invocation) ([]byte, error) {
			if input, ok := inv.Input(); ok {
				out.printf("  Calling %s... (custom tool, input %q)\n", inv.Call.Function, input)
			} else {
				out.printf("  Calling %s...\n", inv.Call.Function)
			}
			return next.Handle(ctx, inv)
		})
	}
}

// reportTurns prints each turn's outcome and latency.
func reportTurns(out *lockedWriter) func(dispatch.Event) {
	return func(e dispatch.Event) {
		switch e.Kind {
		case dispatch.EventTurnSubmitted:
			cut := ""
			if e.Turn.Outcome().CutOff {
				cut = ", cut off at the deadline"
			}
			out.printf("  turn submitted: %d call(s) in %s%s (%s before the run expires)\n",
				len(e.Turn.Calls), e.Latency.Round(10*time.Microsecond), cut, e.TimeLeft.Round(time.Second))
		case dispatch.EventTurnFailed:
			out.printf("  turn failed: %s\n", e.Turn.Outcome().Error)
		}
	}
}

type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) printf(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	fmt.Fprintf(l.w, format, args...)
}
