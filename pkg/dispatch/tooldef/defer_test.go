package tooldef

import (
	"encoding/json"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/responses"

	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// Deferred functions come out as the SDK's own param types encode them,
// with one tool_search tool after the functions; Assistants have no such
// field, so they get every function in full and no tool_search.
func TestToolDefinitionsDeferLoading(t *testing.T) {
	params := `{"type":"object","properties":{"order_id":{"type":"string"}},"required":["order_id"],"additionalProperties":false}`
	specs := []*protocol.FunctionSpec{
		{Name: "get_order_status", Description: "status", Parameters: json.RawMessage(params)},
		{Name: "issue_refund", Description: "refund", Parameters: json.RawMessage(params), DeferLoading: true},
		{Name: "cancel_order", Description: "cancel", Parameters: json.RawMessage(params), DeferLoading: true},
	}
	var schema map[string]any
	if err := json.Unmarshal([]byte(params), &schema); err != nil {
		t.Fatal(err)
	}
	agentFn := func(s *protocol.FunctionSpec) any {
		f := openai.AgentToolParamFunction{Name: s.Name, Description: s.Description, Parameters: schema}
		if s.DeferLoading {
			f.DeferLoading = openai.Bool(true)
		}
		return openai.AgentToolParamUnion{OfParamFunction: &f}
	}
	responsesFn := func(s *protocol.FunctionSpec) any {
		f := responses.FunctionToolParam{Name: s.Name, Description: openai.String(s.Description), Parameters: schema, Strict: openai.Bool(true)}
		if s.DeferLoading {
			f.DeferLoading = openai.Bool(true)
		}
		return responses.ToolUnionParam{OfFunction: &f}
	}
	want := map[protocol.Platform][]any{
		protocol.PlatformAgents: {agentFn(specs[0]), agentFn(specs[1]), agentFn(specs[2]),
			openai.AgentToolParamUnion{OfParamToolSearch: &openai.AgentToolParamToolSearch{}}},
		protocol.PlatformResponses: {responsesFn(specs[0]), responsesFn(specs[1]), responsesFn(specs[2]),
			responses.ToolUnionParam{OfToolSearch: &responses.ToolSearchToolParam{}}},
	}
	for p, sdk := range want {
		defs, err := Definitions(specs, p)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(asJSON(t, sdk), asJSON(t, defs)); diff != "" {
			t.Errorf("%s: our definitions vs the SDK's params (-want +got):\n%s", p, diff)
		}
	}
	defs, err := Definitions(specs, protocol.PlatformAssistants)
	if err != nil {
		t.Fatal(err)
	}
	if len(defs) != len(specs) {
		t.Fatalf("assistants: %d definitions, want %d (no tool_search)", len(defs), len(specs))
	}
	for _, d := range defs {
		var m map[string]any
		_ = json.Unmarshal(d, &m)
		if _, ok := m["defer_loading"]; ok || m["type"] != "function" {
			t.Errorf("assistants definition %s", d)
		}
	}
	// No deferred function: no tool_search.
	defs, _ = Definitions(specs[:1], protocol.PlatformAgents)
	if len(defs) != 1 {
		t.Errorf("without deferred functions: %d definitions, want 1", len(defs))
	}
}

// asJSON re-decodes v's JSON encoding, so encodings that differ only in
// key order compare equal.
func asJSON(t *testing.T, v any) any {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var out any
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return out
}
