package main

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"text/tabwriter"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

type e2eResult struct {
	size         int
	calls, turns float64
	// cpu is the process's CPU time per call (server, dispatcher,
	// executor and driver, all in this process).
	cpu time.Duration
	// alloc is what the process allocated per call, as cpu: unlike CPU
	// time it hardly varies between runs, so it shows a change of a few
	// per cent that the CPU figures' spread hides.
	alloc allocs
	// msgs is what the server received and sent per call.
	msgs traffic
}

type scaleResult struct {
	executors int
	calls     float64
}

type report struct {
	cfg     config
	started time.Time
	elapsed time.Duration
	machine string
	notes   []string

	floorRate  float64
	floorCPU   time.Duration // per call, as e2eResult.cpu
	floorAlloc allocs        // per call, as e2eResult.alloc
	floorMsgs  traffic       // per call, as e2eResult.msgs
	// The floor with toolrelay's writes (writes.go), by turn size.
	writes     []e2eResult
	floorLat   latencies
	e2e        []e2eResult
	e2eLat     latencies
	breakdown  *breakdownResult
	parallel   latencies
	sequential time.Duration
	scale      []scaleResult
	memory     []memory
	microRate  float64
	microLat   latencies
	mcpLat     latencies
	asynqRate  float64
	asynqLat   latencies
	curves     []*curve
}

func (r *report) note(format string, args ...any) {
	r.notes = append(r.notes, fmt.Sprintf(format, args...))
}

type row struct {
	name, value, ratio, target, verdict string
}

func ratio(a, b float64) string {
	if a == 0 || b == 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f×", a/b)
}

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "MISSED"
}

// throughputTargets is the end-to-end throughput wanted, by turn size, as
// a share of the floor measured in the same run.
var throughputTargets = map[int]float64{1: 0.35, 16: 0.6}

// perCall adds the rows of one figure per call: the floor's, then the
// floor with toolrelay's writes and toolrelay by turn size, each valued
// and compared with the floor's by value.
func (r *report) perCall(rows []row, figure, floorNote, floorValue string, value func(e2eResult) (v, ratio string)) []row {
	rows = append(rows, row{"floor: " + figure + " " + floorNote, floorValue, "1.00×", "", ""})
	for _, w := range r.writes {
		v, rt := value(w)
		rows = append(rows, row{fmt.Sprintf("floor with toolrelay's writes: %s, turns of %d", figure, w.size), v, rt, "", ""})
	}
	for _, e := range r.e2e {
		v, rt := value(e)
		rows = append(rows, row{fmt.Sprintf("toolrelay: %s, turns of %d calls", figure, e.size), v, rt, "", ""})
	}
	return rows
}

