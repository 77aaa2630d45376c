package dispatch

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolrelay/toolrelay/internal/backoff"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// The inspection index is what GET /v1/turns, /v1/watches and the console
// read: a cache of the turn and watch buckets kept current by watching
// them, so that a request costs JetStream nothing however many turns are
// open. Each replica builds its own on first use (a dispatcher nobody
// inspects pays nothing) and keeps it until Run ends:
//
//   - every open turn of every replica (collecting or submitting);
//   - the most recent recentTurns closed turns (submitted or failed), in
//     the order they closed, from the bucket's snapshot at start and then
//     as they close; older closed turns stay readable one at a time, by
//     key, for as long as the bucket keeps them (turnTTL);
//   - every active watch and the most recent recentWatches ended ones.
const (
	recentTurns   = 500
	recentWatches = 200
	// indexLoadWait bounds how long a request waits for the index's first
	// snapshot.
	indexLoadWait = 10 * time.Second
	// subscriberBuffer is how many changes a live subscriber (an SSE
	// stream) may fall behind before it is dropped; it then reconnects and
	// starts again from a snapshot.
	subscriberBuffer = 1024
)

// inspector holds the inspection index and the per-function figures this
// replica measured.
type inspector struct {
	d     *Dispatcher
	stats *fnStats

	startMu sync.Mutex
	started bool
	loaded  chan struct{} // closed once both buckets' snapshots are in

	mu     sync.RWMutex
	open   map[protocol.TurnKey]*Turn
	recent *ring[protocol.TurnKey, *recentTurn]
	// watchesOpen are active watches; watchesDone the latest ended ones.
	watchesOpen map[string]*Watch
	watchesDone *ring[string, *Watch]
	subs        map[*subscriber]struct{}

	// turnSeen and watchSeen collect the keys of a snapshot while it is
	// delivered; each is used by its bucket's mirror goroutine alone.
	turnSeen  map[protocol.TurnKey]bool
	watchSeen map[string]bool
}

// recentTurn is a closed turn and, once a request needed them, its calls'
// reports (a closed turn's results no longer change, but late ones).
type recentTurn struct {
	turn  *Turn
	calls []callReport
}

// subscriber receives every change of a turn record seen after it
// subscribed. lost is closed when it fell too far behind.
type subscriber struct {
	ch   chan *Turn
	lost chan struct{}
	once sync.Once
}

func newInspector(d *Dispatcher) *inspector {
	return &inspector{d: d, stats: newFnStats(), open: map[protocol.TurnKey]*Turn{},
		recent: newRing[protocol.TurnKey, *recentTurn](recentTurns), watchesOpen: map[string]*Watch{},
		watchesDone: newRing[string, *Watch](recentWatches), subs: map[*subscriber]struct{}{}}
}

// ensure starts the index if it is not running and waits for its first
// snapshot (up to indexLoadWait). It returns ErrNotRunning when Run is not
// running.
func (in *inspector) ensure(ctx context.Context) error {
	in.startMu.Lock()
	if !in.started {
		loaded := make(chan struct{})
		var once sync.Once
		var left atomic.Int32 // buckets whose first snapshot is not in yet
		left.Store(2)
		partLoaded := func() {
			if left.Add(-1) == 0 {
				once.Do(func() { close(loaded) })
			}
		}
		ok := in.d.background(func(bctx context.Context) {
			ctx, stop := in.d.withRunContext(bctx)
			defer stop()
			var wg sync.WaitGroup
			wg.Go(func() { mirror(ctx, in.d.turns.kv, in.resetTurns, in.applyTurn, partLoaded) })
			wg.Go(func() { mirror(ctx, in.d.watches, in.resetWatches, in.applyWatch, partLoaded) })
			wg.Wait()
			once.Do(func() { close(loaded) })
			in.startMu.Lock()
			in.started = false
			in.startMu.Unlock()
		})
		if !ok {
			in.startMu.Unlock()
			return ErrNotRunning
		}
		in.started, in.loaded = true, loaded
	}
	loaded := in.loaded
	in.startMu.Unlock()
	wait := time.NewTimer(indexLoadWait)
	defer wait.Stop()
	select {
	case <-loaded:
		return nil
	case <-wait.C:
		return errors.New("dispatch: the turn index is still loading; retry shortly")
	case <-ctx.Done():
		return ctx.Err()
	}
}

