package dispatch

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolrelay/toolrelay/internal/provision"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// The sweep repairs what a dead replica left behind. Every replica runs it;
// everything it does is idempotent or compare-and-set, so sweeping twice is
// harmless.
//
//   - a turn collecting past its deadline (its timer was never armed) is
//     cut off and submitted;
//   - a turn collecting whose results are all recorded (the replica that
//     saw the last one died before closing it) is closed;
//   - a turn collecting for a while is re-armed: its timer and its calls
//     re-published (deduplicated), in case intake died half-way;
//   - a turn stuck in submitting is taken over and submitted again;
//   - a watch whose driver stopped reporting, or stopped with its
//     dispatcher and released it, is driven again;
//   - timers of closed turns are purged.
//
// Open turns are found through their timers: a turn's timer subjects
// (scheduled, then fired) exist from intake until it is submitted or
// failed.
const (
	// stuckAfter is how old an open turn must be before the sweep touches
	// it: a healthy turn is closed by its own replica long before.
	stuckAfter = 15 * time.Second
	// watchStaleAfter is how long a driver may stay silent (drivers save
	// every watchSaveEvery) before another replica drives its watch.
	watchStaleAfter = time.Minute
	// watchSaveEvery is how often a driver saves its watch to show it is
	// alive.
	watchSaveEvery = 20 * time.Second
	// timerGrace is how long past its deadline a collecting turn may stay
	// before the sweep cuts it off itself: its timer fires on the whole
	// second before the deadline and closes it at once.
	timerGrace = 2 * time.Second
	// markersLast is how long after a turn's close the sweep may still
	// see the markers that removed its timer (they expire after a second).
	markersLast = 30 * time.Second
)

func (d *Dispatcher) sweep(ctx context.Context, startup bool) {
	keys, err := d.openTurns(ctx)
	if err != nil {
		d.log.Warn("sweep: listing open turns failed", "err", err)
	}
	now := time.Now()
	sinceLast := now.Sub(d.lastSweep) // the sweeps run one after another
	d.lastSweep = now
	listed := make(map[protocol.TurnKey]bool, len(keys))
	for _, key := range keys {
		if ctx.Err() != nil {
			return
		}
		listed[key] = true
		if t, _ := d.gather.known(key); t != nil && !startup && now.Sub(t.CreatedAt) <= stuckAfter {
			d.sweepYoung(t, now)
			continue
		}
		d.sweepTurn(ctx, key, startup, sinceLast)
	}
	if err == nil {
		d.sweepUnlisted(ctx, listed, now)
	}
	d.sweepWatches(ctx, startup)
}

// sweepYoung sweeps a turn this replica gathers for and took in less than
// stuckAfter ago, as it knows it: nothing about it can be stuck yet (a
// replica submitting it has been for less than stuckAfter), so its record
// is not read. Under load most open turns are young, and reading each
// one's record every sweep was most of the sweep's cost.
func (d *Dispatcher) sweepYoung(t *Turn, now time.Time) {
	if now.After(t.Deadline.Add(timerGrace)) { // a deadline shorter than stuckAfter
		d.cutOffLate(t.Key, "sweep: turn past its deadline; cutting it off")
	}
}

// sweepUnlisted deals with the turns this replica gathers for that are
// missing from the index of open turns: one closed by another replica
// (which removed its timer) while this one waited for results it will
// never see is forgotten, and one still open whose timer was lost is cut
// off at its deadline, as its timer would have.
func (d *Dispatcher) sweepUnlisted(ctx context.Context, listed map[protocol.TurnKey]bool, now time.Time) {
	for _, t := range d.gather.trackedTurns() {
		if listed[t.Key] || now.Sub(t.CreatedAt) <= stuckAfter || ctx.Err() != nil {
			continue // open, or too young to be missing from the listing for long
		}
		key := t.Key
		r, _, err := d.turns.get(ctx, key)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound) || (err == nil && !r.Open()):
			d.closedElsewhere(key)
		case err == nil && r.State == TurnCollecting && now.After(r.Deadline.Add(timerGrace)):
			d.cutOffLate(key, "sweep: turn without a timer past its deadline; cutting it off")
		}
	}
}

