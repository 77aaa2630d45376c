package dispatch

import (
	"context"
	"errors"
	"hash/fnv"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/toolrelay/toolrelay/internal/backoff"
	"github.com/toolrelay/toolrelay/internal/crashpoint"
	"github.com/toolrelay/toolrelay/internal/leaderread"
	"github.com/toolrelay/toolrelay/pkg/dispatch/internal/lifecycle"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// gatherer consumes results and notices when a turn has all of them.
//
// Every replica receives every result (resultStreams), and gathers for the
// turns it took in, took over, or read the record of: it keeps their
// results, and closes a turn at once when its own set is complete. A
// replica that took the turn in has had every result since its calls went
// out; one that began gathering later looks at the stream too, a moment
// after each result that leaves its own set incomplete. The deadline timer
// and the sweep are the backstop.
type gatherer struct {
	d       *Dispatcher
	streams *resultStreams

	mu    sync.Mutex
	turns map[protocol.TurnKey]*gathering
	// calls counts the calls of the turns in turns by function: the
	// functions the orphan scan asks about (orphans.go).
	calls map[fnKey]int
	// passing holds the turns of results this replica passes by unread,
	// until when: another replica held the lease of the turn when one was
	// looked at (until that lease could be free), or had closed it (a
	// turn of 16 calls was read once a result).
	passing map[protocol.TurnKey]time.Time
	purgeAt int // how many passing holds when it is next purged
	// lastFor reads a recorded result (tests stand in for the stream).
	lastFor func(context.Context, jetstream.Stream, string) (*jetstream.RawStreamMsg, error)
}

type gathering struct {
	// turn is the record as this replica last read or wrote it, at
	// revision rev: the lifecycle engine's between the turn's events
	// (turnEnv.Cached); only the engine's goroutine of the turn changes it.
	turn *Turn
	rev  uint64
	// results holds the results seen here, in the order of turn.Calls;
	// it is allocated with the first, so an open turn waiting for its
	// calls (most of them, under load) costs no more than its record.
	results []*protocol.Result
	// whole is set when this replica took the turn in: every result
	// reaches it, so a set incomplete here is incomplete.
	whole   bool
	recheck *time.Timer
	// submitting is set once the turn is submitted from here: the
	// outputs it submits (gathered once), and its attempts' backoff.
	submitting *submitting
}

// submitting is what a turn's submission from this replica keeps.
type submitting struct {
	outputs []Output
	// tried counts the attempts made, attempts those refused as
	// retryable.
	tried, attempts int
	backoff         backoff.Backoff
}

const (
	gatherWorkers  = 16
	recheckDelay   = 25 * time.Millisecond
	recheckTimeout = 10 * time.Second
)

func newGatherer(d *Dispatcher) *gatherer {
	g := &gatherer{d: d, streams: newResultStreams(d), turns: map[protocol.TurnKey]*gathering{}, calls: map[fnKey]int{},
		passing: map[protocol.TurnKey]time.Time{}, purgeAt: minPurgeAt}
	g.lastFor = g.leaderLastFor
	return g
}

// start consumes results until the returned stop is called. Results of one
// turn go to one worker, in order; turns proceed in parallel. Results
// queued when stop comes are dropped: they are in the stream, where the
// replica a turn is handed to reads them.
func (g *gatherer) start(ctx context.Context) (stop func(), err error) {
	queues := make([]chan jetstream.Msg, gatherWorkers)
	done := make(chan struct{})
	var wg sync.WaitGroup
	for i := range queues {
		queues[i] = make(chan jetstream.Msg, 256)
		wg.Go(func() {
			for {
				select {
				case msg := <-queues[i]:
					g.handle(ctx, msg)
				case <-done:
					return
				}
			}
		})
	}
	stopAll := func() {
		close(done) // first: a consumer being created again may still hand a result over
		g.streams.stop()
		wg.Wait()
	}
	if err := g.streams.start(ctx, func(msg jetstream.Msg) {
		select {
		case queues[shard(msg.Subject())] <- msg:
		case <-done:
		}
	}); err != nil {
		stopAll()
		return nil, err
	}
	return func() {
		stopAll()
		g.stopRechecks()
	}, nil
}

// shard picks the worker of a result by its turn, so one turn's results are
// handled in order by one worker.
func shard(subject string) int {
	_, key, err := protocol.ParseResultSubject(subject)
	h := fnv.New32a()
	if err == nil {
		_, _ = h.Write([]byte(key.Turn()))
	}
	return int(h.Sum32() % gatherWorkers)
}

func (g *gatherer) handle(ctx context.Context, msg jetstream.Msg) {
	team, key, err := protocol.ParseResultSubject(msg.Subject())
	if err != nil {
		g.d.log.ErrorContext(ctx, "ignoring result on a malformed subject", "subject", msg.Subject(), "err", err)
		return
	}
	turnKey := key.Turn()
	st := g.gathering(turnKey)
	if st == nil {
		g.untracked(ctx, msg, team, key)
		return
	}
	res, ctx, span := g.open(ctx, msg, team, key)
	defer span.End()
	if res == nil {
		return
	}
	t, counts := g.turnOf(st)
	i := t.callIndex(key)
	if i < 0 || t.Calls[i].Team != team {
		span.SetStatus(codes.Error, "result from a team that does not own the call")
		g.d.log.WarnContext(ctx, "result for a call this team does not own; ignored", "subject", msg.Subject(), "turn", turnKey, "team", team)
		return
	}
	if counts {
		g.d.tel.result(ctx, t, res)
		g.d.inspect.stats.record(t, res)
	}
	if t.Calls[i].SideEffects {
		g.d.auditRun(ctx, t, &t.Calls[i], res)
	}
	crashpoint.Reached(crashpoint.Gather, g.d.opts.Name, string(turnKey))
	if g.add(st, i, res) {
		g.d.engine.Close(string(turnKey))
	}
}

// open decodes a result and opens its span; a malformed one is logged
// and nil.
func (g *gatherer) open(ctx context.Context, msg jetstream.Msg, team string, key protocol.CallKey) (*protocol.Result, context.Context, trace.Span) {
	res, err := decodeResult(msg, team, key)
	ctx, span := g.d.tel.processResult(ctx, msg.Subject(), team, msg.Headers(), res)
	if err != nil {
		span.SetStatus(codes.Error, "malformed result")
		g.d.log.ErrorContext(ctx, "ignoring malformed result", "subject", msg.Subject(), "size", len(msg.Data()), "err", err)
		return nil, ctx, span
	}
	return res, ctx, span
}

// decodeResult decodes the result msg carries on the subject of team's
// call key; one that names another call is returned with the error.
func decodeResult(msg jetstream.Msg, team string, key protocol.CallKey) (*protocol.Result, error) {
	res, err := protocol.DecodeResult(msg.Data())
	if err == nil && (res.Key != key || res.Team != team) {
		return res, errors.New("envelope does not match its subject")
	}
	return res, err
}

// untracked looks at a result of a turn this replica does not gather for.
// Most such turns another replica gathers for, and it has the result too:
// the record is read once, and the turn's other results passed by while
// the lease found there holds (or for a minute, once another closed it).
// What is left: a turn this replica owns without gathering for it (its
// intake's answer was lost), looked at now; a turn whose lease is free
// (its owner stopped, died, or let its intake lease run out while the
// calls ran), looked at a moment later unless it closed meanwhile; and a
// late result of a turn already closed. A side-effecting run is audited
// by every replica it reaches, whatever it knows of the turn: the audit
// entry's message ID keeps one.
func (g *gatherer) untracked(ctx context.Context, msg jetstream.Msg, team string, key protocol.CallKey) {
	now := time.Now()
	res, err := decodeResult(msg, team, key)
	if err != nil {
		return // logged by the replica that gathers for the turn, if it is one
	}
	// The executor's trace, for the log and the audit trail.
	remote := func() context.Context { return g.d.tel.prop.Extract(ctx, protocol.HeaderCarrier(msg.Headers())) }
	spec, _ := g.d.registry.claimOf(res.Function)
	audit := spec != nil && spec.SideEffects && spec.Team == team
	if !audit && g.passingBy(key.Turn(), now) {
		return
	}
	t, rev, err := g.d.turns.get(ctx, key.Turn())
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		// A call goes out only once its turn is recorded and gathered for
		// by the replica that took it in: this is a stray result.
		g.d.log.Debug("result for an unknown turn", "subject", msg.Subject())
		return
	case err != nil:
		g.d.log.Warn("looking at a result of a turn another replica may gather for failed; its owner, the sweep or its deadline closes the turn",
			"subject", msg.Subject(), "err", err)
		return
	case !t.Open():
		if t.lease.Owner == g.d.instance {
			g.d.lateResult(remote(), t) // counted once: by the replica that closed it
		} else {
			g.passBy(t.Key, now.Add(closedPassBy))
		}
	case t.lease.Owner == g.d.instance:
		// Taken in here by an intake whose record was stored and its
		// answer lost (the repeat found it recorded).
		g.track(t, rev)
		g.d.engine.Close(string(t.Key))
	case t.lease.Free(now):
		// A live owner closes it at once, having the result too; the look
		// a moment later is for an owner that is gone.
		g.track(t, rev)
		g.recheckIn(t.Key, untrackedLook)
	default:
		g.passBy(t.Key, t.lease.Until.Add(lifecycle.Skew))
	}
	if c := t.call(key); audit && c != nil && c.Team == team && c.SideEffects {
		g.d.auditRun(remote(), t, c, res)
	}
}

