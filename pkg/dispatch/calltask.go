package dispatch

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// A started call is a direct call its client does not wait for on the
// request that made it (an MCP task): [Dispatcher.StartCall] takes it in
// and returns once its turn is recorded, and any replica then reads how it
// stands, waits for its result or cancels it, by its turn's key. The turn
// record is all there is of it: its scope names the client that started
// it (a digest of its name), so no other client reads or cancels it.

// cancelledByClient begins the error of a direct call's turn that its
// client cancelled.
const cancelledByClient = "not answered: the MCP client cancelled the call"

// startedScope is the scope of the turn of a call owner starts.
func startedScope(owner, id string) string {
	return "mcp/" + ownerTag(owner) + "/" + id
}

// ownerTag is the digest of a client's name that its started calls'
// scopes carry.
func ownerTag(owner string) string {
	sum := sha256.Sum256([]byte(owner))
	return hex.EncodeToString(sum[:8])
}

// CallState is where a started call is.
type CallState string

// States of a started call.
const (
	CallRunning   CallState = "running"
	CallDone      CallState = "done"      // it has a result (an output, or a failure)
	CallCancelled CallState = "cancelled" // its client cancelled it
)

// StartedCall is how a call started with [Dispatcher.StartCall] stands.
type StartedCall struct {
	Key      protocol.TurnKey
	Function string
	State    CallState
	// CreatedAt is when the call was taken in; UpdatedAt when its record
	// last changed.
	CreatedAt, UpdatedAt time.Time
	// Result is the call's result once it is done: an output, or a failure
	// written for the model (the turn failing without one included).
	Result *protocol.Result
}

// StartCall takes c in for owner (the client that may read and cancel it)
// and returns once its turn is durably recorded: the call, running, its
// key naming it. c's Progress and Handle are not used. Errors are those of
// intake.
func (d *Dispatcher) StartCall(ctx context.Context, owner string, c DirectCall) (*StartedCall, error) {
	if !d.Ready() {
		return nil, fmt.Errorf("%w: the dispatcher is starting or stopping", ErrNotRunning)
	}
	id := uuid.NewString()
	deadline := time.Now().Add(c.Timeout)
	req := &TurnRequest{
		Ref: Ref{Platform: protocol.PlatformMCP}, Scope: startedScope(owner, id), Channel: "mcp",
		Calls:     []CallRequest{{ID: "call_" + id, Name: c.Function, Arguments: c.Arguments}},
		ExpiresAt: deadline.Add(directAnswerSlack), Deadline: deadline,
	}
	// The index entry first: every call that exists is listed (an entry
	// whose intake failed names no turn, and listing skips it).
	if _, err := d.tasks.Put(ctx, taskIndexKey(owner, req.Key()), nil); err != nil {
		return nil, fmt.Errorf("dispatch: index the call of %s: %w", c.Function, err)
	}
	t, err := d.Intake(ctx, req)
	if err != nil {
		return nil, err
	}
	return &StartedCall{Key: t.Key, Function: c.Function, State: CallRunning, CreatedAt: t.CreatedAt, UpdatedAt: t.CreatedAt}, nil
}

// StartedCall returns how the call owner started as key stands; with
// wait, once it is done or cancelled (or ctx ends). An error wraps
// ErrNotFound if there is no such call of owner's (never started, started
// by another, or expired).
func (d *Dispatcher) StartedCall(ctx context.Context, owner string, key protocol.TurnKey, wait bool) (*StartedCall, error) {
	t, updated, err := d.startedTurn(ctx, owner, key)
	if err != nil {
		return nil, err
	}
	if wait && !closedTurn(t) {
		wctx, cancel := context.WithDeadline(ctx, t.ExpiresAt.Add(directAnswerSlack))
		defer cancel()
		if _, _, _, err := d.awaitClosed(wctx, key, nil, Ref{}); err != nil && ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if t, updated, err = d.startedTurn(ctx, owner, key); err != nil {
			return nil, err
		}
	}
	return d.startedCall(ctx, t, updated)
}

// CancelStartedCall cancels the call owner started as key, as
// [Dispatcher.CancelCall] does a direct call: its turn fails, its
// executors are told. The replica owning the turn (holding its lease)
// cancels it at once; with no lease held, this one does; with the owner
// not answering (it died), this one does once the lease lapses (within
// 17 s of the last write), if ctx lasts. It returns how the call
// stands then: cancelled, or done if it was done before.
func (d *Dispatcher) CancelStartedCall(ctx context.Context, owner string, key protocol.TurnKey) (*StartedCall, error) {
	t, updated, err := d.startedTurn(ctx, owner, key)
	if err != nil {
		return nil, err
	}
	if !closedTurn(t) && (t.lease.Owner == d.engine.Self() || t.lease.Free(time.Now())) {
		// This replica may write the turn now.
		d.cancelTurn(ctx, key, cancelledByClient, "the MCP client cancelled the call")
		if t, updated, err = d.startedTurn(ctx, owner, key); err != nil {
			return nil, err
		}
	}
	if !closedTurn(t) {
		b, _ := json.Marshal(callCancel{Turn: key})
		if err := d.js.Conn().Publish(callCancelSubject, b); err != nil {
			return nil, fmt.Errorf("dispatch: cancel call %s: %w", key, err)
		}
		wctx, cancel := context.WithTimeout(ctx, ownerCancelWait)
		_, _, _, err := d.awaitClosed(wctx, key, nil, Ref{})
		cancel()
		if err != nil {
			// No owner cancelled it: this replica does, once it may.
			d.cancelTurn(ctx, key, cancelledByClient, "the MCP client cancelled the call")
		}
		if t, updated, err = d.startedTurn(ctx, owner, key); err != nil {
			return nil, err
		}
	}
	return d.startedCall(ctx, t, updated)
}

