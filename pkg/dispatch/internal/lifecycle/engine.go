package lifecycle

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"time"
)

// Env is what the engine needs of the world: a clock, goroutines, the
// turn records, the results and the platform. The dispatcher's is
// JetStream and the platform adapters; the simulation's is its own.
// Every method may be called from any goroutine the engine runs.
type Env interface {
	Now() time.Time
	// Go runs f in a new goroutine that ends when the process stops.
	Go(f func(context.Context))
	// After calls f once d has passed; stop cancels it.
	After(d time.Duration, f func()) (stop func() bool)
	// Sleep waits for d; false if ctx ended first.
	Sleep(ctx context.Context, d time.Duration) bool

	// Cached returns the record of a turn as this process last read or
	// wrote it, if it keeps it (the turns it gathers for): the engine keeps
	// nothing of a turn between its events.
	Cached(key string) *Rec
	// Load reads a turn's record (ErrNotFound if there is none), and
	// keeps it as the one Cached returns.
	Load(ctx context.Context, key string) (*Rec, error)
	// Write stores r at revision r.Rev by compare-and-set and returns the
	// new revision: ErrConflict if the record moved, and any other error
	// when the write may or may not be stored. Stored, it is the record
	// Cached returns.
	Write(ctx context.Context, r *Rec) (uint64, error)
	// Complete reports whether every call of r has a recorded result.
	Complete(ctx context.Context, r *Rec) (bool, error)
	// Missing lists the calls of r without a recorded result.
	Missing(ctx context.Context, r *Rec) ([]string, error)
	// Prepare gathers what a submission of r needs (its outputs). It may
	// take a while; Submit may not: the lease is looked at between them.
	// A *RetryError is tried again; any other error fails the turn.
	Prepare(ctx context.Context, r *Rec) error
	// Submit makes one attempt at submitting r's outputs: nil error and
	// what the platform answered, a *RetryError to try again, or an
	// error that fails the turn. While the platform has not answered it
	// calls keep every KeepEvery; once keep reports false (the lease is
	// another's) it stops waiting, and returns.
	Submit(ctx context.Context, r *Rec, keep func() bool) (any, error)
	// Tell asks the process owner to look at the turn key; with no owner
	// (""), any other process that runs.
	Tell(owner, key string)
	// Closed reports r closed: by this process (here), or found so.
	Closed(r *Rec, here bool)
}

// Engine runs the lifecycle of the turns one process works on. Each
// turn's events are handled by one goroutine at a time, in the order
// they came.
type Engine struct {
	self string
	env  Env
	log  *slog.Logger
	// Set by tests only, to show the simulation finds the bugs they make:
	// fenceOnce looks at the lease before the first submission attempt and
	// not before the others; twoWriters lets two goroutines handle one
	// turn's events at once.
	fenceOnce, twoWriters bool

	mu    sync.Mutex
	turns map[string]*turn
	// stopping is set by Release: the process takes no lease any more.
	stopping bool
}

// turn is one turn as this process works on it, from an event until its
// events are handled: it is kept longer only while a wake-up is armed or
// an outcome waits to be recorded.
type turn struct {
	key   string
	queue []event
	// running is set while a goroutine handles the queue; rec, wake and
	// ended are that goroutine's alone.
	running bool
	rec     *Rec
	wake    func() bool
	// ended is a submission's end not yet recorded: recorded, not
	// submitted again, by the next event.
	ended *Rec
	// sent is set once an attempt went out from here whose end is not
	// recorded: the platform may have the outputs.
	sent bool
	// fresh is set while rec is what the store said during this event (a
	// read or a write of it), not a copy kept from before.
	fresh bool
}

type event struct {
	kind  eventKind
	reply func(bool)
	why   string
}

type eventKind int

const (
	evClose eventKind = iota + 1
	evWake
	evDue
	evCancel
	evRelease
)

// New returns the engine of the process instance self.
func New(self string, env Env, log *slog.Logger) *Engine {
	return &Engine{self: self, env: env, log: cmp.Or(log, slog.Default()), turns: map[string]*turn{}}
}

// Self is the process instance the engine acts as: the owner it writes.
func (e *Engine) Self() string { return e.self }

// IntakeLease is the lease a turn taken in at the instant at (its record's
// creation time), due at deadline, is created with: this process's for
// LeaseFor from at, however long the intake took since, so that the
// version before the lease, which dates a hold by the turn's creation,
// never takes over a turn this process may still submit with no write
// (docs/turns.md). A turn due sooner than MinLead is created with none, and
// closed by whichever process first writes it: waiting out a lease of a
// process that died would cost it its deadline.
func (e *Engine) IntakeLease(at, deadline time.Time) Lease {
	if deadline.Sub(at) < MinLead {
		return Lease{}
	}
	return Lease{}.next(e.self, at)
}

