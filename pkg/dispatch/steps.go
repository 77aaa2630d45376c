package dispatch

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolrelay/toolrelay/internal/jspub"
	"github.com/toolrelay/toolrelay/internal/provision"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// An Agents session answers a step's calls one tool_result at a time, and
// until the last arrives it still requires action for the calls not yet
// answered. Seen then (by a poll, the event stream or a webhook), those
// remaining calls are a different set, so a different turn key: taken in
// as a new turn, they would run a second time. The other platforms take a
// step's outputs in one request and never show part of a step.
//
// So each Agents session turn (its scope) remembers the calls of its
// latest step, written beside the turn's record, and a request whose calls
// are all among them is the turn already taken in for that step.

// step is what the step bucket keeps per Agents session turn.
type step struct {
	Turn  protocol.TurnKey `json:"turn"`
	Calls []string         `json:"calls"`
}

func stepKey(scope string) string {
	h := sha256.Sum256([]byte(scope))
	return hex.EncodeToString(h[:16])
}

// stepOf returns the turn already taken in for the step req is part of:
// an Agents request whose calls are all calls of its session turn's latest
// step, under another turn key. It returns nil when req is a step of its
// own (or not of an Agents session).
func (d *Dispatcher) stepOf(ctx context.Context, req *TurnRequest, key protocol.TurnKey) (*Turn, error) {
	if req.Ref.Platform != protocol.PlatformAgents {
		return nil, nil
	}
	e, err := d.steps.Get(ctx, stepKey(req.Scope))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("dispatch: read the step of %s: %w", req.Scope, err)
	}
	var s step
	if json.Unmarshal(e.Value(), &s) != nil || s.Turn == key {
		return nil, nil
	}
	for _, c := range req.Calls {
		if !slices.Contains(s.Calls, c.ID) {
			return nil, nil // a new step of the session turn
		}
	}
	t, _, err := d.turns.get(ctx, s.Turn)
	if err != nil {
		return nil, fmt.Errorf("dispatch: read turn %s of the step of %s: %w", s.Turn, req.Scope, err)
	}
	return t, nil
}

// stepAsync publishes t as its session turn's latest step (Agents only:
// nil otherwise), beside its record (see record): by the time any of its
// results is submitted, a request for its remaining calls finds it.
func (d *Dispatcher) stepAsync(t *Turn) (*jspub.Future, error) {
	if t.Ref.Platform != protocol.PlatformAgents {
		return nil, nil
	}
	b, err := encodeStep(t)
	if err != nil {
		return nil, err
	}
	return d.async.Publish(&nats.Msg{Subject: kvSubject(provision.StepBucket, stepKey(t.Scope)), Data: b})
}

// rememberStep writes t's step again, waiting for it.
func (d *Dispatcher) rememberStep(ctx context.Context, t *Turn) error {
	b, err := encodeStep(t)
	if err != nil {
		return err
	}
	if _, err := d.steps.Put(ctx, stepKey(t.Scope), b); err != nil {
		return fmt.Errorf("dispatch: remember the step of %s: %w", t.Scope, err)
	}
	return nil
}

func encodeStep(t *Turn) ([]byte, error) {
	s := step{Turn: t.Key}
	for _, c := range t.Calls {
		s.Calls = append(s.Calls, c.ID)
	}
	return json.Marshal(&s)
}