// closedPassBy is how long the results of a turn another replica closed
// are passed by unread: the others of its calls came with it, or are late.
const closedPassBy = time.Minute

// passBy passes by the results of the turn key unread until then. What
// it keeps is purged as it grows.
func (g *gatherer) passBy(key protocol.TurnKey, until time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.passing) >= g.purgeAt {
		now := time.Now()
		maps.DeleteFunc(g.passing, func(_ protocol.TurnKey, until time.Time) bool { return !now.Before(until) })
		g.purgeAt = max(2*len(g.passing), minPurgeAt)
	}
	g.passing[key] = until
}

// minPurgeAt is the fewest turns passed by whose expired entries are
// purged.
const minPurgeAt = 1024

// passingBy reports whether the results of the turn key are passed by now.
func (g *gatherer) passingBy(key protocol.TurnKey, now time.Time) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	until, ok := g.passing[key]
	return ok && now.Before(until)
}

// untrackedLook is how long a replica that started gathering for a turn
// because of a result waits before it looks at the turn: the owner,
// if alive, closes it meanwhile.
const untrackedLook = time.Second

// gathering returns the gathering state of a turn this replica gathers
// for, or nil.
func (g *gatherer) gathering(key protocol.TurnKey) *gathering {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.turns[key]
}

// takeIn starts gathering for t, just taken in here and recorded at
// revision rev, before its calls go out.
func (g *gatherer) takeIn(t *Turn, rev uint64) {
	st := g.track(t, rev)
	g.mu.Lock()
	st.whole = true
	g.mu.Unlock()
}

