package dispatch_test

import (
	"context"
	"testing"
	"time"

	"github.com/toolrelay/toolrelay/internal/platformsim"
	"github.com/toolrelay/toolrelay/internal/testutil"
	"github.com/toolrelay/toolrelay/pkg/dispatch"
	"github.com/toolrelay/toolrelay/pkg/dispatch/openaiplatform"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// awaitAction polls ref until the platform asks for calls other than
// those of after (nil: any), and returns them as a turn.
func awaitAction(t *testing.T, p dispatch.Platform, ref dispatch.Ref, after *dispatch.Turn) *dispatch.Turn {
	t.Helper()
	var turn *dispatch.Turn
	testutil.WaitForWhat(t, 10*time.Second, "the platform to require action on a new turn", func() bool {
		obs, err := p.Poll(context.Background(), ref)
		if err != nil || obs.State != dispatch.ObjectRequiresAction {
			return false
		}
		turn = &dispatch.Turn{Key: obs.Turn.Key(), Ref: ref, Scope: obs.Turn.Scope, TurnID: obs.Turn.TurnID}
		for _, c := range obs.Turn.Calls {
			turn.Calls = append(turn.Calls, dispatch.TurnCall{ID: c.ID, Name: c.Name, Team: "geo", Arguments: c.Arguments,
				Key: turn.Key.Call(c.ID)})
		}
		return after == nil || turn.Key != after.Key
	})
	return turn
}

func outputsOf(turn *dispatch.Turn) []dispatch.Output {
	var out []dispatch.Output
	for _, c := range turn.Calls {
		out = append(out, dispatch.Output{Call: c, Result: &protocol.Result{Version: protocol.Version, Key: c.Key,
			CallID: c.ID, Team: c.Team, Function: c.Name, Output: "Seattle, WA", FinishedAt: time.Now()}})
	}
	return out
}

// A submission repeated after the platform moved on (the first one got
// through and the model now waits for its next step) counts as done: a
// replica that took over a turn stuck in "submitting" after a failover
// must not fail the run. An incomplete submission still fails.
func TestRepeatedSubmissionAfterThePlatformMovedOnCountsAsDone(t *testing.T) {
	t.Parallel()
	e := newEnv(t, platformsim.FavoriteCityScenario)
	for _, tc := range []struct {
		name string
		p    dispatch.Platform
		ref  func() dispatch.Ref
	}{
		{"assistants", openaiplatform.NewAssistants(e.client), func() dispatch.Ref { return e.assistantsRun("my favorite city", nil) }},
		{"agents", openaiplatform.NewAgents(e.client), func() dispatch.Ref { return e.session("my favorite city") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			ref := tc.ref()
			first := awaitAction(t, tc.p, ref, nil)
			if _, err := tc.p.Submit(ctx, first, outputsOf(first)); err != nil {
				t.Fatal(err)
			}
			next := awaitAction(t, tc.p, ref, first)
			if len(next.Calls) < 2 {
				t.Fatalf("the scenario's second step asks for %d calls, want 2", len(next.Calls))
			}
			if _, err := tc.p.Submit(ctx, first, outputsOf(first)); err != nil {
				t.Fatalf("repeating the first submission after the platform moved on: %v", err)
			}
			if tc.name == "assistants" {
				partial := *next
				partial.Calls = next.Calls[:1]
				if _, err := tc.p.Submit(ctx, &partial, outputsOf(&partial)); err == nil {
					t.Fatal("a submission missing a call the run waits for counted as done")
				}
			}
		})
	}
}

// A repeated submission of a turn of a conversation looks for the calls'
// outputs in the conversation first: found, it counts as done and the
// watch follows the conversation, instead of continuing it a second time
// (docs/turns.md). A repeat whose outputs are not there submits.
func TestARepeatedConversationSubmissionLooksFirst(t *testing.T) {
	t.Parallel()
	e := newEnv(t, platformsim.FavoriteCityScenario)
	ctx := context.Background()
	p := openaiplatform.NewResponses(e.client)
	start := func() dispatch.Ref { return e.conversation("my favorite city") }

	ref := start()
	first := awaitAction(t, p, ref, nil)
	sub, err := p.Submit(ctx, first, outputsOf(first))
	if err != nil || sub.Next == nil || sub.Next.ResponseID == "" {
		t.Fatalf("first submission: %+v, %v", sub, err)
	}
	again, err := p.Submit(dispatch.WithRepeated(ctx), first, outputsOf(first))
	if err != nil {
		t.Fatal(err)
	}
	if again.Next == nil || again.Next.ResponseID != "" || again.Next.Conversation != ref.Conversation {
		t.Fatalf("the repeat answered %+v; want it found in the conversation, followed by the conversation", again.Next)
	}

	// Never submitted: the repeat submits.
	ref = start()
	turn := awaitAction(t, p, ref, nil)
	sub, err = p.Submit(dispatch.WithRepeated(ctx), turn, outputsOf(turn))
	if err != nil || sub.Next == nil || sub.Next.ResponseID == "" {
		t.Fatalf("a repeat of a submission that never went out: %+v, %v; want it submitted", sub, err)
	}
}
