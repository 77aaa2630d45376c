// Command bench measures toolrelay beside the raw JetStream pipeline it is
// built on (the floor), measured in the same run, and beside the
// alternatives a user would otherwise pick: asynq on Redis, and NATS micro
// request-reply (at-most-once, the lower bound). It prints a table of every
// figure with its ratio to the floor and writes docs/benchmarks.md with
// plots.
//
//	bash bench/run.sh            # from the repository root; starts Redis if needed
//	cd bench && go run . -h      # flags
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"syscall"
	"time"

	"go.opentelemetry.io/otel"

	"github.com/toolrelay/toolrelay/internal/idtrace"
)

type config struct {
	natsURL   string
	redisAddr string
	calls     int
	samples   int
	out       string
	quick     bool
	role      string
	memCalls  int
	// heapProfile: the memory child writes its live heap here (for the
	// largest count) once its calls are in flight.
	heapProfile string
	skip        map[string]bool
	// The curves' children (curves_child.go): a server's store and
	// configuration file, a dispatcher's NKEY seed, result stream size,
	// sweep interval and replica name.
	store, serverConfig, nkey, replicaName string
	resultBytes                            int64
	sweepInterval, runTTL                  time.Duration
	// curveSizes overrides the sizes of the teams, functions and open-turns
	// curves; profileDir takes CPU profiles of the open-turns curve's
	// children.
	curveSizes []int
	profileDir string
	// curves picks the curves the curves phase measures (none: all).
	curves map[string]bool
}

