package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/toolrelay/toolrelay/internal/console"
	"github.com/toolrelay/toolrelay/internal/natsembed"
	"github.com/toolrelay/toolrelay/internal/platformsim"
	"github.com/toolrelay/toolrelay/internal/telemetry"
	"github.com/toolrelay/toolrelay/pkg/dispatch"
	"github.com/toolrelay/toolrelay/pkg/dispatch/httpapi"
	"github.com/toolrelay/toolrelay/pkg/dispatch/openaiplatform"
	"github.com/toolrelay/toolrelay/pkg/dispatch/watch"
	"github.com/toolrelay/toolrelay/pkg/exec"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// DevOptions configures [RunDev]. FunctionsFile is required.
type DevOptions struct {
	// Out receives the story: each scenario's calls, turns, answer and
	// trace. Default: os.Stdout.
	Out io.Writer
	// Logger receives warnings and errors. Default: discard.
	Logger *slog.Logger
	// FunctionsFile is the team's functions file (as `executor -config`
	// takes it). Required.
	FunctionsFile string
	// ScenariosFile scripts the model (see platformsim.LoadScenarios).
	// Default: one scenario per function, calling it with arguments made
	// up from its schema.
	ScenariosFile string
	// HTTPAddr is where the dispatcher's HTTP API (/v1, /mcp) and
	// POST /dev/play listen. Default: 127.0.0.1:8080.
	HTTPAddr string
	// NATSListen is the embedded JetStream server's client address.
	// Default: 127.0.0.1:4222, so `dispatcher tools` and executors in
	// other terminals find it as they would a local dispatcher's.
	NATSListen string
	// TraceURL links the console's trace ids to a tracing UI, as
	// TOOLRELAY_TRACE_URL does for the dispatcher. Default: no links.
	TraceURL string
	// Timeout bounds each scenario. Default: 60s.
	Timeout time.Duration
	// PollInterval is how often the files are checked for changes.
	// Default: 500ms.
	PollInterval time.Duration
	// Ready, if set, is called once everything runs and the scenarios
	// were played the first time. Tests use it.
	Ready func(httpAddr string)
}