// track starts gathering for t, recorded at revision rev (no-op if
// already tracked).
func (g *gatherer) track(t *Turn, rev uint64) *gathering {
	g.mu.Lock()
	defer g.mu.Unlock()
	if st := g.turns[t.Key]; st != nil {
		return st
	}
	st := &gathering{turn: t, rev: rev}
	g.turns[t.Key] = st
	// Only calls that go to an executor count: a rejected call names a
	// function nobody serves (a hostile turn can name any), and would
	// make every orphan scan walk the open calls for as long as its turn
	// is open.
	for i := range t.Calls {
		if t.Calls[i].published() {
			g.calls[fnKey{t.Calls[i].Team, t.Calls[i].Name}]++
		}
	}
	return st
}

// functions lists the functions the turns this replica gathers for call.
func (g *gatherer) functions() []fnKey {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Collect(maps.Keys(g.calls))
}

// cached returns the record of a turn this replica gathers for, as it
// last read or wrote it, and its revision; nil if it gathers for none.
func (g *gatherer) cached(key protocol.TurnKey) (*Turn, uint64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if st := g.turns[key]; st != nil {
		return st.turn, st.rev
	}
	return nil, 0
}

// turnOf returns the record st keeps now (the engine replaces it as it
// writes the turn), and whether this replica counts the turn's results in
// its metrics and statistics: it took the turn in, or holds its lease.
// Others gathering for it (a slow turn every replica's sweep re-armed)
// receive the same results.
func (g *gatherer) turnOf(st *gathering) (t *Turn, counts bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return st.turn, st.whole || st.turn.lease.Owner == g.d.instance
}

