package main

import (
	"context"
	"fmt"
	"image/color"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"

	"github.com/toolrelay/toolrelay/internal/platformsim"
)

// result is what the soak found, judged from the platform's ledger and
// the side-effect function's effect log.
type result struct {
	cfg     config
	seed    uint64
	elapsed time.Duration
	faults  []faultRecord
	convs   []*conversation
	ledger  platformsim.Ledger
	effects map[string]int
	drained bool
	t0      time.Time
	corpus  []corpusResult
	crashed []string
	quiet   quietPhase
	fuzz    []fuzzResult
	// mcpOK, mcpFailed and mcpWrong count the tools/call outcomes.
	mcpOK, mcpFailed, mcpWrong int
	mcpErrors                  []string
}

// quietPhase is the soak's workload without faults, and the floor.
type quietPhase struct {
	from, to   time.Time
	throughput *floorResult
	latency    *floorResult
}

// quietFigures returns the calls asked in the quiet phase, answered per
// second, and their latencies.
func (r *result) quietFigures() (calls int, perSec float64, lat []time.Duration) {
	if r.quiet.throughput == nil {
		return 0, 0, nil
	}
	var last time.Time
	for id, at := range r.ledger.Asked {
		if at.Before(r.quiet.from) || at.After(r.quiet.to) || len(r.ledger.Answered[id]) == 0 {
			continue
		}
		calls++
		ans := r.ledger.Answered[id][0]
		lat = append(lat, ans.Sub(at))
		if ans.After(last) {
			last = ans
		}
	}
	slices.Sort(lat)
	if calls > 0 {
		perSec = float64(calls) / last.Sub(r.quiet.from).Seconds()
	}
	return calls, perSec, lat
}

// judge waits until the platform has every call answered and every run
// ended (or timeout), then reads the ledgers.
func judge(ctx context.Context, f *fleet, l *load, timeout time.Duration) *result {
	deadline := time.Now().Add(timeout)
	res := &result{convs: l.conversations()}
	l.mu.Lock()
	res.mcpOK, res.mcpFailed, res.mcpWrong, res.mcpErrors = l.mcpOK, l.mcpFailed, l.mcpWrong, l.mcpErrors
	l.mu.Unlock()
	var stableSince time.Time
	lastCalls := -1
	for time.Now().Before(deadline) && ctx.Err() == nil {
		led := f.sim.Ledger()
		open := led.Runs["queued"] + led.Runs["in_progress"] + led.Runs["requires_action"]
		unanswered := 0
		for id := range led.Calls {
			if len(led.Outputs[id]) == 0 {
				unanswered++
			}
		}
		if len(led.Calls) != lastCalls {
			lastCalls, stableSince = len(led.Calls), time.Now()
		}
		if open == 0 && unanswered == 0 && time.Since(stableSince) > 3*time.Second {
			res.drained = true
			break
		}
		time.Sleep(500 * time.Millisecond) // polling the ledger; the deadline bounds the wait
	}
	res.ledger, res.effects = f.sim.Ledger(), f.effects.effects()
	return res
}

// violations lists every broken invariant, with evidence.
func (r *result) violations() []string {
	var v []string
	add := func(format string, args ...any) { v = append(v, fmt.Sprintf(format, args...)) }
	for _, c := range r.convs {
		if c.watchErr != nil {
			add("%s conversation %v was never driven: %v", c.platform, c.ref, c.watchErr)
		}
	}
	for _, id := range sortedKeys(r.ledger.Calls) {
		outs := r.ledger.Outputs[id]
		switch {
		case len(outs) == 0:
			add("call %s (%s on %s) never answered", id, r.ledger.Calls[id], r.ledger.Platform[id])
		case len(outs) > 1:
			add("call %s (%s on %s) answered %d times: %q", id, r.ledger.Calls[id], r.ledger.Platform[id], len(outs), outs)
		}
		if fn := r.ledger.Calls[id]; sideEffect(fn) {
			n := r.effects[id]
			if n > 1 {
				add("side effect of call %s (%s on %s) ran %d times", id, fn, r.ledger.Platform[id], n)
			}
			if len(outs) > 0 && isEffect(outs[0]) && n != 1 {
				add("call %s (%s) reported done but the effect log has %d runs", id, fn, n)
			}
		}
	}
	if r.mcpWrong > 0 {
		add("%d MCP calls succeeded with the wrong output", r.mcpWrong)
	}
	if n := r.ledger.Runs["expired"]; n > 0 {
		add("%d Assistants runs expired", n)
	}
	for _, s := range []string{"failed", "cancelled", "incomplete"} {
		if n := r.ledger.Runs[s]; n > 0 {
			add("%d Assistants runs %s", n, s)
		}
	}
	for _, f := range r.faults {
		if f.err != nil {
			add("fault %s on %s at %.1fs: %v", f.kind, f.target, f.at.Seconds(), f.err)
		}
	}
	for _, c := range r.corpus {
		if !c.ok {
			add("bad input %q at %s: got %s", c.input, c.door, c.got)
		}
	}
	for _, fz := range r.fuzz {
		if !fz.passed {
			add("fuzz target %s failed: %s", fz.target, fz.last)
		}
	}
	for _, p := range r.crashed {
		add("%s stopped while the bad-input corpus was thrown", p)
	}
	if !r.drained {
		add("the fleet did not finish within %s of the load's end", drainTimeout)
	}
	return v
}

