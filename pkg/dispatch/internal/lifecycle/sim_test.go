package lifecycle

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The simulation runs several processes' engines against a simulated
// store (compare-and-set on a revision, as a JetStream KV bucket), result
// stream, deadline timers, sweep and platform, under the seeded scheduler
// of sched_test.go, and injects at every step: kill -9 (and a restart as
// a new instance), a clean stop, a pause of a process (some longer than a
// lease), a write stored whose answer is lost, a write not stored,
// duplicate and late results, a lost message to an owner, and a platform
// that answers 429 or times out after accepting. After each run it checks:
//   - no process submits a turn whose lease another holds (unless it was
//     paused for longer than Ahead between its look at the lease and the
//     platform receiving the submission: the residual window);
//   - every submission of a turn carries the same outputs, and none
//     names a result that is not recorded;
//   - on a platform that keeps every submission (Responses chained by
//     previous_response_id), a second one comes only from the documented
//     windows: a pause, an answer lost after the platform accepted, a
//     submission whose outcome its owner could not record;
//   - every turn is submitted before its run expires whenever a process
//     lived unpaused through the end of its window;
//   - every turn is closed once the faults stop.

var (
	simSeed  = flag.Uint64("seed", 0, "run the simulation with this seed only")
	simSeeds = flag.Int("seeds", 10000, "how many seeds the simulation runs")
)

// simConfig sets the faults of a run, and the bugs it re-introduces.
type simConfig struct {
	procs, turns int
	fenceOnce    bool // the pause window: the lease looked at once per submission
	twoWriters   bool // two goroutines of a process acting on one turn
	// cancels (review): some turns are cancelled, as the watch driver
	// does when the platform ends a run or an MCP client cancels, at a
	// random moment of their life on a random process.
	cancels bool
	// handover: the only faults are clean stops, and no message or write
	// is lost; a turn whose results are all in must then be submitted at
	// once, whichever process stopped.
	handover bool
}

func TestSimulation(t *testing.T) {
	cfg := simConfig{procs: 3, turns: 6}
	if *simSeed != 0 {
		replay(t, cfg)
		return
	}
	sum := simulateSeeds(t, "TestSimulation$", *simSeeds, cfg)
	t.Logf("%d seeds: %d turns (%d created with no lease, %d cancelled), %d submissions (%d taken over, %d cut off), %d kills, %d stops, %d pauses, %d lost answers; "+
		"repeats on a keep-every-submission platform from the documented windows: %d after a pause past the lease, %d after an answer lost, %d after a takeover",
		sum.seeds, sum.turns, sum.unleased, sum.cancelled, sum.arrivals, sum.takeovers, sum.cutOffs, sum.kills, sum.stops, sum.pauses, sum.lostAnswers, sum.residualPause, sum.residualAmbiguous, sum.residualTakeover)
}

// TestSimulationHandover runs processes that only ever stop cleanly (a
// rolling restart), with nothing lost: a stopping process hands its turns
// on, so no turn whose results are all in waits for a lease to lapse or
// for the sweep.
func TestSimulationHandover(t *testing.T) {
	cfg := simConfig{procs: 3, turns: 6, handover: true}
	if *simSeed != 0 {
		replay(t, cfg)
		return
	}
	sum := simulateSeeds(t, "TestSimulationHandover", *simSeeds/5, cfg)
	t.Logf("%d seeds: %d turns, %d submissions (%d taken over), %d stops", sum.seeds, sum.turns, sum.arrivals, sum.takeovers, sum.stops)
}

// replay runs the seed -seed with tracing.
func replay(t *testing.T, cfg simConfig) {
	if r := simulate(*simSeed, cfg, true); len(r.violations) > 0 {
		t.Fatalf("seed %d:\n%s\n\ntrace:\n%s", *simSeed, strings.Join(r.violations, "\n"), strings.Join(r.trace, "\n"))
	}
}

