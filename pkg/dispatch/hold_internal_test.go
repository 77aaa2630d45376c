package dispatch

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/toolrelay/toolrelay/internal/firstwins"
	"github.com/toolrelay/toolrelay/internal/natstest"
	"github.com/toolrelay/toolrelay/internal/testutil"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// stampingPlatform takes every submission and notes when it came.
type stampingPlatform struct {
	idlePlatform
	mu sync.Mutex
	at []time.Time
}

func (p *stampingPlatform) Submit(context.Context, *Turn, []Output) (*Submission, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.at = append(p.at, time.Now())
	return &Submission{}, nil
}

func (p *stampingPlatform) submissions() []time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]time.Time(nil), p.at...)
}

// The hold of a replica that died (nobody releases it) is its claim until
// it is stuckAfter old: no other replica submits the turn before, though its
// result is in; then one takes the turn as collecting and submits it once.
func TestADeadReplicasHoldIsTakenOnlyOnceStale(t *testing.T) {
	_, js := natstest.Start(t).Connect(t)
	p := &stampingPlatform{}
	two := replicaOn(t, js, "two", p, func(d *Dispatcher) { d.opts.SweepInterval = 100 * time.Millisecond })
	ctx := t.Context()

	now := time.Now().UTC()
	key := protocol.TurnKey("0123456789abcdef0123456789abcdef")
	since := now.Add(-stuckAfter + 2*time.Second) // stale two seconds from now
	turn := &Turn{Version: protocol.Version, Key: key, Ref: Ref{Platform: protocol.PlatformResponses, ResponseID: "resp_gone"},
		Scope: "resp_gone", State: TurnCollecting, CreatedAt: since, ExpiresAt: now.Add(5 * time.Minute), Deadline: now.Add(4 * time.Minute),
		Calls: []TurnCall{{ID: "call_1", Name: "get_weather", Key: key.Call("call_1"), Team: "geo", Arguments: json.RawMessage(`{}`)}},
		out:   &TurnOutcome{Owner: "gone", SubmittingSince: since, Held: true}}
	rev, err := two.turns.create(ctx, turn)
	if err != nil {
		t.Fatal(err)
	}
	if err := two.scheduleDeadline(ctx, turn); err != nil {
		t.Fatal(err)
	}
	if _, err := two.gather.streams.stream(ctx, "geo"); err != nil {
		t.Fatal(err)
	}
	res := &protocol.Result{Version: protocol.Version, Key: turn.Calls[0].Key, CallID: "call_1", Team: "geo", Function: "get_weather",
		Output: `"sunny"`, Executor: "test", FinishedAt: now}
	if err := firstwins.Record(ctx, js.Conn(), res, nil); err != nil {
		t.Fatal(err)
	}

	staleAt := since.Add(stuckAfter)
	for time.Until(staleAt) > 200*time.Millisecond {
		if got := p.submissions(); len(got) != 0 {
			t.Fatalf("submitted at %s, %s before the hold of a replica that may still run was stale", got[0].Format(time.StampMilli), staleAt.Sub(got[0]))
		}
		if _, have, err := two.turns.get(ctx, key); err != nil || have != rev {
			t.Fatalf("the held record changed (revision %d, want %d; %v) before the hold was stale", have, rev, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	testutil.WaitFor(t, 10*time.Second, func() bool { return len(p.submissions()) > 0 })
	got := p.submissions()
	if got[0].Before(staleAt) {
		t.Errorf("submitted %s before the hold was stale", staleAt.Sub(got[0]))
	}
	testutil.WaitFor(t, 10*time.Second, func() bool {
		have, _, err := two.turns.get(ctx, key)
		return err == nil && have.State == TurnSubmitted
	})
	if got := p.submissions(); len(got) != 1 {
		t.Errorf("submitted %d times, want once", len(got))
	}
	have, _, err := two.turns.get(ctx, key)
	if err != nil || have.Outcome().Owner != "two" || have.Outcome().Held {
		t.Errorf("the record is %+v (%v); want submitted by two, no longer held", have.Outcome(), err)
	}
}

// A held turn's record says submitting, owned by its holder since its
// intake, as every version of the dispatcher reads records; read back, it
// is the turn collecting that it is, with its holder.
func TestAHeldRecordReadsAsSubmittingToEveryVersion(t *testing.T) {
	created := time.Date(2026, 12, 5, 10, 0, 0, 0, time.UTC)
	d := &Dispatcher{opts: Options{Name: "one"}}
	d.holdOutcome = &TurnOutcome{Owner: "one", Held: true}
	turn := &Turn{Version: protocol.Version, Key: "0123456789abcdef0123456789abcdef", State: TurnCollecting, CreatedAt: created,
		Calls: []TurnCall{{ID: "c", Arguments: json.RawMessage(`{}`)}}, out: d.holdOutcome}
	b, err := appendTurn(nil, turn)
	if err != nil {
		t.Fatal(err)
	}
	var old struct { // a record as a version without holds reads it
		State           TurnState `json:"state"`
		Owner           string    `json:"owner"`
		SubmittingSince time.Time `json:"submitting_since"`
	}
	if err := json.Unmarshal(b, &old); err != nil {
		t.Fatal(err)
	}
	if old.State != TurnSubmitting || old.Owner != "one" || !old.SubmittingSince.Equal(created) {
		t.Errorf("the record reads %+v; want submitting by one since %s", old, created)
	}
	back, err := decodeTurn(b)
	if err != nil {
		t.Fatal(err)
	}
	if back.State != TurnCollecting || !d.heldHere(back) || !back.submittingSince().Equal(created) {
		t.Errorf("read back: %s, %+v; want collecting, held by one since %s", back.State, back.Outcome(), created)
	}
	// Changing the outcome of a turn held here changes that turn's only.
	claimed := back.clone()
	claimed.writeOutcome().Held = false
	turn.writeOutcome().Held = false
	if !d.holdOutcome.Held {
		t.Error("changing a held turn's outcome changed the outcome the held turns share")
	}
	sameRecord(t, back)
}
