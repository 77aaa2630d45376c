package dispatch

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// A watch is the dispatcher driving a platform object it cannot learn of
// by webhook: it polls the object, takes in each required action as a turn,
// and for Responses follows each continuation, until the object is done.
// The attached WatchDriver (package watch) writes a watch's record; the
// engine keeps the bucket, reads it (WatchStatus, the inspection index)
// and answers the watch API from it.

// WatchState is where a watch is.
type WatchState string

// Watch states.
const (
	WatchActive    WatchState = "watching"
	WatchCompleted WatchState = "completed"
	WatchFailed    WatchState = "failed"
	// WatchUnsupported: the object waits on, or ended on, something
	// toolrelay does not serve (Watch.Unsupported names it). A response
	// that ended so cannot move on, and its watch ends in this state. An
	// Agents session or an Assistants run can, once someone else answers:
	// its record stays "watching" and its driver goes on polling, and
	// WatchStatus reports it as "unsupported" until the object moves.
	WatchUnsupported WatchState = "unsupported"
)

// Watch is the record of a watch, kept in the watch bucket.
type Watch struct {
	ID string `json:"id"`
	// Ref is what was asked for; Current what is driven now (a Responses
	// continuation moves it).
	Ref     Ref                `json:"ref"`
	Current Ref                `json:"current"`
	State   WatchState         `json:"state"`
	Turns   []protocol.TurnKey `json:"turns"`
	Answer  string             `json:"answer,omitempty"`
	Error   string             `json:"error,omitempty"`
	// Unsupported lists what the object waits on (or ended on) that
	// toolrelay does not serve; empty when there is nothing.
	Unsupported []UnsupportedItem `json:"unsupported,omitempty"`
	CreatedAt   time.Time         `json:"created_at"`
	UpdatedAt   time.Time         `json:"updated_at"`
	// Trace is the W3C context the watch request carried; its turns'
	// spans are its children.
	Trace TraceContext `json:"trace,omitzero"`
	// Released says the replica driving the watch stopped and left it for
	// any other to take at its next sweep.
	Released bool `json:"released,omitempty"`
	// Driver is the replica that drives the watch (its Options.Name).
	// Empty in records written before replicas named themselves.
	Driver string `json:"driver,omitempty"`
}

// WatchStatus returns the record of a watch; an error wrapping ErrNotFound
// if there is none.
func (d *Dispatcher) WatchStatus(ctx context.Context, id string) (*Watch, error) {
	e, err := d.watches.Get(ctx, id)
	if err != nil {
		return nil, notFound("watch", id, err)
	}
	var w Watch
	if err := json.Unmarshal(e.Value(), &w); err != nil {
		return nil, fmt.Errorf("dispatch: decode watch %s: %w", id, err)
	}
	w.State = w.reported()
	return &w, nil
}

// reported is the state a watch is reported in: an object still driven
// that waits on something toolrelay does not serve reads "unsupported",
// not "watching", whatever its record keeps for its driver.
func (w *Watch) reported() WatchState {
	if w.State == WatchActive && len(w.Unsupported) > 0 {
		return WatchUnsupported
	}
	return w.State
}

// Turn returns the record of a turn; an error wrapping ErrNotFound if
// there is none.
func (d *Dispatcher) Turn(ctx context.Context, key protocol.TurnKey) (*Turn, error) {
	t, _, err := d.turns.get(ctx, key)
	if err != nil {
		return nil, notFound("turn", string(key), err)
	}
	return t, nil
}
