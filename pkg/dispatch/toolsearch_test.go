package dispatch_test

import (
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/toolrelay/toolrelay/internal/platformsim"
	"github.com/toolrelay/toolrelay/pkg/dispatch"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// TestSearchFunctions: names and descriptions match a query's words,
// best first; stop words and short words match nothing.
func TestSearchFunctions(t *testing.T) {
	t.Parallel()
	specs := []*protocol.FunctionSpec{
		{Name: "get_weather", Description: "Current weather at a location"},
		{Name: "issue_refund", Description: "Refund an order, in full or in part", DeferLoading: true},
		{Name: "get_order_status", Description: "Where an order is"},
		{Name: "get_shipping_eta", Description: "When an order arrives", DeferLoading: true},
	}
	names := func(query string) []string {
		var out []string
		for _, s := range dispatch.SearchFunctions(specs, query) {
			out = append(out, s.Name)
		}
		return out
	}
	for query, want := range map[string][]string{
		"refund the order":    {"issue_refund", "get_shipping_eta", "get_order_status"},
		"weather":             {"get_weather"},
		"get_order_status":    {"get_order_status", "get_shipping_eta", "issue_refund"},
		"find the tool for a": nil,
		"":                    nil,
		"shipping ETA":        {"get_shipping_eta"},
	} {
		if got := names(query); !slices.Equal(got, want) {
			t.Errorf("search %q = %v, want %v", query, got, want)
		}
	}
	if got := dispatch.SearchQuery(json.RawMessage(`{"query":"refund","paths":["orders"]}`)); got != "orders refund" {
		t.Errorf("query of hosted-style arguments = %q", got)
	}
	if got := dispatch.SearchQuery(json.RawMessage(`{"goal":"late parcel"}`)); got != "late parcel" {
		t.Errorf("query of custom arguments = %q", got)
	}
}

// TestClientToolSearchIsAnsweredFromTheRegistry: a Responses response
// that asks the client to search its tools (tool_search_call, execution
// client) is answered by the dispatcher with a tool_search_output of the
// matching functions, as `dispatcher tools` defines them for Responses,
// and the conversation goes on to call the function found. Chained by
// previous_response_id and in a conversation.
func TestClientToolSearchIsAnsweredFromTheRegistry(t *testing.T) {
	t.Parallel()
	e := newEnv(t, platformsim.Scenario{
		Name: "search", Prompt: "refund my order",
		Steps: []platformsim.Step{
			{{Kind: platformsim.KindToolSearch, Arguments: "refund an order"}},
			{{Name: "issue_refund", Arguments: `{"order_id":"A-1"}`}},
		},
		Answer: `loaded {{out "tool_search"}}; {{out "issue_refund"}}`,
	})
	e.register("orders", "issue_refund", `{"type":"object","properties":{"order_id":{"type":"string"}},"required":["order_id"],"additionalProperties":false}`)
	e.register("geo", "get_weather", weatherSchema)
	ran := e.serve("orders", []string{"issue_refund"}, func(c *protocol.Call) (string, bool) { return "refunded " + string(c.Arguments), false })
	d, _ := e.dispatcher(dispatch.Options{})

	for _, ref := range []dispatch.Ref{
		e.response("please refund my order"),
		e.conversation("refund my order"),
	} {
		w := finish(t, d, ref, 20*time.Second)
		if want := `loaded issue_refund; refunded {"order_id":"A-1"}`; w.State != dispatch.WatchCompleted || w.Answer != want {
			t.Errorf("%s: watch %s %q (%s), want answer %q", ref, w.State, w.Answer, w.Error, want)
		}
	}
	if n := ran.Load(); n != 2 {
		t.Errorf("issue_refund ran %d times, want 2", n)
	}

	// What the platform got: the function's definition, as exported.
	l := e.sim.Ledger()
	searches := 0
	for id, name := range l.Calls {
		if name != "tool_search" {
			continue
		}
		searches++
		if len(l.Outputs[id]) != 1 {
			t.Fatalf("tool search %s answered %d times", id, len(l.Outputs[id]))
		}
		var tools []map[string]any
		if err := json.Unmarshal([]byte(l.Outputs[id][0]), &tools); err != nil {
			t.Fatal(err)
		}
		if len(tools) != 1 || tools[0]["type"] != "function" || tools[0]["name"] != "issue_refund" || tools[0]["strict"] != true ||
			tools[0]["parameters"] == nil {
			t.Errorf("tool_search_output tools = %v", tools)
		}
	}
	if searches != 2 {
		t.Errorf("%d tool searches, want 2", searches)
	}
}
