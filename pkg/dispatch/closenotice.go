package dispatch

import (
	"sync"

	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// closeNotices hands a turn this process closed, and the outputs it
// submitted, to whoever in the process waits for it (awaitClosed), so the
// wait ends without reading the record or the results back. Turns closed
// by another replica reach the waiters through the record's subject.
type closeNotices struct {
	mu      sync.Mutex
	waiting map[protocol.TurnKey][]chan closeNotice
}

// closeNotice is a closed turn as the replica that closed it has it.
// outputs is nil if the turn failed before its outputs were gathered.
type closeNotice struct {
	turn    *Turn
	outputs []Output
}

// wait registers for the close of key; stop, called once the wait is
// over, unregisters. The channel holds the one notice it can get.
func (n *closeNotices) wait(key protocol.TurnKey) (notices <-chan closeNotice, stop func()) {
	ch := make(chan closeNotice, 1)
	n.mu.Lock()
	if n.waiting == nil {
		n.waiting = map[protocol.TurnKey][]chan closeNotice{}
	}
	n.waiting[key] = append(n.waiting[key], ch)
	n.mu.Unlock()
	return ch, func() {
		n.mu.Lock()
		defer n.mu.Unlock()
		left := n.waiting[key]
		for i, c := range left {
			if c == ch {
				left = append(left[:i], left[i+1:]...)
				break
			}
		}
		if len(left) == 0 {
			delete(n.waiting, key)
		} else {
			n.waiting[key] = left
		}
	}
}

// closed tells the waiters of t that it is closed: its record says so.
func (n *closeNotices) closed(t *Turn, outputs []Output) {
	n.mu.Lock()
	waiting := n.waiting[t.Key]
	delete(n.waiting, t.Key)
	n.mu.Unlock()
	for _, ch := range waiting {
		ch <- closeNotice{turn: t, outputs: outputs} // buffered, one notice each
	}
}