// replace keeps t, at revision rev, as the record of a turn this replica
// gathers for.
func (g *gatherer) replace(t *Turn, rev uint64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if st := g.turns[t.Key]; st != nil && rev > st.rev {
		st.turn, st.rev = t, rev
	}
}

// ownedBy lists the turns this replica gathers for whose lease, as it
// last saw it, is owner's.
func (g *gatherer) ownedBy(owner string) []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	var keys []string
	for k, st := range g.turns {
		if st.turn.lease.Owner == owner {
			keys = append(keys, string(k))
		}
	}
	return keys
}

// completeHere reports whether every result of the turn key was seen
// here.
func (g *gatherer) completeHere(key protocol.TurnKey) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	st := g.turns[key]
	return st != nil && st.results != nil && !slices.Contains(st.results, nil)
}

// outputsOf returns the outputs a submission of st gathered, if any.
func (g *gatherer) outputsOf(st *gathering) []Output {
	g.mu.Lock()
	defer g.mu.Unlock()
	if st.submitting == nil {
		st.submitting = &submitting{backoff: backoff.Backoff{Initial: 250 * time.Millisecond, Max: 8 * time.Second}}
	}
	return st.submitting.outputs
}

// keepOutputs keeps the outputs a submission of st gathered, for its
// next attempts.
func (g *gatherer) keepOutputs(st *gathering, outputs []Output) {
	g.mu.Lock()
	defer g.mu.Unlock()
	st.submitting.outputs = outputs
}

// nextBackoff is how long st's submission waits before its next attempt,
// before the platform's Retry-After and the run's expiry have their say.
func (g *gatherer) nextBackoff(st *gathering) time.Duration {
	g.mu.Lock()
	defer g.mu.Unlock()
	return st.submitting.backoff.Next()
}

// submittedOutputs returns the outputs the turn key was submitted with
// from here, and whether it was submitted from here at all.
func (g *gatherer) submittedOutputs(key protocol.TurnKey) ([]Output, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if st := g.turns[key]; st != nil && st.submitting != nil {
		return st.submitting.outputs, true
	}
	return nil, false
}

// add records the result of the turn's call i; it reports whether the
// turn is now complete here. If not, it schedules a re-check of the stream.
func (g *gatherer) add(st *gathering, i int, res *protocol.Result) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if st.results == nil {
		st.results = make([]*protocol.Result, len(st.turn.Calls))
	}
	st.results[i] = res
	if !slices.Contains(st.results, nil) {
		return true
	}
	if !st.whole {
		g.scheduleRecheck(st)
	}
	return false
}

// recheckSoon schedules a re-check of a turn's results (resume).
func (g *gatherer) recheckSoon(key protocol.TurnKey) {
	g.recheckIn(key, recheckDelay)
}

// recheckIn schedules a re-check of a turn's results after delay.
func (g *gatherer) recheckIn(key protocol.TurnKey, delay time.Duration) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if st := g.turns[key]; st != nil {
		g.scheduleRecheckIn(st, delay)
	}
}

// scheduleRecheck (re)arms st's re-check; g.mu must be held. The timer is
// the turn's own: forget and stop stop it, and the re-check runs as Run's
// background work, so none runs after Run returns.
func (g *gatherer) scheduleRecheck(st *gathering) { g.scheduleRecheckIn(st, recheckDelay) }

func (g *gatherer) scheduleRecheckIn(st *gathering, delay time.Duration) {
	if st.recheck != nil {
		st.recheck.Reset(delay)
		return
	}
	key := st.turn.Key
	st.recheck = time.AfterFunc(delay, func() {
		g.d.background(func(ctx context.Context) { g.recheck(ctx, key) })
	})
}

