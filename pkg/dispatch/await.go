package dispatch

import (
	"context"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolrelay/toolrelay/internal/backoff"
	"github.com/toolrelay/toolrelay/internal/provision"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// Waiting for a turn to close, cancelling one whose run ended, and resuming
// one a stopped process took in: the engine operations a caller that waits
// on a turn (a direct call, a watch's driver) needs.

// While a turn is open, awaitClosed asks the platform whether it still
// waits for it after closedPollFirst, then less and less often, down to
// every closedPollMax: the platform ending a run early is rare, and its
// answer only saves the turn's wait for the deadline. It reads the turn's
// record every recordReadEvery.
const (
	closedPollFirst = 2 * time.Second
	closedPollMax   = 10 * time.Second
	recordReadEvery = time.Second
)

// AwaitClosed waits until the turn key is submitted or failed and returns
// its record. Meanwhile, unless run is the zero Ref, it asks run's platform,
// from every 2 s to every 10 s, whether the run still waits for the turn:
// if the platform cancelled, expired or finished it without the turn's
// results, AwaitClosed returns that observation and no record (the turn is
// still open: [Dispatcher.CancelTurn] closes it). It returns ctx's error
// if ctx ends first. Any replica may close the turn.
func (d *Dispatcher) AwaitClosed(ctx context.Context, key protocol.TurnKey, run Ref) (*Turn, *Observation, error) {
	t, _, ended, err := d.awaitClosed(ctx, key, d.platforms[run.Platform], run)
	return t, ended, err
}

// awaitClosed is AwaitClosed on platform p (nil: no polling), and returns
// the outputs too when this process closed the turn (nil when not known).
//
// Every write of the record is heard as it is published, by a plain
// subscription to its subject, whichever replica writes it; one that
// closes the turn is confirmed by reading the record (a write heard may
// have lost its compare-and-set). The record is also read once the
// subscription is in place, and every recordReadEvery, so a write missed
// (published before the subscription, or while the connection was away)
// costs a second, not the turn. A KV watch would bring the same news,
// through an ordered consumer created and deleted for each wait: on the
// MCP path that was most of a no-op call's time (docs/benchmarks.md).
func (d *Dispatcher) awaitClosed(ctx context.Context, key protocol.TurnKey, p Platform, ref Ref) (*Turn, []Output, *Observation, error) {
	here, stop := d.closing.wait(key)
	defer stop()
	heard := make(chan struct{}, 1)
	if sub, err := d.turns.nc.Subscribe(kvSubject(provision.TurnBucket, string(key)), func(m *nats.Msg) {
		if t, err := decodeTurn(m.Data); err == nil && closedTurn(t) {
			select {
			case heard <- struct{}{}:
			default:
			}
		}
	}); err == nil {
		defer func() { _ = sub.Unsubscribe() }()
	}
	if t, _, err := d.turns.get(ctx, key); err == nil && closedTurn(t) {
		return t, nil, nil, nil
	}
	polls := backoff.Backoff{Initial: closedPollFirst, Max: closedPollMax}
	poll := time.NewTimer(polls.Next())
	defer poll.Stop()
	pollC := poll.C
	if p == nil {
		pollC = nil
	}
	read := time.NewTicker(recordReadEvery)
	defer read.Stop()
	for {
		select {
		case n := <-here:
			return n.turn, n.outputs, nil, nil
		case <-heard:
			if t, _, err := d.turns.get(ctx, key); err == nil && closedTurn(t) {
				return t, nil, nil, nil
			}
		case <-read.C:
			if t, _, err := d.turns.get(ctx, key); err == nil && closedTurn(t) {
				return t, nil, nil, nil
			}
		case <-pollC:
			obs, err := p.Poll(ctx, ref)
			if err == nil && obs.State == ObjectFailed {
				return nil, nil, obs, nil
			}
			if err == nil && obs.State == ObjectDone {
				// Make sure it is not our own submission that finished it:
				// a turn still submitting (its submitted mark not yet
				// stored, as during a failover) or unreadable now is waited
				// for; only a turn nobody began to submit means the run
				// finished without its results.
				t, _, err := d.turns.get(ctx, key)
				switch {
				case err == nil && closedTurn(t):
					return t, nil, nil, nil
				case err == nil && t.State == TurnCollecting && t.lease.Owner == "" && t.lease.Epoch == 0:
					// Created with no lease, and nobody began to submit it:
					// the run finished without the calls' results.
					return nil, nil, &Observation{State: ObjectFailed, Reason: "the platform finished the run without the calls' results"}, nil
				case err == nil && t.lease.Free(time.Now()):
					// Its owner went, maybe after submitting it with no
					// write (docs/turns.md): the engine takes it over and
					// submits it again, which the platform, done with the
					// run, answers as already submitted.
					d.engine.Close(string(key))
				}
			}
			poll.Reset(polls.Next())
		case <-ctx.Done():
			return nil, nil, nil, ctx.Err()
		}
	}
}

// closedTurn reports whether t is submitted or failed.
func closedTurn(t *Turn) bool { return t.State == TurnSubmitted || t.State == TurnFailed }

// CancelTurn fails the turn key, if it is still collecting, because the
// platform ended its run (reason says how): nothing can be submitted any
// more. The record's error reads "not submitted: " and reason, and the
// executors of its calls are told, so running handlers are cancelled and
// queued calls skip. It reports whether it cancelled the turn (false: it
// was closed already, or the record could not be changed). A turn another
// replica owns is cancelled once its lease lapses, if it is still
// collecting then (docs/turns.md).
func (d *Dispatcher) CancelTurn(ctx context.Context, key protocol.TurnKey, reason string) bool {
	if !d.cancelTurn(ctx, key, "not submitted: "+reason, reason) {
		return false
	}
	d.log.Warn("turn cancelled: the platform ended the run", "turn", key, "reason", reason)
	return true
}

// cancelTurn is CancelTurn with the record's error errMsg, and reason
// what the executors are told.
func (d *Dispatcher) cancelTurn(ctx context.Context, key protocol.TurnKey, errMsg, reason string) bool {
	done := make(chan bool, 1)
	d.engine.Cancel(string(key), errMsg, func(ok bool) { done <- ok })
	var cancelled bool
	select {
	case cancelled = <-done:
	case <-ctx.Done():
		return false
	}
	if !cancelled {
		return false
	}
	t, _, err := d.turns.get(ctx, key)
	if err != nil {
		return true
	}
	teams := map[string]bool{}
	for _, c := range t.Calls {
		if c.published() && c.Team != protocol.SystemTeam && !teams[c.Team] {
			teams[c.Team] = true
			if _, err := d.js.Publish(ctx, protocol.CancelSubject(c.Team, key), []byte(reason),
				jetstream.WithMsgID(protocol.CancelMsgID(key, c.Team))); err != nil {
				d.log.Warn("telling executors of a cancelled turn failed", "turn", key, "team", c.Team, "err", err)
			}
		}
	}
	d.emit(Event{Kind: EventTurnFailed, Turn: t})
	return true
}

// Resume returns the record of the turn key and makes sure it is worked
// on: a turn still collecting that this process does not gather results
// for (taken in by a process that stopped mid-intake, whose calls may
// never have gone out) has its deadline re-armed and its calls without a
// result published again now, deduplicated, rather than when the sweep
// finds it. It returns an error wrapping ErrNotFound if there is no
// such turn.
func (d *Dispatcher) Resume(ctx context.Context, key protocol.TurnKey) (*Turn, error) {
	t, rev, err := d.turns.get(ctx, key)
	if err != nil {
		return nil, notFound("turn", string(key), err)
	}
	if t.State == TurnCollecting && !d.gather.tracking(key) {
		d.resumeTurn(ctx, t, rev, nil)
	}
	return t, nil
}