func (r *report) rows() []row {
	var rows []row
	if r.floorRate > 0 {
		rows = append(rows, row{"floor: raw JetStream pipeline, throughput", fmt.Sprintf("%.0f calls/s", r.floorRate), "1.00×", "", ""})
	}
	for _, w := range r.writes {
		rows = append(rows, row{fmt.Sprintf("floor with toolrelay's writes, turns of %d calls (no toolrelay code)", w.size),
			fmt.Sprintf("%.0f calls/s", w.calls), ratio(w.calls, r.floorRate), "", ""})
	}
	for _, e := range r.e2e {
		target, v := "", ""
		if want, ok := throughputTargets[e.size]; ok {
			target = fmt.Sprintf("≥ %.2f× floor", want)
			if r.floorRate > 0 { // no floor measured (-only): nothing to judge by
				v = verdict(e.calls >= want*r.floorRate)
			}
		}
		rows = append(rows, row{fmt.Sprintf("toolrelay end to end, turns of %d calls", e.size),
			fmt.Sprintf("%.0f calls/s (%.0f turns/s)", e.calls, e.turns), ratio(e.calls, r.floorRate), target, v})
	}
	if r.floorCPU > 0 {
		rows = r.perCall(rows, "CPU time per call", "(whole process)", usf(r.floorCPU), func(e e2eResult) (string, string) {
			return usf(e.cpu), ratio(float64(e.cpu), float64(r.floorCPU)) + " the floor's"
		})
		rows = r.perCall(rows, "heap allocated per call", "(whole process)", r.floorAlloc.String(), func(e e2eResult) (string, string) {
			return e.alloc.String(), ratio(e.alloc.bytes, r.floorAlloc.bytes) + " the floor's bytes"
		})
	}
	if r.floorMsgs.in > 0 {
		rows = r.perCall(rows, "server messages per call", "(received and sent)", r.floorMsgs.String(), func(e e2eResult) (string, string) {
			return e.msgs.String(), ratio(e.msgs.in, r.floorMsgs.in) + " the floor's received"
		})
	}
	if len(r.floorLat) > 0 {
		rows = append(rows, row{"floor: round trip, closed loop", pcts(r.floorLat), "1.00× (p50)", "", ""})
	}
	if len(r.e2eLat) > 0 {
		p50 := msf(r.e2eLat.pct(50))
		f50 := msf(r.floorLat.pct(50))
		p99, f99 := msf(r.e2eLat.pct(99)), msf(r.floorLat.pct(99))
		rows = append(rows, row{"toolrelay intake→submission, single-call turns", pcts(r.e2eLat),
			ratio(p50, f50) + " (p50), " + ratio(p99, f99) + " (p99)", "p50 ≤ 1.5×, p99 ≤ 2× floor",
			verdict(f50 > 0 && p50 <= 1.5*f50 && p99 <= 2*f99)})
	}
	if len(r.parallel) > 0 {
		p50 := msf(r.parallel.pct(50))
		rows = append(rows, row{"turn of 8 × 100 ms calls (toolrelay, p50 / max)", fmt.Sprintf("%.1f ms / %.1f ms", p50, msf(r.parallel.pct(100))), "", "≤ 105 ms", verdict(p50 <= 105)})
		rows = append(rows, row{"same 8 calls in sequence, in process (SDK helper)", fmt.Sprintf("%.1f ms", msf(r.sequential)), "", "", ""})
	}
	for _, s := range r.scale {
		base := r.scale[0].calls
		rows = append(rows, row{fmt.Sprintf("%d executor process(es), 5 ms calls, 8 per process", s.executors), fmt.Sprintf("%.0f calls/s", s.calls),
			ratio(s.calls, base) + " of 1 process", "", ""})
	}
	for _, m := range r.memory {
		per := float64(m.RSSAfter-m.RSSBefore) / float64(m.Calls)
		heap := float64(m.HeapAfter-m.HeapBefore) / float64(m.Calls)
		target, v := "", "" // the target is at 100k, where fixed costs no longer count
		if m.Calls >= 100000 {
			target, v = "≤ 1024 B/call", verdict(per <= 1024)
		}
		rows = append(rows, row{fmt.Sprintf("dispatcher memory at %d in-flight calls", m.Calls),
			fmt.Sprintf("RSS +%.1f MiB: %.0f B/call (live heap %.0f B/call)", float64(m.RSSAfter-m.RSSBefore)/(1<<20), per, heap),
			"", target, v})
	}
	if r.microRate > 0 {
		rows = append(rows, row{"NATS micro request-reply (at most once)", fmt.Sprintf("%.0f calls/s; %s", r.microRate, pcts(r.microLat)), ratio(r.microRate, r.floorRate), "", ""})
	}
	if len(r.mcpLat) > 0 {
		ratio := ""
		if len(r.microLat) > 0 {
			ratio = fmt.Sprintf("%.1f× NATS micro's p50", msf(r.mcpLat.pct(50))/msf(r.microLat.pct(50)))
		}
		rows = append(rows, row{"MCP tools/call through /mcp, no-op, closed loop", pcts(r.mcpLat), ratio, "", ""})
	}
	if r.asynqRate > 0 {
		best := 0.0
		for _, e := range r.e2e {
			best = max(best, e.calls)
		}
		var one float64
		if len(r.e2e) > 0 {
			one = r.e2e[0].calls
		}
		rows = append(rows, row{"asynq on Redis, results retrieved", fmt.Sprintf("%.0f calls/s", r.asynqRate), ratio(r.asynqRate, r.floorRate),
			"toolrelay ≥ 3×", verdict(one >= 3*r.asynqRate) + fmt.Sprintf(" (%.1f× with single-call turns)", one/r.asynqRate)})
		a50 := msf(r.asynqLat.pct(50))
		t50 := msf(r.e2eLat.pct(50))
		rows = append(rows, row{"asynq closed loop (enqueue → result)", pcts(r.asynqLat), "",
			"toolrelay ≥ 100× lower", verdict(t50 > 0 && a50/t50 >= 100) + fmt.Sprintf(" (%.0f× lower)", a50/math.Max(t50, 1e-9))})
	}
	return rows
}

