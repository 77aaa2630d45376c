package dispatch

import (
	"context"
	"errors"
	"fmt"
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
	stops   []func()
	// consuming is the context consumers run under, nil until start and
	// after stop: a team first seen then gets its stream but no consumer.
	consuming context.Context
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
)

func newResultStreams(d *Dispatcher) *resultStreams {
	return &resultStreams{d: d, streams: map[string]jetstream.Stream{}}
}

// start consumes every existing result stream, and the dispatcher's own,
// handing results to handle until stop.
func (r *resultStreams) start(ctx context.Context, handle jetstream.MessageHandler) error {
	r.mu.Lock()
	r.handle = handle
	r.consuming = ctx
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
		if _, err := r.stream(ctx, team); err != nil {
			return err
		}
	}
	return nil
}

// stream returns team's result stream, creating it and starting its
// consumer if this replica has not yet.
func (r *resultStreams) stream(ctx context.Context, team string) (jetstream.Stream, error) {
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
		stop, err := r.consume(r.consuming, s)
		if err != nil {
			return nil, fmt.Errorf("dispatch: consume results of team %s: %w", team, err)
		}
		r.stops = append(r.stops, stop)
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
	r.stops, r.consuming = nil, nil
	r.streams = map[string]jetstream.Stream{}
	r.mu.Unlock()
	for _, stop := range stops {
		stop()
	}
}

// consume hands this replica every result recorded in s from now on, in
// order, until stop; stop returns once handle is no longer called.
func (r *resultStreams) consume(ctx context.Context, s jetstream.Stream) (stop func(), err error) {
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		NamePrefix:        resultsConsumer + "_" + replicaDigest(leaseInstance(r.d.instance)),
		DeliverPolicy:     jetstream.DeliverNewPolicy,
		InactiveThreshold: resultsInactive,
	})
	if err != nil {
		return nil, err
	}
	cc, err := cons.Consume(r.handle, jetstream.PullMaxMessages(resultsBatch),
		jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
			if !errors.Is(err, jetstream.ErrNoHeartbeat) {
				r.d.log.Warn("consuming results", "stream", s.CachedInfo().Config.Name, "err", err)
			}
		}))
	if err != nil {
		return nil, err
	}
	return func() { cc.Stop(); <-cc.Closed() }, nil
}
