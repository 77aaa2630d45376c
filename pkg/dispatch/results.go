package dispatch

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolrelay/toolrelay/internal/provision"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// resultStreams are the teams' result streams (protocol.ResultStream), each
// with this replica's own consumer of it. A team's stream is created the
// first time the dispatcher needs it (an executor of the team declares, or
// a call is routed to it) and consumed from then on; at start every
// existing one is.
//
// Every replica receives every result: the replica that gathers for a turn
// (it took the turn in, took it over, or has read its record) has all of
// its results from the moment it started gathering, with no read and no
// word from another replica; the others look at a result only to find the
// turns nobody gathers for (gatherer.untracked). A consumer is an ordered
// one: the server keeps no acknowledgements, and the client creates it
// again, from the next result, when it is lost.
type resultStreams struct {
	d      *Dispatcher
	handle jetstream.MessageHandler

	mu      sync.Mutex
	streams map[string]jetstream.Stream
	stops   map[string]func()
	// consuming is the context consumers run under, nil until start and
	// after stop: a team first seen then gets its stream but no consumer.
	consuming context.Context
	// starts counts the starts, which name the consumers: one a start
	// before left may linger on the server for resultsInactive.
	starts int
}

const (
	// resultsConsumer begins the name of each replica's consumer of a
	// result stream: resultsConsumer_<digest of the replica>_<n>. The
	// dispatchers before this version shared a durable of that name;
	// nothing reads it any more once they are all upgraded
	// (docs/operations.md).
	resultsConsumer = "toolrelay_dispatcher"
	// resultsBatch bounds one replica's buffered results per team.
	resultsBatch = 512
	// resultsInactive is how long a replica's consumer outlives the
	// replica (killed, or cut off from the server): then the server
	// removes it. A replica cut off for longer creates it again.
	resultsInactive = time.Minute
	// resultsStopWait bounds how long a stop waits for the consumers.
	resultsStopWait = 2 * time.Second
)

func newResultStreams(d *Dispatcher) *resultStreams {
	return &resultStreams{d: d, streams: map[string]jetstream.Stream{}, stops: map[string]func(){}}
}

// start consumes every existing result stream, and the dispatcher's own,
// handing results to handle until stop: each from the results recorded
// after it is started.
func (r *resultStreams) start(ctx context.Context, handle jetstream.MessageHandler) error {
	r.mu.Lock()
	r.handle = handle
	r.consuming = ctx
	r.starts++
	r.mu.Unlock()
	teams := []string{protocol.SystemTeam}
	names := r.d.js.StreamNames(ctx, jetstream.WithStreamListSubject(protocol.ResultSubjectPrefix+".>"))
	for name := range names.Name() {
		if team, ok := protocol.ResultStreamTeam(name); ok && team != protocol.SystemTeam {
			teams = append(teams, team)
		}
	}
	if err := names.Err(); err != nil && !errors.Is(err, jetstream.ErrEndOfData) {
		return fmt.Errorf("list result streams: %w", err)
	}
	for _, team := range teams {
		if _, err := r.provide(ctx, team, false); err != nil {
			return err
		}
	}
	return nil
}

// stream returns team's result stream, creating it and starting its
// consumer if this replica has not yet. A stream this replica first
// consumes after its start (a team new since, or a stream created again)
// is consumed whole: every result in it may be of a turn it took in.
func (r *resultStreams) stream(ctx context.Context, team string) (jetstream.Stream, error) {
	return r.provide(ctx, team, true)
}

// provide is stream; whole consumes the stream from its first result,
// not from the next.
func (r *resultStreams) provide(ctx context.Context, team string, whole bool) (jetstream.Stream, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if s := r.streams[team]; s != nil {
		return s, nil
	}
	popts := provision.Options{Replicas: r.d.opts.Replicas}
	s, err := provision.Stream(ctx, r.d.js, provision.ResultStreamConfig(team, r.d.opts.ResultStreamBytes, popts))
	var noTTL *provision.MsgTTLError
	if errors.As(err, &noTTL) && s != nil {
		// One team's stream this dispatcher may not update must not keep
		// it from serving every team: its results are recorded without
		// their TTL, kept for the stream's MaxAge.
		r.d.log.Warn("a team's result stream keeps its results for its MaxAge: it could not be updated to take their TTLs", "team", team, "err", err)
		err = nil
	}
	if err != nil {
		return nil, fmt.Errorf("dispatch: results stream of team %s: %w", team, err)
	}
	if r.consuming != nil && r.consuming.Err() == nil {
		stop, err := r.consume(r.consuming, team, s, whole)
		if err != nil {
			return nil, fmt.Errorf("dispatch: consume results of team %s: %w", team, err)
		}
		r.stops[team] = stop
	}
	r.streams[team] = s
	return s, nil
}

