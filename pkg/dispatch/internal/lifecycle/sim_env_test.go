package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// The Env of a simulated process, and the platform's checks of what it
// receives.

func (p *proc) Now() time.Time {
	if th := p.w.cur; th != nil {
		th.lastNow = p.w.now
	}
	return p.w.now
}

// pausedFor is how long p was paused between a and b.
func (p *proc) pausedFor(a, b time.Time) time.Duration {
	var d time.Duration
	for _, iv := range p.paused {
		from, to := iv[0], iv[1]
		if from.Before(a) {
			from = a
		}
		if to.After(b) {
			to = b
		}
		if to.After(from) {
			d += to.Sub(from)
		}
	}
	return d
}

func (p *proc) Go(f func(context.Context)) { p.w.spawn(p, f) }

func (p *proc) After(d time.Duration, f func()) func() bool {
	tm := p.w.at(p.w.now.Add(d), p, f)
	return func() bool {
		was := !tm.dead
		tm.dead = true
		return was
	}
}

func (p *proc) Sleep(ctx context.Context, d time.Duration) bool {
	p.w.step(p)
	return p.w.sleep(d)
}

func (p *proc) Cached(key string) *Rec {
	if r := p.cache[key]; r != nil {
		return r.Clone()
	}
	return nil
}

func (p *proc) Load(ctx context.Context, key string) (*Rec, error) {
	p.w.step(p)
	r := p.w.store[key]
	if r == nil {
		return nil, ErrNotFound
	}
	p.cache[key] = r.Clone()
	return r.Clone(), nil
}

var errNoAnswer = errors.New("sim: no answer")

func (p *proc) Write(ctx context.Context, r *Rec) (uint64, error) {
	w := p.w
	w.step(p)
	cur := w.store[r.Key]
	if (cur == nil) != (r.Rev == 0) || (cur != nil && cur.Rev != r.Rev) {
		return 0, ErrConflict
	}
	if w.lossy() && w.rng.IntN(20) == 0 {
		return 0, errNoAnswer // not stored
	}
	w.rev++
	rev := w.rev
	stored := r.Clone()
	stored.Rev, stored.Outcome = w.rev, nil
	w.store[r.Key] = stored
	w.tracef("%s wrote %s at rev %d: %s, lease %s", p.inst, r.Key, r.Rev, stored.State, stored.Lease)
	if cur != nil && cur.Lease.Owner != "" && cur.Lease.Owner != stored.Lease.Owner && stored.Lease.Owner != "" {
		w.report.takeovers++
	}
	if sp := w.spec(r.Key); stored.State.Closed() && sp.closedAt.IsZero() {
		sp.closedAt = w.now
	}
	if stored.CutOff && (cur == nil || !cur.CutOff) {
		w.report.cutOffs++
	}
	if w.lossy() && w.rng.IntN(20) == 0 {
		w.report.lostAnswers++
		w.step(p)
		return 0, errNoAnswer // stored, its answer lost
	}
	w.step(p)
	p.cache[r.Key] = stored.Clone()
	return rev, nil
}

func (p *proc) Complete(ctx context.Context, r *Rec) (bool, error) {
	p.w.step(p)
	return len(p.w.results[r.Key]) == p.w.spec(r.Key).calls, nil
}

func (p *proc) Missing(ctx context.Context, r *Rec) ([]string, error) {
	p.w.step(p)
	var missing []string
	for i := range p.w.spec(r.Key).calls {
		if _, ok := p.w.results[r.Key][i]; !ok {
			missing = append(missing, fmt.Sprint(i))
		}
	}
	return missing, nil
}

func (p *proc) Prepare(ctx context.Context, r *Rec) error {
	p.w.step(p)
	return nil
}

