package exec

import (
	"context"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// cancels tracks the turns the dispatcher cancelled, so running handlers of
// such a turn are cancelled and its queued calls do not run.
type cancels struct {
	mu    sync.Mutex
	turns map[protocol.TurnKey]time.Time
	// running holds the calls running here, each with what cancels it.
	// A cancellation is rare and the calls running at once are few, so
	// it looks through them all; each call costs one map entry.
	running map[protocol.CallKey]context.CancelCauseFunc
}

func newCancels() *cancels {
	return &cancels{turns: map[protocol.TurnKey]time.Time{}, running: map[protocol.CallKey]context.CancelCauseFunc{}}
}

func (c *cancels) cancelled(turn protocol.TurnKey) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.turns[turn]
	return ok
}

func (c *cancels) cancel(turn protocol.TurnKey) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	c.turns[turn] = now
	for t, at := range c.turns {
		if now.Sub(at) > protocol.CancelMemory {
			delete(c.turns, t)
		}
	}
	for key, stop := range c.running {
		if key.Turn() == turn {
			stop(ErrCallCancelled)
		}
	}
}

// track derives the context a call runs under, cancelled if its turn is.
func (c *cancels) track(ctx context.Context, key protocol.CallKey) (context.Context, func()) {
	ctx, stop := context.WithCancelCause(ctx)
	turn := key.Turn()
	c.mu.Lock()
	c.running[key] = stop
	_, gone := c.turns[turn]
	c.mu.Unlock()
	if gone {
		stop(ErrCallCancelled)
	}
	return ctx, func() {
		c.mu.Lock()
		delete(c.running, key)
		c.mu.Unlock()
		stop(nil)
	}
}

// follow applies the cancellations sent to team, starting far enough back
// to learn of every turn still alive, until the returned stop is called.
// s is the cancel stream (provision.CancelStreamConfig).
func (c *cancels) follow(ctx context.Context, s jetstream.Stream, team string) (stop func(), err error) {
	since := time.Now().Add(-protocol.CancelMemory)
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{protocol.TeamCancelFilter(team)},
		DeliverPolicy:  jetstream.DeliverByStartTimePolicy,
		OptStartTime:   &since,
	})
	if err != nil {
		return nil, err
	}
	cc, err := cons.Consume(func(msg jetstream.Msg) {
		if _, turn, err := protocol.ParseCancelSubject(msg.Subject()); err == nil {
			c.cancel(turn)
		}
	})
	if err != nil {
		return nil, err
	}
	return cc.Stop, nil
}