// simulateSeeds runs seeds 1 to n (at most 1000 with -short or -race) on every
// core and sums their reports; a failure reports the lowest seed that
// fails, and how to replay it with the test named run.
func simulateSeeds(t *testing.T, run string, n int, cfg simConfig) simReport {
	if testing.Short() || raceEnabled {
		n = min(n, 1000)
	}
	reports := make([]simReport, n+1)
	var next atomic.Uint64
	var wg sync.WaitGroup
	for range runtime.GOMAXPROCS(0) {
		wg.Go(func() {
			for seed := next.Add(1); seed <= uint64(n); seed = next.Add(1) {
				reports[seed] = simulate(seed, cfg, false)
				if len(reports[seed].violations) > 0 {
					next.Store(uint64(n)) // the others stop at their next seed
				}
			}
		})
	}
	wg.Wait()
	var sum simReport
	for seed := uint64(1); seed <= uint64(n); seed++ {
		r := reports[seed]
		if len(r.violations) > 0 {
			t.Fatalf("seed %d broke the lifecycle's promises:\n%s\nreplay it with:\n  go test ./pkg/dispatch/internal/lifecycle -run '%s' -seed %d -v",
				seed, strings.Join(r.violations, "\n"), run, seed)
		}
		sum.add(r)
	}
	sum.seeds = n
	return sum
}

// TestSimulationFindsBugs re-introduces two bugs that review found in the
// dispatcher before the lease, and checks that the simulation catches
// each within the seeds TestSimulation runs (seed 24 and seed 1 do).
func TestSimulationFindsBugs(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  simConfig
		want string
	}{
		{"lease looked at once per submission", simConfig{procs: 3, turns: 6, fenceOnce: true}, "without holding the lease"},
		{"two goroutines closing one turn", simConfig{procs: 3, turns: 6, twoWriters: true}, "a second time under one lease"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for seed := uint64(1); seed <= 10000; seed++ {
				r := simulate(seed, tc.cfg, false)
				for _, v := range r.violations {
					if strings.Contains(v, tc.want) {
						t.Logf("seed %d finds it: %s", seed, v)
						return
					}
				}
			}
			t.Fatalf("no seed of 10000 found the bug")
		})
	}
}

type simReport struct {
	seeds                                                                  int // summed reports only
	violations, trace                                                      []string
	turns, arrivals, takeovers, cutOffs, kills, stops, pauses, lostAnswers int
	cancelled, unleased                                                    int
	residualPause, residualAmbiguous, residualTakeover                     int
}

func (r *simReport) add(o simReport) {
	r.turns += o.turns
	r.arrivals += o.arrivals
	r.takeovers += o.takeovers
	r.cutOffs += o.cutOffs
	r.kills += o.kills
	r.stops += o.stops
	r.pauses += o.pauses
	r.lostAnswers += o.lostAnswers
	r.cancelled += o.cancelled
	r.unleased += o.unleased
	r.residualPause += o.residualPause
	r.residualAmbiguous += o.residualAmbiguous
	r.residualTakeover += o.residualTakeover
}

type world struct {
	*sched
	cfg     simConfig
	report  simReport
	tracing bool
	faults  bool

	procs   []*proc
	insts   int
	rev     uint64
	store   map[string]*Rec
	specs   []*spec
	results map[string]map[int]time.Time
	// arrivals are the submissions the platform received, by turn.
	arrivals map[string][]*arrival
}

type spec struct {
	key                        string
	calls                      int
	created, deadline, expires time.Time
	strict                     bool // every submission continues the conversation
	published                  bool
	// closedAt is when the record first said closed; attempted when a
	// submission first reached the platform, whatever it answered.
	closedAt, attempted time.Time
}

type arrival struct {
	inst      string
	epoch     uint64
	at        time.Time
	outputs   string
	ambiguous bool // accepted, its answer lost
	fenced    bool // (review) made under the lease, not in the pause window
}

type proc struct {
	w           *world
	inst        string
	eng         *Engine
	dead        bool
	stopped     bool
	pausedUntil time.Time
	// liveFrom, deadFrom and paused bound when it ran, for the deadline check.
	liveFrom, deadFrom time.Time
	paused             [][2]time.Time
	ctx                context.Context
	cancel             context.CancelFunc
	local              map[string]map[int]bool
	// whole holds the turns it took in: every result reaches it.
	whole map[string]bool
	// cache is each turn's record as the process last read or wrote it:
	// the turns it tracks.
	cache map[string]*Rec
	// lastSweep is when its last sweep began.
	lastSweep time.Time
}

