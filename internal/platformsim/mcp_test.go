package platformsim_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/conversations"
	"github.com/openai/openai-go/v3/responses"

	"github.com/toolrelay/toolrelay/internal/platformsim"
	"github.com/toolrelay/toolrelay/internal/testutil"
)

// cityServer is an MCP server (the official SDK's) serving the
// favorite-city scenario's three functions; it records the calls and the
// Authorization header they came with.
type cityServer struct {
	url   string
	mu    sync.Mutex
	calls []string
	auth  []string
}

func newCityServer(t *testing.T) *cityServer {
	t.Helper()
	cs := &cityServer{}
	srv := mcp.NewServer(&mcp.Implementation{Name: "cities", Version: "1"}, nil)
	type location struct {
		Location string `json:"location,omitempty"`
		Unit     string `json:"unit,omitempty"`
	}
	add := func(name string, readOnly bool, answer func(location) (string, bool)) {
		mcp.AddTool(srv, &mcp.Tool{Name: name, Description: name + " of the user", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: readOnly}},
			func(_ context.Context, _ *mcp.CallToolRequest, in location) (*mcp.CallToolResult, any, error) {
				cs.mu.Lock()
				cs.calls = append(cs.calls, name)
				cs.mu.Unlock()
				out, failed := answer(in)
				return &mcp.CallToolResult{IsError: failed, Content: []mcp.Content{&mcp.TextContent{Text: out}}}, nil, nil
			})
	}
	add("getUserFavoriteCity", true, func(location) (string, bool) { return "Seattle, WA", false })
	add("getCityNickname", true, func(in location) (string, bool) {
		if in.Location != "Seattle, WA" {
			return "I know no nickname for " + in.Location, true
		}
		return "The Emerald City", false
	})
	add("getCurrentWeatherAtLocation", false, func(location) (string, bool) { return "70f", false })
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, &mcp.StreamableHTTPOptions{Stateless: true})
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cs.mu.Lock()
		cs.auth = append(cs.auth, r.Header.Get("Authorization"))
		cs.mu.Unlock()
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(hs.Close)
	cs.url = hs.URL
	return cs
}

func (cs *cityServer) called() []string {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	return slices.Clone(cs.calls)
}

func mcpTool(url string, approval responses.ToolMcpRequireApprovalUnionParam) responses.ToolUnionParam {
	return responses.ToolUnionParam{OfMcp: &responses.ToolMcpParam{ServerLabel: "cities", ServerURL: openai.String(url),
		Authorization: openai.String("tok-1"), RequireApproval: approval}}
}

// outputTypes lists the types of a response's output items.
func outputTypes(r *responses.Response) []string {
	var types []string
	for _, it := range r.Output {
		types = append(types, it.Type)
	}
	return types
}

// A Responses request with an mcp tool: the platform lists the server's
// tools once, calls them itself and answers, with mcp_list_tools and
// mcp_call items in the output, as the SDK decodes them.
func TestResponsesMCPTool(t *testing.T) {
	_, hs := newSim(t, platformsim.Options{})
	cs := newCityServer(t)
	c := client(hs)
	r, err := c.Responses.New(t.Context(), responses.ResponseNewParams{
		Model: "gpt-5.5", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("What's the weather like in my favorite city?")},
		Tools: []responses.ToolUnionParam{mcpTool(cs.url, responses.ToolMcpRequireApprovalUnionParam{OfMcpToolApprovalSetting: openai.String("never")})},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"mcp_list_tools", "mcp_call", "mcp_call", "mcp_call", "message"}
	if got := outputTypes(r); !slices.Equal(got, want) {
		t.Fatalf("output %v, want %v", got, want)
	}
	list := r.Output[0].AsMcpListTools()
	var names []string
	for _, tool := range list.Tools {
		names = append(names, tool.Name)
		if tool.InputSchema == nil {
			t.Errorf("%s listed without its input_schema", tool.Name)
		}
	}
	slices.Sort(names)
	if list.ServerLabel != "cities" || !slices.Equal(names, []string{"getCityNickname", "getCurrentWeatherAtLocation", "getUserFavoriteCity"}) {
		t.Errorf("mcp_list_tools %s %v", list.ServerLabel, names)
	}
	first := r.Output[1].AsMcpCall()
	if first.Name != "getUserFavoriteCity" || first.Output != "Seattle, WA" || first.ServerLabel != "cities" || first.Status != "completed" || first.ID == "" {
		t.Errorf("first mcp_call %+v", first)
	}
	if got := r.OutputText(); !strings.Contains(got, "The Emerald City") || !strings.Contains(got, "70f") {
		t.Errorf("answer %q", got)
	}
	if got := cs.called(); len(got) != 3 {
		t.Errorf("the server got calls %v, want three", got)
	}
	for _, a := range cs.auth {
		if a != "Bearer tok-1" {
			t.Errorf("a request reached the server with Authorization %q, want the tool's authorization", a)
		}
	}
}