// mirror delivers every entry of kv to apply until ctx ends, re-creating
// its watcher when it closes (a reconnect). Each watcher starts with the
// bucket's snapshot: reset(true) is called before it, reset(false) after,
// so what disappeared meanwhile can be dropped. loaded is called once,
// after the first snapshot.
func mirror(ctx context.Context, kv jetstream.KeyValue, reset func(begin bool), apply func(jetstream.KeyValueEntry), loaded func()) {
	var once sync.Once
	defer once.Do(loaded)
	for ctx.Err() == nil {
		w, err := kv.WatchAll(ctx)
		if err != nil {
			backoff.Sleep(ctx, time.Second)
			continue
		}
		reset(true)
		for e := range w.Updates() {
			if e == nil {
				reset(false)
				once.Do(loaded)
				continue
			}
			apply(e)
		}
		_ = w.Stop()
	}
}

func (in *inspector) resetTurns(begin bool) {
	if begin {
		in.turnSeen = map[protocol.TurnKey]bool{}
		return
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	for k := range in.open {
		if !in.turnSeen[k] {
			delete(in.open, k) // closed and gone while the watcher was down
		}
	}
	in.turnSeen = nil
}

func (in *inspector) resetWatches(begin bool) {
	if begin {
		in.watchSeen = map[string]bool{}
		return
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	for k := range in.watchesOpen {
		if !in.watchSeen[k] {
			delete(in.watchesOpen, k)
		}
	}
	in.watchSeen = nil
}

func (in *inspector) applyTurn(e jetstream.KeyValueEntry) {
	key := protocol.TurnKey(e.Key())
	if in.turnSeen != nil {
		in.turnSeen[key] = true
	}
	if e.Operation() != jetstream.KeyValuePut {
		in.mu.Lock()
		delete(in.open, key)
		in.recent.remove(key)
		in.mu.Unlock()
		return
	}
	t, err := decodeTurn(e.Value())
	if err != nil {
		return
	}
	in.mu.Lock()
	if t.Open() {
		in.open[key] = t
	} else {
		delete(in.open, key)
		if rt, ok := in.recent.get(key); ok {
			rt.turn, rt.calls = t, nil
		} else {
			in.recent.add(key, &recentTurn{turn: t})
		}
	}
	for s := range in.subs {
		select {
		case s.ch <- t:
		default:
			s.once.Do(func() { close(s.lost) })
			delete(in.subs, s)
		}
	}
	in.mu.Unlock()
}

func (in *inspector) applyWatch(e jetstream.KeyValueEntry) {
	id := e.Key()
	if in.watchSeen != nil {
		in.watchSeen[id] = true
	}
	var w Watch
	put := e.Operation() == jetstream.KeyValuePut && json.Unmarshal(e.Value(), &w) == nil
	in.mu.Lock()
	defer in.mu.Unlock()
	delete(in.watchesOpen, id)
	in.watchesDone.remove(id)
	switch {
	case !put:
	case w.State == WatchActive:
		in.watchesOpen[id] = &w
	default:
		in.watchesDone.add(id, &w)
	}
}

// subscribe returns a subscriber of turn changes; cancel ends it.
func (in *inspector) subscribe() (s *subscriber, cancel func()) {
	s = &subscriber{ch: make(chan *Turn, subscriberBuffer), lost: make(chan struct{})}
	in.mu.Lock()
	in.subs[s] = struct{}{}
	in.mu.Unlock()
	return s, func() {
		in.mu.Lock()
		delete(in.subs, s)
		in.mu.Unlock()
	}
}

// ring keeps the latest n values added, by key, oldest first.
type ring[K comparable, V any] struct {
	n     int
	order []K
	vals  map[K]V
}

func newRing[K comparable, V any](n int) *ring[K, V] {
	return &ring[K, V]{n: n, vals: map[K]V{}}
}

func (r *ring[K, V]) add(k K, v V) {
	if _, ok := r.vals[k]; !ok {
		r.order = append(r.order, k)
	}
	r.vals[k] = v
	if len(r.order) > 2*r.n { // compact now and then, not on every add
		r.order = append(r.order[:0:0], r.order[len(r.order)-r.n:]...)
		keep := make(map[K]V, r.n)
		for _, k := range r.order {
			keep[k] = r.vals[k]
		}
		r.vals = keep
	}
}

func (r *ring[K, V]) get(k K) (V, bool) { v, ok := r.vals[k]; return v, ok }

func (r *ring[K, V]) remove(k K) {
	if _, ok := r.vals[k]; ok {
		delete(r.vals, k)
		for i, o := range r.order {
			if o == k {
				r.order = append(r.order[:i], r.order[i+1:]...)
				break
			}
		}
	}
}

// newest returns the latest n values (at most the ring's size), newest
// first.
func (r *ring[K, V]) newest() []V {
	out := make([]V, 0, r.n)
	for i := len(r.order) - 1; i >= 0 && len(out) < r.n; i-- {
		out = append(out, r.vals[r.order[i]])
	}
	return out
}
