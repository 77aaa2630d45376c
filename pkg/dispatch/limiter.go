package dispatch

import (
	"context"
	"sync"
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
func (l *limiter) tryAcquire(team string) (release func(), ok bool) {
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
	return l.releaser(t), true
}

func (l *limiter) releaser(t chan struct{}) func() {
	var once sync.Once
	return func() {
		once.Do(func() { <-l.global; <-t })
	}
}

// acquire waits for a slot of team's and then a global one; release gives
// both back.
func (l *limiter) acquire(ctx context.Context, team string) (release func(), err error) {
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
	return l.releaser(t), nil
}
