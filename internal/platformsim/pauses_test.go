package platformsim_test

import (
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/responses"
	"github.com/openai/openai-go/v3/shared"

	"github.com/toolrelay/toolrelay/internal/platformsim"
	"github.com/toolrelay/toolrelay/internal/testutil"
)

// pauseScenarios are the pauses a platform makes besides function calls.
var pauseScenarios = []platformsim.Scenario{
	{Name: "custom", Prompt: "run sql", Steps: []platformsim.Step{{{Name: "run_sql", Kind: platformsim.KindCustom, Arguments: "SELECT 1"}}},
		Answer: `rows: {{out "run_sql"}}`},
	{Name: "approval", Prompt: "needs approval", Steps: []platformsim.Step{{{Name: "get_weather", Arguments: `{"location":"Oz"}`}, {Name: "delete_repo", Kind: "mcp_approval_request"}}}},
	{Name: "unknown", Prompt: "new item", Steps: []platformsim.Step{{{Kind: "hologram_call"}}}},
	{Name: "environment", Prompt: "connect env", Steps: []platformsim.Step{{
		{Name: "get_weather", Arguments: `{"location":"Oz"}`}, {Name: "env_1", Kind: "environment_connection"}}}},
}

// TestResponsesCustomToolCall: a custom tool declared with a regex
// grammar, its custom_tool_call as the SDK reads it, answered with the
// SDK's custom_tool_call_output and not with a function_call_output; a
// custom tool whose format the platform would refuse is refused.
func TestResponsesCustomToolCall(t *testing.T) {
	_, hs := newSim(t, platformsim.Options{Model: &platformsim.Model{Scenarios: pauseScenarios}})
	c := client(hs)
	ctx := t.Context()
	runSQL := func(format shared.CustomToolInputFormatUnionParam) []responses.ToolUnionParam {
		return []responses.ToolUnionParam{{OfCustom: &responses.CustomToolParam{Name: "run_sql",
			Description: openai.String("Runs one SELECT statement."), Format: format}}}
	}
	grammar := func(syntax, definition string) shared.CustomToolInputFormatUnionParam {
		return shared.CustomToolInputFormatUnionParam{OfGrammar: &shared.CustomToolInputFormatGrammarParam{Syntax: syntax, Definition: definition}}
	}
	first, err := c.Responses.New(ctx, responses.ResponseNewParams{Model: "gpt-5.5",
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("please run sql")},
		Tools: runSQL(grammar("regex", `SELECT [0-9]+`))})
	if err != nil {
		t.Fatal(err)
	}
	if len(first.Output) != 1 || first.Output[0].Type != "custom_tool_call" {
		t.Fatalf("output = %+v", first.Output)
	}
	cc := first.Output[0].AsCustomToolCall()
	if cc.Name != "run_sql" || cc.Input != "SELECT 1" || cc.CallID == "" {
		t.Fatalf("custom_tool_call = %+v", cc)
	}
	if len(first.Tools) != 1 || first.Tools[0].AsCustom().Format.AsGrammar().Definition != `SELECT [0-9]+` {
		t.Errorf("the response's tools = %s", first.JSON.Tools.Raw())
	}
	answer := func(item responses.ResponseInputItemUnionParam) (*responses.Response, error) {
		return c.Responses.New(ctx, responses.ResponseNewParams{Model: "gpt-5.5", PreviousResponseID: openai.String(first.ID),
			Input: responses.ResponseNewParamsInputUnion{OfInputItemList: responses.ResponseInputParam{item}}})
	}
	asFunction := responses.ResponseInputItemParamOfFunctionCallOutput("1")
	asFunction.OfFunctionCallOutput.CallID = openai.String(cc.CallID)
	_, err = answer(asFunction)
	apiError(t, err, 400, "No tool call found for function call output with call_id "+cc.CallID)
	final, err := answer(responses.ResponseInputItemParamOfCustomToolCallOutput(cc.CallID, "1"))
	if err != nil {
		t.Fatal(err)
	}
	if got := final.OutputText(); got != "rows: 1" {
		t.Errorf("final = %q", got)
	}

	for _, tc := range []struct {
		format shared.CustomToolInputFormatUnionParam
		want   string
	}{
		{grammar("pcre", `SELECT 1`), "'tools[0].format.syntax': must be 'lark' or 'regex'"},
		{grammar("regex", ""), "Missing required parameter: 'tools[0].format.definition'"},
		{grammar("regex", `SELECT (`), "Invalid regex grammar in 'tools[0].format.definition'"},
	} {
		_, err := c.Responses.New(ctx, responses.ResponseNewParams{Model: "gpt-5.5",
			Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("please run sql")}, Tools: runSQL(tc.format)})
		apiError(t, err, 400, tc.want)
	}
	if _, err := c.Responses.New(ctx, responses.ResponseNewParams{Model: "gpt-5.5",
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("please run sql")},
		Tools: runSQL(shared.CustomToolInputFormatUnionParam{OfText: &shared.CustomToolInputFormatTextParam{}})}); err != nil {
		t.Errorf("a custom tool with format text: %v", err)
	}
}

