package platformsim_test

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"

	"github.com/toolrelay/toolrelay/internal/platformsim"
	"github.com/toolrelay/toolrelay/pkg/dispatch/tooldef"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

var refundSchema = map[string]any{"type": "object", "properties": map[string]any{"order_id": map[string]any{"type": "string"}}, "required": []any{"order_id"}}

// An agent with a deferred function and tool_search is accepted as the
// platform accepts it: the session's agent lists the tools, the deferred
// one with defer_loading true, the others false.
func TestAgentsDeferredToolsWithToolSearch(t *testing.T) {
	_, hs := newSim(t, platformsim.Options{})
	c := client(hs)
	fn := func(name string, deferred bool) openai.AgentToolParamUnion {
		f := openai.AgentToolParamFunction{Name: name, Description: "d", Parameters: refundSchema}
		if deferred {
			f.DeferLoading = openai.Bool(true)
		}
		return openai.AgentToolParamUnion{OfParamFunction: &f}
	}
	search := openai.AgentToolParamUnion{OfParamToolSearch: &openai.AgentToolParamToolSearch{}}
	newSession := func(tools ...openai.AgentToolParamUnion) (*openai.AgentSession, error) {
		return c.Beta.Agents.Sessions.New(t.Context(), openai.BetaAgentSessionNewParams{
			Environment: openai.EnvironmentParamUnion{OfParamNone: &openai.EnvironmentParamNone{}},
			Agent:       openai.BetaAgentSessionNewParamsAgent{Model: openai.String("gpt-5.5"), Tools: tools},
			Input:       openai.BetaAgentSessionNewParamsInputUnion{OfString: openai.String("hello")},
		})
	}
	sess, err := newSession(fn("get_order_status", false), fn("issue_refund", true), search)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, tool := range sess.Agent.Tools {
		if tool.Type == "function" {
			got[tool.Name] = tool.DeferLoading
		}
	}
	if !got["issue_refund"] || got["get_order_status"] || len(got) != 2 {
		t.Errorf("session agent tools' defer_loading = %v, want issue_refund true, get_order_status false", got)
	}

	_, err = newSession(fn("get_order_status", false), fn("issue_refund", true))
	apiError(t, err, http.StatusBadRequest, "issue_refund is deferred")
	_, err = newSession(fn("issue_refund", true), search, search)
	apiError(t, err, http.StatusBadRequest, "at most one tool_search")
	_, err = c.Beta.Agents.Sessions.New(t.Context(), openai.BetaAgentSessionNewParams{
		Environment: openai.EnvironmentParamUnion{OfParamNone: &openai.EnvironmentParamNone{}},
		Agent:       openai.BetaAgentSessionNewParamsAgent{Model: openai.String("gpt-5.5")},
		Input:       openai.BetaAgentSessionNewParamsInputUnion{OfString: openai.String("hello")},
	}, option.WithJSONSet("agent.tools", []any{map[string]any{"type": "tool_search", "execution": "client"}}))
	apiError(t, err, http.StatusBadRequest, "agent.tools[0].execution")
}

// What `dispatcher tools` prints for deferred functions is a configuration
// both platforms take.
func TestToolDefinitionsAreAccepted(t *testing.T) {
	_, hs := newSim(t, platformsim.Options{})
	c := client(hs)
	params, _ := json.Marshal(refundSchema)
	specs := []*protocol.FunctionSpec{
		{Name: "get_order_status", Description: "status", Parameters: params},
		{Name: "issue_refund", Description: "refund", Parameters: params, DeferLoading: true},
	}
	for _, p := range []protocol.Platform{protocol.PlatformAgents, protocol.PlatformResponses} {
		defs, err := tooldef.Definitions(specs, p)
		if err != nil {
			t.Fatal(err)
		}
		switch p {
		case protocol.PlatformAgents:
			_, err = c.Beta.Agents.Sessions.New(t.Context(), openai.BetaAgentSessionNewParams{
				Environment: openai.EnvironmentParamUnion{OfParamNone: &openai.EnvironmentParamNone{}},
				Agent:       openai.BetaAgentSessionNewParamsAgent{Model: openai.String("gpt-5.5")},
				Input:       openai.BetaAgentSessionNewParamsInputUnion{OfString: openai.String("hello")},
			}, option.WithJSONSet("agent.tools", defs))
		default:
			var r *responses.Response
			r, err = c.Responses.New(t.Context(), responses.ResponseNewParams{
				Model: "gpt-5.5", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("hello")},
			}, option.WithJSONSet("tools", defs))
			if err == nil && (len(r.Tools) != 3 || r.Tools[1].DeferLoading != true || r.Tools[2].Type != "tool_search") {
				t.Errorf("response tools = %s", mustJSON(r.Tools))
			}
		}
		if err != nil {
			t.Errorf("%s: %v", p, err)
		}
	}
	// Without the tool_search, Responses refuse the deferred function too.
	_, err := c.Responses.New(t.Context(), responses.ResponseNewParams{
		Model: "gpt-5.5", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("hello")},
		Tools: []responses.ToolUnionParam{{OfFunction: &responses.FunctionToolParam{Name: "issue_refund", Parameters: refundSchema, DeferLoading: openai.Bool(true)}}},
	})
	apiError(t, err, http.StatusBadRequest, "needs a {\"type\":\"tool_search\"} tool")
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