var simStart = time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC)

func simulate(seed uint64, cfg simConfig, tracing bool) simReport {
	w := &world{sched: newSched(seed, simStart), cfg: cfg, tracing: tracing, faults: true,
		store: map[string]*Rec{}, results: map[string]map[int]time.Time{}, arrivals: map[string][]*arrival{}}
	w.panicked = func(r any) { w.violate("a thread panicked: %v", r) }
	for range cfg.procs {
		w.start()
	}
	var last time.Time
	for i := range cfg.turns {
		// Some runs are short: their deadline is less than MinLead away at
		// intake, and they are created with no lease.
		life := time.Duration(40+w.rng.IntN(110)) * time.Second
		created := simStart.Add(time.Duration(w.rng.IntN(40_000)) * time.Millisecond)
		sp := &spec{key: fmt.Sprintf("turn%d", i), calls: 1 + w.rng.IntN(3), created: created,
			expires: created.Add(life), deadline: created.Add(life - 30*time.Second), strict: w.rng.IntN(2) == 0}
		w.specs = append(w.specs, sp)
		w.at(created, nil, func() { w.intake(sp) })
		w.at(sp.deadline, nil, func() { w.fire(sp) })
		if n := w.rng.IntN(6); !cfg.handover && (n == 0 || (cfg.cancels && n < 2)) {
			// The platform ends the run: some process cancels the turn
			// (waiting, if another owns it, for that lease to lapse).
			w.at(created.Add(time.Duration(w.rng.Int64N(int64(life)))), nil, func() { w.cancelTurn(sp) })
		}
		if sp.expires.After(last) {
			last = sp.expires
		}
	}
	w.at(simStart.Add(10*time.Second), nil, w.sweepAll)
	w.run(last.Add(time.Minute), 200_000)
	w.faults = false
	for _, p := range w.procs {
		p.pausedUntil = time.Time{}
	}
	w.run(last.Add(4*time.Minute), 400_000)
	w.check()
	w.killAll()
	return w.report
}

func (w *world) tracef(format string, args ...any) {
	if w.tracing {
		w.report.trace = append(w.report.trace, w.now.Sub(simStart).String()+" "+fmt.Sprintf(format, args...))
	}
}

// traceWriter puts a process's engine logs in the trace.
type traceWriter struct {
	w    *world
	inst string
}

func (t traceWriter) Write(b []byte) (int, error) {
	t.w.tracef("%s: %s", t.inst, strings.TrimSpace(string(b)))
	return len(b), nil
}

func (w *world) violate(format string, args ...any) {
	w.report.violations = append(w.report.violations, w.now.Sub(simStart).String()+" "+fmt.Sprintf(format, args...))
}

// start starts a process, with a new instance name, and sweeps at once.
func (w *world) start() *proc {
	w.insts++
	p := &proc{w: w, inst: fmt.Sprintf("p%d", w.insts), liveFrom: w.now, local: map[string]map[int]bool{}, whole: map[string]bool{}, cache: map[string]*Rec{}}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	var out io.Writer = io.Discard
	if w.tracing {
		out = traceWriter{w, p.inst}
	}
	p.eng = New(p.inst, p, slog.New(slog.NewTextHandler(out, &slog.HandlerOptions{Level: slog.LevelDebug,
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		}})))
	p.eng.fenceOnce, p.eng.twoWriters = w.cfg.fenceOnce, w.cfg.twoWriters
	w.procs = append(w.procs, p)
	w.tracef("%s starts", p.inst)
	w.spawn(p, p.sweep)
	return p
}

// live returns the processes taking work, in a drawn order.
func (w *world) live() []*proc {
	var out []*proc
	for _, p := range w.procs {
		if !p.dead && !p.stopped {
			out = append(out, p)
		}
	}
	w.rng.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out
}

func (w *world) any() *proc {
	if l := w.live(); len(l) > 0 {
		return l[0]
	}
	return nil
}

