// Package crashpoint lets resilience tests stop a dispatcher at a chosen
// step of a turn (TOOLRELAY_TEST_CRASH_AT). Its hooks are process-wide and
// kept out of the dispatcher's public options: only the dispatcher command
// and tests add them.
//
// It imports only the standard library; pkg/dispatch reports its points and
// cmd/dispatcher installs the hook.
package crashpoint

import (
	"slices"
	"sync"
	"sync/atomic"
)

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

var (
	mu    sync.Mutex
	hooks atomic.Pointer[[]*func(point, process, turn string)]
)

// Add installs f, called in the goroutine doing the work each time a turn
// of the dispatcher named process reaches a point, until remove is
// called. Hooks of several tests run side by side: each looks at its own
// process or turns. f must not block unless it means to stop the process.
func Add(f func(point, process, turn string)) (remove func()) {
	mu.Lock()
	defer mu.Unlock()
	var cur []*func(point, process, turn string)
	if p := hooks.Load(); p != nil {
		cur = *p
	}
	next := append(slices.Clip(cur), &f)
	hooks.Store(&next)
	return func() {
		mu.Lock()
		defer mu.Unlock()
		cur := *hooks.Load()
		i := slices.Index(cur, &f)
		if i < 0 {
			return
		}
		next := slices.Delete(slices.Clone(cur), i, i+1)
		hooks.Store(&next)
	}
}

// Reached reports that turn, of the dispatcher named process, reached
// point.
func Reached(point, process, turn string) {
	if p := hooks.Load(); p != nil {
		for _, f := range *p {
			(*f)(point, process, turn)
		}
	}
}