// MinLead is how far a turn's deadline must be at intake for the turn to
// be created with a lease.
const MinLead = LeaseFor + Skew + 5*time.Second

// Close looks at a turn: it is submitted if its results are all in or
// its deadline has come, by this process if it holds the lease or may
// take it; otherwise its owner is told, and the turn looked at again
// once the owner's lease lapses.
func (e *Engine) Close(key string) { e.send(key, event{kind: evClose}) }

// Due tells the engine a turn's deadline timer fired: the turn is cut off
// at its deadline (the timer may fire a moment before).
func (e *Engine) Due(key string) { e.send(key, event{kind: evDue}) }

// Cancel fails a turn still collecting with the error why. reply, if not
// nil, is told whether this call failed it.
func (e *Engine) Cancel(key, why string, reply func(bool)) {
	e.send(key, event{kind: evCancel, why: why, reply: reply})
}

// Release gives up, at shutdown, this process's leases on the turns owned
// returns (those it gathers for; owned may be nil) and on those it works
// on now, each once the events before are handled. [Engine.Idle] tells
// when they all are. owned is called once the engine is stopping, so a
// turn taken in meanwhile is either among them or sees [Engine.Stopping].
func (e *Engine) Release(owned func() []string) {
	e.mu.Lock()
	e.stopping = true
	e.mu.Unlock()
	var keys []string
	if owned != nil {
		keys = owned()
	}
	e.mu.Lock()
	for k := range e.turns {
		keys = append(keys, k)
	}
	e.mu.Unlock()
	slices.Sort(keys) // one order, for the simulation
	keys = slices.Compact(keys)
	for _, k := range keys {
		e.send(k, event{kind: evRelease})
	}
}

// ReleaseNow gives up this process's lease on r, on the caller's
// goroutine: for a turn recorded after the process's release ran (an intake
// finishing while it stops), which no event of it has reached yet and for
// which no goroutine may be started any more.
func (e *Engine) ReleaseNow(ctx context.Context, r *Rec) {
	e.release(ctx, &turn{key: r.Key, rec: r})
}

// Idle reports whether no event of any turn is being handled or waits.
func (e *Engine) Idle() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, t := range e.turns {
		if t.running {
			return false
		}
	}
	return true
}

func (e *Engine) send(key string, ev event) {
	e.mu.Lock()
	t := e.turns[key]
	if t == nil {
		t = &turn{key: key}
		e.turns[key] = t
	}
	t.queue = append(t.queue, ev)
	start := !t.running || e.twoWriters
	t.running = true
	e.mu.Unlock()
	if start {
		e.env.Go(func(ctx context.Context) { e.run(ctx, t) })
	}
}

// run handles t's events until none is left.
func (e *Engine) run(ctx context.Context, t *turn) {
	for {
		e.mu.Lock()
		if len(t.queue) == 0 {
			t.running = false
			if t.wake == nil && t.ended == nil && !t.sent && e.turns[t.key] == t {
				delete(e.turns, t.key) // its record stays with the Env
				t.rec = nil
			}
			e.mu.Unlock()
			return
		}
		ev := t.queue[0]
		t.queue = t.queue[1:]
		e.mu.Unlock()
		ok := e.handle(ctx, t, ev)
		if ev.reply != nil {
			ev.reply(ok)
		}
	}
}

// handle runs one event of t; it reports whether a cancellation failed
// the turn.
func (e *Engine) handle(ctx context.Context, t *turn, ev event) bool {
	t.fresh = false
	if ev.kind == evWake {
		t.rec = nil // looked at again: as it is now, not as this process last saw it
	} else if t.rec == nil {
		t.rec = e.env.Cached(t.key)
	}
	if t.rec == nil {
		r, err := e.env.Load(ctx, t.key)
		if err != nil {
			if !errors.Is(err, ErrNotFound) && (ev.kind == evClose || ev.kind == evWake || ev.kind == evDue) {
				e.wakeIn(t, time.Second)
			}
			e.log.Debug("reading a turn failed", "turn", t.key, "err", err)
			if errors.Is(err, ErrNotFound) {
				e.drop(t)
			}
			return false
		}
		t.rec, t.fresh = r, true
	}
	switch ev.kind {
	case evWake:
		t.wake = nil
		e.close(ctx, t)
	case evDue:
		if now := e.env.Now(); t.rec.State == Collecting && now.Before(t.rec.Deadline) {
			e.wakeIn(t, t.rec.Deadline.Sub(now))
			return false
		}
		e.close(ctx, t)
	case evClose:
		e.close(ctx, t)
	case evCancel:
		return e.cancel(ctx, t, ev.why)
	case evRelease:
		e.release(ctx, t)
	}
	return false
}