// RunDev runs a team's whole loop on one machine until ctx ends: an
// embedded JetStream server (in a temporary directory), the platform
// simulator playing the scenarios, a dispatcher, and executors serving the
// functions file. It plays every scenario once the functions are served,
// again after each valid change of either file, and on POST /dev/play
// (?scenario=NAME plays one). An invalid change is printed and the last
// good version keeps running. RunDev returns nil when ctx ends (a signal),
// and an error when it cannot start (a bad file, a port in use).
func RunDev(ctx context.Context, opts DevOptions) (err error) {
	if opts.Out == nil {
		opts.Out = os.Stdout
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.HTTPAddr == "" {
		opts.HTTPAddr = "127.0.0.1:8080"
	}
	if opts.NATSListen == "" {
		opts.NATSListen = "127.0.0.1:4222"
	}
	if opts.Timeout <= 0 {
		opts.Timeout = 60 * time.Second
	}
	if opts.PollInterval <= 0 {
		opts.PollInterval = 500 * time.Millisecond
	}
	out := &lockedWriter{w: opts.Out}
	files := newDevFiles(opts.FunctionsFile, opts.ScenariosFile)
	teams, scenarios, err := files.load()
	if err != nil {
		return err
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// The recorder feeds the printed traces, which only hold this
	// process's spans; with OTEL_EXPORTER_OTLP_ENDPOINT set, the spans go
	// there too, where executors in other processes send theirs.
	rec := tracetest.NewSpanRecorder()
	topts := []sdktrace.TracerProviderOption{sdktrace.WithSpanProcessor(rec)}
	exp, err := telemetry.TraceExporter(ctx)
	if err != nil {
		return fmt.Errorf("dev: %w", err)
	}
	if exp != nil {
		topts = append(topts, sdktrace.WithBatcher(exp))
	}
	tp := sdktrace.NewTracerProvider(topts...)
	defer func() { _ = tp.Shutdown(context.Background()) }()

	dir, err := os.MkdirTemp("", "toolrelay-dev-")
	if err != nil {
		return fmt.Errorf("dev: temporary directory: %w", err)
	}
	defer os.RemoveAll(dir)
	ns, err := natsembed.Start(natsembed.Options{StoreDir: dir, Listen: opts.NATSListen})
	if err != nil {
		return fmt.Errorf("dev: start JetStream on %s (-nats-listen): %w", opts.NATSListen, err)
	}
	defer func() { ns.Shutdown(); ns.WaitForShutdown() }()
	natsURL := ns.ClientURL()

	sim := &swappableSim{}
	sim.swap(newDevSim(scenarios, opts.Logger))
	defer sim.close()
	simLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("dev: listen for the platform simulator: %w", err)
	}
	simSrv := httpapi.NewServer(sim, simTimeouts)
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { _ = simSrv.Serve(simLn) })
	defer func() { _ = simSrv.Close() }()
	baseURL := "http://" + simLn.Addr().String() + "/v1"

	nc, js, err := connect(natsURL, "toolrelay-dev-dispatcher")
	if err != nil {
		return err
	}
	defer nc.Close()
	client := openai.NewClient(option.WithBaseURL(baseURL), option.WithAPIKey("sk-dev"), option.WithMaxRetries(0))
	var dp atomic.Pointer[dispatch.Dispatcher] // for the report, which New needs first
	d, err := dispatch.New(js, openaiplatform.New(client), dispatch.Options{
		Logger: opts.Logger, OnEvent: reportDevTurns(ctx, out, &dp), TracerProvider: tp,
	})
	if err != nil {
		return err
	}
	watch.New(d, js)
	dp.Store(d)
	derr := make(chan error, 1)
	wg.Go(func() { derr <- d.Run(ctx) })
	defer cancel() // runs before wg.Wait: stops the dispatcher and executors

	plays := make(chan playRequest)
	api, err := net.Listen("tcp", opts.HTTPAddr)
	if err != nil {
		return fmt.Errorf("dev: listen for the dispatcher's HTTP API on %s (-addr): %w", opts.HTTPAddr, err)
	}
	p := &devPlayer{out: out, client: client, d: d, js: js, rec: rec, timeout: opts.Timeout, apiURL: "http://" + api.Addr().String()}
	p.scenarios.Store(&scenarios)
	mux := http.NewServeMux()
	apiHandler := httpapi.New(d, httpapi.Options{Logger: opts.Logger, TracerProvider: tp})
	mux.Handle("POST /dev/play", apiHandler.Guard(playHandler(ctx, plays))) // refuses other sites' pages
	mux.Handle("/", apiHandler)
	ui, err := console.New(d, apiHandler, console.Options{Logger: opts.Logger, TraceURL: opts.TraceURL})
	if err != nil {
		return err
	}
	ui.Mount(mux) // /ui and /v1/deadletters, for loopback clients
	apiSrv := httpapi.NewServer(mux, httpapi.Timeouts{})
	wg.Go(func() { _ = apiSrv.Serve(api) })
	defer func() { _ = apiSrv.Close() }()
	httpAddr := api.Addr().String()

	out.printf("toolrelay dev\n  functions:  %s (%s)\n  scenarios:  %s\n  JetStream:  %s (data in a temporary directory, removed at exit)\n"+
		"  platform:   simulator at %s\n  dispatcher: http://%s (/v1, /mcp)\n  console:    http://%s/ui\n"+
		"  executors:  others join with NATS_URL=%s (executor -config FILE, or a Go program on pkg/exec)\n"+
		"  play again: curl -X POST http://%s/dev/play   (or save either file)\n  one call:   dispatcher call -addr http://%s <function> '<json>'\n\n",
		opts.FunctionsFile, describeTeams(teams), files.describeScenarios(len(scenarios)), natsURL, baseURL, httpAddr, httpAddr, natsURL, httpAddr, httpAddr)

	// warn runs once the file's functions are served, so that functions
	// executors in other processes serve count too.
	warn := func() {
		var elsewhere []string
		if specs, err := dispatch.Functions(ctx, js); err == nil {
			for _, s := range specs {
				elsewhere = append(elsewhere, s.Name)
			}
		}
		for _, w := range unserved(teams, elsewhere, *p.scenarios.Load()) {
			out.printf("warning: %s\n", w)
		}
	}
	fleet := &devFleet{js: js, out: out, tp: tp, log: opts.Logger}
	exs, err := fleet.prepare(teams)
	if err != nil {
		return err
	}
	fleet.run(ctx, exs)
	defer fleet.stop()
	if err := p.waitServed(ctx, teams, derr); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	warn()
	p.playAll(ctx, "")
	if opts.Ready != nil {
		opts.Ready(httpAddr)
	}

	tick := time.NewTicker(opts.PollInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			out.printf("stopping\n")
			return nil
		case err := <-derr:
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("dev: the dispatcher stopped: %w", err)
		case req := <-plays:
			req.reply <- p.playAll(ctx, req.scenario)
		case <-tick.C:
			change := files.poll()
			if change == nil {
				continue
			}
			if change.err != nil {
				out.printf("%s changed, but it is not valid; still running the last good version:\n  %v\n\n", change.path, change.err)
				continue
			}
			out.printf("%s changed: reloading\n", change.path)
			if change.teams != nil {
				exs, err := fleet.prepare(change.teams)
				if err != nil {
					out.printf("  the new functions cannot be served; still running the last good version:\n  %v\n\n", err)
					continue
				}
				fleet.run(ctx, exs)
				teams = change.teams
			}
			if change.scenarios != nil {
				sim.swap(newDevSim(change.scenarios, opts.Logger))
				p.scenarios.Store(&change.scenarios)
			}
			if err := p.waitServed(ctx, teams, derr); err != nil {
				out.printf("  %v\n\n", err)
				continue
			}
			warn()
			p.playAll(ctx, "")
		}
	}
}

