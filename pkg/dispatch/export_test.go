package dispatch

import (
	"context"
	"errors"
	"time"

	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// Tracking reports, for tests, whether d gathers results for the turn.
func Tracking(d *Dispatcher, key protocol.TurnKey) bool { return d.gather.tracking(key) }

// LiveSchemas is, for tests, how many distinct schemas the live executors
// of a function declare in d's view of the registry (0: none serves it).
func LiveSchemas(d *Dispatcher, function string) int {
	for _, f := range d.registry.fleet() {
		if f.function == function {
			return int(f.schemas)
		}
	}
	return 0
}

// ErrConflict is, for tests, what writing a record another intake stored
// first returns.
var ErrConflict = errConflict

// EarlyIntake is, for tests, the first half of a young turn's intake: the
// turn resolved and tracked early, its calls published, its record not
// written (StoreRecord and Settle are the rest).
func EarlyIntake(ctx context.Context, d *Dispatcher, req *TurnRequest) (*Turn, error) {
	t := d.newTurn(req, req.Key(), time.Now())
	_, checked, err := d.resolveCalls(ctx, t, req.Calls)
	if err != nil {
		return nil, err
	}
	t.Key = t.Calls[0].Key.Turn()
	if !d.gather.trackEarly(t) {
		return nil, errors.New("the turn is tracked already")
	}
	d.publishCalls(ctx, t, nil, checked)
	return t, nil
}

// StoreRecord writes t's record, for tests, and returns its revision.
func StoreRecord(ctx context.Context, d *Dispatcher, t *Turn) (uint64, error) {
	return d.turns.create(ctx, t)
}

// Settle is, for tests, the end of an early intake whose record write
// ended with err.
func Settle(ctx context.Context, d *Dispatcher, key protocol.TurnKey, rev uint64, err error) {
	d.gather.settle(ctx, key, rev, err)
}

// Track starts gathering for t, stored at rev, as an intake does once
// its record is stored.
func Track(d *Dispatcher, t *Turn, rev uint64) { d.gather.track(t, rev) }

// HeldResults is, for tests, how many results d holds for a turn tracked
// early.
func HeldResults(d *Dispatcher, key protocol.TurnKey) int {
	d.gather.mu.Lock()
	defer d.gather.mu.Unlock()
	if st := d.gather.turns[key]; st != nil {
		return len(st.held)
	}
	return 0
}
