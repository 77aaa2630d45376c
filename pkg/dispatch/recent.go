package dispatch

import (
	"sync"
	"time"

	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// recentlyClosed remembers the turns this replica removed from the index
// of open turns in the last few seconds. The roll-up markers that remove
// a turn's timer stay on its subjects for a second, so a sweep lists the
// turns closed just before it as open, and used to read each one's record
// only to find it closed: at thousands of turns a second, most of the
// records a sweep read.
type recentlyClosed struct {
	keep time.Duration

	mu    sync.Mutex
	set   map[protocol.TurnKey]struct{}
	queue []closedAt // in the order added, so the oldest go first
}

type closedAt struct {
	key protocol.TurnKey
	at  time.Time
}

// recentlyClosedFor is how long a closed turn is remembered: well past
// the markers' second, and the time a listing takes.
const recentlyClosedFor = 5 * time.Second

func newRecentlyClosed(keep time.Duration) *recentlyClosed {
	return &recentlyClosed{keep: keep, set: map[protocol.TurnKey]struct{}{}}
}

// add remembers key, closed now, and forgets what was closed before the
// window.
func (r *recentlyClosed) add(key protocol.TurnKey, now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.expire(now)
	if _, ok := r.set[key]; ok {
		return
	}
	r.set[key] = struct{}{}
	r.queue = append(r.queue, closedAt{key, now})
}

// has reports whether key was closed here within the window.
func (r *recentlyClosed) has(key protocol.TurnKey, now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.expire(now)
	_, ok := r.set[key]
	return ok
}

// expire forgets what was closed before the window; r.mu is held.
func (r *recentlyClosed) expire(now time.Time) {
	n := 0
	for n < len(r.queue) && now.Sub(r.queue[n].at) > r.keep {
		delete(r.set, r.queue[n].key)
		n++
	}
	if n == 0 {
		return
	}
	clear(r.queue[:n]) // let the keys go
	r.queue = r.queue[n:]
}
