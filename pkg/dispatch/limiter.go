package dispatch

import (
	"context"
	"sync"
	"sync/atomic"
)

// limiter bounds the calls being published: at most max in flight overall
// and at most perTeam for any one team, so one team's burst takes its share
// of the pipe and never all of it. Waiters are served in arrival order.
type limiter struct {
	global  chan struct{}
	perTeam int

	mu    sync.Mutex
	teams map[string]chan struct{}
}

func newLimiter(max, perTeam int) *limiter {
	return &limiter{global: make(chan struct{}, max), perTeam: min(perTeam, max), teams: map[string]chan struct{}{}}
}

func (l *limiter) team(name string) chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	ch := l.teams[name]
	if ch == nil {
		ch = make(chan struct{}, l.perTeam)
		l.teams[name] = ch
	}
	return ch
}

// tryAcquire takes a slot of team's and a global one if both are free at
// once; ok is false otherwise.
func (l *limiter) tryAcquire(team string) (s *slot, ok bool) {
	t := l.team(team)
	select {
	case t <- struct{}{}:
	default:
		return nil, false
	}
	select {
	case l.global <- struct{}{}:
	default:
		<-t
		return nil, false
	}
	return &slot{l: l, team: t}, true
}

// slot is a team's slot and a global one, held until released.
type slot struct {
	l        *limiter
	team     chan struct{}
	released atomic.Bool
}

// release gives the slots back; releasing again does nothing.
func (s *slot) release() {
	if s.released.CompareAndSwap(false, true) {
		<-s.l.global
		<-s.team
	}
}

// acquire waits for a slot of team's and then a global one.
func (l *limiter) acquire(ctx context.Context, team string) (*slot, error) {
	if err := ctx.Err(); err != nil {
		return nil, err // stopping: a free slot must not win the select by chance
	}
	t := l.team(team)
	select {
	case t <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	select {
	case l.global <- struct{}{}:
	case <-ctx.Done():
		<-t
		return nil, ctx.Err()
	}
	return &slot{l: l, team: t}, nil
}