// require_approval: a call that needs approval stops the response with an
// mcp_approval_request, and nothing runs until an mcp_approval_response
// answers it; approved, the call is made (its mcp_call names the request);
// denied, it is not, and the model is told. Tools are not listed again.
func TestResponsesMCPApproval(t *testing.T) {
	_, hs := newSim(t, platformsim.Options{})
	cs := newCityServer(t)
	c := client(hs)
	ctx := t.Context()
	tools := []responses.ToolUnionParam{mcpTool(cs.url, responses.ToolMcpRequireApprovalUnionParam{
		OfMcpToolApprovalFilter: &responses.ToolMcpRequireApprovalMcpToolApprovalFilterParam{
			Never: responses.ToolMcpRequireApprovalMcpToolApprovalFilterNeverParam{ToolNames: []string{"getUserFavoriteCity", "getCityNickname"}},
		}})}
	first, err := c.Responses.New(ctx, responses.ResponseNewParams{
		Model: "gpt-5.5", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("What's the weather like in my favorite city?")},
		Tools: tools,
	})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := outputTypes(first), []string{"mcp_list_tools", "mcp_call", "mcp_call", "mcp_approval_request"}; !slices.Equal(got, want) {
		t.Fatalf("first output %v, want %v", got, want)
	}
	req := first.Output[3].AsMcpApprovalRequest()
	if req.Name != "getCurrentWeatherAtLocation" || req.ServerLabel != "cities" || !strings.Contains(req.Arguments, "Seattle, WA") {
		t.Errorf("approval request %+v", req)
	}
	if got := cs.called(); slices.Contains(got, "getCurrentWeatherAtLocation") {
		t.Fatalf("the call waiting for approval ran: %v", got)
	}

	// Continuing without answering the request is refused.
	_, err = c.Responses.New(ctx, responses.ResponseNewParams{
		Model: "gpt-5.5", PreviousResponseID: openai.String(first.ID), Tools: tools,
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("go on")},
	})
	apiError(t, err, 400, "No approval response found for MCP approval request "+req.ID)

	answer := func(approve bool) *responses.Response {
		t.Helper()
		r, err := c.Responses.New(ctx, responses.ResponseNewParams{
			Model: "gpt-5.5", PreviousResponseID: openai.String(first.ID), Tools: tools,
			Input: responses.ResponseNewParamsInputUnion{OfInputItemList: responses.ResponseInputParam{
				responses.ResponseInputItemParamOfMcpApprovalResponse(req.ID, approve)}},
		})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	denied := answer(false)
	if got, want := outputTypes(denied), []string{"message"}; !slices.Equal(got, want) {
		t.Errorf("denied: output %v, want %v", got, want)
	}
	if got := denied.OutputText(); !strings.Contains(got, "did not approve") {
		t.Errorf("denied: answer %q; want the model told the call was not approved", got)
	}
	if slices.Contains(cs.called(), "getCurrentWeatherAtLocation") {
		t.Error("a denied call ran")
	}
	approved := answer(true)
	if got, want := outputTypes(approved), []string{"mcp_call", "message"}; !slices.Equal(got, want) {
		t.Fatalf("approved: output %v, want %v", got, want)
	}
	if call := approved.Output[0].AsMcpCall(); call.ApprovalRequestID != req.ID || call.Output != "70f" {
		t.Errorf("approved call %+v; want it to name the approval request", call)
	}
	if got := approved.OutputText(); !strings.Contains(got, "70f") || !strings.Contains(got, "The Emerald City") {
		t.Errorf("approved: answer %q", got)
	}
}