// close submits t if it is due and this process may. It is tried
// again, a moment later, when the store cannot answer.
func (e *Engine) close(ctx context.Context, t *turn) {
	if t.ended != nil {
		e.finish(ctx, t, t.ended.Outcome, t.ended.Error)
		return
	}
	if e.isStopping(ctx) {
		// Its results or its timer came as this process stops: the turn
		// is the others', and so is the news.
		e.release(ctx, t)
		return
	}
	for range maxRounds {
		r := t.rec
		if r.State.Closed() {
			e.closed(t, false)
			return
		}
		now := e.env.Now()
		if r.Lease.Owner != e.self && !r.Lease.Free(now) {
			if !t.fresh {
				// Another's lease, as this process last saw it: it may have
				// been released since (its owner stopped). Read it once
				// before waiting for it to lapse.
				if cur, err := e.env.Load(ctx, t.key); err == nil {
					t.rec, t.fresh = cur, true
					continue
				}
			}
			e.env.Tell(r.Lease.Owner, r.Key)
			e.wakeIn(t, r.Lease.Until.Add(Skew).Sub(now))
			return
		}
		due := !now.Before(r.Deadline)
		if r.State == Collecting && !due {
			complete, err := e.env.Complete(ctx, r)
			if err != nil {
				e.wakeIn(t, time.Second)
			}
			if err != nil || !complete {
				return
			}
		}
		var change func(*Rec)
		if r.State == Collecting && due {
			missing, err := e.env.Missing(ctx, r)
			if err != nil {
				e.log.Warn("listing a cut-off turn's results failed; trying again", "turn", r.Key, "err", err)
				e.wakeIn(t, time.Second)
				return
			}
			change = func(n *Rec) { n.CutOff, n.TimedOut = true, missing }
		}
		direct := r.State == Collecting && !due && r.Lease.HeldBy(e.self, now)
		if !direct {
			switch e.own(ctx, t, change, false) {
			case lost:
				if e.isStopping(ctx) {
					return
				}
				continue // as the record now is
			case unknown:
				e.wakeIn(t, time.Second)
				return
			}
			if r.Lease.Owner != e.self && r.Lease.Owner != "" {
				e.log.Warn("took over a turn whose owner let its lease lapse", "turn", r.Key, "from", r.Lease.Owner, "epoch", t.rec.Lease.Epoch)
			}
			if change != nil {
				e.log.Warn("deadline reached; submitting without every result", "turn", r.Key, "timed_out", len(t.rec.TimedOut))
			}
		}
		e.submit(ctx, t)
		return
	}
	e.wakeIn(t, time.Second)
}

// KeepEvery is how often a submission attempt the platform has not
// answered yet keeps its lease: well within Ahead, so a slow platform
// does not let the lease lapse under the request.
const KeepEvery = 2 * time.Second

// maxRounds bounds how often one event re-reads a record that others
// keep changing before it is looked at again later.
const maxRounds = 8

type ownership int

const (
	owned   ownership = iota
	lost              // another process owns the turn, or closed it: t.rec says
	unknown           // the store did not answer; t.rec may be behind
)

// own makes sure this process holds t's lease with Ahead left, writing
// the record (as submitting, with change applied) if it does not, or if
// change is not nil. A stopping process takes and renews no lease, but
// for the submission it has under way (underWay): cut off, that request
// may still reach the platform, and the process its release hands the
// turn to would send it again; it finishes within the stop's wait
// instead (Options.ShutdownTimeout).
func (e *Engine) own(ctx context.Context, t *turn, change func(*Rec), underWay bool) ownership {
	r := t.rec
	now := e.env.Now()
	if change == nil && r.Lease.HeldBy(e.self, now) {
		return owned
	}
	stopping := ctx.Err() != nil || e.Stopping() && !(underWay && r.Lease.Owner == e.self)
	if r.State.Closed() || (r.Lease.Owner != e.self && !r.Lease.Free(now)) || stopping {
		return lost
	}
	next := r.Clone()
	next.State = Submitting
	next.Lease = r.Lease.next(e.self, now)
	if change != nil {
		change(next)
	}
	return e.write(ctx, t, next, func(cur *Rec) bool {
		return cur.State == next.State && cur.CutOff == next.CutOff && cur.Lease.Equal(next.Lease)
	})
}

