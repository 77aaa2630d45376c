package main

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/toolrelay/toolrelay/internal/provision"
)

// curveOpenTurns: N turns open at once, each waiting on a slow function
// (nobody answers "hold"), in one dispatcher process on one server.
func curveOpenTurns(ctx context.Context, cfg config, c *curve) error {
	c.title, c.size, c.logX = "Open turns", "open turns", true
	c.cols = []column{
		{"intake (turns/s)", false}, {"dispatcher RSS (B/turn)", false}, {"dispatcher heap (B/turn)", false}, {"server RSS (B/turn)", false},
		{"dispatcher RSS (MiB)", true}, {"server RSS (MiB)", true}, {"open-turns gauge read (ms)", true},
		{"sweep pass (ms)", true}, {"next sweep pass (ms)", true}, {"console list, first (ms)", true}, {"console list, then (ms)", true},
		{"restart to ready (ms)", true}, {"restart's sweep, re-arming all (ms)", true},
	}
	for _, n := range sizes(cfg, []int{1000}, []int{1000, 10000, 100000}) {
		pctx, cancel := context.WithTimeout(ctx, 2*pointTimeout)
		err := openTurnsPoint(pctx, c, n, !cfg.quick, cfg.profileDir)
		cancel()
		if err != nil {
			return fmt.Errorf("%d open turns: %w", n, err)
		}
	}
	c.note("Each turn is a single call to a function whose one executor takes a call and never answers, so every turn stays open " +
		"(the dispatcher's run TTL is set to an hour so that none reaches its deadline meanwhile). Memory per turn is the growth from " +
		"before the intake to after it, divided by the turns. The sweep pass is one sweep once every turn is older than its lease " +
		"(15 s), the steady state of turns waiting on slow functions, and the next pass the one after it (the first runs beside the " +
		"re-checks of results that crossing the lease schedules for every turn); the console's first list loads the inspection index, later ones " +
		"read it from memory. The restart kills the dispatcher (SIGKILL) and starts another on the same server: it is ready at once, " +
		"and its first sweep re-arms every open turn it finds.")
	return nil
}

// openTurnsPoint measures n open turns; the sweep pass only if sweep
// (it waits for the turns to pass their lease).
func openTurnsPoint(ctx context.Context, c *curve, n int, sweep bool, profileDir string) error {
	srv, env, done, err := freshServer(ctx, "turns")
	if err != nil {
		return err
	}
	defer done()
	stopHold, err := serveHold(ctx, env)
	if err != nil {
		return err
	}
	defer stopHold()
	args := []string{"-sweep", "2s", "-run-ttl", "1h"}
	d, err := dispatcherChild(ctx, env.url, args...)
	if err != nil {
		return err
	}
	defer func() { d.kill() }()
	drss0, dheap0, err := d.mem()
	if err != nil {
		return err
	}
	srss0, _, err := srv.mem()
	if err != nil {
		return err
	}
	r, err := d.ask(childReq{Op: "hold", N: n})
	if err != nil {
		return err
	}
	intakeEnd := time.Now()
	rate := float64(n) / time.Duration(r.Took).Seconds()
	fmt.Printf("   %d turns taken in at %.0f turns/s\n", n, rate)
	drss1, dheap1, err := d.mem()
	if err != nil {
		return err
	}
	srss1, _, err := srv.mem()
	if err != nil {
		return err
	}
	_, js, err := env.connect("curves-check")
	if err != nil {
		return err
	}
	defer js.Conn().Close()
	gauge, err := best(3, func() error {
		st, err := js.Stream(ctx, provision.TimerStream)
		if err != nil {
			return err
		}
		info, err := st.Info(ctx)
		if err == nil && info.State.NumSubjects < uint64(n) {
			err = fmt.Errorf("the timer index has %d subjects, want %d", info.State.NumSubjects, n)
		}
		return err
	})
	if err != nil {
		return err
	}

	// profiled runs f with the dispatcher and the server profiled, if asked.
	profiled := func(what string, f func() error) error {
		if profileDir == "" {
			return f()
		}
		for _, p := range []struct {
			c    *child
			name string
		}{{d, "dispatcher"}, {srv, "server"}} {
			path := filepath.Join(profileDir, fmt.Sprintf("turns-%d-%s-%s.pprof", n, what, p.name))
			if _, err := p.c.ask(childReq{Op: "profile", Path: path}); err != nil {
				return err
			}
			defer p.c.ask(childReq{Op: "profile"})
		}
		return f()
	}
	pass, next := time.Duration(-1), time.Duration(-1)
	if sweep {
		if err := profiled("sweep", func() (err error) { pass, next, err = sweepPass(ctx, d, intakeEnd); return err }); err != nil {
			return err
		}
	}

	first, err := d.ask(childReq{Op: "inspect"})
	if err != nil {
		return err
	}
	if first.Count < n {
		sub, _ := d.ask(childReq{Op: "submitted"})
		return fmt.Errorf("the console lists %d open turns, want %d (%d turns submitted, %d failed calls: %s)", first.Count, n, sub.Count, sub.Failed, sub.Why)
	}
	var then childResp
	if err := profiled("list", func() (err error) { then, err = d.ask(childReq{Op: "inspect"}); return err }); err != nil {
		return err
	}

	d.kill()
	if d, err = dispatcherChild(ctx, env.url, args...); err != nil {
		return err
	}
	var rearm time.Duration
	if err := profiled("rearm", func() (err error) { rearm, err = startupSweep(ctx, d); return err }); err != nil {
		return err
	}
	per := func(a, b uint64) float64 { return (float64(b) - float64(a)) / float64(n) }
	c.add(float64(n), "", rate, per(drss0, drss1), per(dheap0, dheap1), per(srss0, srss1),
		float64(drss1)/(1<<20), float64(srss1)/(1<<20), msf(gauge), nonNegative(msf(pass)), nonNegative(msf(next)),
		msf(time.Duration(first.Took)), msf(time.Duration(then.Took)), msf(d.ready), msf(rearm))
	return nil
}