// ownerCancelWait bounds how long a replica cancelling a started call
// waits for the turn's owner to cancel it before doing it itself.
const ownerCancelWait = 3 * time.Second

// cancelOwnTurn cancels the turn key for its client if this replica
// owns it (holds its lease).
func (d *Dispatcher) cancelOwnTurn(ctx context.Context, key protocol.TurnKey) {
	ctx, cancel := context.WithTimeout(ctx, directCancelTimeout)
	defer cancel()
	t, _, err := d.turns.get(ctx, key)
	if err != nil || closedTurn(t) || t.lease.Owner != d.engine.Self() {
		return
	}
	if d.cancelTurn(ctx, key, cancelledByClient, "the MCP client cancelled the call") {
		d.log.Info("started call cancelled by its client", "turn", key)
	}
}

// startedTurn reads the record of a call owner started, and when it was
// last written.
func (d *Dispatcher) startedTurn(ctx context.Context, owner string, key protocol.TurnKey) (*Turn, time.Time, error) {
	if key.Validate() != nil {
		return nil, time.Time{}, fmt.Errorf("%w: call %q", ErrNotFound, key)
	}
	e, err := d.turns.kv.Get(ctx, string(key))
	if err != nil {
		return nil, time.Time{}, notFound("call", string(key), err)
	}
	t, err := decodeTurn(e.Value())
	if err != nil {
		return nil, time.Time{}, err
	}
	if t.Ref.Platform != protocol.PlatformMCP || !strings.HasPrefix(t.Scope, "mcp/"+ownerTag(owner)+"/") || len(t.Calls) != 1 {
		return nil, time.Time{}, fmt.Errorf("%w: call %q", ErrNotFound, key)
	}
	return t, e.Created(), nil
}

// startedCall describes a started call from its turn's record.
func (d *Dispatcher) startedCall(ctx context.Context, t *Turn, updated time.Time) (*StartedCall, error) {
	c := t.Calls[0]
	s := &StartedCall{Key: t.Key, Function: c.Name, State: CallRunning, CreatedAt: t.CreatedAt, UpdatedAt: updated}
	switch {
	case t.State == TurnFailed && strings.HasPrefix(t.Outcome().Error, cancelledByClient):
		s.State = CallCancelled
	case t.State == TurnFailed:
		s.State = CallDone
		s.Result = d.directFailure(c.Name, c.Team, protocol.CodeUnavailable,
			fmt.Sprintf("%s was not run to completion (%s). Try again later or continue without it.", c.Name, t.Outcome().Error))
	case t.State == TurnSubmitted:
		outputs, err := d.outputs(ctx, t)
		if err != nil {
			return nil, err
		}
		s.State, s.Result = CallDone, outputs[0].Result
	}
	return s, nil
}

// taskIndexKey is the key of the entry naming key among owner's started
// calls in the task bucket.
func taskIndexKey(owner string, key protocol.TurnKey) string {
	return ownerTag(owner) + "." + string(key)
}

// StartedCalls lists the calls owner started whose records are kept, by
// key: at most limit of them, those after the key after (none: from the
// first). more reports whether there are more after the last one listed.
// Each is read as [Dispatcher.StartedCall] reads it; a call whose record
// is gone (expired) is left out. Every page reads all of owner's index
// entries (kept as long as turns are), then the records of the page.
func (d *Dispatcher) StartedCalls(ctx context.Context, owner string, after protocol.TurnKey, limit int) (calls []*StartedCall, more bool, err error) {
	lister, err := d.tasks.ListKeysFiltered(ctx, ownerTag(owner)+".*")
	if err != nil {
		return nil, false, fmt.Errorf("dispatch: list the calls of a client: %w", err)
	}
	var keys []protocol.TurnKey
	for k := range lister.Keys() {
		if _, key, ok := strings.Cut(k, "."); ok && protocol.TurnKey(key) > after {
			keys = append(keys, protocol.TurnKey(key))
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, false, err // the listing was cut short
	}
	slices.Sort(keys)
	for _, key := range keys {
		if len(calls) == limit {
			return calls, true, nil
		}
		t, updated, err := d.startedTurn(ctx, owner, key)
		if errors.Is(err, ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, false, err
		}
		s, err := d.startedCall(ctx, t, updated)
		if err != nil {
			return nil, false, err
		}
		calls = append(calls, s)
	}
	return calls, false, nil
}

// RunningStartedCalls counts owner's started calls that have not ended,
// fleet-wide, as this replica's inspection index knows them (it follows
// the turn bucket, so a call started a moment ago elsewhere may be
// missing). The index is built on first use; an error says it could not
// be.
func (d *Dispatcher) RunningStartedCalls(ctx context.Context, owner string) (int, error) {
	if err := d.inspect.ensure(ctx); err != nil {
		return 0, err
	}
	prefix := "mcp/" + ownerTag(owner) + "/"
	d.inspect.mu.RLock()
	defer d.inspect.mu.RUnlock()
	n := 0
	for _, o := range d.inspect.open {
		if o.turn.Ref.Platform == protocol.PlatformMCP && strings.HasPrefix(o.turn.Scope, prefix) {
			n++
		}
	}
	return n, nil
}