// figures the report shows.
type figures struct {
	convs, calls, turns      map[string]int
	quiet, faulty            []time.Duration
	sideEffects, charged     int
	failedCalls, expiredRuns int
}

func (r *result) figures() figures {
	fg := figures{convs: map[string]int{}, calls: map[string]int{}, turns: map[string]int{}}
	for _, c := range r.convs {
		fg.convs[c.platform]++
	}
	for id, fn := range r.ledger.Calls {
		p := r.ledger.Platform[id]
		fg.calls[p]++
		// Each turn asks for charge (pay, first step), quote (pay, second),
		// slow (mixed) or refund (refund): one of them per turn.
		if fn == "charge" || fn == "quote" || fn == "slow" || fn == "refund" {
			fg.turns[p]++
		}
		outs := r.ledger.Outputs[id]
		if len(outs) == 0 {
			continue
		}
		if strings.Contains(outs[0], `"error"`) || strings.HasPrefix(outs[0], "error: ") {
			fg.failedCalls++
		}
		if sideEffect(fn) && isEffect(outs[0]) {
			fg.charged++
		}
		lat := r.ledger.Answered[id][0].Sub(r.ledger.Asked[id])
		if r.duringFault(r.ledger.Asked[id]) {
			fg.faulty = append(fg.faulty, lat)
		} else {
			fg.quiet = append(fg.quiet, lat)
		}
	}
	for _, n := range r.effects {
		fg.sideEffects += n
	}
	fg.expiredRuns = r.ledger.Runs["expired"]
	slices.Sort(fg.quiet)
	slices.Sort(fg.faulty)
	return fg
}

func (r *result) duringFault(at time.Time) bool {
	d := at.Sub(r.t0)
	for _, f := range r.faults {
		if d >= f.at && d <= f.end+5*time.Second {
			return true
		}
	}
	return false
}

func pct(d []time.Duration, p float64) string {
	if len(d) == 0 {
		return "–"
	}
	return d[min(len(d)-1, int(float64(len(d))*p))].Round(time.Millisecond).String()
}

