package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// The curves (issue 43): how the cost of toolrelay grows with the size of
// the fleet — teams, functions, open turns, time at a sustained rate,
// dispatcher replicas, cluster nodes and MCP clients — each as cost
// against size, with the floor or a baseline measured in the same run
// where there is one. `go run . -only curves` runs them and writes
// docs/scale.md; -quick runs the small sizes only; -curves picks some.
//
// Each size point runs under its own deadline (pointTimeout): a point
// that does not finish is reported as such and the curve's larger sizes
// are not tried.

// curve is one curve: a row per size, a column per cost.
type curve struct {
	name  string // what -curves names it by, and its plot's file
	title string
	// size names the x axis; logX plots it on a log scale.
	size string
	logX bool
	// yLabel, when set, plots the columns' own values (all in this unit)
	// on a linear scale rather than each relative to its first.
	yLabel string
	cols   []column
	rows   []curveRow
	// on is when the curve was measured; load is the load average when
	// it started.
	on    time.Time
	load  string
	notes []string
	took  time.Duration
	// failed says why the curve stopped short, if it did.
	failed error
}

type column struct {
	name string
	// plot: drawn in the curve's plot, relative to its first row.
	plot bool
}

type curveRow struct {
	size  float64
	label string // how the size reads in the table; default the number
	v     []float64
}

// add adds a row and prints it.
func (c *curve) add(size float64, label string, v ...float64) {
	c.rows = append(c.rows, curveRow{size: size, label: label, v: v})
	fmt.Print(c.rowText(c.rows[len(c.rows)-1]))
}

func (c *curve) note(format string, args ...any) {
	c.notes = append(c.notes, fmt.Sprintf(format, args...))
	fmt.Printf("   note: %s\n", c.notes[len(c.notes)-1])
}

// na marks a figure not measured.
var na = math.NaN()

// curveSteps are the curves in the order they run.
var curveSteps = []struct {
	name string
	f    func(context.Context, config, *curve) error
}{
	{"teams", curveTeams},
	{"functions", curveFunctions},
	{"turns", curveOpenTurns},
	{"time", curveTime},
	{"results", curveResultsFull},
	{"replicas", curveReplicas},
	{"cluster", curveCluster},
	{"mcp", curveMCP},
}

// pointTimeout bounds one size point of a curve.
const pointTimeout = 6 * time.Minute

// errPointTimeout: a size point did not finish within its deadline.
var errPointTimeout = errors.New("the size point did not finish within its deadline")

func measureCurves(ctx context.Context, cfg config, r *report) error {
	for _, s := range curveSteps {
		if len(cfg.curves) > 0 && !cfg.curves[s.name] {
			continue
		}
		c := &curve{name: s.name, on: time.Now(), load: loadAverage()}
		fmt.Printf("-- curve %s (load %s)\n", s.name, c.load)
		t0 := time.Now()
		err := s.f(ctx, cfg, c)
		c.took = time.Since(t0)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			c.note("failed: %v", err)
			c.failed = err
		}
		fmt.Printf("   (%s)\n", c.took.Round(time.Second))
		r.curves = append(r.curves, c)
	}
	return nil
}

// loadAverage is the machine's 1, 5 and 15-minute load averages: the
// machine may be shared, and rates move with it.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// fmtVal writes a figure with three significant digits or so.
func fmtVal(v float64) string {
	switch a := math.Abs(v); {
	case math.IsNaN(v):
		return "–"
	case a >= 100 || a == math.Trunc(a):
		return fmt.Sprintf("%.0f", v)
	case a >= 10:
		return fmt.Sprintf("%.1f", v)
	case a >= 1:
		return fmt.Sprintf("%.2f", v)
	default:
		return fmt.Sprintf("%.3g", v)
	}
}

func (c *curve) label(r curveRow) string {
	if r.label != "" {
		return r.label
	}
	return fmtVal(r.size)
}

// rowText is a row as text, for the console.
func (c *curve) rowText(r curveRow) string {
	var b strings.Builder
	fmt.Fprintf(&b, "   %s %s:", c.size, c.label(r))
	for i, col := range c.cols {
		if i < len(r.v) {
			fmt.Fprintf(&b, " %s %s;", col.name, fmtVal(r.v[i]))
		}
	}
	b.WriteString("\n")
	return b.String()
}

func (c *curve) markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "## %s\n\n", c.title)
	fmt.Fprintf(&b, "`cd bench && go run . -only curves -curves %s`; measured %s, load average before: %s; %s.\n\n",
		c.name, c.on.UTC().Format("2006-01-02 15:04 UTC"), c.load, c.took.Round(time.Second))
	b.WriteString("| " + c.size + " |")
	for _, col := range c.cols {
		b.WriteString(" " + col.name + " |")
	}
	b.WriteString("\n|---|")
	for range c.cols {
		b.WriteString("---|")
	}
	b.WriteString("\n")
	for _, r := range c.rows {
		b.WriteString("| " + c.label(r) + " |")
		for i := range c.cols {
			v := na
			if i < len(r.v) {
				v = r.v[i]
			}
			b.WriteString(" " + fmtVal(v) + " |")
		}
		b.WriteString("\n")
	}
	if c.plotted() {
		fmt.Fprintf(&b, "\n![%s](scale_%s.png)\n", c.title, c.name)
	}
	for _, n := range c.notes {
		fmt.Fprintf(&b, "\n- %s", n)
	}
	if len(c.notes) > 0 {
		b.WriteString("\n")
	}
	b.WriteString("\n")
	return b.String()
}