func pcts(l latencies) string {
	return fmt.Sprintf("p50 %.3f ms, p99 %.3f ms, p999 %.3f ms", msf(l.pct(50)), msf(l.pct(99)), msf(l.pct(99.9)))
}

func (r *report) table() string {
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "MEASUREMENT\tVALUE\tRATIO TO FLOOR\tTARGET\t")
	for _, x := range r.rows() {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s %s\t\n", x.name, x.value, x.ratio, x.target, x.verdict)
	}
	_ = tw.Flush()
	for _, n := range r.notes {
		fmt.Fprintln(&b, "note:", n)
	}
	return b.String()
}

func (r *report) markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Benchmarks\n\nMeasured by `bash bench/run.sh` on %s, %s (%s in all).\n\n",
		r.started.UTC().Format("2006-01-02"), r.machine, r.elapsed.Round(time.Second))
	b.WriteString("Every ratio is against the *floor* measured in the same run: the raw JetStream pipeline toolrelay is built on — " +
		"publish a call, pull it, acknowledge it, publish a result, consume the result — with toolrelay's stream settings " +
		"(file storage, one replica, work-queue calls, first-result-wins results) and no toolrelay code. " +
		"toolrelay runs its whole path: intake (turn record by compare-and-set, deadline timer), " +
		"validation against the function's JSON Schema, publication with message IDs and TTLs, the executor (no second schema check " +
		"when the call names the executor's own schema, the handler under the deadline, first-wins result, ack), gathering, the submission compare-and-set and a " +
		"submission to an in-process platform sink. Each phase gets a fresh embedded JetStream server.\n\n")
	b.WriteString("| measurement | value | ratio to floor | target |\n|---|---|---|---|\n")
	for _, x := range r.rows() {
		fmt.Fprintf(&b, "| %s | %s | %s | %s %s |\n", x.name, x.value, x.ratio, x.target, x.verdict)
	}
	if br := r.breakdown; br != nil {
		fmt.Fprintf(&b, "\nWhere a single-call turn's time goes: the closed loop once more, with every span recorded in memory by the "+
			"OpenTelemetry SDK, each step read from the turn's trace (p50 over %d turns; recording spans costs a little, so the total "+
			"sits a little above the untraced loop's):\n\n| step | p50 | what it is |\n|---|---|---|\n", br.turns)
		for i, st := range steps {
			fmt.Fprintf(&b, "| %s | %.0f µs | %s |\n", st.name, usFloat(br.p50[i]), st.why)
		}
		fmt.Fprintf(&b, "| intake → the platform has it | %.0f µs | |\n", usFloat(br.total))
		if len(r.floorLat) > 0 {
			fmt.Fprintf(&b, "| the floor's round trip (its two hops) | %.0f µs | |\n", usFloat(r.floorLat.pct(50)))
		}
	}
	b.WriteString("\n![throughput against executor processes](bench_scale.png)\n\n![latency CDF](bench_latency.png)\n\n")
	if len(r.notes) > 0 {
		b.WriteString("Notes from the run:\n\n")
		for _, n := range r.notes {
			fmt.Fprintf(&b, "- %s\n", n)
		}
		b.WriteString("\n")
	}
	b.WriteString(analysis)
	return b.String()
}