// write stores next for t. When the answer is a conflict or none, the
// record is read again: mine tells whether what it holds is next, stored
// with its answer lost.
func (e *Engine) write(ctx context.Context, t *turn, next *Rec, mine func(*Rec) bool) ownership {
	from := t.rec.Rev
	rev, err := e.env.Write(ctx, next)
	if err == nil {
		next.Rev = rev
		t.rec, t.fresh = next, true
		return owned
	}
	cur, lerr := e.env.Load(ctx, t.key)
	if lerr != nil {
		return unknown
	}
	t.rec, t.fresh = cur, true
	switch {
	case cur.Rev != from && mine(cur):
		cur.Outcome = next.Outcome
		return owned
	case errors.Is(err, ErrConflict) || cur.Rev != from:
		return lost
	}
	return unknown // not stored, or not yet: looked at again
}

// submit submits t, which this process owns, until the platform takes
// it, refuses it, or the run expires, and records how it ended. Before
// every attempt the lease is looked at, and renewed if less than Ahead
// is left.
func (e *Engine) submit(ctx context.Context, t *turn) {
	keep := func() bool { return e.own(ctx, t, nil, true) != lost }
	for attempt := 1; ctx.Err() == nil; attempt++ { // a stopping process starts none
		if err := e.env.Prepare(ctx, t.rec); err != nil {
			var retry *RetryError
			if !errors.As(err, &retry) {
				e.finish(ctx, t, nil, err.Error())
				return
			}
			if !e.env.Sleep(ctx, retry.Wait) {
				return // stopping: the release hands the turn on
			}
			continue
		}
		if attempt == 1 || !e.fenceOnce {
			switch e.own(ctx, t, nil, false) {
			case lost:
				e.log.Warn("another process took this turn's submission over; leaving it to that process", "turn", t.key, "lease", t.rec.Lease)
				t.sent = false // the new owner records the outcome
				if t.rec.State.Closed() {
					e.closed(t, false)
				}
				return
			case unknown:
				e.wakeIn(t, time.Second)
				return
			}
		}
		t.sent = true
		out, err := e.env.Submit(ctx, t.rec, keep)
		if t.rec.Lease.Owner != e.self || t.rec.State.Closed() {
			// Lost while the platform answered: the new owner submits
			// again, with the same ids, and records the outcome.
			e.log.Warn("the turn was taken over while its submission was under way; leaving it to its new owner", "turn", t.key, "lease", t.rec.Lease)
			t.sent = false
			if t.rec.State.Closed() {
				e.closed(t, false)
			}
			return
		}
		var retry *RetryError
		if errors.As(err, &retry) {
			e.log.Warn("submission failed; retrying", "turn", t.key, "attempt", attempt, "wait", retry.Wait.String(), "err", retry.Err)
			if !e.env.Sleep(ctx, retry.Wait) {
				return // stopping: the release hands the turn on
			}
			continue
		}
		var why string
		if err != nil {
			why = err.Error()
		}
		e.finish(ctx, t, out, why)
		return
	}
}

// finish records how t's submission ended: submitted with out, or failed
// with the error why. A record found closed by another process is the
// outcome. One it cannot record is kept, and recorded by the turn's next
// event (the lease's lapse at the latest), never submitted again here.
func (e *Engine) finish(ctx context.Context, t *turn, out any, why string) {
	t.ended = &Rec{Outcome: out, Error: why}
	for range maxRounds {
		next := t.rec.Clone()
		next.State, next.Outcome = Submitted, out
		if why != "" {
			next.State, next.Error = Failed, why
		}
		switch e.write(ctx, t, next, func(cur *Rec) bool { return cur.State == next.State && cur.Lease.Equal(next.Lease) }) {
		case owned:
			t.ended = nil
			e.closed(t, true)
			return
		case lost:
			if t.rec.State.Closed() {
				t.ended = nil
				e.closed(t, false)
				return
			}
			if t.rec.Lease.Owner != e.self {
				// Taken over while the platform answered: the new owner
				// submits again, with the same ids, and records it.
				t.ended, t.sent = nil, false
				e.log.Warn("the turn was taken over before its outcome was recorded; its new owner records it", "turn", t.key, "lease", t.rec.Lease)
				return
			}
		case unknown:
			e.env.Sleep(ctx, 250*time.Millisecond) // tried again even when stopping: it cannot wait
		}
	}
	e.log.Error("recording a submission's outcome failed; it is tried again", "turn", t.key)
	e.wakeIn(t, time.Second)
}