func (c *curve) plotted() bool {
	if len(c.rows) < 2 {
		return false
	}
	for _, col := range c.cols {
		if col.plot {
			return true
		}
	}
	return false
}

var palette = []color.RGBA{
	{B: 200, A: 255}, {R: 200, A: 255}, {G: 150, A: 255}, {R: 200, G: 120, A: 255},
	{R: 140, B: 160, A: 255}, {G: 150, B: 150, A: 255}, {R: 90, G: 90, B: 90, A: 255},
	{R: 230, G: 100, B: 180, A: 255}, {R: 120, G: 80, B: 20, A: 255}, {G: 60, B: 90, A: 255}, {R: 150, G: 190, A: 255},
}

// plot draws each plotted column relative to its value at the smallest
// size, against the size, both on log scales where the sizes are, with
// the line a cost proportional to the size would follow.
func (c *curve) plot(dir string) error {
	if !c.plotted() {
		return nil
	}
	p := plot.New()
	p.X.Label.Text = c.size
	if c.yLabel != "" {
		p.Title.Text = c.title
		p.Y.Label.Text = c.yLabel
	} else {
		p.Title.Text = c.title + ": cost relative to the smallest size"
		p.Y.Label.Text = "× the smallest size's (log)"
		p.Y.Scale = plot.LogScale{}
		p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	}
	if c.logX {
		p.X.Scale = plot.LogScale{}
		p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	}
	x0 := c.rows[0].size
	linear := plotter.XYs{}
	for _, r := range c.rows {
		linear = append(linear, plotter.XY{X: r.size, Y: r.size / x0})
	}
	k := 0
	for i, col := range c.cols {
		if !col.plot {
			continue
		}
		var pts plotter.XYs
		base := na
		for _, r := range c.rows {
			if i >= len(r.v) || math.IsNaN(r.v[i]) || (r.v[i] <= 0 && c.yLabel == "") {
				continue
			}
			if math.IsNaN(base) {
				base = r.v[i]
			}
			if c.yLabel != "" {
				base = 1
			}
			pts = append(pts, plotter.XY{X: r.size, Y: r.v[i] / base})
		}
		if len(pts) < 2 {
			continue
		}
		if err := addLine(p, col.name, pts, palette[k%len(palette)]); err != nil {
			return err
		}
		k++
	}
	if x0 > 0 && c.logX {
		l, err := plotter.NewLine(linear)
		if err != nil {
			return err
		}
		l.Color = color.RGBA{R: 170, G: 170, B: 170, A: 255}
		l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		p.Add(l)
		p.Legend.Add("proportional to "+c.size, l)
	}
	p.Legend.Top = true
	p.Legend.Left = true
	return p.Save(7*vg.Inch, 4.5*vg.Inch, filepath.Join(dir, "scale_"+c.name+".png"))
}

// scaleMarkdown is docs/scale.md.
func (r *report) scaleMarkdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "# How cost grows with the fleet\n\nMeasured by `cd bench && go run . -only curves` on %s, %s (%s in all; each curve says when it was measured)",
		r.started.UTC().Format("2006-01-02"), r.machine, r.elapsed.Round(time.Second))
	if r.cfg.quick {
		b.WriteString(", with -quick (small sizes only)")
	}
	b.WriteString(". Each curve names the command that measures it alone and the machine's load average when it started: " +
		"memory, sizes and start-up times hardly move with the load; rates do, so each rate has the floor (the raw JetStream " +
		"pipeline, bench/floor.go) or a baseline measured in the same run beside it. The JetStream server, and the dispatcher " +
		"where its memory is measured, run each in a process of their own (bench/curves_child.go), with toolrelay's code as it ships; " +
		"memory is the resident set after a garbage collection. Each plot of a curve against a size shows every cost relative to " +
		"its value at the smallest size, with the dashed line a cost proportional to the size would follow: a line steeper than it " +
		"grows faster than linearly; the curves against time plot their values. The analysis after the curves (bench/scale_analysis.md) says what grows how, why, and what was done about it; " +
		"[operations.md](operations.md#capacity-planning) turns the curves into sizes for a deployment.\n\n")
	for _, c := range r.curves {
		b.WriteString(c.markdown())
	}
	if a, err := os.ReadFile("scale_analysis.md"); err == nil {
		b.Write(a)
	}
	return b.String()
}

// sizes are the sizes of a curve: -curve-sizes, or quick's or full's.
func sizes(cfg config, quick, full []int) []int {
	switch {
	case len(cfg.curveSizes) > 0:
		return cfg.curveSizes
	case cfg.quick:
		return quick
	}
	return full
}

