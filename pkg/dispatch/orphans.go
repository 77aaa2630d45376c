package dispatch

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/toolrelay/toolrelay/internal/backoff"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// An orphaned call is a call of an open turn whose function no executor
// serves any more: its last executor stopped (and withdrew its
// declaration) or died (and its lease lapsed) after the call was taken in.
// Nothing will run it, so waiting for the turn's deadline would keep a
// model waiting minutes for nothing. Each replica looks at the turns it
// gathers for: a call whose function has had no live declaration for
// Options.ServeGrace (the same wait intake gives a function nobody
// serves; 10 s when the last lease lapsed unrenewed rather than was
// withdrawn, as intake waits then too) gets a failed result, unavailable,
// recorded first-wins like any result. An executor that comes back within the grace runs the call; one
// that comes back later finds the result recorded and skips the call.

// orphanScan is how often a replica looks for orphaned calls when the
// registry does not change (a lease past its expiry here, unrenewed, is
// noticed by time, not by an event).
const orphanScan = time.Second

// orphanGap is the least time between two scans.
const orphanGap = 200 * time.Millisecond

// orphans remembers, between scans, since when each function with open
// calls has been unserved, and which calls were failed already.
type orphans struct {
	unserved map[fnKey]time.Time       // unserved since
	failed   map[protocol.CallKey]bool // failed here, result on its way
	// walks counts the scans that looked at the open calls: only those
	// that found a function with open calls unserved.
	walks int
}

// fnKey names a function of a team.
type fnKey struct{ team, name string }

// orphanCandidate is an open call without a result here.
type orphanCandidate struct {
	turn *Turn
	i    int
}

// watchOrphans fails orphaned calls (see above) until the returned stop is
// called or ctx ends; stop waits for a scan under way.
func (d *Dispatcher) watchOrphans(ctx context.Context) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		o := &orphans{unserved: map[fnKey]time.Time{}, failed: map[protocol.CallKey]bool{}}
		wait := time.NewTimer(orphanScan)
		defer wait.Stop()
		for {
			d.registry.mu.RLock()
			changed := d.registry.changed
			d.registry.mu.RUnlock()
			select {
			case <-ctx.Done():
				return
			case <-changed:
			case <-wait.C:
			}
			due := d.failOrphans(ctx, o, time.Now())
			// Next when a grace ends, or after orphanScan at the latest.
			wait.Reset(orphanScan)
			if !due.IsZero() {
				wait.Reset(min(orphanScan, max(time.Until(due), orphanGap)))
			}
			// Every renewal of every declaration is a change: scan at
			// most every orphanGap, however busy the registry.
			if !backoff.Sleep(ctx, orphanGap) {
				return
			}
		}
	})
	return func() { cancel(); wg.Wait() }
}

// failOrphans makes one scan: it records a failure for each open call
// whose function has been unserved for ServeGrace by now. Most scans find
// every function served, and cost a registry look-up per function the
// open turns call (the gatherer counts them as it tracks and forgets
// turns) and none per call: at 100,000 open turns a walk of their calls
// every scan was a sixth of the dispatcher's CPU. Only a scan that finds
// one unserved walks the open calls, for those of the unserved.
//
// It returns when the earliest grace still running ends (zero: none runs).
func (d *Dispatcher) failOrphans(ctx context.Context, o *orphans, now time.Time) (due time.Time) {
	if !d.registry.loaded.Load() {
		return time.Time{} // who serves what is not known yet
	}
	var unserved map[fnKey]bool
	for _, fn := range d.gather.functions() {
		if !d.served(fn.name, fn.team) {
			if unserved == nil {
				unserved = map[fnKey]bool{}
			}
			unserved[fn] = true
		}
	}
	var open map[fnKey][]orphanCandidate // open calls of unserved functions
	seen := map[protocol.CallKey]bool{}  // failed calls still open
	if unserved != nil {
		o.walks++
		open = d.unservedCalls(o, unserved, seen)
	}
	for k := range o.failed { // results arrived, or turns closed
		if !seen[k] {
			delete(o.failed, k)
		}
	}
	for fn := range o.unserved { // served again, or no open call left
		if _, ok := open[fn]; !ok {
			delete(o.unserved, fn)
		}
	}
	for fn, calls := range open {
		since, ok := o.unserved[fn]
		if !ok {
			since = now
			o.unserved[fn] = now
		}
		// A function whose lease lapsed unrenewed (rather than withdrawn)
		// is waited for as intake waits for it: its executors are likelier
		// cut off while a server fails over than gone.
		grace := d.opts.ServeGrace
		if d.registry.lapsedLately(fn.name, fn.team) {
			grace = max(grace, d.unavailableFor)
		}
		if now.Sub(since) < grace {
			if end := since.Add(grace); due.IsZero() || end.Before(due) {
				due = end
			}
			continue
		}
		d.log.WarnContext(ctx, "no executor serves the function any more; failing its open calls as unavailable",
			"team", fn.team, "fn", fn.name, "calls", len(calls), "unserved_for", now.Sub(since).Round(time.Millisecond).String())
		for _, oc := range calls {
			c := &oc.turn.Calls[oc.i]
			o.failed[c.Key] = true
			d.recordFailure(ctx, oc.turn, c, orphaned(c.Name))
		}
	}
	return due
}

// unservedCalls returns the open calls of the unserved functions without
// a result here, leaving out those failed already, which it marks in seen.
func (d *Dispatcher) unservedCalls(o *orphans, unserved map[fnKey]bool, seen map[protocol.CallKey]bool) map[fnKey][]orphanCandidate {
	var open map[fnKey][]orphanCandidate
	for _, t := range d.gather.trackedTurns() {
		if t.State != TurnCollecting {
			continue
		}
		for i := range t.Calls {
			c := &t.Calls[i]
			fn := fnKey{c.Team, c.Name}
			if !unserved[fn] || !c.published() || c.Approval || d.gather.local(t.Key, c.Key) != nil {
				continue // a held call is queued nowhere; its auto-deny ends it
			}
			if o.failed[c.Key] {
				seen[c.Key] = true
				continue
			}
			if open == nil {
				open = map[fnKey][]orphanCandidate{}
			}
			open[fn] = append(open[fn], orphanCandidate{turn: t, i: i})
		}
	}
	return open
}

// served reports whether a live executor of team serves name now.
func (d *Dispatcher) served(name, team string) bool {
	d.registry.mu.RLock()
	defer d.registry.mu.RUnlock()
	return len(d.registry.liveOf(name, team)) > 0
}

// orphaned is the failure of a call whose function lost its last executor
// while the call waited.
func orphaned(name string) *protocol.CallError {
	return &protocol.CallError{Code: protocol.CodeUnavailable,
		Message: fmt.Sprintf("%s is unavailable: no executor is serving it right now (the last one went away before answering this call). Continue without it, or try again later.", name)}
}
