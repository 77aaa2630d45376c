// Command chaos soaks toolrelay under faults, as it is deployed: a
// three-node JetStream cluster (nats-server processes built from the
// module, configured by `dispatcher nats-config` with an account per team),
// two dispatcher processes, executors of two teams, and the platform
// simulator playing Agents sessions, Assistants runs (some with their expiry
// 30 s away) and Responses chains. While turns run, a schedule of faults
// drawn from a printed seed kills, stops and restarts processes and makes
// the platform fail. At the end it judges toolrelay from the outside: from
// the simulator's ledger (every call answered exactly once, no run expired)
// and from the side-effect function's own effect log (at most once per call,
// exactly once where its result says it ran). Any violation fails the run
// and prints the seed and the evidence.
//
//	cd bench && go run ./chaos                       # the short run (about a minute)
//	cd bench && go run ./chaos -duration 10m -rate 8 -report ../docs/reliability.md
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

type config struct {
	duration  time.Duration
	rate      float64
	seed      uint64
	faults    time.Duration
	quiet     time.Duration
	quietRate float64
	report    string
	keep      bool
	repo      string
	fuzz      time.Duration
}

func main() {
	var cfg config
	flag.DurationVar(&cfg.duration, "duration", 45*time.Second, "how long to start conversations")
	flag.Float64Var(&cfg.rate, "rate", 4, "conversations started per second")
	flag.Uint64Var(&cfg.seed, "seed", 0, "seed of the fault schedule and the workload (0: from the clock; printed)")
	flag.DurationVar(&cfg.faults, "fault-every", 4*time.Second, "mean time between faults")
	flag.DurationVar(&cfg.quiet, "quiet", 15*time.Second, "first, this long without faults at -quiet-rate, then the raw JetStream floor on the same cluster")
	flag.Float64Var(&cfg.quietRate, "quiet-rate", 10, "conversations started per second in the quiet phase")
	flag.StringVar(&cfg.report, "report", "", "write the report (markdown) to this file")
	flag.DurationVar(&cfg.fuzz, "fuzz", 0, "also run each fuzz target of pkg/protocol this long, after the soak, for the report")
	flag.BoolVar(&cfg.keep, "keep", false, "keep the working directory (logs, stores)")
	flag.StringVar(&cfg.repo, "repo", "..", "the repository's root, where the commands are built")
	flag.Parse()
	if cfg.seed == 0 {
		cfg.seed = uint64(time.Now().UnixNano())
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := run(ctx, cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "chaos: FAILED (seed %d; replay with -seed %d): %v\n", cfg.seed, cfg.seed, err)
		os.Exit(1)
	}
}

func run(ctx context.Context, cfg config) error {
	fmt.Printf("chaos: seed %d, %s of load at %.1f conversations/s, a fault every %s on average\n",
		cfg.seed, cfg.duration, cfg.rate, cfg.faults)
	dir, err := os.MkdirTemp("", "toolrelay-chaos-")
	if err != nil {
		return err
	}
	if cfg.keep {
		fmt.Println("chaos: working directory", dir)
	} else {
		defer os.RemoveAll(dir)
	}
	rng := rand.New(rand.NewPCG(cfg.seed, cfg.seed^0x9e3779b97f4a7c15))
	bins, err := build(ctx, cfg.repo, filepath.Join(dir, "bin"))
	if err != nil {
		return fmt.Errorf("build: %w", err)
	}
	f, err := startFleet(ctx, dir, bins)
	if err != nil {
		return err
	}
	defer f.stop()

	load := newLoad(f, rand.New(rand.NewPCG(rng.Uint64(), rng.Uint64())))
	// The quiet phase: the same workload, no faults, for what replication
	// costs beside the raw floor measured right after on the same cluster.
	var quiet quietPhase
	if cfg.quiet > 0 {
		quiet.from = time.Now()
		qctx, stopQuiet := context.WithTimeout(ctx, cfg.quiet)
		load.run(qctx, cfg.quietRate)
		stopQuiet()
		quiet.to = time.Now()
		// Let the quiet phase's last turns finish before measuring the floor.
		judge(ctx, f, load, drainTimeout)
		if quiet.throughput, err = f.measureFloor(ctx, 5*time.Second, 256); err != nil {
			return err
		}
		if quiet.latency, err = f.measureFloor(ctx, 3*time.Second, 1); err != nil {
			return err
		}
		fmt.Printf("chaos: quiet phase over; raw JetStream R3 floor %.0f calls/s (256 in flight), round trip p50 %s (one at a time)\n",
			float64(quiet.throughput.calls)/quiet.throughput.elapsed.Seconds(), pct(quiet.latency.rtts, .5))
	}

	started := time.Now()
	lctx, stopLoad := context.WithTimeout(ctx, cfg.duration)
	defer stopLoad()
	loadDone := make(chan struct{})
	go func() { load.run(lctx, cfg.rate); close(loadDone) }()
	// The bad-input corpus goes first, while turns run and before any
	// fault, so that whatever breaks is its doing.
	corpus := f.throwCorpus(lctx, bins)
	var crashed []string
	for _, p := range f.all() {
		if !p.running() {
			crashed = append(crashed, fmt.Sprintf("%s (exit %d; its log ends: %s)", p.name, p.exitCode(), tailOf(p.log, 600)))
		}
	}
	fmt.Printf("chaos: bad-input corpus: %d inputs thrown, %d crashed processes\n", len(corpus), len(crashed))
	faultsFrom := time.Now()
	faults := f.injectFaults(lctx, rng, cfg.faults)
	<-loadDone
	if ctx.Err() != nil {
		return errors.New("interrupted")
	}
	fmt.Printf("chaos: load over after %s: %d conversations started, %d faults; waiting for the fleet to finish\n",
		time.Since(started).Round(time.Second), load.count(), len(faults))
	f.restoreAll(ctx)
	res := judge(ctx, f, load, drainTimeout)
	res.seed, res.faults, res.elapsed, res.cfg = cfg.seed, faults, time.Since(started), cfg
	res.corpus, res.crashed, res.quiet, res.t0 = corpus, crashed, quiet, faultsFrom
	res.print(os.Stdout)
	if cfg.fuzz > 0 {
		f.stop()
		res.fuzz = runFuzzers(ctx, cfg.repo, cfg.fuzz)
	}
	if cfg.report != "" {
		if err := res.writeReport(cfg.report); err != nil {
			return err
		}
		fmt.Println("chaos: report written to", cfg.report)
	}
	if v := res.violations(); len(v) > 0 {
		for _, line := range v {
			fmt.Fprintln(os.Stderr, "chaos: VIOLATION:", line)
		}
		return fmt.Errorf("%d invariant(s) violated", len(v))
	}
	fmt.Println("chaos: every invariant held")
	return nil
}

// tailOf returns the end of a log file, on one line.
func tailOf(path string, n int) string {
	b, _ := os.ReadFile(path)
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return strings.ReplaceAll(strings.TrimSpace(string(b)), "\n", " | ")
}

// drainTimeout bounds the wait for the last conversations once load and
// faults stopped: longer than the runs' TTL, so an expiry would show.
const drainTimeout = 2 * time.Minute
