// Package crashpoint lets resilience tests stop a dispatcher at a chosen
// step of a turn (TOOLRELAY_TEST_CRASH_AT). It is a process-wide hook kept
// out of the dispatcher's public options: only the dispatcher command sets
// it, and only for tests.
//
// It imports only the standard library; pkg/dispatch reports its points and
// cmd/dispatcher installs the hook.
package crashpoint

import "sync/atomic"

// Points of a turn's life where a dispatcher may be stopped, in order.
const (
	// Intake: the turn is recorded; no call is published yet.
	Intake = "intake"
	// Fanout: every call is published.
	Fanout = "fanout"
	// Gather: a result was taken in; the turn may not be complete.
	Gather = "gather"
	// Submitted: the platform accepted the outputs; the turn is not yet
	// marked submitted.
	Submitted = "submitted"
)

// Valid reports whether point names one of the points above.
func Valid(point string) bool {
	switch point {
	case Intake, Fanout, Gather, Submitted:
		return true
	}
	return false
}

var hook atomic.Pointer[func(point, turn string)]

// Set installs f, called in the goroutine doing the work each time a turn
// reaches a point; nil removes it. f must not block unless it means to
// stop the process.
func Set(f func(point, turn string)) {
	if f == nil {
		hook.Store(nil)
		return
	}
	hook.Store(&f)
}

// Reached reports that turn reached point.
func Reached(point, turn string) {
	if f := hook.Load(); f != nil {
		(*f)(point, turn)
	}
}