// cancel fails t if it is still collecting and no other process owns it;
// a turn another process owns is handed to it, and cancelled here if its
// lease lapses.
func (e *Engine) cancel(ctx context.Context, t *turn, why string) bool {
	if t.ended != nil {
		// Submitted, its outcome not yet recorded: that is recorded, and the
		// turn is not cancelled.
		e.finish(ctx, t, t.ended.Outcome, t.ended.Error)
		return false
	}
	for range maxRounds {
		r := t.rec
		if r.State != Collecting {
			if r.State.Closed() {
				e.closed(t, false)
			}
			return false
		}
		now := e.env.Now()
		if r.Lease.Owner != e.self && !r.Lease.Free(now) {
			if !e.env.Sleep(ctx, r.Lease.Until.Add(Skew).Sub(now)) {
				return false
			}
			if cur, err := e.env.Load(ctx, t.key); err == nil {
				t.rec = cur
			}
			continue
		}
		next := r.Clone()
		next.State, next.Error = Failed, why
		if t.sent || (r.Lease.Owner != "" && r.Lease.Owner != e.self) {
			// An attempt of this process's went out unanswered, or its owner
			// let the lease lapse, maybe after submitting it with no write
			// (docs/turns.md): the record says the platform may have it
			// rather than that nothing went out.
			next.Error += MaybeSubmitted
		}
		next.Lease = Lease{Epoch: r.Lease.Epoch}
		switch e.write(ctx, t, next, func(cur *Rec) bool { return cur.State == Failed && cur.Error == next.Error }) {
		case owned:
			e.closed(t, true)
			return true
		case unknown:
			if !e.env.Sleep(ctx, 250*time.Millisecond) {
				return false
			}
			if cur, err := e.env.Load(ctx, t.key); err == nil {
				t.rec = cur
			}
		}
	}
	return false
}

// MaybeSubmitted ends the error of a turn cancelled when a submission of
// it may have reached the platform first.
const MaybeSubmitted = " (a submission of it may have reached the platform first)"

// release hands t to the other processes as this one stops: its lease
// on t given up, and another process told to look at the turn at once
// (its results may all be in, and nothing else would bring it to anyone
// before the sweep finds it).
func (e *Engine) release(ctx context.Context, t *turn) {
	if t.ended != nil {
		e.finish(ctx, t, t.ended.Outcome, t.ended.Error)
		if t.rec == nil {
			return // recorded
		}
	}
	if t.wake != nil {
		t.wake()
		t.wake = nil
	}
	if t.rec.Lease.Owner != e.self && !t.fresh {
		// Whom to tell is read, not remembered: the owner this process
		// last saw may be long gone.
		if cur, err := e.env.Load(ctx, t.key); err == nil {
			t.rec, t.fresh = cur, true
		}
	}
	if t.rec.State.Closed() {
		return
	}
	if t.rec.Lease.Owner == e.self {
		next := t.rec.Clone()
		next.Lease = Lease{Epoch: t.rec.Lease.Epoch}
		if e.write(ctx, t, next, func(cur *Rec) bool { return cur.Lease.Equal(next.Lease) }) == unknown {
			e.log.Debug("releasing a turn's lease failed; it lapses", "turn", t.key)
			return
		}
	}
	if r := t.rec; !r.State.Closed() && r.Lease.Owner != e.self {
		owner := r.Lease.Owner
		if r.Lease.Free(e.env.Now()) {
			owner = "" // any other process may take it
		}
		e.env.Tell(owner, r.Key)
	}
}

// Stopping reports whether Release was called: the process takes no
// lease any more.
func (e *Engine) Stopping() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.stopping
}

// isStopping reports whether the process stops: it released its leases,
// or its goroutines' context ended.
func (e *Engine) isStopping(ctx context.Context) bool {
	if ctx.Err() != nil {
		return true
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.stopping
}

// closed ends t here.
func (e *Engine) closed(t *turn, here bool) {
	e.env.Closed(t.rec, here)
	e.drop(t)
}

// drop forgets t: events still queued read its record again.
func (e *Engine) drop(t *turn) {
	t.sent = false
	if t.wake != nil {
		t.wake()
		t.wake = nil
	}
	t.rec = nil
	e.mu.Lock()
	if len(t.queue) == 0 && e.turns[t.key] == t {
		delete(e.turns, t.key)
	}
	e.mu.Unlock()
}

// wakeIn looks at t again after d.
func (e *Engine) wakeIn(t *turn, d time.Duration) {
	if t.wake != nil {
		t.wake()
	}
	key := t.key
	t.wake = e.env.After(max(d, 0), func() { e.send(key, event{kind: evWake}) })
}