// failedCurves names the curves that stopped short, with why.
func (r *report) failedCurves() error {
	var errs []error
	for _, c := range r.curves {
		if c.failed != nil {
			errs = append(errs, fmt.Errorf("curve %s: %w", c.name, c.failed))
		}
	}
	return errors.Join(errs...)
}

// The curves are also written as JSON (docs/scale.json), so that
// docs/scale.md can be written again from the same figures with a new
// analysis (-curves-from), without measuring again.

type curveJSON struct {
	Name, Title, Size, Load string
	Measured                time.Time
	LogX                    bool
	YLabel                  string `json:",omitempty"`
	Cols                    []columnJSON
	Rows                    []rowJSON
	Notes                   []string
	TookSeconds             float64
	Failed                  string `json:",omitempty"`
}

type columnJSON struct {
	Name string
	Plot bool
}

type rowJSON struct {
	Size  float64
	Label string `json:",omitempty"`
	V     []*float64
}

type curvesJSON struct {
	Started        time.Time
	Machine        string
	ElapsedSeconds float64
	Quick          bool
	Curves         []curveJSON
}

func (r *report) curvesJSON() curvesJSON {
	out := curvesJSON{Started: r.started, Machine: r.machine, ElapsedSeconds: r.elapsed.Seconds(), Quick: r.cfg.quick}
	for _, c := range r.curves {
		cj := curveJSON{Name: c.name, Title: c.title, Size: c.size, Measured: c.on, Load: c.load, LogX: c.logX, YLabel: c.yLabel, Notes: c.notes,
			TookSeconds: c.took.Seconds()}
		if c.failed != nil {
			cj.Failed = c.failed.Error()
		}
		for _, col := range c.cols {
			cj.Cols = append(cj.Cols, columnJSON{col.name, col.plot})
		}
		for _, row := range c.rows {
			rj := rowJSON{Size: row.size, Label: row.label}
			for _, v := range row.v {
				if math.IsNaN(v) {
					rj.V = append(rj.V, nil)
				} else {
					rj.V = append(rj.V, &v)
				}
			}
			cj.Rows = append(cj.Rows, rj)
		}
		out.Curves = append(out.Curves, cj)
	}
	return out
}

// loadCurves reads curves written by curvesJSON into r.
func (r *report) loadCurves(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var in curvesJSON
	if err := json.Unmarshal(b, &in); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	r.started, r.machine, r.elapsed, r.cfg.quick = in.Started, in.Machine, time.Duration(in.ElapsedSeconds*float64(time.Second)), in.Quick
	for _, cj := range in.Curves {
		c := &curve{name: cj.Name, title: cj.Title, size: cj.Size, on: cmp.Or(cj.Measured, in.Started), load: cj.Load, logX: cj.LogX, yLabel: cj.YLabel, notes: cj.Notes,
			took: time.Duration(cj.TookSeconds * float64(time.Second))}
		if cj.Failed != "" {
			c.failed = errors.New(cj.Failed)
		}
		for _, col := range cj.Cols {
			c.cols = append(c.cols, column{col.Name, col.Plot})
		}
		for _, rj := range cj.Rows {
			row := curveRow{size: rj.Size, label: rj.Label}
			for _, v := range rj.V {
				if v == nil {
					row.v = append(row.v, na)
				} else {
					row.v = append(row.v, *v)
				}
			}
			c.rows = append(c.rows, row)
		}
		r.curves = append(r.curves, c)
	}
	return nil
}

// keepOthers adds to r the curves of the scale.json at path that r did
// not measure, in the order the curves run, so that measuring some
// curves again (-curves) rewrites their sections and keeps the others'.
// Each curve says when it was measured. No file: nothing to keep.
func (r *report) keepOthers(path string) error {
	old := &report{}
	if err := old.loadCurves(path); errors.Is(err, os.ErrNotExist) {
		return nil
	} else if err != nil {
		return err
	}
	measured := map[string]*curve{}
	for _, c := range r.curves {
		measured[c.name] = c
	}
	var all []*curve
	var took time.Duration
	for _, s := range curveSteps {
		c := measured[s.name]
		if c == nil {
			c = old.curveNamed(s.name)
		}
		if c != nil {
			all, took = append(all, c), took+c.took
		}
	}
	r.curves, r.elapsed = all, took
	return nil
}

func (r *report) curveNamed(name string) *curve {
	for _, c := range r.curves {
		if c.name == name {
			return c
		}
	}
	return nil
}

// writeScale writes scale.md, scale.json and the curves' plots into dir.
func (r *report) writeScale(dir string, measured bool) error {
	for _, c := range r.curves {
		if err := c.plot(dir); err != nil {
			c.note("plot: %v", err)
		}
	}
	if measured {
		b, err := json.MarshalIndent(r.curvesJSON(), "", " ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, "scale.json"), append(b, '\n'), 0o644); err != nil {
			return err
		}
	}
	path := filepath.Join(dir, "scale.md")
	if err := os.WriteFile(path, []byte(r.scaleMarkdown()), 0o644); err != nil {
		return err
	}
	fmt.Printf("\nwrote %s\n", path)
	return nil
}
