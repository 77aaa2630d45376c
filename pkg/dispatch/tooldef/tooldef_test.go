package tooldef

import (
	"encoding/json"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/toolrelay/toolrelay/pkg/protocol"
)

func TestToolDefinitions(t *testing.T) {
	specs := []*protocol.FunctionSpec{
		{Name: "strict_fn", Description: "d", Parameters: json.RawMessage(`{"type":"object","properties":{"a":{"type":"string"}},"required":["a"],"additionalProperties":false}`)},
		{Name: "loose_fn", Parameters: json.RawMessage(`{"type":"object","properties":{"a":{"type":"string"}}}`)},
	}
	want := map[protocol.Platform][]string{
		protocol.PlatformAgents: {
			`{"description":"d","name":"strict_fn","parameters":{"type":"object","properties":{"a":{"type":"string"}},"required":["a"],"additionalProperties":false},"type":"function"}`,
			`{"description":"","name":"loose_fn","parameters":{"type":"object","properties":{"a":{"type":"string"}}},"type":"function"}`,
		},
		protocol.PlatformAssistants: {
			`{"function":{"description":"d","name":"strict_fn","parameters":{"type":"object","properties":{"a":{"type":"string"}},"required":["a"],"additionalProperties":false},"strict":true},"type":"function"}`,
			`{"function":{"description":"","name":"loose_fn","parameters":{"type":"object","properties":{"a":{"type":"string"}}},"strict":false},"type":"function"}`,
		},
		protocol.PlatformResponses: {
			`{"description":"d","name":"strict_fn","parameters":{"type":"object","properties":{"a":{"type":"string"}},"required":["a"],"additionalProperties":false},"strict":true,"type":"function"}`,
			`{"description":"","name":"loose_fn","parameters":{"type":"object","properties":{"a":{"type":"string"}}},"strict":false,"type":"function"}`,
		},
	}
	for p, w := range want {
		defs, err := Definitions(specs, p)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, d := range defs {
			got = append(got, string(d))
		}
		if diff := cmp.Diff(w, got); diff != "" {
			t.Errorf("%s (-want +got):\n%s", p, diff)
		}
	}
	if _, err := Definitions(specs, "slack"); err == nil {
		t.Error("unknown platform accepted")
	}
}

func TestStrictCompatibleNested(t *testing.T) {
	var s map[string]any
	_ = json.Unmarshal([]byte(`{"type":"object","additionalProperties":false,"required":["o"],"properties":{"o":{"type":"object","properties":{"x":{"type":"string"}}}}}`), &s)
	if strictCompatible(s) {
		t.Error("a nested open object passed as strict")
	}
}