// analysis is kept beside the generated table: what dominates the cost
// and what would change it. It is written from profiles of this bench.
var analysis = func() string {
	b, err := os.ReadFile("analysis.md")
	if err != nil {
		return ""
	}
	return string(b)
}()

func (r *report) plots(dir string) error {
	if len(r.scale) > 0 {
		p := plot.New()
		p.Title.Text = "toolrelay throughput against executor processes (5 ms calls)"
		p.X.Label.Text = "executor processes"
		p.Y.Label.Text = "calls/s"
		got, ideal := plotter.XYs{}, plotter.XYs{}
		for _, s := range r.scale {
			got = append(got, plotter.XY{X: float64(s.executors), Y: s.calls})
			ideal = append(ideal, plotter.XY{X: float64(s.executors), Y: r.scale[0].calls * float64(s.executors)})
		}
		if err := addLine(p, "measured", got, color.RGBA{B: 200, A: 255}); err != nil {
			return err
		}
		if err := addLine(p, "linear", ideal, color.RGBA{R: 160, G: 160, B: 160, A: 255}); err != nil {
			return err
		}
		if err := p.Save(6*vg.Inch, 4*vg.Inch, filepath.Join(dir, "bench_scale.png")); err != nil {
			return err
		}
	}
	if len(r.floorLat)+len(r.e2eLat)+len(r.microLat)+len(r.asynqLat) == 0 {
		return nil // a partial run (-only) measured no latency: no plot to draw
	}
	p := plot.New()
	p.Title.Text = "closed-loop latency, CDF"
	p.X.Label.Text = "milliseconds (log)"
	p.Y.Label.Text = "fraction of calls"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	series := []struct {
		name string
		l    latencies
		c    color.RGBA
	}{
		{"floor round trip", r.floorLat, color.RGBA{R: 120, G: 120, B: 120, A: 255}},
		{"toolrelay intake→submission", r.e2eLat, color.RGBA{B: 200, A: 255}},
		{"NATS micro (at most once)", r.microLat, color.RGBA{G: 150, A: 255}},
		{"asynq enqueue→result", r.asynqLat, color.RGBA{R: 200, A: 255}},
	}
	for _, s := range series {
		if len(s.l) == 0 {
			continue
		}
		sorted := s.l.sorted()
		pts := plotter.XYs{}
		for i, d := range sorted {
			pts = append(pts, plotter.XY{X: math.Max(msf(d), 0.001), Y: float64(i+1) / float64(len(sorted))})
		}
		if err := addLine(p, s.name, pts, s.c); err != nil {
			return err
		}
	}
	p.Legend.Top = false
	p.Legend.Left = false
	return p.Save(7*vg.Inch, 4.5*vg.Inch, filepath.Join(dir, "bench_latency.png"))
}

func addLine(p *plot.Plot, name string, pts plotter.XYs, c color.RGBA) error {
	l, err := plotter.NewLine(pts)
	if err != nil {
		return err
	}
	l.Color = c
	l.Width = vg.Points(1.5)
	p.Add(l)
	p.Legend.Add(name, l)
	return nil
}

func describeMachine() string {
	cpu := "unknown CPU"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(line, "model name") {
				if _, v, ok := strings.Cut(line, ":"); ok {
					cpu = strings.TrimSpace(v)
				}
				break
			}
		}
	}
	return fmt.Sprintf("%s, %d cores, %s, %s/%s", cpu, runtime.NumCPU(), runtime.Version(), runtime.GOOS, runtime.GOARCH)
}
