package dispatch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
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
//   - every open turn of every replica (collecting or submitting): found at
//     start through the index of open turns the sweep reads (their timer
//     subjects) and read a thousand a request, then kept current by a
//     watch of the bucket;
//   - the most recent recentTurns closed turns (submitted or failed), in
//     the order they closed: at start from the last turnTail changes the
//     bucket holds, then as they close. The bucket's other closed turns
//     (it keeps them for turnTTL) are not read: with many turns an hour
//     that would be a full scan. They stay readable one at a time, by key;
//   - every active watch and the most recent recentWatches ended ones,
//     from the watch bucket's snapshot (one record per watched object).
//
// Records are applied by revision, so a read that overtakes a change
// (the open turns are read while the watch already runs) never undoes it.
const (
	recentTurns   = 500
	recentWatches = 200
	// turnTail is how many of the turn bucket's latest changes are read at
	// start to find the recently closed turns (a turn changes about three
	// times).
	turnTail = 4 * recentTurns
	// indexReaders bounds the requests for open turns' records in flight
	// at start (each for up to indexBatch records).
	indexReaders = 4
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
	open   map[protocol.TurnKey]*openTurn
	recent *ring[protocol.TurnKey, *recentTurn]
	// watchesOpen are active watches; watchesDone the latest ended ones.
	watchesOpen map[string]*Watch
	watchesDone *ring[string, *Watch]
	subs        map[*subscriber]struct{}

	// watchSeen collects the keys of the watch bucket's snapshot while it
	// is delivered; only its mirror goroutine uses it.
	watchSeen map[string]bool
}

// openTurn is an open turn and the revision of its record.
type openTurn struct {
	turn *Turn
	rev  uint64
}

// recentTurn is a closed turn and, once a request needed them, its calls'
// reports (a closed turn's results no longer change, but late ones).
type recentTurn struct {
	turn  *Turn
	rev   uint64
	calls []CallReport
}

// subscriber receives every change of a turn record seen after it
// subscribed. lost is closed when it fell too far behind.
type subscriber struct {
	ch   chan *Turn
	lost chan struct{}
	once sync.Once
}

