package exec

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// cancels tracks the turns the dispatcher cancelled, so running handlers of
// such a turn are cancelled and its queued calls do not run.
type cancels struct {
	mu    sync.Mutex
	turns map[protocol.TurnKey]cancellation
	// running holds the calls running here, each with what cancels it.
	// A cancellation is rare and the calls running at once are few, so
	// it looks through them all; each call costs one map entry.
	running map[protocol.CallKey]context.CancelCauseFunc
}

// cancellation is a turn's cancellation: when it came, and why, as the
// dispatcher put it ("the MCP client cancelled the call", the platform's
// reason); empty if it gave none.
type cancellation struct {
	at     time.Time
	reason string
}

// maxCancelReason bounds the reason kept from a cancellation's body.
const maxCancelReason = 200

func newCancels() *cancels {
	return &cancels{turns: map[protocol.TurnKey]cancellation{}, running: map[protocol.CallKey]context.CancelCauseFunc{}}
}

// cancelled reports whether turn was cancelled, and why, for the model:
// the dispatcher's reason, or "the platform ended the run" if it gave
// none.
func (c *cancels) cancelled(turn protocol.TurnKey) (why string, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	k, ok := c.turns[turn]
	return cancelReason(k.reason), ok
}

func cancelReason(reason string) string {
	if reason == "" {
		return "the platform ended the run"
	}
	return reason
}

func (c *cancels) cancel(turn protocol.TurnKey, reason string) {
	if r := []rune(strings.TrimSpace(reason)); len(r) > maxCancelReason {
		reason = string(r[:maxCancelReason]) + "…"
	} else {
		reason = string(r)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	c.turns[turn] = cancellation{at: now, reason: reason}
	for t, k := range c.turns {
		if now.Sub(k.at) > protocol.CancelMemory {
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
			c.cancel(turn, string(msg.Data()))
		}
	})
	if err != nil {
		return nil, err
	}
	return cc.Stop, nil
}