func main() {
	var cfg config
	var skip string
	flag.StringVar(&cfg.natsURL, "nats", os.Getenv("NATS_URL"), "NATS servers; empty: an embedded server per phase (file storage, R1, as toolrelay's default)")
	flag.StringVar(&cfg.redisAddr, "redis", "127.0.0.1:6390", "Redis for the asynq peer (bench/run.sh starts one)")
	flag.IntVar(&cfg.calls, "calls", 20000, "calls per throughput measurement")
	flag.IntVar(&cfg.samples, "samples", 1000, "closed-loop samples per latency measurement")
	flag.StringVar(&cfg.out, "out", "../docs", "where to write benchmarks.md and the plots")
	flag.BoolVar(&cfg.quick, "quick", false, "small counts, to check the bench itself")
	flag.StringVar(&skip, "skip", "", "comma-separated phases to skip: asynq, micro, mcp, scale, memory, breakdown")
	flag.StringVar(&cfg.role, "role", "", "internal: run as a child process (executor, memory)")
	flag.IntVar(&cfg.memCalls, "mem-calls", 0, "internal: calls for the memory child")
	flag.StringVar(&cfg.store, "store", "", "internal: the server child's store directory")
	flag.StringVar(&cfg.serverConfig, "server-config", "", "internal: the server child's configuration file")
	flag.StringVar(&cfg.nkey, "nkey", "", "internal: the dispatcher child's NKEY seed file")
	flag.StringVar(&cfg.replicaName, "replica", "", "internal: the dispatcher child's replica name")
	flag.Int64Var(&cfg.resultBytes, "result-bytes", 0, "internal: the dispatcher child's result stream size")
	flag.DurationVar(&cfg.sweepInterval, "sweep", 0, "internal: the dispatcher child's sweep interval")
	flag.DurationVar(&cfg.runTTL, "run-ttl", 0, "internal: the dispatcher child's run TTL")
	curveSizes := flag.String("curve-sizes", "", "comma-separated sizes for the teams, functions and turns curves (with -curves naming one)")
	flag.StringVar(&cfg.profileDir, "curve-profiles", "", "write CPU profiles of the open-turns curve's dispatcher and server here")
	curvesFrom := flag.String("curves-from", "", "write scale.md and its plots again from this scale.json, without measuring")
	flag.StringVar(&cfg.heapProfile, "heapprofile", "", "write the memory phase's dispatcher heap (live, at the largest count) to this file")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	memprofile := flag.String("memprofile", "", "write a profile of what the whole run allocated to this file")
	flag.IntVar(&inflightCalls, "inflight", inflightCalls, "calls kept in flight in the saturation runs")
	sizes := flag.String("sizes", "", "comma-separated turn sizes for the toolrelay phase (default 1,4,16)")
	only := flag.String("only", "", "comma-separated phases to run (floor, writes, toolrelay, breakdown, parallel, scale, memory, micro, mcp, asynq, curves); default all but curves")
	curves := flag.String("curves", "", "comma-separated curves of the curves phase (teams, functions, turns, time, replicas, cluster, mcp); default all")
	flag.Parse()
	// Tracing as the commands set it up with no exporter: spans that
	// record nothing and keep their IDs (the breakdown records its own).
	otel.SetTracerProvider(idtrace.Provider())
	cfg.skip = map[string]bool{}
	for _, s := range splitComma(skip) {
		cfg.skip[s] = true
	}
	if cfg.quick {
		cfg.calls, cfg.samples = 2000, 100
	}
	if *sizes != "" {
		turnSizes = nil
		for _, s := range splitComma(*sizes) {
			n, err := strconv.Atoi(s)
			if err != nil || n < 1 {
				fmt.Fprintln(os.Stderr, "bench: -sizes: bad size", s)
				os.Exit(2)
			}
			turnSizes = append(turnSizes, n)
		}
	}
	for _, s := range splitComma(*curveSizes) {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			fmt.Fprintln(os.Stderr, "bench: -curve-sizes: bad size", s)
			os.Exit(2)
		}
		cfg.curveSizes = append(cfg.curveSizes, n)
	}
	cfg.curves = map[string]bool{}
	for _, s := range splitComma(*curves) {
		cfg.curves[s] = true
	}
	if *only != "" {
		keep := map[string]bool{}
		for _, s := range splitComma(*only) {
			keep[s] = true
		}
		for _, s := range phases {
			if !keep[s] {
				cfg.skip[s] = true
			}
		}
	} else {
		// The curves take a quarter hour and write docs/scale.md:
		// only when asked for.
		cfg.skip["curves"] = true
	}
	if *cpuprofile != "" && cfg.role == "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		_ = pprof.StartCPUProfile(f)
		defer pprof.StopCPUProfile()
	}
	if *memprofile != "" && cfg.role == "" {
		defer func() {
			if f, err := os.Create(*memprofile); err == nil {
				_ = pprof.Lookup("allocs").WriteTo(f, 0)
				f.Close()
			}
		}()
	}
	// Warnings and errors of the parts under test go to stderr: a run that
	// measures oddly says why.
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	var err error
	if *curvesFrom != "" {
		r := &report{cfg: cfg}
		if err := r.loadCurves(*curvesFrom); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		if err := r.writeScale(cfg.out, false); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		return
	}
	switch cfg.role {
	case "executor":
		err = runExecutorChild(ctx, cfg)
	case "memory":
		err = runMemoryChild(ctx, cfg)
	case "server":
		err = runServerChild(cfg)
	case "dispatcher":
		err = runDispatcherChild(ctx, cfg)
	case "":
		err = run(ctx, cfg)
	default:
		err = fmt.Errorf("unknown role %q", cfg.role)
	}
	if err != nil {
		pprof.StopCPUProfile()
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, cfg config) error {
	start := time.Now()
	r := &report{cfg: cfg, started: start}
	r.machine = describeMachine()
	fmt.Printf("toolrelay bench on %s\n\n", r.machine)

	steps := []struct {
		name string
		f    func(context.Context, config, *report) error
	}{
		{"floor", measureFloor},
		{"writes", measureWrites},
		{"toolrelay", measureToolrelay},
		{"breakdown", measureBreakdown},
		{"parallel", measureParallelTurn},
		{"scale", measureScale},
		{"memory", measureMemory},
		{"micro", measureMicro},
		{"mcp", measureMCP},
		{"asynq", measureAsynq},
		{"curves", measureCurves},
	}
	ranBench := false // a phase of benchmarks.md ran
	for _, s := range steps {
		if cfg.skip[s.name] {
			r.note("%s: skipped (-skip)", s.name)
			continue
		}
		fmt.Printf("== %s\n", s.name)
		ranBench = ranBench || s.name != "curves"
		t := time.Now()
		if err := s.f(ctx, cfg, r); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			r.note("%s: failed: %v", s.name, err)
			fmt.Printf("   failed: %v\n", err)
		}
		fmt.Printf("   (%s)\n", time.Since(t).Round(time.Second))
	}
	r.elapsed = time.Since(start)
	if err := os.MkdirAll(cfg.out, 0o755); err != nil {
		return err
	}
	if len(r.curves) > 0 {
		if len(cfg.curves) > 0 && !cfg.quick {
			if err := r.keepOthers(filepath.Join(cfg.out, "scale.json")); err != nil {
				return err
			}
		}
		if err := r.writeScale(cfg.out, true); err != nil {
			return err
		}
	}
	if err := r.failedCurves(); err != nil {
		return err // after the report: what did run is written
	}
	if !ranBench {
		return nil
	}
	fmt.Println()
	fmt.Print(r.table())
	if err := r.plots(cfg.out); err != nil {
		r.note("plots: %v", err)
	}
	path := filepath.Join(cfg.out, "benchmarks.md")
	if err := os.WriteFile(path, []byte(r.markdown()), 0o644); err != nil {
		return err
	}
	fmt.Printf("\nwrote %s\n", path)
	return nil
}

// phases are the phases of the bench, in the order they run.
var phases = []string{"floor", "writes", "toolrelay", "breakdown", "parallel", "scale", "memory", "micro", "mcp", "asynq", "curves"}

func splitComma(s string) []string {
	var out []string
	cur := ""
	for _, r := range s + "," {
		if r == ',' {
			if cur != "" {
				out = append(out, cur)
			}
			cur = ""
			continue
		}
		cur += string(r)
	}
	return out
}