// openTurns lists the turns whose timer subjects exist: the open turns.
func (d *Dispatcher) openTurns(ctx context.Context) ([]protocol.TurnKey, error) {
	info, err := d.timers.Info(ctx, jetstream.WithSubjectFilter(provision.TimerSubjectPrefix+".>"))
	if err != nil {
		return nil, err
	}
	seen := map[protocol.TurnKey]bool{}
	var keys []protocol.TurnKey
	for subj := range info.State.Subjects {
		if key, err := parseTimerSubject(subj); err == nil && !seen[key] {
			key = protocol.TurnKey(strings.Clone(string(key))) // not the subject: the listing goes
			seen[key] = true
			keys = append(keys, key)
		}
	}
	return keys, nil
}

// recheckDue reports whether a turn this replica gathers for, open for
// age and last swept sinceLast ago, is due a re-check of its results (a
// stream-info request each): when its age passes stuckAfter,
// then twice that, four times... until the gap is recheckEvery, and every
// recheckEvery after. A turn open for long is read a few times a
// quarter hour, not every sweep; the price is that a turn whose last
// result was seen only by a replica that died at once waits up to
// recheckEvery to be closed (before the deadline, which would close it
// with that result too).
func recheckDue(age, sinceLast time.Duration) bool {
	for at := stuckAfter; at <= age; at = min(2*at, at+recheckEvery) {
		if age-sinceLast < at {
			return true
		}
	}
	return false
}

// recheckEvery is the longest gap between re-checks of a turn this
// replica gathers for.
const recheckEvery = 2 * time.Minute

func (d *Dispatcher) sweepTurn(ctx context.Context, key protocol.TurnKey, startup bool, sinceLast time.Duration) {
	t, rev, err := d.turns.get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		// A timer without a record: intake died in between (or is under
		// way right now, so only old timers are dropped).
		if m, gerr := d.timers.GetLastMsgForSubject(ctx, timerScheduleSubject(key)); gerr != nil || time.Since(m.Time) > stuckAfter {
			d.unindex(key, true)
		}
		return
	}
	if err != nil {
		return
	}
	if !t.Open() {
		if !t.SubmittedAt.IsZero() && time.Since(t.SubmittedAt) < markersLast {
			// Closed a moment ago: what the sweep saw is the roll-up
			// markers its close left, not a timer. Marking it again
			// would keep the markers and fire the timers' consumer.
			d.gather.forget(key)
			return
		}
		d.finished(t, true)
		return
	}
	now := time.Now()
	age := now.Sub(t.CreatedAt)
	switch t.State {
	case TurnCollecting:
		switch {
		case now.After(t.Deadline.Add(timerGrace)):
			d.cutOffLate(key, "sweep: turn past its deadline; cutting it off")
		case startup || age > stuckAfter:
			if !d.gather.tracking(key) || startup {
				d.log.Info("sweep: re-arming turn", "turn", key, "age", age.Round(time.Second))
				d.resumeTurn(ctx, t, rev)
			} else if recheckDue(age, sinceLast) {
				// Its results may be split with a replica that died
				// before closing it: look at the stream, a few times in
				// the turn's life rather than every sweep.
				d.gather.recheckSoon(key)
			}
		}
	case TurnSubmitting:
		if startup || now.Sub(t.SubmittingSince) > stuckAfter {
			d.background(func(ctx context.Context) { d.takeOver(ctx, key) })
		}
	}
}

// sweepWatches drives watches whose driver went silent.
func (d *Dispatcher) sweepWatches(ctx context.Context, startup bool) {
	keys, err := d.watches.ListKeys(ctx)
	if err != nil {
		return
	}
	for k := range keys.Keys() {
		e, err := d.watches.Get(ctx, k)
		if err != nil {
			continue
		}
		var w Watch
		if json.Unmarshal(e.Value(), &w) != nil || w.State != WatchActive {
			continue
		}
		if d.driving(w.ID) || (!startup && !w.Released && time.Since(w.UpdatedAt) < watchStaleAfter) {
			continue
		}
		// Claim it by compare-and-set so one replica revives it.
		w.UpdatedAt, w.Released = time.Now().UTC(), false
		b, _ := json.Marshal(&w)
		if _, err := d.watches.Update(ctx, k, b, e.Revision()); err != nil {
			continue
		}
		d.log.Info("sweep: driving a watch whose driver stopped", "watch", w.ID)
		d.startDriver(&w)
	}
}