// sweepAfterLease is how old a turn must be before the sweep looks at it
// (pkg/dispatch's sweepAfter, the lease), with a second to spare. It reads
// the record only of a turn it does not track, or whose copy shows it past
// its deadline; the others it hands to their engine on their re-checks.
const sweepAfterLease = 16 * time.Second

// nextSweep waits until the dispatcher child has finished n sweeps.
func nextSweep(ctx context.Context, d *child, n int) (childResp, error) {
	for {
		s, err := d.ask(childReq{Op: "sweeps"})
		if err != nil || s.Sweeps >= n {
			return s, err
		}
		if err := sleepCtx(ctx, 50*time.Millisecond); err != nil {
			return s, fmt.Errorf("waiting for sweep %d: %w", n, err)
		}
	}
}

// startupSweep waits for the dispatcher child's startup sweep and
// returns how long it took.
func startupSweep(ctx context.Context, d *child) (time.Duration, error) {
	for {
		s, err := d.ask(childReq{Op: "sweeps"})
		if err != nil {
			return 0, err
		}
		if s.StartupSweepNs > 0 {
			return time.Duration(s.StartupSweepNs), nil
		}
		if err := sleepCtx(ctx, 50*time.Millisecond); err != nil {
			return 0, fmt.Errorf("waiting for the startup sweep: %w", err)
		}
	}
}

// sleepCtx waits for d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

// sweepPass is how long one sweep of the dispatcher child takes once
// every turn it took in by intakeEnd is older than its lease, and the one
// after it: the first such pass runs beside the re-checks of results
// that crossing the lease schedules for every turn at once.
func sweepPass(ctx context.Context, d *child, intakeEnd time.Time) (pass, next time.Duration, err error) {
	for time.Since(intakeEnd) < sweepAfterLease {
		if err := sleepCtx(ctx, 100*time.Millisecond); err != nil {
			return 0, 0, err
		}
	}
	s, err := d.ask(childReq{Op: "sweeps"})
	if err != nil {
		return 0, 0, err
	}
	// The next sweep may have started before; the ones after did not.
	var took []time.Duration
	for range 3 {
		n, err := nextSweep(ctx, d, s.Sweeps+1)
		if err != nil {
			return 0, 0, err
		}
		took = append(took, time.Duration((n.SweepNs-s.SweepNs)/int64(n.Sweeps-s.Sweeps)))
		s = n
	}
	return took[1], took[2], nil
}

// nonNegative is v, or "not measured" if v < 0.
func nonNegative(v float64) float64 {
	if v < 0 {
		return na
	}
	return v
}