func total(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

func (r *result) print(w io.Writer) {
	fg := r.figures()
	fmt.Fprintf(w, "chaos: %d conversations %v, %d turns, %d calls %v in %s; %d faults\n",
		total(fg.convs), fg.convs, total(fg.turns), total(fg.calls), fg.calls, r.elapsed.Round(time.Second), len(r.faults))
	fmt.Fprintf(w, "chaos: call latency (asked → answered, platform's clock) quiet p50 %s p99 %s; during faults p50 %s p99 %s\n",
		pct(fg.quiet, .5), pct(fg.quiet, .99), pct(fg.faulty, .5), pct(fg.faulty, .99))
	fmt.Fprintf(w, "chaos: side effects run %d, calls reported charged %d; failed calls (read by the model) %d; MCP calls ok %d, failed %d, wrong %d\n",
		fg.sideEffects, fg.charged, fg.failedCalls, r.mcpOK, r.mcpFailed, r.mcpWrong)
}

// writeReport writes the markdown report and its plot beside it.
func (r *result) writeReport(path string) error {
	fg := r.figures()
	var b strings.Builder
	b.WriteString("# Reliability: toolrelay under fire\n\n")
	b.WriteString("Written by `cd bench && go run ./chaos " + r.flags() + "` (the soak's own\nreport; run it again with the same seed to replay the fault schedule).\n\n")
	b.WriteString("## Topology\n\n")
	b.WriteString("- three `nats-server` processes (built from the module), a JetStream cluster configured by\n  `dispatcher nats-config -cluster 3` with an account per team, `sync_interval: always`, every\n  stream and bucket R3;\n")
	b.WriteString("- two dispatcher processes; executors of two teams, `orders` (two functions-file executors\n  and a Go one) and `billing` (two), each team in its own account; the platform simulator\n  playing Agents sessions (half of them reaching the dispatchers by signed webhooks alone),\n  Assistants runs (half of them expiring 30 s after creation, the rest 90 s), Responses\n  chains, and MCP `tools/call` through `/mcp`;\n")
	b.WriteString("- functions: `charge` (HTTP, side effects), `lookup` and `slow` (commands), `quote`\n  (command), `flaky` (HTTP answering 503 to a third of attempts: retried), `refuse` (a\n  command failing: the model reads the error), and from a Go executor built on `pkg/exec`,\n  `refund` (side effects, with a `Reconcile` hook that asks the effect log) and `tally`.\n\n")
	fmt.Fprintf(&b, "Seed **%d**; %s of load at %.1f conversations/s, a fault every %s on average; %s in all.\n\n",
		r.seed, r.cfg.duration, r.cfg.rate, r.cfg.faults, r.elapsed.Round(time.Second))
	if calls, perSec, lat := r.quietFigures(); calls > 0 {
		tp, lt := r.quiet.throughput, r.quiet.latency
		floorRate := float64(tp.calls) / tp.elapsed.Seconds()
		b.WriteString("## Throughput on the cluster, without faults\n\n")
		fmt.Fprintf(&b, "The soak's workload alone for %s (%.0f conversations/s offered), then the raw JetStream\npipeline on the same three nodes and replication (R3: call to a work queue, a worker taking it and\npublishing a result, the caller consuming it):\n\n", r.quiet.to.Sub(r.quiet.from).Round(time.Second), r.cfg.quietRate)
		b.WriteString("| | calls | calls/s | latency p50 | p99 |\n|---|---|---|---|---|\n")
		fmt.Fprintf(&b, "| toolrelay, the soak's workload (model → platform output, through functions that sleep up to 1.5 s) | %d | %.1f | %s | %s |\n", calls, perSec, pct(lat, .5), pct(lat, .99))
		fmt.Fprintf(&b, "| raw JetStream R3 floor, 256 in flight | %d | %.0f | %s | %s |\n", tp.calls, floorRate, pct(tp.rtts, .5), pct(tp.rtts, .99))
		fmt.Fprintf(&b, "| raw JetStream R3 floor, one at a time | %d | %.0f | %s | %s |\n\n", lt.calls, float64(lt.calls)/lt.elapsed.Seconds(), pct(lt.rtts, .5), pct(lt.rtts, .99))
		b.WriteString("The soak's rate is what its driver offers, not toolrelay's ceiling (see docs/benchmarks.md for\nthat, on one node); its latency includes the functions' own time and the platform's model\nsteps, so it is an end-to-end figure beside the floor's bare round trip.\n\n")
	}
	b.WriteString("## Invariants (from the platform's ledger and the effect log)\n\n| invariant | count |\n|---|---|\n")
	unanswered, dup, effectsOver, chargedMismatch := 0, 0, 0, 0
	for id := range r.ledger.Calls {
		n := len(r.ledger.Outputs[id])
		if n == 0 {
			unanswered++
		}
		if n > 1 {
			dup++
		}
		if sideEffect(r.ledger.Calls[id]) {
			if r.effects[id] > 1 {
				effectsOver++
			}
			if n > 0 && isEffect(r.ledger.Outputs[id][0]) && r.effects[id] != 1 {
				chargedMismatch++
			}
		}
	}
	notDriven := 0
	for _, c := range r.convs {
		if c.watchErr != nil {
			notDriven++
		}
	}
	fmt.Fprintf(&b, "| calls never answered | %d |\n| calls answered more than once (duplicate submissions) | %d |\n", unanswered, dup)
	fmt.Fprintf(&b, "| Assistants runs expired | %d |\n| side-effect runs beyond one per call | %d |\n", fg.expiredRuns, effectsOver)
	fmt.Fprintf(&b, "| side-effect calls reported done without exactly one effect | %d |\n| conversations no dispatcher would take | %d |\n\n", chargedMismatch, notDriven)
	b.WriteString("## Workload\n\n| platform | conversations | turns | calls |\n|---|---|---|---|\n")
	for _, p := range []string{"agents", "assistants", "responses"} {
		fmt.Fprintf(&b, "| %s | %d | %d | %d |\n", p, fg.convs[p], fg.turns[p], fg.calls[p])
	}
	fmt.Fprintf(&b, "| all | %d | %d | %d |\n\n", total(fg.convs), total(fg.turns), total(fg.calls))
	fmt.Fprintf(&b, "MCP `tools/call` through `/mcp` (the official client, a dispatcher chosen at random): %d answered\nright, %d failed (a transport error or `isError`, as when the dispatcher holding the request\nis killed), %d answered wrong.\n\n", r.mcpOK, r.mcpFailed, r.mcpWrong)
	mcp := r.mcpOK + r.mcpFailed + r.mcpWrong
	fmt.Fprintf(&b, "In all, %d turns: %d of the platforms and %d MCP calls (each a one-call turn of its own).\n\n",
		total(fg.turns)+mcp, total(fg.turns), mcp)
	for _, e := range r.mcpErrors {
		fmt.Fprintf(&b, "- a failure: `%s`\n", strings.ReplaceAll(e, "`", "'"))
	}
	if len(r.mcpErrors) > 0 {
		b.WriteString("\n")
	}
	fmt.Fprintf(&b, "Side effects run (charge and refund): %d; calls reporting theirs done: %d; calls failed to the model (`refuse`, and any\nstraggler cut off at its deadline): %d.\n\n", fg.sideEffects, fg.charged, fg.failedCalls)
	b.WriteString("## Latency of a call, from the model asking to the platform accepting its output\n\n| | calls | p50 | p90 | p99 | max |\n|---|---|---|---|---|---|\n")
	fmt.Fprintf(&b, "| quiet | %d | %s | %s | %s | %s |\n", len(fg.quiet), pct(fg.quiet, .5), pct(fg.quiet, .9), pct(fg.quiet, .99), pct(fg.quiet, 1))
	fmt.Fprintf(&b, "| during a fault (or within 5 s after) | %d | %s | %s | %s | %s |\n\n", len(fg.faulty), pct(fg.faulty, .5), pct(fg.faulty, .9), pct(fg.faulty, .99), pct(fg.faulty, 1))
	b.WriteString("## Faults\n\n| kind | injected | stop took (mean) | back after (mean / max) |\n|---|---|---|---|\n")
	byKind := map[faultKind][]faultRecord{}
	for _, f := range r.faults {
		byKind[f.kind] = append(byKind[f.kind], f)
	}
	for _, k := range faultKinds {
		fs := byKind[k]
		if len(fs) == 0 {
			fmt.Fprintf(&b, "| %s | 0 | | |\n", k)
			continue
		}
		var stop, back, worst time.Duration
		for _, f := range fs {
			stop += f.stopTook
			back += f.recovered
			worst = max(worst, f.recovered)
		}
		n := time.Duration(len(fs))
		fmt.Fprintf(&b, "| %s | %d | %s | %s / %s |\n", k, len(fs), (stop / n).Round(time.Millisecond), (back / n).Round(time.Millisecond), worst.Round(time.Millisecond))
	}
	b.WriteString("\n\"Back after\" is until the restarted process is ready again (a dispatcher's `/readyz`, an\nexecutor declaring, a node taking connections); the platform's outages last 2–6 s by design.\n\n")
	plotName := strings.TrimSuffix(filepath.Base(path), filepath.Ext(path)) + ".png"
	if err := r.plot(filepath.Join(filepath.Dir(path), plotName)); err != nil {
		return err
	}
	fmt.Fprintf(&b, "![calls answered per second and p50 latency over time; faults marked](%s)\n\n", plotName)
	b.WriteString("## Bad input\n\nThrown at the running deployment while turns ran, before the first fault. Every one got a\nrefusal or a clean failed call, and no process stopped:\n\n| door | input | answer |\n|---|---|---|\n")
	for _, c := range r.corpus {
		mark := ""
		if !c.ok {
			mark = " **(violation)**"
		}
		fmt.Fprintf(&b, "| %s | %s | %s%s |\n", c.door, c.input, strings.ReplaceAll(c.got, "|", "\\|"), mark)
	}
	b.WriteString("\n")
	if len(r.fuzz) > 0 {
		fmt.Fprintf(&b, "## Fuzzing the wire contract's decoders\n\nEach fuzz target of `pkg/protocol` for %s, after the soak (`go test -fuzz`):\n\n| target | executions | result |\n|---|---|---|\n", r.cfg.fuzz)
		for _, fz := range r.fuzz {
			res := "passed"
			if !fz.passed {
				res = "**failed**: " + fz.last
			}
			fmt.Fprintf(&b, "| `%s` | %s | %s |\n", fz.target, fz.execs, res)
		}
		b.WriteString("\n")
	}
	b.WriteString("## Not covered\n\n")
	b.WriteString("- The Agents event stream as intake (objects reach the dispatchers by `POST /v1/watch` and,\n  for half the Agents sessions, by signed webhooks alone); the MCP calls' side effects (they call\n  `lookup`, which has none: a client retrying a call MCP gives no idempotency key for).\n")
	b.WriteString("- Network partitions (processes die or stop; links do not fail), disks that lie about fsync,\n  clock skew between machines (one machine, one clock).\n")
	b.WriteString("- A node's store deleted (restarts keep it); two faults at once (they come one after another).\n")
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

func (r *result) flags() string {
	return fmt.Sprintf("-seed %d -duration %s -rate %g -fault-every %s", r.seed, r.cfg.duration, r.cfg.rate, r.cfg.faults)
}

// plot draws calls answered per second and the p50 latency per 5 s over
// time, with each fault as a vertical band.
func (r *result) plot(path string) error {
	p := plot.New()
	p.Title.Text = "toolrelay under faults (seed " + fmt.Sprint(r.seed) + ")"
	p.X.Label.Text = "seconds since the faults began (before: the quiet phase and the bad-input corpus)"
	p.Y.Label.Text = "calls answered per second; p50 latency (ms / 10)"
	perSec := map[int]int{}
	lat := map[int][]time.Duration{}
	for id := range r.ledger.Calls {
		ans := r.ledger.Answered[id]
		if len(ans) == 0 {
			continue
		}
		s := int(ans[0].Sub(r.t0).Seconds())
		perSec[s]++
		lat[s/5] = append(lat[s/5], ans[0].Sub(r.ledger.Asked[id]))
	}
	var rate, p50 plotter.XYs
	for _, s := range sortedInts(perSec) {
		rate = append(rate, plotter.XY{X: float64(s), Y: float64(perSec[s])})
	}
	for _, bin := range sortedInts(lat) {
		ds := lat[bin]
		slices.Sort(ds)
		p50 = append(p50, plotter.XY{X: float64(bin*5 + 2), Y: float64(ds[len(ds)/2].Milliseconds()) / 10})
	}
	maxY := 1.0
	for _, pt := range append(append(plotter.XYs{}, rate...), p50...) {
		maxY = max(maxY, pt.Y)
	}
	for _, f := range r.faults {
		band, err := plotter.NewPolygon(plotter.XYs{{X: f.at.Seconds(), Y: 0}, {X: f.end.Seconds(), Y: 0}, {X: f.end.Seconds(), Y: maxY}, {X: f.at.Seconds(), Y: maxY}})
		if err != nil {
			return err
		}
		band.Color = color.RGBA{R: 255, G: 200, B: 200, A: 255}
		band.LineStyle.Width = 0
		p.Add(band)
	}
	for _, s := range []struct {
		name string
		pts  plotter.XYs
		c    color.RGBA
	}{{"calls/s", rate, color.RGBA{B: 200, A: 255}}, {"p50 latency (ms/10)", p50, color.RGBA{G: 140, A: 255}}} {
		if len(s.pts) == 0 {
			continue
		}
		l, err := plotter.NewLine(s.pts)
		if err != nil {
			return err
		}
		l.Color, l.Width = s.c, vg.Points(1.2)
		p.Add(l)
		p.Legend.Add(s.name, l)
	}
	p.Legend.Top = true
	return p.Save(8*vg.Inch, 4*vg.Inch, path)
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func sortedInts[V any](m map[int]V) []int {
	out := make([]int, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Ints(out)
	return out
}
