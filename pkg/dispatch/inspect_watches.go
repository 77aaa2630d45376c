package dispatch

import (
	"cmp"
	"context"
	"slices"
	"time"

	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// WatchView is a watch as GET /v1/watches and the console show it.
type WatchView struct {
	ID       string            `json:"id"`
	Platform protocol.Platform `json:"platform"`
	Object   string            `json:"object"`
	State    WatchState        `json:"state"`
	// Steps is how many turns the watch drove, of at most MaxSteps.
	Steps    int                `json:"steps"`
	MaxSteps int                `json:"max_steps"`
	Turns    []protocol.TurnKey `json:"turns"`
	Answer   string             `json:"answer,omitempty"`
	// AnswerRedacted says the answer is left out: it draws on results of
	// calls the caller may not see.
	AnswerRedacted bool   `json:"answer_redacted,omitempty"`
	Error          string `json:"error,omitempty"`
	// Unsupported lists what the object waits on (or ended on) that
	// toolrelay does not serve; State is then "unsupported".
	Unsupported []UnsupportedItem `json:"unsupported,omitempty"`
	CreatedAt   time.Time         `json:"created_at"`
	UpdatedAt   time.Time         `json:"updated_at"`
	StatusURL   string            `json:"status_url"`
}

// InspectWatches lists the active watches and the latest 200 ended ones
// caller may see, the latest change first. A caller scoped
// to teams sees a watch once one of its turns calls a function of theirs,
// and its answer only when every call is theirs.
func (d *Dispatcher) InspectWatches(ctx context.Context, caller Caller) ([]WatchView, error) {
	if err := d.inspect.ensure(ctx); err != nil {
		return nil, err
	}
	in := d.inspect
	in.mu.RLock()
	watches := make([]*Watch, 0, len(in.watchesOpen)+recentWatches)
	for _, w := range in.watchesOpen {
		watches = append(watches, w)
	}
	watches = append(watches, in.watchesDone.newest()...)
	in.mu.RUnlock()
	slices.SortFunc(watches, func(a, b *Watch) int { return cmp.Or(b.UpdatedAt.Compare(a.UpdatedAt), cmp.Compare(a.ID, b.ID)) })
	out := []WatchView{}
	for _, w := range watches {
		v := WatchView{ID: w.ID, Platform: w.Ref.Platform, Object: w.Current.String(), State: w.reported(), Steps: len(w.Turns),
			MaxSteps: d.opts.MaxSteps, Turns: w.Turns, Answer: w.Answer, Error: w.Error, Unsupported: w.Unsupported, CreatedAt: w.CreatedAt, UpdatedAt: w.UpdatedAt,
			StatusURL: "/v1/watch/" + w.ID}
		if v.Turns == nil {
			v.Turns = []protocol.TurnKey{}
		}
		if !caller.Admin {
			mine, others := in.teamsOfWatch(ctx, caller, w)
			if mine == 0 {
				continue
			}
			if others > 0 && v.Answer != "" {
				v.Answer, v.AnswerRedacted = "", true
			}
		}
		out = append(out, v)
	}
	return out, nil
}

// teamsOfWatch counts the calls of w's turns that caller sees and those
// it does not. A turn's calls never change, so the index's copy serves;
// a turn it no longer holds is read from the bucket.
func (in *inspector) teamsOfWatch(ctx context.Context, caller Caller, w *Watch) (mine, others int) {
	for _, key := range w.Turns {
		in.mu.RLock()
		var t *Turn
		if ot := in.open[key]; ot != nil {
			t = ot.turn
		} else if rt, ok := in.recent.get(key); ok {
			t = rt.turn
		}
		in.mu.RUnlock()
		if t == nil {
			var err error
			if t, _, err = in.d.turns.get(ctx, key); err != nil {
				continue
			}
		}
		for i := range t.Calls {
			if caller.Sees(t.Calls[i].Team) {
				mine++
			} else {
				others++
			}
		}
	}
	return mine, others
}