func (p *proc) Submit(ctx context.Context, r *Rec, keep func() bool) (any, error) {
	w := p.w
	looked := w.cur.lastNow // the engine's last look at the lease
	w.step(p)
	// The documented window: the process stalled between its look at the
	// lease and the platform receiving the request. Time it spent in its
	// own waits since (a retry's) is not a stall: it should have looked again.
	paused := p.pausedFor(looked, w.now)
	if w.now.Sub(looked)-paused >= Ahead {
		paused = 0
	}
	if sp := w.spec(r.Key); sp.attempted.IsZero() {
		sp.attempted = w.now
	}
	accepted := w.rng.IntN(10)
	w.tracef("%s: submit %s answer %d", p.inst, r.Key, accepted)
	var a *arrival
	if accepted < 8 {
		a = w.arrive(p, r, paused, accepted == 7 && w.faults)
	}
	if w.rng.IntN(5) == 0 {
		// A slow platform: it answers up to 40 s later, while the
		// submission keeps its lease; by the run's expiry at the latest,
		// when the attempt's context ends.
		answer := w.now.Add(time.Duration(w.rng.IntN(40_000)) * time.Millisecond)
		if exp := w.spec(r.Key).expires; answer.After(exp) {
			answer = exp
		}
		for w.now.Before(answer) {
			if !w.sleep(min(KeepEvery, answer.Sub(w.now))) || !keep() {
				if a != nil {
					a.ambiguous = true // its answer never came back
				}
				return nil, &RetryError{Wait: time.Second, Err: errors.New("stopped waiting for the platform")}
			}
		}
	}
	w.step(p)
	if accepted >= 7 && accepted <= 8 && !w.now.Before(w.spec(r.Key).expires.Add(-time.Second)) {
		// No time for another attempt (turnEnv.Submit's retryWait).
		return nil, errors.New("gave up: the run expires before another attempt")
	}
	switch {
	case accepted == 7 && w.faults:
		return nil, &RetryError{Wait: time.Duration(w.rng.IntN(3000)) * time.Millisecond, Err: errors.New("timed out after the platform accepted")}
	case accepted < 8:
		return "next", nil
	case accepted == 8:
		return nil, &RetryError{Wait: time.Duration(w.rng.IntN(3000)) * time.Millisecond, Err: errors.New("429")}
	}
	if !w.faults {
		w.arrive(p, r, paused, false)
		return "next", nil
	}
	w.tracef("%s: %s refused", p.inst, r.Key)
	return nil, errors.New("400: refused") // not taken: the turn fails
}

// arrive is the platform receiving a submission of r from p, paused for
// paused just before it went out.
func (w *world) arrive(p *proc, r *Rec, paused time.Duration, ambiguous bool) *arrival {
	sp := w.spec(r.Key)
	cur := w.store[r.Key]
	fenced := cur != nil && !cur.State.Closed() && cur.Lease.Owner == p.inst
	var outs []string
	for i := range sp.calls {
		switch _, ok := w.results[r.Key][i]; {
		case slices.Contains(r.TimedOut, fmt.Sprint(i)):
			outs = append(outs, "timeout")
		case ok:
			outs = append(outs, "ok")
		default:
			w.violate("%s submitted %s with call %d's result, which is not recorded", p.inst, r.Key, i)
		}
	}
	a := &arrival{inst: p.inst, epoch: r.Lease.Epoch, at: w.now, outputs: strings.Join(outs, ","), ambiguous: ambiguous, fenced: fenced}
	w.report.arrivals++
	w.tracef("%s submits %s (epoch %d, fenced %v, outputs %s, paused %s, rec rev %d lease %s)", p.inst, r.Key, a.epoch, fenced, a.outputs, paused, r.Rev, r.Lease)
	prev := w.arrivals[r.Key]
	w.arrivals[r.Key] = append(prev, a)
	if !fenced && paused < Ahead {
		w.violate("%s submitted %s without holding the lease (record: %s, lease %s)", p.inst, r.Key, cur.State, cur.Lease)
		return a
	}
	if len(prev) > 0 && prev[0].outputs != a.outputs {
		w.violate("%s submitted %s with outputs %s after %s submitted %s", p.inst, r.Key, a.outputs, prev[0].inst, prev[0].outputs)
	}
	if !sp.strict || len(prev) == 0 {
		return a
	}
	switch {
	case !fenced:
		w.report.residualPause++
	case slices.ContainsFunc(prev, func(o *arrival) bool { return o.inst == a.inst && o.epoch == a.epoch && o.ambiguous }):
		w.report.residualAmbiguous++
	case !slices.ContainsFunc(prev, func(o *arrival) bool { return o.inst == a.inst && o.epoch == a.epoch }):
		w.report.residualTakeover++ // its owner went (or stopped) before it recorded the outcome
	default:
		w.violate("%s submitted %s a second time under one lease (epoch %d) with no answer lost", p.inst, r.Key, a.epoch)
	}
	return a
}

// Tell reaches the owner (stopping, it still hears), or with none a
// running process other than p, a millisecond later; one message in ten
// is lost.
func (p *proc) Tell(owner, key string) {
	w := p.w
	to := w.live()
	if owner != "" {
		to = w.procs
	}
	for _, o := range to {
		if o != p && !o.dead && (o.inst == owner || owner == "") {
			if !w.lossy() || w.rng.IntN(10) != 0 {
				w.tracef("%s tells %s of %s", p.inst, o.inst, key)
				w.at(w.now.Add(time.Millisecond), o, func() { o.eng.Close(key) })
			}
			return
		}
	}
}

func (p *proc) Closed(r *Rec, here bool) {
	delete(p.local, r.Key)
	delete(p.whole, r.Key)
	delete(p.cache, r.Key)
	if here {
		p.w.tracef("%s closed %s: %s", p.inst, r.Key, r.State)
	}
}
