package dispatch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	"github.com/nats-io/nats.go"

	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// A client may cancel a direct call on another request than the one that
// waits for it (an MCP notifications/cancelled on its own POST), which may
// reach any replica. Each running direct call with a handle is noted in
// its replica; a cancellation is told to every replica on one subject, and
// the replica running a call of that handle ends its wait, which cancels
// the turn as a client going away does: the turn fails, its executors are
// told, a running handler is cancelled.

// callCancelSubject is where every replica (no queue group) hears of
// direct calls cancelled by handle.
const callCancelSubject = "toolrelay.dispatcher.any.cancel"

// maxCancelReason bounds the reason a cancellation carries.
const maxCancelReason = 200

// ErrCancelled is wrapped by the error [Dispatcher.Call] returns for a
// call cancelled through [Dispatcher.CancelCall].
var ErrCancelled = errors.New("dispatch: the call was cancelled by its client")

// callCancel is a cancellation as told on callCancelSubject: of the
// direct calls of a handle, or of a started call's turn (which the
// replica owning it cancels).
type callCancel struct {
	Handle string           `json:"handle,omitempty"`
	Reason string           `json:"reason,omitempty"`
	Turn   protocol.TurnKey `json:"turn,omitempty"`
}

// runningCalls are the direct calls with a handle running in this process.
// The zero value is ready to use.
type runningCalls struct {
	mu       sync.Mutex
	next     uint64
	byHandle map[string]map[uint64]context.CancelCauseFunc
}

// add notes a call of handle, cancelled by cancel; remove forgets it.
func (r *runningCalls) add(handle string, cancel context.CancelCauseFunc) (remove func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.byHandle == nil {
		r.byHandle = map[string]map[uint64]context.CancelCauseFunc{}
	}
	r.next++
	id := r.next
	if r.byHandle[handle] == nil {
		r.byHandle[handle] = map[uint64]context.CancelCauseFunc{}
	}
	r.byHandle[handle][id] = cancel
	return func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		delete(r.byHandle[handle], id)
		if len(r.byHandle[handle]) == 0 {
			delete(r.byHandle, handle)
		}
	}
}

// cancel cancels the calls of handle running here, with cause, and
// reports how many there were.
func (r *runningCalls) cancel(handle string, cause error) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, cancel := range r.byHandle[handle] {
		cancel(cause)
	}
	return len(r.byHandle[handle])
}

// CancelCall cancels the direct calls running with handle
// ([DirectCall.Handle]) on whichever replica runs them, as if their
// clients had gone away: their turns fail and their executors are told,
// so running handlers are cancelled. reason is logged. A handle no call
// runs with cancels nothing; a call that starts after the cancellation is
// not cancelled. It returns once the cancellation is sent, an error only
// if it could not be.
func (d *Dispatcher) CancelCall(ctx context.Context, handle, reason string) error {
	if len(reason) > maxCancelReason {
		reason = reason[:maxCancelReason]
	}
	b, _ := json.Marshal(callCancel{Handle: handle, Reason: reason})
	nc := d.js.Conn()
	if err := nc.Publish(callCancelSubject, b); err != nil {
		return fmt.Errorf("dispatch: cancel call: %w", err)
	}
	if err := nc.FlushWithContext(ctx); err != nil {
		return fmt.Errorf("dispatch: cancel call: %w", err)
	}
	return nil
}

// serveCallCancels hears of cancelled direct calls and cancels those
// running here.
func (d *Dispatcher) serveCallCancels() (stop func(), err error) {
	return d.hear(callCancelSubject, "", func(m *nats.Msg) {
		var c callCancel
		if json.Unmarshal(m.Data, &c) != nil {
			return
		}
		if c.Turn != "" && c.Turn.Validate() == nil {
			d.background(func(ctx context.Context) { d.cancelOwnTurn(ctx, c.Turn) })
			return
		}
		if c.Handle == "" {
			return
		}
		cause := ErrCancelled
		if c.Reason != "" {
			cause = fmt.Errorf("%w: %s", ErrCancelled, c.Reason)
		}
		if n := d.calls.cancel(c.Handle, cause); n > 0 {
			d.log.Info("direct call cancelled by its client", "calls", n, "reason", c.Reason)
		}
	})
}