func newInspector(d *Dispatcher) *inspector {
	return &inspector{d: d, stats: newFnStats(), open: map[protocol.TurnKey]*openTurn{},
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
			wg.Go(func() { in.mirrorTurns(ctx, partLoaded) })
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

// mirrorTurns keeps the turns of the index current until ctx ends (see
// inspector), starting again from the index of open turns whenever the
// watch of the bucket closes (a reconnect). loaded is called once, when
// the first start is done.
func (in *inspector) mirrorTurns(ctx context.Context, loaded func()) {
	var once sync.Once
	defer once.Do(loaded)
	kv := in.d.turns.kv
	for ctx.Err() == nil {
		from := uint64(1)
		if st, err := kv.Status(ctx); err == nil {
			if bs, ok := st.(*jetstream.KeyValueBucketStatus); ok && bs.StreamInfo().State.LastSeq > turnTail {
				from = bs.StreamInfo().State.LastSeq - turnTail + 1
			}
		}
		// The watch first: what changes while the open turns are read is
		// delivered after, and applied by revision.
		w, err := kv.WatchAll(ctx, jetstream.IncludeHistory(), jetstream.ResumeFromRevision(from))
		if err != nil {
			backoff.Sleep(ctx, time.Second)
			continue
		}
		in.mu.Lock()
		clear(in.open) // read again below: a reconnect may have missed closes
		in.mu.Unlock()
		if err := in.loadOpen(ctx); err != nil {
			in.d.log.Warn("inspection index: reading the open turns failed; retrying", "err", err)
			_ = w.Stop()
			backoff.Sleep(ctx, time.Second)
			continue
		}
		for e := range w.Updates() {
			if e == nil { // the tail is in: loaded
				once.Do(loaded)
				continue
			}
			in.applyTurn(e)
		}
		_ = w.Stop()
	}
}

// loadOpen reads the record of every turn in the index of open turns,
// up to indexBatch turns a request (a direct get of the last message of
// many subjects), indexReaders requests at once. Read one request a
// turn, the first list after a start took 11 s at 100,000 open turns,
// past indexLoadWait.
func (in *inspector) loadOpen(ctx context.Context) error {
	keys, _, err := in.d.openTurns(ctx, nil)
	if err != nil {
		return err
	}
	work := make(chan []protocol.TurnKey)
	errs := make(chan error, indexReaders)
	var wg sync.WaitGroup
	for range min(indexReaders, (len(keys)+indexBatch-1)/indexBatch) {
		wg.Go(func() {
			for batch := range work {
				if err := in.d.turns.lastOfEach(ctx, batch, in.apply); err != nil {
					select {
					case errs <- err:
					default:
					}
				}
			}
		})
	}
	for batch := range slices.Chunk(keys, indexBatch) {
		select {
		case work <- batch:
		case <-ctx.Done():
		}
	}
	close(work)
	wg.Wait()
	select {
	case err := <-errs:
		return err
	default:
		return ctx.Err()
	}
}

// indexBatch is how many records one request of loadOpen reads: the
// server answers at most 1024 subjects' last messages a request.
const indexBatch = 1000

// lastOfEach reads the records of keys with one request, a direct get of
// each one's last message, handing each found to apply (key, record,
// revision). A key without a record is left out. Any replica of the bucket
// may answer, as for any direct get: one that lags may answer an older
// record, or none, for a turn that changed a moment ago.
func (s turnStore) lastOfEach(ctx context.Context, keys []protocol.TurnKey, apply func(key string, value []byte, rev uint64)) error {
	prefix := kvSubject(s.kv.Bucket(), "")
	req := struct {
		MultiLast []string `json:"multi_last"`
	}{MultiLast: make([]string, len(keys))}
	for i, k := range keys {
		req.MultiLast[i] = prefix + string(k)
	}
	data, err := json.Marshal(req)
	if err != nil {
		return err
	}
	inbox := s.nc.NewRespInbox()
	msgs := make(chan *nats.Msg, len(keys)+1)
	sub, err := s.nc.ChanSubscribe(inbox, msgs)
	if err != nil {
		return err
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := s.nc.PublishRequest("$JS.API.DIRECT.GET.KV_"+s.kv.Bucket(), inbox, data); err != nil {
		return err
	}
	wait := time.NewTimer(listPageTimeout)
	defer wait.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-wait.C:
			return fmt.Errorf("dispatch: read %d turn records: no answer in %s", len(keys), listPageTimeout)
		case m := <-msgs:
			switch status := m.Header.Get("Status"); status {
			case "":
			case "204", "404": // the end of the batch; none found
				return nil
			default:
				return fmt.Errorf("dispatch: read %d turn records: %s %s", len(keys), status, m.Header.Get("Description"))
			}
			if op := m.Header.Get("KV-Operation"); op != "" { // deleted or purged
				continue
			}
			key, ok := strings.CutPrefix(m.Header.Get(jetstream.SubjectHeader), prefix)
			rev, err := strconv.ParseUint(m.Header.Get(jetstream.SequenceHeader), 10, 64)
			if ok && err == nil {
				apply(key, m.Data, rev)
			}
		}
	}
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

// applyTurn applies a record (or its deletion) newer than what the index
// holds of its turn.
func (in *inspector) applyTurn(e jetstream.KeyValueEntry) {
	if e.Operation() == jetstream.KeyValuePut {
		in.apply(e.Key(), e.Value(), e.Revision())
	} else {
		in.applyRecord(protocol.TurnKey(e.Key()), nil, e.Revision())
	}
}

// apply applies a turn's record, at revision rev.
func (in *inspector) apply(key string, value []byte, rev uint64) {
	if t, err := decodeTurn(value); err == nil {
		in.applyRecord(protocol.TurnKey(key), t, rev)
	}
}

// applyRecord applies t, the record of the turn key at revision rev (nil:
// deleted), if newer than what the index holds of it.
func (in *inspector) applyRecord(key protocol.TurnKey, t *Turn, rev uint64) {
	if t != nil {
		for i := range t.Calls {
			t.Calls[i].Arguments = nil // never shown; an index of 10,000 turns need not hold them
		}
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	if ot := in.open[key]; ot != nil && ot.rev >= rev {
		return
	}
	if rt, ok := in.recent.get(key); ok && rt.rev >= rev {
		return
	}
	if t == nil {
		delete(in.open, key)
		in.recent.remove(key)
		return
	}
	if t.Open() {
		in.open[key] = &openTurn{turn: t, rev: rev}
	} else {
		delete(in.open, key)
		if rt, ok := in.recent.get(key); ok {
			rt.turn, rt.rev, rt.calls = t, rev, nil
		} else {
			in.recent.add(key, &recentTurn{turn: t, rev: rev})
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
