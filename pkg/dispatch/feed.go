package dispatch

import (
	"context"
	"errors"
	"time"
)

// ErrFellBehind is returned by [TurnFeed.Next] when its reader fell too far
// behind the changes: the feed has ended, and a reader starts again from a
// fresh snapshot.
var ErrFellBehind = errors.New("dispatch: the turn feed's reader fell behind")

// TurnFeed delivers every change of the turns a query selects, as seen
// after [Dispatcher.FollowTurns] returned it. One goroutine reads it.
type TurnFeed struct {
	caller Caller
	q      TurnQuery
	sub    *subscriber
	run    context.Context // ends when the dispatcher stops
	stop   func()
}

// FollowTurns returns the open turns caller may see that q selects (a
// snapshot, as [Dispatcher.InspectTurns] with q.OpenOnly) and a feed of
// every later change of a turn caller may see that q selects, open or
// closed: q.Outcome applies to the snapshot only, so a reader sees a turn
// close. Nothing falls between the snapshot and the feed. The feed ends
// when the dispatcher stops; Close releases it. Errors are those of
// InspectTurns.
func (d *Dispatcher) FollowTurns(ctx context.Context, caller Caller, q TurnQuery) (*TurnList, *TurnFeed, error) {
	if err := d.inspect.ensure(ctx); err != nil {
		return nil, nil, err
	}
	run, stopRun := d.withRunContext(context.WithoutCancel(ctx))
	sub, cancel := d.inspect.subscribe() // before the snapshot: nothing falls in between
	q.OpenOnly = true
	list, err := d.InspectTurns(ctx, caller, q)
	if err != nil {
		cancel()
		stopRun()
		return nil, nil, err
	}
	q.Outcome = ""
	return list, &TurnFeed{caller: caller, q: q, sub: sub, run: run, stop: func() { cancel(); stopRun() }}, nil
}

// Next blocks until the next change the feed selects and returns the turn
// as its caller may see it (without its calls' results). It returns
// ErrFellBehind once the reader fell behind, ErrNotRunning once the
// dispatcher stops, and ctx's error when ctx ends first (the feed goes on).
func (f *TurnFeed) Next(ctx context.Context) (TurnView, error) {
	for {
		select {
		case t := <-f.sub.ch:
			if f.q.matches(f.caller, t) {
				return view(f.caller, t, time.Now()), nil
			}
		case <-f.sub.lost:
			return TurnView{}, ErrFellBehind
		case <-f.run.Done():
			return TurnView{}, ErrNotRunning
		case <-ctx.Done():
			return TurnView{}, ctx.Err()
		}
	}
}

// Close ends the feed. It is safe to call more than once.
func (f *TurnFeed) Close() { f.stop() }