// step is where a thread of p hands control back, and where faults
// strike p.
func (w *world) step(p *proc) {
	if w.faults {
		switch n := w.rng.IntN(1000); {
		case w.cfg.handover:
			if n < 10 && len(w.live()) > 1 && !p.stopped {
				w.stop(p)
			}
		case n < 4 && len(w.live()) > 1 && !p.stopped:
			w.kill(p)
			panic(errKilled{})
		case n < 6 && len(w.live()) > 1 && !p.stopped:
			w.stop(p)
		case n < 30 && w.unpausedOthers(p):
			d := time.Duration(w.rng.IntN(2000)) * time.Millisecond
			if w.rng.IntN(3) == 0 {
				d = LeaseFor + Skew + time.Duration(w.rng.IntN(25_000))*time.Millisecond
			}
			p.pausedUntil = w.now.Add(d)
			p.paused = append(p.paused, [2]time.Time{w.now, p.pausedUntil})
			w.report.pauses++
			w.tracef("%s paused for %s", p.inst, d)
		}
	}
	w.yield()
}

// lossy reports whether messages and the answers of writes may be lost
// now.
func (w *world) lossy() bool { return w.faults && !w.cfg.handover }

func (w *world) unpausedOthers(p *proc) bool {
	for _, o := range w.procs {
		if o != p && !o.dead && !o.stopped && !o.pausedUntil.After(w.now) {
			return true
		}
	}
	return false
}

// kill ends p at once, as kill -9 would, and starts another in a moment.
func (w *world) kill(p *proc) {
	w.report.kills++
	w.tracef("%s killed", p.inst)
	p.dead, p.deadFrom = true, w.now
	p.cancel()
	w.at(w.now.Add(time.Duration(1+w.rng.IntN(5))*time.Second), nil, func() { w.start() })
}

// stop stops p as SIGTERM would: it releases its leases, and is gone two
// seconds later.
func (w *world) stop(p *proc) {
	w.report.stops++
	w.tracef("%s stops", p.inst)
	p.stopped = true
	p.cancel()
	w.wakeSleepers(p)
	var mine []string
	for k, r := range p.cache {
		if r.Lease.Owner == p.inst {
			mine = append(mine, k)
		}
	}
	p.eng.Release(func() []string { return mine })
	w.at(w.now.Add(2*time.Second), nil, func() {
		if !p.dead {
			p.dead, p.deadFrom = true, w.now
			w.start()
		}
	})
}

func (w *world) spec(key string) *spec {
	for _, sp := range w.specs {
		if sp.key == key {
			return sp
		}
	}
	panic("no spec " + key)
}

// intake takes sp in on some process, as a webhook would, again until
// one recorded it (a webhook not answered is delivered again).
func (w *world) intake(sp *spec) {
	p := w.any()
	if p == nil {
		w.at(w.now.Add(time.Second), nil, func() { w.intake(sp) })
		return
	}
	w.at(w.now.Add(5*time.Second), nil, func() {
		if w.store[sp.key] == nil {
			w.intake(sp)
		}
	})
	w.spawn(p, func(ctx context.Context) {
		r := &Rec{Key: sp.key, Deadline: sp.deadline, State: Collecting, Lease: p.eng.IntakeLease(w.now, sp.deadline)}
		rev, err := p.Write(ctx, r)
		switch {
		case err == nil:
			r.Rev = rev
			p.whole[sp.key] = true
			if r.Lease.Owner == "" {
				w.report.unleased++
			}
			if p.eng.Stopping() {
				// As the dispatcher's intake: the stop's release ran before
				// the turn was recorded.
				p.eng.ReleaseNow(ctx, r)
			}
			w.publish(sp)
		case errors.Is(err, ErrConflict):
			w.publish(sp) // a repeat publishes the calls again
		}
	})
}

