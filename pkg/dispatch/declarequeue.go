package dispatch

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// Declarations are taken in per team, so that one team's flood cannot
// delay another team's renewals (which would let its declarations lapse and
// its calls fail as unavailable). The subscription's handler only hands each
// request to its team's queue, bounded in requests
// (Options.DeclareQueuePerTeam) and bytes (declareQueueBytes); a worker per
// team, started with the team's first request and ended when the team has
// been quiet for declareWorkerIdle, takes them in one at a time. Of what
// waits, requests that only renew declarations live already go first: new
// declarations of a team (a deploy starting many processes) cannot starve
// the renewals of its processes running. A full queue answers at once with
// a DeclareReply error saying so, which executors send again shortly, as
// for any error of the dispatcher.

const (
	// declareQueueBytes bounds the bytes of one team's waiting requests.
	declareQueueBytes = 4 << 20
	// declareQueuesBytes bounds the bytes of all teams' waiting requests.
	declareQueuesBytes = 64 << 20
	// declareTeamsMax bounds the teams with a queue at once.
	declareTeamsMax = 1024
	// declareWorkers bounds the requests taken in at once, all teams
	// together; each team's worker takes one at a time.
	declareWorkers = 16
	// declareWorkerIdle is how long a team's worker waits for its next
	// request before it ends.
	declareWorkerIdle = time.Minute
)

// declareQueues are the per-team queues of one replica.
type declareQueues struct {
	ctx   context.Context
	take  func(ctx context.Context, team string, req *protocol.DeclareRequest) *protocol.DeclareReply
	renew func(req *protocol.DeclareRequest) bool // renews only declarations live already
	busy  func(team string)
	depth int
	sem   chan struct{}
	wg    sync.WaitGroup

	mu    sync.Mutex
	teams map[string]*teamQueue
	bytes int
}

// teamQueue is one team's waiting requests: pending has not been looked
// at yet, its worker holds the others; count and bytes include both.
type teamQueue struct {
	pending []*nats.Msg
	count   int
	bytes   int
	wake    chan struct{}
}

// declareJob is a request its team's worker has decoded.
type declareJob struct {
	m   *nats.Msg
	req *protocol.DeclareRequest
	err error
}

// enqueue is the subscription's handler: it hands m to its team's queue,
// or answers at once when it is malformed or the queue is full.
func (q *declareQueues) enqueue(m *nats.Msg) {
	team, err := protocol.ParseDeclareSubject(m.Subject)
	if err != nil {
		respondDeclare(m, &protocol.DeclareReply{Version: protocol.Version, Error: err.Error()})
		return
	}
	q.mu.Lock()
	t := q.teams[team]
	full := ""
	switch {
	case t == nil && len(q.teams) >= declareTeamsMax:
		full = fmt.Sprintf("%d teams have declarations waiting here, the most this dispatcher takes", declareTeamsMax)
	case t != nil && t.count >= q.depth:
		full = fmt.Sprintf("team %q has %d declare requests waiting here, the most it may (TOOLRELAY_DECLARE_QUEUE_PER_TEAM)", team, t.count)
	case t != nil && t.bytes+len(m.Data) > declareQueueBytes:
		full = fmt.Sprintf("team %q has %d bytes of declare requests waiting here, the most it may (%d)", team, t.bytes, declareQueueBytes)
	case q.bytes+len(m.Data) > declareQueuesBytes:
		full = fmt.Sprintf("%d bytes of declare requests are waiting here, the most this dispatcher takes (%d)", q.bytes, declareQueuesBytes)
	}
	if full != "" {
		q.mu.Unlock()
		q.busy(team)
		respondDeclare(m, &protocol.DeclareReply{Version: protocol.Version, Error: "dispatcher busy: " + full + "; send the request again shortly"})
		return
	}
	if t == nil {
		t = &teamQueue{wake: make(chan struct{}, 1)}
		q.teams[team] = t
		q.wg.Go(func() { q.work(team, t) })
	}
	t.pending = append(t.pending, m)
	t.count++
	t.bytes += len(m.Data)
	q.bytes += len(m.Data)
	q.mu.Unlock()
	select {
	case t.wake <- struct{}{}:
	default:
	}
}

// work takes team's requests in until the team has been quiet for
// declareWorkerIdle or the queues stop.
func (q *declareQueues) work(team string, t *teamQueue) {
	var renewals, others []declareJob
	idle := time.NewTimer(declareWorkerIdle)
	defer idle.Stop()
	for {
		q.mu.Lock()
		arrived := t.pending
		t.pending = nil
		q.mu.Unlock()
		for _, m := range arrived {
			j := declareJob{m: m}
			j.req, j.err = protocol.DecodeDeclareRequest(team, m.Data)
			if j.err == nil && q.renew(j.req) {
				renewals = append(renewals, j)
			} else {
				others = append(others, j)
			}
		}
		var j declareJob
		switch {
		case len(renewals) > 0:
			j, renewals = renewals[0], renewals[1:]
		case len(others) > 0:
			j, others = others[0], others[1:]
		default:
			idle.Reset(declareWorkerIdle)
			select {
			case <-t.wake:
				continue
			case <-q.ctx.Done():
				return
			case <-idle.C:
			}
			q.mu.Lock()
			if t.count == 0 {
				delete(q.teams, team)
				q.mu.Unlock()
				return
			}
			q.mu.Unlock()
			continue
		}
		q.serve(team, j)
		q.mu.Lock()
		t.count--
		t.bytes -= len(j.m.Data)
		q.bytes -= len(j.m.Data)
		q.mu.Unlock()
		if q.ctx.Err() != nil {
			return
		}
	}
}

// serve takes one request in and answers it.
func (q *declareQueues) serve(team string, j declareJob) {
	reply := &protocol.DeclareReply{Version: protocol.Version}
	if j.err != nil {
		reply.Error = j.err.Error()
		respondDeclare(j.m, reply)
		return
	}
	select {
	case q.sem <- struct{}{}:
	case <-q.ctx.Done():
		return
	}
	reply = q.take(q.ctx, team, j.req)
	<-q.sem
	respondDeclare(j.m, reply)
}

// wait waits for the workers, which end with q.ctx.
func (q *declareQueues) wait() { q.wg.Wait() }

func respondDeclare(m *nats.Msg, reply *protocol.DeclareReply) {
	b, _ := json.Marshal(reply)
	_ = m.Respond(b)
}
