package dispatch

import (
	"strconv"
	"testing"
	"time"

	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// A turn closed here is remembered for the window and forgotten after it,
// and what is remembered stays about one window's worth of closes, however
// long the replica runs.
func TestRecentlyClosedKeepsOneWindow(t *testing.T) {
	r := newRecentlyClosed(5 * time.Second)
	start := time.Now()
	key := func(i int) protocol.TurnKey { return protocol.TurnKey("responses.resp_" + strconv.Itoa(i)) }
	r.add(key(0), start)
	r.add(key(0), start.Add(time.Second)) // closed twice (a sweep's finish): remembered from the first
	if !r.has(key(0), start.Add(5*time.Second)) {
		t.Fatal("a turn closed 5 s ago is forgotten within the 5 s window")
	}
	if r.has(key(1), start) {
		t.Fatal("a turn never closed here is remembered")
	}
	if r.has(key(0), start.Add(5*time.Second+time.Millisecond)) {
		t.Fatal("a turn closed just over 5 s ago is still remembered")
	}
	// A close every millisecond for a minute: one window's worth stays.
	for i := range 60_000 {
		r.add(key(i), start.Add(time.Duration(i)*time.Millisecond))
	}
	end := start.Add(60 * time.Second)
	if !r.has(key(59_999), end) || !r.has(key(55_000), end) || r.has(key(54_998), end) {
		t.Fatal("the window holds the wrong closes")
	}
	if len(r.set) > 5002 || len(r.queue) != len(r.set) || cap(r.queue) > 4*5002 {
		t.Fatalf("after a minute of closes: %d remembered, queue %d (capacity %d); want about 5000", len(r.set), len(r.queue), cap(r.queue))
	}
}
