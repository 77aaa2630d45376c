package lifecycle

import (
	"errors"
	"fmt"
	"slices"
	"time"
)

// State is where a turn is in its life. It only moves forward:
// collecting → submitting → submitted | failed (a collecting turn may
// also go straight to either end).
type State string

// Turn states.
const (
	Collecting State = "collecting"
	Submitting State = "submitting"
	Submitted  State = "submitted"
	Failed     State = "failed"
)

// Closed reports whether s is an end state.
func (s State) Closed() bool { return s == Submitted || s == Failed }

// The lease's figures. A submission starts only with Ahead left on the
// lease, and another process takes a lease over only Skew after it
// lapsed: a process paused for less than Ahead+Skew between its look at
// the lease and the platform receiving its submission, with clocks apart
// by less than Skew, never submits a turn another process owns.
const (
	// LeaseFor is how long a lease lasts from when it is written.
	LeaseFor = 15 * time.Second
	// Ahead is how much of its lease an owner must have left to start a
	// submission attempt without renewing it first.
	Ahead = 5 * time.Second
	// Skew is how long after a lease lapsed another process may take it.
	Skew = 2 * time.Second
)

// Lease is the right to submit a turn and write its record.
type Lease struct {
	// Owner is the process instance holding the lease; empty once
	// released.
	Owner string
	// Until is when the lease lapses unless renewed.
	Until time.Time
	// Epoch rises by one on every change of owner.
	Epoch uint64
}

// HeldBy reports whether owner holds l at now with at least Ahead left.
func (l Lease) HeldBy(owner string, now time.Time) bool {
	return owner != "" && l.Owner == owner && now.Add(Ahead).Before(l.Until)
}

// Free reports whether a process other than its owner may take l at now:
// released, or lapsed Skew ago.
func (l Lease) Free(now time.Time) bool {
	return l.Owner == "" || !now.Before(l.Until.Add(Skew))
}

// Equal reports whether l and o are the same lease.
func (l Lease) Equal(o Lease) bool {
	return l.Owner == o.Owner && l.Epoch == o.Epoch && l.Until.Equal(o.Until)
}

// next is the lease owner writes at now: renewed if it is owner's
// already (its epoch kept), taken otherwise (its epoch one up).
func (l Lease) next(owner string, now time.Time) Lease {
	epoch := l.Epoch
	if l.Owner != owner {
		epoch++
	}
	return Lease{Owner: owner, Until: now.Add(LeaseFor), Epoch: epoch}
}

// String describes l for logs.
func (l Lease) String() string {
	if l.Owner == "" {
		return fmt.Sprintf("released (epoch %d)", l.Epoch)
	}
	return fmt.Sprintf("%s until %s (epoch %d)", l.Owner, l.Until.UTC().Format(time.RFC3339Nano), l.Epoch)
}

// Rec is what the engine reads and writes of a turn's record: its
// lifecycle fields, and the rest as the Env keeps it.
type Rec struct {
	Key   string
	State State
	Lease Lease
	// Deadline is when the turn is cut off.
	Deadline time.Time
	// CutOff is set when the deadline closed the turn; TimedOut lists
	// the calls submitted as timed out.
	CutOff   bool
	TimedOut []string
	// Error says why a failed turn failed.
	Error string
	// Rev is the record's revision: the compare-and-set's.
	Rev uint64
	// Body is the rest of the record, the Env's; Outcome is what a
	// submission of this process answered (Env.Submit's), written with
	// the end state. The engine carries both and reads neither.
	Body    any
	Outcome any
}

// Clone returns a copy of r that can be changed without changing r.
func (r *Rec) Clone() *Rec {
	c := *r
	c.TimedOut = slices.Clone(r.TimedOut)
	return &c
}

// Errors an Env returns.
var (
	// ErrConflict: the record moved since the revision written at.
	ErrConflict = errors.New("lifecycle: turn record changed concurrently")
	// ErrNotFound: no such record.
	ErrNotFound = errors.New("lifecycle: no such turn")
)

// RetryError is a submission attempt that may be tried again after Wait.
type RetryError struct {
	Wait time.Duration
	Err  error
}

func (e *RetryError) Error() string { return e.Err.Error() }
func (e *RetryError) Unwrap() error { return e.Err }
