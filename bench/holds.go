package main

import (
	"context"
	"fmt"
	"slices"
	"time"
)

// The holds phase weighs what holding each turn from its intake buys
// (pkg/dispatch/hold.go): toolrelay with holds and with holds off
// (dispatch.Options.NoHolds, which is how turns were taken in before),
// each on its own stack and server in this process, single-call turns
// driven in bursts that alternate between the two (ABBA), so that the
// host's drift, which moves CPU time per call by a fifth between runs,
// falls on both alike; then closed-loop samples, in blocks that
// alternate the same way.

// holdsResult is one side of the comparison: medians over its bursts.
type holdsResult struct {
	cpu   []time.Duration // per call, one per burst
	rate  []float64       // calls/s, one per burst
	alloc allocs          // per call, over every burst
	msgs  traffic         // per call, over every burst
	lat   latencies
}

func (h *holdsResult) medianCPU() time.Duration {
	s := slices.Clone(h.cpu)
	slices.Sort(s)
	return s[len(s)/2]
}

func (h *holdsResult) medianRate() float64 {
	s := slices.Clone(h.rate)
	slices.Sort(s)
	return s[len(s)/2]
}

const (
	holdsRounds  = 8
	holdsBurst   = 2500 // single-call turns per burst
	holdsLatency = 250  // closed-loop samples per block
)

func measureHolds(ctx context.Context, cfg config, r *report) error {
	sides := make([]*holdsResult, 2) // with holds, holds off
	stacks := make([]*stack, 2)
	envs := make([]*natsEnv, 2)
	defer func() {
		for i := range stacks {
			if stacks[i] != nil {
				stacks[i].stop()
			}
			if envs[i] != nil {
				envs[i].close()
			}
		}
	}()
	for i := range stacks {
		env, err := startNATS(ctx, cfg)
		if err != nil {
			return err
		}
		envs[i] = env
		if stacks[i], err = newStack(ctx, env, 1, noop, stackOptions{noHolds: i == 1}); err != nil {
			return err
		}
		sides[i] = &holdsResult{}
	}
	burst, rounds, samples := holdsBurst, holdsRounds, holdsLatency
	if cfg.quick {
		burst, rounds, samples = 500, 2, 50
	}
	inflight := max(inflightCalls, 16)
	// Warm both up, so neither pays for a cold start.
	for _, s := range stacks {
		if _, err := s.drive(ctx, "noop", burst/5, 1, inflight); err != nil {
			return err
		}
	}
	for round := range rounds {
		for _, i := range abba(round) {
			alloc0, msgs0, cpu0 := allocated(), envs[i].traffic(), cpuTime()
			elapsed, err := stacks[i].drive(ctx, "noop", burst, 1, inflight)
			if err != nil {
				return err
			}
			h := sides[i]
			h.cpu = append(h.cpu, (cpuTime()-cpu0)/time.Duration(burst))
			h.rate = append(h.rate, float64(burst)/elapsed.Seconds())
			// Summed here, divided by the bursts at the end.
			a, m := alloc0.per(burst), msgs0.per(envs[i], burst)
			h.alloc.objects, h.alloc.bytes = h.alloc.objects+a.objects, h.alloc.bytes+a.bytes
			h.msgs.in, h.msgs.out = h.msgs.in+m.in, h.msgs.out+m.out
		}
		for _, i := range abba(round) {
			for range samples {
				req := turn("noop", 1)
				done := stacks[i].sink.expect(req.Key())
				t0 := time.Now()
				if _, err := stacks[i].d.Intake(ctx, req); err != nil {
					return err
				}
				<-done
				sides[i].lat = append(sides[i].lat, time.Since(t0))
			}
		}
	}
	for i, h := range sides {
		n := float64(len(h.cpu))
		h.alloc = allocs{objects: h.alloc.objects / n, bytes: h.alloc.bytes / n}
		h.msgs = traffic{in: h.msgs.in / n, out: h.msgs.out / n}
		name := [2]string{"with holds", "holds off"}[i]
		fmt.Printf("   %-10s CPU per call %s (median of %d bursts; %s), %.0f calls/s, %s, server messages %s; p50 %.3fms p99 %.3fms\n",
			name, usf(h.medianCPU()), len(h.cpu), usList(h.cpu), h.medianRate(), h.alloc, h.msgs, msf(h.lat.pct(50)), msf(h.lat.pct(99)))
	}
	r.holds = sides
	return nil
}

// abba orders the two sides in a round: A B, then B A, and so on.
func abba(round int) [2]int {
	if round%2 == 0 {
		return [2]int{0, 1}
	}
	return [2]int{1, 0}
}

func usList(ds []time.Duration) string {
	s := ""
	for i, d := range ds {
		if i > 0 {
			s += "/"
		}
		s += fmt.Sprintf("%.0f", float64(d)/float64(time.Microsecond))
	}
	return s + " µs"
}
