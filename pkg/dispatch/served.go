package dispatch

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolrelay/toolrelay/internal/backoff"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// servedCache answers "does any executor serve this function right now?"
// from the function's consumer: it exists, and executors are pulling from
// it (waiting pull requests) or working on it (pending acks). Positive
// answers are cached briefly, so the question costs one request per
// function per second, not one per call.
type servedCache struct {
	js jetstream.JetStream

	mu   sync.Mutex
	seen map[string]time.Time // team/function → last time found served
}

const servedTTL = time.Second

func newServedCache(js jetstream.JetStream) *servedCache {
	return &servedCache{js: js, seen: map[string]time.Time{}}
}

// served reports whether team's function has executors, waiting up to
// grace for one to appear (an executor starting, or reconnecting).
func (s *servedCache) served(ctx context.Context, team, function string, grace time.Duration) (bool, error) {
	key := team + "/" + function
	s.mu.Lock()
	at, ok := s.seen[key]
	s.mu.Unlock()
	if ok && time.Since(at) < servedTTL {
		return true, nil
	}
	deadline := time.Now().Add(grace)
	for {
		ok, err := s.check(ctx, team, function)
		if err != nil {
			return false, err
		}
		if ok {
			s.mu.Lock()
			s.seen[key] = time.Now()
			s.mu.Unlock()
			return true, nil
		}
		if !time.Now().Before(deadline) {
			return false, nil
		}
		backoff.Sleep(ctx, min(200*time.Millisecond, time.Until(deadline)))
		if ctx.Err() != nil {
			return false, ctx.Err()
		}
	}
}

func (s *servedCache) check(ctx context.Context, team, function string) (bool, error) {
	c, err := s.js.Consumer(ctx, protocol.CallStream(team), function)
	if errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrStreamNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	info := c.CachedInfo()
	return info.NumWaiting > 0 || info.NumAckPending > 0, nil
}
