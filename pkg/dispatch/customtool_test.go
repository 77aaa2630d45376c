package dispatch_test

import (
	"context"
	"encoding/json"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3/conversations"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/toolrelay/toolrelay/internal/platformsim"
	"github.com/toolrelay/toolrelay/pkg/dispatch"
	"github.com/toolrelay/toolrelay/pkg/exec"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// TestCustomToolCallsEndToEnd: the model's custom_tool_calls go through
// the real path (a dispatcher over the openai-go SDK, JetStream, pkg/exec
// executors, one of them running a command) beside a function call in the
// same turn. Each executor gets the model's text as it is (a Go handler
// through Invocation.Input, a command on stdin), and the platform gets
// exactly one custom_tool_call_output per custom call with the executor's
// output. An input its regex grammar does not admit is never published:
// the model gets a custom_tool_call_output saying so. Chained by
// previous_response_id and in a conversation.
func TestCustomToolCallsEndToEnd(t *testing.T) {
	t.Parallel()
	const raw = "it's \"raw\" text\nline two"
	e := newEnv(t, platformsim.Scenario{
		Name: "custom", Prompt: "sign dates",
		Steps: []platformsim.Step{{
			{Name: "get_horoscope", Arguments: `{"sign":"Aquarius"}`},
			{Name: "get_sign_dates", Kind: platformsim.KindCustom, Arguments: "Aquarius"},
			{Name: "get_sign_dates", Kind: platformsim.KindCustom, Arguments: "Ophiuchus", As: "refused"},
			{Name: "shout", Kind: platformsim.KindCustom, Arguments: raw},
		}},
		Answer: `{{out "get_horoscope"}} | {{out "get_sign_dates"}} | {{out "refused"}} | {{out "shout"}}`,
	})
	d, _ := e.dispatcher(dispatch.Options{})

	var mu sync.Mutex
	var inputs []string // what get_sign_dates' handler was given
	shout, err := exec.CommandHandler([]string{"tr", "a-z", "A-Z"})
	if err != nil {
		t.Fatal(err)
	}
	f := &mcpFleet{e: e, tp: sdktrace.NewTracerProvider()}
	f.executor(t, "astro",
		exec.Function{Name: "get_horoscope", Description: "Today's horoscope for a sign.",
			Parameters: json.RawMessage(`{"type":"object","properties":{"sign":{"type":"string"}},"required":["sign"]}`),
			Handler: exec.HandlerFunc(func(context.Context, *exec.Invocation) ([]byte, error) {
				return []byte("Aquarius: otters"), nil
			})},
		exec.Function{Name: "get_sign_dates", Description: "The birthdays of a sign; input: its name.",
			Format: &protocol.InputFormat{Type: protocol.FormatGrammar, Syntax: protocol.SyntaxRegex, Definition: "Aquarius|Pisces|Leo"},
			Handler: exec.HandlerFunc(func(_ context.Context, inv *exec.Invocation) ([]byte, error) {
				input, ok := inv.Input()
				mu.Lock()
				inputs = append(inputs, input)
				mu.Unlock()
				if !ok {
					t.Errorf("get_sign_dates was called with JSON arguments %s", inv.Call.Arguments)
				}
				return []byte("dates of " + input), nil
			})},
		exec.Function{Name: "shout", Description: "Shouts the text it is given.",
			Format: &protocol.InputFormat{Type: protocol.FormatText}, Handler: shout},
	)

	ctx := context.Background()
	conv := e.conversation("sign dates, please")
	for _, ref := range []dispatch.Ref{e.response("sign dates, please"), conv} {
		w := finish(t, d, ref, 20*time.Second)
		parts := strings.Split(w.Answer, " | ")
		if w.State != dispatch.WatchCompleted || len(parts) != 4 {
			t.Fatalf("%s: watch %s %q (%s), want a completed answer of 4 parts", ref, w.State, w.Answer, w.Error)
		}
		if want := []string{"Aquarius: otters", "dates of Aquarius"}; !slices.Equal(parts[:2], want) {
			t.Errorf("%s: answers %q, want %q", ref, parts[:2], want)
		}
		var refused struct {
			Error struct{ Type, Message string }
		}
		if err := json.Unmarshal([]byte(parts[2]), &refused); err != nil || refused.Error.Type != string(protocol.CodeInvalidArguments) ||
			!strings.Contains(refused.Error.Message, "The input for get_sign_dates does not match its grammar") ||
			!strings.Contains(refused.Error.Message, "Aquarius|Pisces|Leo") {
			t.Errorf("%s: the refused call's output is %q; want an invalid_arguments error naming the grammar", ref, parts[2])
		}
		if want := strings.ToUpper(raw); parts[3] != want {
			t.Errorf("%s: the command's output is %q, want %q (its stdin the model's text as it is)", ref, parts[3], want)
		}
	}

	// No executor saw the refused input: it was never published.
	mu.Lock()
	if want := []string{"Aquarius", "Aquarius"}; !slices.Equal(inputs, want) {
		t.Errorf("get_sign_dates' handler was given %q, want %q", inputs, want)
	}
	mu.Unlock()
	s, err := e.js.Stream(ctx, protocol.CallStream("astro"))
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.LastSeq != 6 {
		t.Errorf("%d calls were published to astro's call stream, want 6: 3 per conversation, none for the refused input", info.State.LastSeq)
	}

	// The platform's side: one output per call; in the conversation, each
	// of the type that answers the call (the simulator refuses any other
	// pairing, so the chained conversation is checked by its completing).
	l := e.sim.Ledger()
	custom := 0
	for id, name := range l.Calls {
		if len(l.Outputs[id]) != 1 {
			t.Errorf("call %s (%s) was answered %d times, want once", id, name, len(l.Outputs[id]))
		}
		if name != "get_horoscope" {
			custom++
		}
	}
	if len(l.Calls) != 8 || custom != 6 {
		t.Errorf("the model made %d calls, %d of them custom; want 8 and 6", len(l.Calls), custom)
	}
	types := map[string]int{}
	items := e.client.Conversations.Items.ListAutoPaging(ctx, conv.Conversation, conversations.ItemListParams{})
	for items.Next() {
		it := items.Current()
		if strings.HasSuffix(it.Type, "_output") {
			types[it.Type]++
			if it.Type == "custom_tool_call_output" && l.Calls[it.CallID] == "get_horoscope" {
				t.Errorf("the function call %s was answered with a custom_tool_call_output", it.CallID)
			}
		}
	}
	if err := items.Err(); err != nil {
		t.Fatal(err)
	}
	if want := map[string]int{"function_call_output": 1, "custom_tool_call_output": 3}; !maps.Equal(types, want) {
		t.Errorf("the conversation's outputs by type: %v, want %v", types, want)
	}
}