// publish runs sp's calls: most answer, some twice, some never.
func (w *world) publish(sp *spec) {
	if sp.published {
		return
	}
	sp.published = true
	span := sp.expires.Sub(sp.created)
	for i := range sp.calls {
		if w.rng.IntN(8) == 0 {
			continue // a straggler
		}
		at := w.now.Add(time.Duration(w.rng.Int64N(int64(span))))
		w.at(at, nil, func() { w.result(sp, i) })
		if w.rng.IntN(10) == 0 {
			w.at(at.Add(time.Duration(w.rng.IntN(5000))*time.Millisecond), nil, func() { w.deliver(sp.key, i) })
		}
	}
}

// result records the result of sp's call i (first wins) and hands it to
// the running processes, as each one's consumer of the stream would.
func (w *world) result(sp *spec, i int) {
	if w.results[sp.key] == nil {
		w.results[sp.key] = map[int]time.Time{}
	}
	if _, ok := w.results[sp.key][i]; !ok {
		w.results[sp.key][i] = w.now
		w.tracef("result %s/%d recorded", sp.key, i)
	}
	w.deliver(sp.key, i)
}

// deliver hands a result to every running process, as the dispatcher's
// gatherer takes it: a process that gathers for the turn (it took it in,
// or read its record) keeps it, and closes the turn once its own set is
// complete or, having begun gathering later, looks at the stream a moment
// later; one that does not reads the record, and begins gathering for a
// turn whose lease is free, looking at it a second later.
func (w *world) deliver(key string, i int) {
	for _, p := range w.live() {
		w.tracef("result %s/%d delivered to %s", key, i, p.inst)
		w.spawn(p, func(ctx context.Context) {
			if p.cache[key] == nil {
				w.step(p)
				r := w.store[key]
				switch {
				case r == nil || r.State.Closed():
					// a stray, or a late result
				case r.Lease.Owner == p.inst: // its intake's answer was lost
					if _, err := p.Load(ctx, key); err == nil {
						p.eng.Close(key)
					}
				case r.Lease.Free(w.now):
					if _, err := p.Load(ctx, key); err == nil {
						w.at(w.now.Add(time.Second), p, func() { p.eng.Close(key) })
					}
				}
				return
			}
			if p.local[key] == nil {
				p.local[key] = map[int]bool{}
			}
			p.local[key][i] = true
			if len(p.local[key]) == w.spec(key).calls {
				p.eng.Close(key)
				return
			}
			if !p.whole[key] {
				w.at(w.now.Add(25*time.Millisecond), p, func() { p.eng.Close(key) }) // the re-check
			}
		})
	}
}

// fire delivers sp's deadline timer to some process.
func (w *world) fire(sp *spec) {
	p := w.any()
	if p == nil {
		w.at(w.now.Add(time.Second), nil, func() { w.fire(sp) })
		return
	}
	w.tracef("%s: timer of %s", p.inst, sp.key)
	p.eng.Due(sp.key)
}

// sweepAll sweeps on every process, every 10 s.
func (w *world) sweepAll() {
	for _, p := range w.live() {
		w.spawn(p, p.sweep)
	}
	w.at(w.now.Add(10*time.Second), nil, w.sweepAll)
}

// sweep looks at every open turn whose lease is this process's or free;
// one whose intake died before its calls went out has them published. As
// the dispatcher's sweep, it reads a turn it tracks only when SweepReads
// says so, and has its engine look at the others on their re-checks; it
// reads every other turn, and gathers for those it acts on.
func (p *proc) sweep(ctx context.Context) {
	w := p.w
	now := w.now
	sinceLast := now.Sub(p.lastSweep)
	p.lastSweep = now
	for _, sp := range w.specs {
		if c := p.cache[sp.key]; c != nil && !SweepReads(c.State, c.Deadline, now) {
			if age := now.Sub(sp.created); age > LeaseFor && RecheckDue(age, sinceLast) {
				p.eng.Close(sp.key)
			}
			continue
		}
		w.step(p)
		r := w.store[sp.key]
		if r != nil && r.State.Closed() && p.cache[sp.key] != nil {
			p.Closed(r, false) // closed by another: forgotten
		}
		if r == nil || r.State.Closed() || r.Lease.Owner != p.inst && !r.Lease.Free(w.now) {
			continue // read, and left: it gathers only for what it acts on
		}
		if _, err := p.Load(ctx, sp.key); err != nil {
			continue
		}
		if w.now.Sub(sp.created) > LeaseFor {
			w.publish(sp)
		}
		p.eng.Close(sp.key)
	}
}