// A tool's failure (isError) is an mcp_call with an mcp_tool_execution_error
// whose text the model reads; a server that cannot be reached is an
// mcp_list_tools item with an error, and the others still serve.
func TestResponsesMCPToolErrors(t *testing.T) {
	_, hs := newSim(t, platformsim.Options{Model: &platformsim.Model{Scenarios: []platformsim.Scenario{{
		Name: "paris", Prompt: "nickname of paris",
		Steps:  []platformsim.Step{{{Name: "getCityNickname", Arguments: `{"location":"Paris"}`}}},
		Answer: `{{out "getCityNickname"}}`,
	}}}})
	cs := newCityServer(t)
	down := httptest.NewServer(http.NotFoundHandler())
	down.Close()
	never := responses.ToolMcpRequireApprovalUnionParam{OfMcpToolApprovalSetting: openai.String("never")}
	c := client(hs)
	r, err := c.Responses.New(t.Context(), responses.ResponseNewParams{
		Model: "gpt-5.5", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("What is the nickname of Paris?")},
		Tools: []responses.ToolUnionParam{mcpTool(cs.url, never),
			{OfMcp: &responses.ToolMcpParam{ServerLabel: "down", ServerURL: openai.String(down.URL), RequireApproval: never}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := outputTypes(r), []string{"mcp_list_tools", "mcp_list_tools", "mcp_call", "message"}; !slices.Equal(got, want) {
		t.Fatalf("output %v, want %v", got, want)
	}
	if l := r.Output[1].AsMcpListTools(); l.ServerLabel != "down" || !strings.Contains(l.Error, "down") {
		t.Errorf("listing of an unreachable server: %+v", l)
	}
	call := r.Output[2].AsMcpCall()
	if call.Status != "failed" || call.Error.Type != "mcp_tool_execution_error" || call.Output != "" {
		t.Errorf("failed call %+v", call)
	}
	if got := r.OutputText(); got != "I know no nickname for Paris" {
		t.Errorf("answer %q; want the tool's error text", got)
	}
}

// allowed_tools narrows what the model sees of a server: a tool left out
// is not called over MCP, and the model's call of a function no server
// lists goes to the client as a function_call, beside the MCP calls.
func TestResponsesMCPAllowedTools(t *testing.T) {
	_, hs := newSim(t, platformsim.Options{})
	cs := newCityServer(t)
	c := client(hs)
	tool := mcpTool(cs.url, responses.ToolMcpRequireApprovalUnionParam{OfMcpToolApprovalSetting: openai.String("never")})
	tool.OfMcp.AllowedTools = responses.ToolMcpAllowedToolsUnionParam{OfMcpAllowedTools: []string{"getUserFavoriteCity"}}
	r, err := c.Responses.New(t.Context(), responses.ResponseNewParams{
		Model: "gpt-5.5", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("What's the weather like in my favorite city?")},
		Tools: []responses.ToolUnionParam{tool},
	})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := outputTypes(r), []string{"mcp_list_tools", "mcp_call", "function_call", "function_call"}; !slices.Equal(got, want) {
		t.Fatalf("output %v, want %v", got, want)
	}
	if l := r.Output[0].AsMcpListTools(); len(l.Tools) != 1 || l.Tools[0].Name != "getUserFavoriteCity" {
		t.Errorf("listed %+v; want only the allowed tool", l.Tools)
	}
	if got := cs.called(); !slices.Equal(got, []string{"getUserFavoriteCity"}) {
		t.Errorf("the server got %v; want only the allowed tool called", got)
	}
	var outputs responses.ResponseInputParam
	for _, it := range r.Output[2:] {
		fc := it.AsFunctionCall()
		out := map[string]string{"getCityNickname": "The Emerald City", "getCurrentWeatherAtLocation": "70f"}[fc.Name]
		o := responses.ResponseInputItemParamOfFunctionCallOutput(out)
		o.OfFunctionCallOutput.CallID = openai.String(fc.CallID)
		outputs = append(outputs, o)
	}
	final, err := c.Responses.New(t.Context(), responses.ResponseNewParams{Model: "gpt-5.5", PreviousResponseID: openai.String(r.ID),
		Input: responses.ResponseNewParamsInputUnion{OfInputItemList: outputs}, Tools: []responses.ToolUnionParam{tool}})
	if err != nil {
		t.Fatal(err)
	}
	if got := final.OutputText(); got != "Your favorite city, Seattle, WA, is also known as The Emerald City. The current weather there is 70f." {
		t.Errorf("answer %q", got)
	}
	if got := outputTypes(final); !slices.Equal(got, []string{"message"}) {
		t.Errorf("final output %v; the tools were listed already in this conversation", got)
	}
}

// In the background the platform makes the MCP calls after answering
// queued; the response completes with them, and the conversation holds the
// items.
func TestResponsesMCPToolInTheBackground(t *testing.T) {
	_, hs := newSim(t, platformsim.Options{})
	cs := newCityServer(t)
	c := client(hs)
	ctx := t.Context()
	conv, err := c.Conversations.New(ctx, conversations.ConversationNewParams{})
	if err != nil {
		t.Fatal(err)
	}
	r, err := c.Responses.New(ctx, responses.ResponseNewParams{
		Model: "gpt-5.5", Background: openai.Bool(true),
		Conversation: responses.ResponseNewParamsConversationUnion{OfString: openai.String(conv.ID)},
		Input:        responses.ResponseNewParamsInputUnion{OfString: openai.String("What's the weather like in my favorite city?")},
		Tools:        []responses.ToolUnionParam{mcpTool(cs.url, responses.ToolMcpRequireApprovalUnionParam{OfMcpToolApprovalSetting: openai.String("never")})},
	})
	if err != nil || r.Status != "queued" {
		t.Fatalf("background response: %v %v; want queued", r, err)
	}
	testutil.WaitForWhat(t, 10*time.Second, "the background response to complete", func() bool {
		r, err = c.Responses.Get(ctx, r.ID, responses.ResponseGetParams{})
		return err == nil && r.Status == "completed"
	})
	if got := r.OutputText(); !strings.Contains(got, "The Emerald City") {
		t.Errorf("answer %q", got)
	}
	items, err := c.Conversations.Items.List(ctx, conv.ID, conversations.ItemListParams{Order: "asc"})
	if err != nil {
		t.Fatal(err)
	}
	var types []string
	for _, it := range items.Data {
		types = append(types, it.Type)
	}
	if want := []string{"message", "mcp_list_tools", "mcp_call", "mcp_call", "mcp_call", "message"}; !slices.Equal(types, want) {
		t.Errorf("conversation items %v, want %v", types, want)
	}
}