// reportDevTurns prints turns as the demo does, and a direct call
// (dispatcher call, or any MCP client), which has no scenario around it,
// by its function and how it ended: answered, or failed and why.
func reportDevTurns(ctx context.Context, out *lockedWriter, d *atomic.Pointer[dispatch.Dispatcher]) func(dispatch.Event) {
	report := reportTurns(out)
	return func(e dispatch.Event) {
		if e.Turn == nil || e.Turn.Ref.Platform != protocol.PlatformMCP || len(e.Turn.Calls) != 1 {
			report(e)
			return
		}
		t, latency := e.Turn, e.Latency.Round(10*time.Microsecond)
		switch e.Kind {
		case dispatch.EventTurnFailed:
			out.printf("[mcp] %s not answered after %s: %s\n", t.Calls[0].Name, latency, t.Outcome().Error)
		case dispatch.EventTurnSubmitted:
			// The result is read off the event's goroutine, which the
			// dispatcher's hot path runs.
			go func() {
				how := "answered"
				if v, err := d.Load().InspectTurn(ctx, dispatch.Caller{Admin: true}, t.Key); err == nil && len(v.Calls) == 1 && v.Calls[0].Error != nil {
					ce := v.Calls[0].Error
					how = fmt.Sprintf("failed (%s: %s)", ce.Code, firstLine(ce.Message))
				}
				trace := ""
				if parts := strings.Split(t.Trace.Traceparent, "-"); len(parts) == 4 {
					trace = ", trace " + parts[1]
				}
				out.printf("[mcp] %s %s in %s%s\n", t.Calls[0].Name, how, latency, trace)
			}()
		}
	}
}

// firstLine is s up to its first line break.
func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

func describeTeams(teams map[string][]exec.Function) string {
	var names []string
	n := 0
	for team, fns := range teams {
		names = append(names, team)
		n += len(fns)
	}
	slices.Sort(names)
	return fmt.Sprintf("%d function(s) of team %v", n, names)
}

// devFleet runs an executor per team for the functions file, and restarts
// them on a change.
type devFleet struct {
	js  jetstream.JetStream
	out *lockedWriter
	tp  *sdktrace.TracerProvider
	log *slog.Logger
	// stopFn stops the executors running now.
	stopFn func()
}

// prepare makes an executor per team and registers its functions, so a
// function that cannot be served fails here, before the running executors
// are stopped.
func (f *devFleet) prepare(teams map[string][]exec.Function) ([]*exec.Executor, error) {
	var exs []*exec.Executor
	for team, fns := range teams {
		ex, err := exec.New(f.js, team, exec.Options{Logger: f.log, Middleware: []exec.Middleware{announce(f.out)},
			TracerProvider: f.tp, ShutdownTimeout: 5 * time.Second, Name: "dev-" + team})
		if err != nil {
			return nil, err
		}
		for _, fn := range fns {
			if err := ex.Register(fn); err != nil {
				return nil, fmt.Errorf("dev: %s: %w", fn.Name, err)
			}
		}
		exs = append(exs, ex)
	}
	return exs, nil
}

// run stops the executors running (they withdraw their declarations and
// finish their calls) and runs exs until ctx ends or the next run.
func (f *devFleet) run(ctx context.Context, exs []*exec.Executor) {
	f.stop()
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for _, ex := range exs {
		wg.Go(func() {
			if err := ex.Run(ctx); err != nil && ctx.Err() == nil {
				f.out.printf("executor stopped: %v\n", err)
			}
		})
	}
	var once sync.Once
	f.stopFn = func() { once.Do(func() { cancel(); wg.Wait() }) }
}

// stop stops the running executors and waits for them.
func (f *devFleet) stop() {
	if f.stopFn != nil {
		f.stopFn()
	}
}

// swappableSim serves the current simulator; a change of the scenarios
// swaps in a new one (the scripted model is fixed once it serves).
type swappableSim struct {
	cur atomic.Pointer[platformsim.Server]
}

func newDevSim(scenarios []platformsim.Scenario, log *slog.Logger) *platformsim.Server {
	return platformsim.New(platformsim.Options{Model: &platformsim.Model{Scenarios: scenarios}, Logger: log})
}

func (s *swappableSim) swap(next *platformsim.Server) {
	if old := s.cur.Swap(next); old != nil {
		old.Close()
	}
}

func (s *swappableSim) close() {
	if cur := s.cur.Load(); cur != nil {
		cur.Close()
	}
}

func (s *swappableSim) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.cur.Load().ServeHTTP(w, r)
}

// errNoScenario is the answer of /dev/play?scenario= for an unknown name.
var errNoScenario = errors.New("no such scenario")