// check looks at what the run left.
func (w *world) check() {
	w.report.turns = len(w.specs)
	for _, sp := range w.specs {
		r := w.store[sp.key]
		switch {
		case r == nil:
			w.violate("%s was never recorded", sp.key)
			continue
		case !r.State.Closed():
			w.violate("%s is still %s (lease %s) after the faults stopped", sp.key, r.State, r.Lease)
			continue
		}
		if r.Error == simCancelled {
			w.report.cancelled++
		}
		arr := w.arrivals[sp.key]
		if i := slices.IndexFunc(arr, func(a *arrival) bool { return a.fenced }); r.State == Failed && r.Error == simCancelled && i >= 0 {
			arr := arr[i:]
			w.violate("%s is recorded cancelled (never submitted), and the platform received it from %s (epoch %d) at %s",
				sp.key, arr[0].inst, arr[0].epoch, arr[0].at.Sub(simStart))
		}
		if r.State == Submitted && len(arr) == 0 {
			w.violate("%s is recorded submitted, and the platform received nothing", sp.key)
		}
		first := sp.closedAt
		if !sp.attempted.IsZero() && sp.attempted.Before(first) {
			first = sp.attempted
		}
		if last, ok := w.lastResult(sp); w.cfg.handover && ok && last.Before(sp.deadline) && (first.IsZero() || first.Sub(last) > time.Second) {
			w.violate("%s was first submitted or closed at %s, more than a second after its last result (%s), with clean stops the only faults",
				sp.key, first.Sub(simStart), last.Sub(simStart))
		}
		if first.After(sp.expires) && w.livedThrough(sp.deadline.Add(-LeaseFor-Skew), sp.expires) {
			w.violate("%s was first submitted or closed at %s, after its run expired at %s, though a process lived unpaused throughout",
				sp.key, first.Sub(simStart), sp.expires.Sub(simStart))
		}
	}
}

// lastResult returns when the last of sp's results was recorded, if all
// were.
func (w *world) lastResult(sp *spec) (time.Time, bool) {
	if len(w.results[sp.key]) < sp.calls {
		return time.Time{}, false
	}
	var last time.Time
	for _, at := range w.results[sp.key] {
		if at.After(last) {
			last = at
		}
	}
	return last, true
}

// livedThrough reports whether some process was up and never paused
// from a to b, and the other processes were killed, stopped or paused
// past Ahead at most once in that time between them: an owner killed or
// paused while it holds a turn's lease (or stopped, its release lost)
// keeps it from the others until the lease lapses (LeaseFor+Skew), and
// the submit margin (30 s) absorbs one such.
func (w *world) livedThrough(a, b time.Time) bool {
	faults := 0
	for _, p := range w.procs {
		for _, iv := range p.paused {
			if iv[0].Before(b) && iv[1].After(a) && iv[1].Sub(iv[0]) > Ahead {
				faults++
			}
		}
		if p.dead && p.deadFrom.After(a) && p.deadFrom.Before(b.Add(2*time.Second)) {
			faults++
		}
	}
	if faults > 1 {
		return false
	}
	for _, p := range w.procs {
		if p.liveFrom.After(a) || (p.dead && p.deadFrom.Before(b)) {
			continue
		}
		if !slices.ContainsFunc(p.paused, func(iv [2]time.Time) bool { return iv[0].Before(b) && iv[1].After(a) }) {
			return true
		}
	}
	return false
}

// simCancelled is the error a simulated cancellation records.
const simCancelled = "sim: cancelled"

// cancelTurn cancels sp on some process (review).
func (w *world) cancelTurn(sp *spec) {
	p := w.any()
	if p == nil || !w.faults {
		return
	}
	w.tracef("%s: cancel %s", p.inst, sp.key)
	p.eng.Cancel(sp.key, simCancelled, func(ok bool) {
		if ok {
			w.tracef("%s cancelled %s", p.inst, sp.key)
		}
	})
}