// stop stops every consumer; it returns once no result is being handed out.
// The streams are forgotten too, so that a start after it (one that failed
// half-way is tried again) consumes each again.
func (r *resultStreams) stop() {
	r.mu.Lock()
	stops := r.stops
	r.stops, r.consuming = map[string]func(){}, nil
	r.streams = map[string]jetstream.Stream{}
	r.mu.Unlock()
	// A consumer being created again (its server gone, a failover) holds its
	// stop until the attempt ends: the replica must go on to release its
	// turns. Its results are dropped meanwhile (gatherer.start).
	var wg sync.WaitGroup
	for _, stop := range stops {
		wg.Go(stop)
	}
	stopped := make(chan struct{})
	go func() { wg.Wait(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(resultsStopWait):
		r.d.log.Warn("some results consumers had not stopped after " + resultsStopWait.String() + "; going on without them")
	}
}

// consume hands this replica the results recorded in s, in order, until
// stop: whole, from its first; else from those after what s's cached
// state holds (read a moment ago). The start is a sequence, not "new": a
// consumer created again before it delivered anything starts there too.
// r.mu is held.
func (r *resultStreams) consume(ctx context.Context, team string, s jetstream.Stream, whole bool) (stop func(), err error) {
	info := s.CachedInfo()
	from := info.State.LastSeq + 1
	if whole {
		from = max(info.State.FirstSeq, 1)
	}
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		NamePrefix:        resultsConsumer + "_" + replicaDigest(leaseInstance(r.d.instance)) + "_" + strconv.Itoa(r.starts),
		DeliverPolicy:     jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:       from,
		InactiveThreshold: resultsInactive,
	})
	if err != nil {
		return nil, err
	}
	cc, err := cons.Consume(r.handle, jetstream.PullMaxMessages(resultsBatch), jetstream.PullExpiry(sharedPullExpiry),
		jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
			if errors.Is(err, jetstream.ErrConsumerDeleted) {
				// The client creates it again from where it was; that is
				// wrong if the stream itself went.
				r.d.background(func(ctx context.Context) { r.lost(ctx, team, s, info.Created) })
			}
			if !errors.Is(err, jetstream.ErrNoHeartbeat) {
				r.d.log.Warn("consuming results", "stream", info.Config.Name, "err", err)
			}
		}))
	if err != nil {
		return nil, err
	}
	return func() { cc.Stop(); <-cc.Closed() }, nil
}

// lost looks at team's stream s, created at created, whose consumer was
// deleted. If the stream is not that one any more (deleted, and perhaps
// created again), the sequence the consumer had reached means nothing
// there: the consumer is stopped, and a stream there now consumed whole;
// one created later is, when this replica next needs it.
func (r *resultStreams) lost(ctx context.Context, team string, s jetstream.Stream, created time.Time) {
	r.mu.Lock()
	current := r.streams[team] == s
	r.mu.Unlock()
	if !current {
		return // looked at already
	}
	now, err := r.d.js.Stream(ctx, protocol.ResultStream(team))
	if err == nil && now.CachedInfo().Created.Equal(created) {
		return // the same stream: the consumer was removed alone
	}
	if err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		r.d.log.Warn("a results consumer was removed and its stream cannot be read; it is created again where it was", "team", team, "err", err)
		return
	}
	r.mu.Lock()
	if r.streams[team] != s {
		r.mu.Unlock()
		return
	}
	stop := r.stops[team]
	delete(r.streams, team)
	delete(r.stops, team)
	r.mu.Unlock()
	if stop != nil {
		go stop()
	}
	r.d.log.Warn("a team's result stream was removed; its results are consumed again from the stream there now", "team", team)
	if err == nil {
		if _, err := r.stream(ctx, team); err != nil {
			r.d.log.Warn("consuming a team's result stream created again failed; the next call to the team tries again", "team", team, "err", err)
		}
	}
}