// TestResponsesUnservedItems: items the client must answer that are not
// function calls, known to the SDK or not, decode through its union.
func TestResponsesUnservedItems(t *testing.T) {
	_, hs := newSim(t, platformsim.Options{Model: &platformsim.Model{Scenarios: pauseScenarios}})
	c := client(hs)
	for prompt, want := range map[string][]string{
		"needs approval": {"function_call", "mcp_approval_request"},
		"new item":       {"hologram_call"},
	} {
		r, err := c.Responses.New(t.Context(), responses.ResponseNewParams{Model: "gpt-5.5",
			Input: responses.ResponseNewParamsInputUnion{OfString: openai.String(prompt)}})
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, it := range r.Output {
			got = append(got, it.Type)
		}
		if len(got) != len(want) || got[0] != want[0] || got[len(got)-1] != want[len(want)-1] {
			t.Errorf("%s: output types = %v, want %v", prompt, got, want)
		}
		if want[0] == "function_call" && r.Output[1].AsMcpApprovalRequest().ID == "" {
			t.Errorf("%s: approval request without id: %s", prompt, r.Output[1].RawJSON())
		}
	}
}

// TestAgentsEnvironmentConnectionAction: a session that waits on a
// non-function action, as the SDK reads it.
func TestAgentsEnvironmentConnectionAction(t *testing.T) {
	_, hs := newSim(t, platformsim.Options{Model: &platformsim.Model{Scenarios: pauseScenarios}})
	c := client(hs)
	ctx := t.Context()
	sess, err := c.Beta.Agents.Sessions.New(ctx, openai.BetaAgentSessionNewParams{
		Environment: openai.EnvironmentParamUnion{OfParamNone: &openai.EnvironmentParamNone{}},
		Input:       openai.BetaAgentSessionNewParamsInputUnion{OfString: openai.String("connect env")},
	})
	if err != nil {
		t.Fatal(err)
	}
	var got *openai.AgentSession
	testutil.WaitForWhat(t, 5*time.Second, "the session to require action", func() bool {
		got, err = c.Beta.Agents.Sessions.Get(ctx, sess.ID)
		return err == nil && got.Status == "requires_action"
	})
	if len(got.RequiredActions) != 2 || got.RequiredActions[0].Type != "function_call" || got.RequiredActions[1].Type != "environment_connection" ||
		got.RequiredActions[1].AsEnvironmentConnection().EnvironmentID != "env_1" {
		t.Fatalf("required actions = %+v", got.RequiredActions)
	}
	// The function call answered, the session still waits on the
	// environment connection, which nothing here answers.
	fc := got.RequiredActions[0].AsFunctionCall()
	params := openai.BetaAgentSessionEventNewParams{Events: []openai.AgentSessionInputParamUnion{
		openai.AgentSessionInputParamOfParamAgentSessionInputToolResult(fc.CallID, true, fc.TurnID)}}
	params.Events[0].OfParamAgentSessionInputToolResult.Output = openai.AgentFunctionCallOutputParamUnion{OfString: openai.String("sunny")}
	if err := c.Beta.Agents.Sessions.Events.New(ctx, sess.ID, params); err != nil {
		t.Fatal(err)
	}
	got, err = c.Beta.Agents.Sessions.Get(ctx, sess.ID)
	if err != nil || got.Status != "requires_action" || len(got.RequiredActions) != 1 || got.RequiredActions[0].Type != "environment_connection" {
		t.Fatalf("after the function call's result: %+v, %v; want requires_action on the environment connection alone", got, err)
	}
}