// recheck has the engine look at a turn whose results may be split
// between replicas: it reads the stream, and submits the turn if every
// result is recorded.
func (g *gatherer) recheck(ctx context.Context, key protocol.TurnKey) {
	if g.tracking(key) {
		g.d.engine.Close(string(key))
	}
}

// present counts the calls of t whose result is recorded.
func (g *gatherer) present(ctx context.Context, t *Turn) (int, error) {
	rec, err := g.recorded(ctx, t, nil)
	return len(rec), err
}

// recorded returns the calls of t whose result is in its team's stream:
// from known if it is not nil (a listing of the streams, see
// recordedOf), else by a stream-info request per team.
func (g *gatherer) recorded(ctx context.Context, t *Turn, known *recordedResults) (map[protocol.CallKey]bool, error) {
	rec := map[protocol.CallKey]bool{}
	if known != nil {
		for i := range t.Calls {
			if known.has(t.Calls[i].Key) {
				rec[t.Calls[i].Key] = true
			}
		}
		return rec, nil
	}
	for _, team := range t.teams() {
		s, err := g.streams.stream(ctx, team)
		if err != nil {
			return nil, err
		}
		info, err := s.Info(ctx, jetstream.WithSubjectFilter(protocol.TurnResultsFilter(t.Key)))
		if err != nil {
			return nil, err
		}
		for i := range t.Calls {
			if t.Calls[i].Team == team && info.State.Subjects[t.Calls[i].resultSubject()] > 0 {
				rec[t.Calls[i].Key] = true
			}
		}
	}
	return rec, nil
}

// tracking reports whether this replica gathers results for the turn.
func (g *gatherer) tracking(key protocol.TurnKey) bool { return g.gathering(key) != nil }

// result returns the result of a call: the one this replica saw, or the
// one recorded in the stream.
func (g *gatherer) result(ctx context.Context, t *Turn, c *TurnCall) (*protocol.Result, error) {
	if res := g.local(t.Key, c.Key); res != nil {
		return res, nil
	}
	s, err := g.streams.stream(ctx, c.Team)
	if err != nil {
		return nil, err
	}
	m, err := g.lastFor(ctx, s, c.resultSubject())
	if err != nil {
		return nil, err
	}
	return protocol.DecodeResult(m.Data)
}

// leaderLastFor reads the last message on subject as the stream's leader
// has it. Result streams allow direct gets (executors look their results
// up so), which any replica answers, and one that lags answers "not
// found" for a result already recorded.
func (g *gatherer) leaderLastFor(ctx context.Context, s jetstream.Stream, subject string) (*jetstream.RawStreamMsg, error) {
	return leaderread.LastFor(ctx, g.d.js, s.CachedInfo().Config.Name, subject)
}

// local returns the result of call key of turn this replica holds, or nil.
func (g *gatherer) local(turn protocol.TurnKey, key protocol.CallKey) *protocol.Result {
	g.mu.Lock()
	defer g.mu.Unlock()
	st := g.turns[turn]
	if st == nil || st.results == nil {
		return nil
	}
	if i := st.turn.callIndex(key); i >= 0 {
		return st.results[i]
	}
	return nil
}

// trackedTurns returns the records of the turns this replica gathers for.
func (g *gatherer) trackedTurns() []*Turn {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make([]*Turn, 0, len(g.turns))
	for _, st := range g.turns {
		out = append(out, st.turn)
	}
	return out
}

// stopRechecks stops every re-check timer (the dispatcher is stopping).
func (g *gatherer) stopRechecks() {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, st := range g.turns {
		if st.recheck != nil {
			st.recheck.Stop()
		}
	}
}

// forget drops a closed turn.
func (g *gatherer) forget(key protocol.TurnKey) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if st := g.turns[key]; st != nil {
		if st.recheck != nil {
			st.recheck.Stop()
		}
		delete(g.turns, key)
		// A turn's calls never change (a record written later shares
		// them), so these are the functions track counted.
		for i := range st.turn.Calls {
			if !st.turn.Calls[i].published() {
				continue
			}
			fn := fnKey{st.turn.Calls[i].Team, st.turn.Calls[i].Name}
			if g.calls[fn]--; g.calls[fn] <= 0 {
				delete(g.calls, fn)
			}
		}
	}
}