// TestResponsesClientToolSearch: a client-executed tool_search_call as the
// SDK reads it, answered with the SDK's tool_search_output, after which
// the model calls the function the search loaded; a malformed output is
// refused.
func TestResponsesClientToolSearch(t *testing.T) {
	_, hs := newSim(t, platformsim.Options{Model: &platformsim.Model{Scenarios: []platformsim.Scenario{{
		Name: "search", Prompt: "refund",
		Steps: []platformsim.Step{
			{{Kind: platformsim.KindToolSearch, Arguments: "refund an order"}},
			{{Name: "issue_refund", Arguments: `{"order_id":"A-1"}`}},
		},
		Answer: `loaded {{out "tool_search"}}; {{out "issue_refund"}}`,
	}}}})
	c := client(hs)
	ctx := t.Context()
	first, err := c.Responses.New(ctx, responses.ResponseNewParams{Model: "gpt-5.5",
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("please refund")},
		Tools: []responses.ToolUnionParam{
			{OfFunction: &responses.FunctionToolParam{Name: "get_order_status", Parameters: map[string]any{"type": "object"}}},
			{OfToolSearch: &responses.ToolSearchToolParam{Execution: responses.ToolSearchToolExecutionClient}},
		}})
	if err != nil {
		t.Fatal(err)
	}
	if len(first.Output) != 1 || first.Output[0].Type != "tool_search_call" {
		t.Fatalf("output = %+v", first.Output)
	}
	ts := first.Output[0].AsToolSearchCall()
	if ts.Execution != responses.ResponseToolSearchCallExecutionClient || ts.CallID == "" ||
		ts.JSON.Arguments.Raw() != `{"query":"refund an order"}` {
		t.Fatalf("tool_search_call = %s", first.Output[0].RawJSON())
	}
	answer := func(tools []responses.ResponseToolSearchOutputItemParamToolUnion) (*responses.Response, error) {
		item := responses.ResponseInputItemParamOfToolSearchOutput(tools)
		item.OfToolSearchOutput.CallID = openai.String(ts.CallID)
		item.OfToolSearchOutput.Execution = responses.ResponseToolSearchOutputItemParamExecutionClient
		return c.Responses.New(ctx, responses.ResponseNewParams{Model: "gpt-5.5", PreviousResponseID: openai.String(first.ID),
			Input: responses.ResponseNewParamsInputUnion{OfInputItemList: responses.ResponseInputParam{item}}})
	}
	if _, err := answer([]responses.ResponseToolSearchOutputItemParamToolUnion{{OfFunction: &responses.FunctionToolParam{}}}); err == nil {
		t.Fatal("a loaded function without a name was accepted")
	}
	next, err := answer([]responses.ResponseToolSearchOutputItemParamToolUnion{{OfFunction: &responses.FunctionToolParam{
		Name: "issue_refund", Description: openai.String("Refund an order"), DeferLoading: openai.Bool(true),
		Parameters: map[string]any{"type": "object", "properties": map[string]any{"order_id": map[string]any{"type": "string"}}},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	if len(next.Output) != 1 || next.Output[0].AsFunctionCall().Name != "issue_refund" {
		t.Fatalf("after the search: %+v", next.Output)
	}
	final, err := c.Responses.New(ctx, responses.ResponseNewParams{Model: "gpt-5.5", PreviousResponseID: openai.String(next.ID),
		Input: responses.ResponseNewParamsInputUnion{OfInputItemList: responses.ResponseInputParam{
			{OfFunctionCallOutput: &responses.ResponseInputItemFunctionCallOutputParam{CallID: openai.String(next.Output[0].AsFunctionCall().CallID),
				Output: responses.ResponseInputItemFunctionCallOutputOutputUnionParam{OfString: openai.String("done")}}},
		}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := final.OutputText(); got != "loaded issue_refund; done" {
		t.Errorf("final = %q", got)
	}
}
