package platformsim_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/azure"
	"github.com/openai/openai-go/v3/conversations"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"

	"github.com/toolrelay/toolrelay/internal/platformsim"
	"github.com/toolrelay/toolrelay/internal/testutil"
)

// These tests drive the simulator with the official SDK, unchanged: they are
// the proof that it speaks the platforms' wire format.

const apiKey = "sk-sim-test"

func newSim(t *testing.T, opts platformsim.Options) (*platformsim.Server, *httptest.Server) {
	t.Helper()
	if opts.Model == nil {
		opts.Model = &platformsim.Model{Scenarios: platformsim.SeedScenarios()}
	}
	if opts.APIKey == "" {
		opts.APIKey = apiKey
	}
	sim := platformsim.New(opts)
	hs := httptest.NewServer(sim)
	t.Cleanup(func() { hs.CloseClientConnections(); sim.Close(); hs.Close() })
	return sim, hs
}

func client(hs *httptest.Server, opts ...option.RequestOption) openai.Client {
	return openai.NewClient(append([]option.RequestOption{
		option.WithBaseURL(hs.URL + "/v1"), option.WithAPIKey(apiKey), option.WithMaxRetries(0),
	}, opts...)...)
}

func apiError(t *testing.T, err error, status int, contains string) {
	t.Helper()
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) {
		t.Fatalf("err = %v, want *openai.Error", err)
	}
	if apiErr.StatusCode != status || !strings.Contains(apiErr.Message, contains) {
		t.Fatalf("error = %d %q, want %d containing %q", apiErr.StatusCode, apiErr.Message, status, contains)
	}
}

func TestAgentsSessionStreamHelper(t *testing.T) {
	sim, hs := newSim(t, platformsim.Options{})
	c := client(hs)
	ctx := t.Context()
	sess, err := c.Beta.Agents.Sessions.New(ctx, openai.BetaAgentSessionNewParams{
		Environment: openai.EnvironmentParamOfParamSelfHosted("/work"),
		Agent:       openai.BetaAgentSessionNewParamsAgent{Model: openai.String("gpt-5.5")},
	})
	if err != nil {
		t.Fatal(err)
	}
	if sess.Status != "idle" {
		t.Fatalf("new session status = %s, want idle", sess.Status)
	}
	stream := c.Beta.Agents.Sessions.Stream(ctx, sess.ID, openai.AgentSessionStreamParams{
		Input: "Tell me about customer 123",
		ToolHandlers: map[string]openai.AgentToolHandler{
			"get_customer": func(ctx context.Context, args map[string]any) (any, error) {
				if args["customer_id"] != "123" {
					return nil, errors.New("wrong customer")
				}
				return map[string]any{"name": "Example Customer", "plan": "pro"}, nil
			},
			"get_weather": func(ctx context.Context, args map[string]any) (any, error) {
				return map[string]any{"location": args["location"], "conditions": "sunny", "temperature": "22c"}, nil
			},
		},
	}).WithResultCollection()
	res, err := stream.FinalResult()
	if err != nil {
		t.Fatal(err)
	}
	want := `Customer 123 is Example Customer on the pro plan. In Paris, France it is sunny and 22c.`
	if got := res.OutputText(); got != want {
		t.Errorf("final answer = %q, want %q", got, want)
	}
	if got := sim.Stats().ToolResults; got != 2 {
		t.Errorf("tool results accepted = %d, want 2", got)
	}
}

func TestAgentsCreationStream(t *testing.T) {
	_, hs := newSim(t, platformsim.Options{})
	c := client(hs)
	stream := c.Beta.Agents.Sessions.NewStreaming(t.Context(), openai.BetaAgentSessionNewParams{
		Environment: openai.EnvironmentParamUnion{OfParamNone: &openai.EnvironmentParamNone{}},
		Input:       openai.BetaAgentSessionNewParamsInputUnion{OfString: openai.String("what's my horoscope")},
		ToolHandlers: map[string]openai.AgentToolHandler{
			"get_horoscope": func(ctx context.Context, args map[string]any) (any, error) {
				return args["sign"].(string) + ": Next Tuesday you will befriend a baby otter.", nil
			},
		},
	})
	res, err := openai.BetaAgentSessionFinalResult(stream)
	if err != nil {
		t.Fatal(err)
	}
	if got := res.OutputText(); got != "Your horoscope: Aquarius: Next Tuesday you will befriend a baby otter." {
		t.Errorf("final answer = %q", got)
	}
}

func TestAgentsRequiredActionsAndToolResults(t *testing.T) {
	sim, hs := newSim(t, platformsim.Options{})
	c := client(hs)
	ctx := t.Context()
	sess, err := c.Beta.Agents.Sessions.New(ctx, openai.BetaAgentSessionNewParams{
		Environment: openai.EnvironmentParamUnion{OfParamNone: &openai.EnvironmentParamNone{}},
		Input:       openai.BetaAgentSessionNewParamsInputUnion{OfString: openai.String("customer 123 please")},
	})
	if err != nil {
		t.Fatal(err)
	}
	var got *openai.AgentSession
	testutil.WaitForWhat(t, 5*time.Second, "the session to require action", func() bool {
		got, err = c.Beta.Agents.Sessions.Get(ctx, sess.ID)
		return err == nil && got.Status == "requires_action"
	})
	if len(got.RequiredActions) != 2 {
		t.Fatalf("required actions = %d, want 2", len(got.RequiredActions))
	}
	for i, a := range got.RequiredActions {
		fc := a.AsFunctionCall()
		args, ok := fc.Arguments.(map[string]any)
		if a.Type != "function_call" || fc.CallID == "" || fc.TurnID == "" || !ok {
			t.Fatalf("required action %d = %+v", i, fc)
		}
		params := openai.BetaAgentSessionEventNewParams{
			Events: []openai.AgentSessionInputParamUnion{
				openai.AgentSessionInputParamOfParamAgentSessionInputToolResult(fc.CallID, true, fc.TurnID),
			},
			IdempotencyKey: openai.String("key-" + fc.CallID),
		}
		params.Events[0].OfParamAgentSessionInputToolResult.Output = openai.AgentFunctionCallOutputParamUnion{OfString: openai.String(fc.Name + " output")}
		if fc.Name == "get_weather" {
			params.Events[0].OfParamAgentSessionInputToolResult.Success = false
			params.Events[0].OfParamAgentSessionInputToolResult.Output = openai.AgentFunctionCallOutputParamUnion{}
			params.Events[0].OfParamAgentSessionInputToolResult.Error = openai.String("weather service down")
			if args["location"] != "Paris, France" {
				t.Errorf("arguments = %v", args)
			}
		}
		if err := c.Beta.Agents.Sessions.Events.New(ctx, sess.ID, params); err != nil {
			t.Fatal(err)
		}
		// A retry with the same key and body is accepted and changes nothing.
		if err := c.Beta.Agents.Sessions.Events.New(ctx, sess.ID, params); err != nil {
			t.Fatalf("replay with the same Idempotency-Key: %v", err)
		}
		if i == 0 {
			if s, _ := c.Beta.Agents.Sessions.Get(ctx, sess.ID); s.Status != "requires_action" || len(s.RequiredActions) != 1 {
				t.Errorf("after one of two results: status %s with %d actions", s.Status, len(s.RequiredActions))
			}
		}
	}
	if n := sim.Stats().ToolResults; n != 2 {
		t.Errorf("tool results accepted = %d, want 2", n)
	}
	// A result for a call that is no longer pending gets the exact error the
	// SDK's race retry recognises.
	late := openai.BetaAgentSessionEventNewParams{Events: []openai.AgentSessionInputParamUnion{
		openai.AgentSessionInputParamOfParamAgentSessionInputToolResult(got.RequiredActions[0].CallID, true, got.RequiredActions[0].TurnID),
	}}
	err = c.Beta.Agents.Sessions.Events.New(ctx, sess.ID, late)
	apiError(t, err, 400, "Unknown pending tool call: "+got.RequiredActions[0].CallID)

	testutil.WaitForWhat(t, 5*time.Second, "the session to be idle", func() bool {
		s, err := c.Beta.Agents.Sessions.Get(ctx, sess.ID)
		return err == nil && s.Status == "idle"
	})
	items, err := c.Beta.Agents.Sessions.Items.List(ctx, sess.ID, openai.BetaAgentSessionItemListParams{Limit: openai.Int(1)})
	if err != nil {
		t.Fatal(err)
	}
	if len(items.Data) != 1 || !items.HasMore {
		t.Fatalf("items page = %d items, has_more %v", len(items.Data), items.HasMore)
	}
	msg := items.Data[0]
	if msg.Type != "message" || msg.Role != "assistant" {
		t.Fatalf("latest item = %s/%s", msg.Type, msg.Role)
	}
	if !strings.Contains(msg.RawJSON(), "get_customer output") || !strings.Contains(msg.RawJSON(), "error: weather service down") {
		t.Errorf("final message does not reflect the outputs: %s", msg.RawJSON())
	}
	turns, err := c.Beta.Agents.Sessions.Turns.List(ctx, sess.ID, openai.BetaAgentSessionTurnListParams{})
	if err != nil || len(turns.Data) != 1 || turns.Data[0].Status != "completed" {
		t.Fatalf("turns = %+v, %v", turns, err)
	}
}

func TestAssistantsRunsAndSubmitToolOutputs(t *testing.T) {
	sim, hs := newSim(t, platformsim.Options{})
	c := client(hs)
	ctx := t.Context()
	asst, err := c.Beta.Assistants.New(ctx, openai.BetaAssistantNewParams{Model: "gpt-4o"})
	if err != nil {
		t.Fatal(err)
	}
	run, err := c.Beta.Threads.NewAndRun(ctx, openai.BetaThreadNewAndRunParams{
		AssistantID: asst.ID,
		Thread: openai.BetaThreadNewAndRunParamsThread{Messages: []openai.BetaThreadNewAndRunParamsThreadMessage{{
			Role: "user", Content: openai.BetaThreadNewAndRunParamsThreadMessageContentUnion{OfString: openai.String("What's the weather in my favorite city?")},
		}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if run.ExpiresAt-run.CreatedAt != 600 {
		t.Errorf("expires_at - created_at = %d, want 600", run.ExpiresAt-run.CreatedAt)
	}
	poll := func(status openai.RunStatus) *openai.Run {
		var r *openai.Run
		testutil.WaitForWhat(t, 5*time.Second, "the run to be "+string(status), func() bool {
			r, err = c.Beta.Threads.Runs.Get(ctx, run.ThreadID, run.ID)
			return err == nil && r.Status == status
		})
		return r
	}
	r := poll("requires_action")
	calls := r.RequiredAction.SubmitToolOutputs.ToolCalls
	if len(calls) != 1 || calls[0].Function.Name != "getUserFavoriteCity" {
		t.Fatalf("step 1 calls = %+v", calls)
	}
	r, err = c.Beta.Threads.Runs.SubmitToolOutputs(ctx, run.ThreadID, run.ID, openai.BetaThreadRunSubmitToolOutputsParams{
		ToolOutputs: []openai.BetaThreadRunSubmitToolOutputsParamsToolOutput{{ToolCallID: openai.String(calls[0].ID), Output: openai.String("Seattle, WA")}},
	})
	if err != nil {
		t.Fatal(err)
	}
	r = poll("requires_action")
	calls = r.RequiredAction.SubmitToolOutputs.ToolCalls
	if len(calls) != 2 || !strings.Contains(calls[0].Function.Arguments, `"Seattle, WA"`) {
		t.Fatalf("step 2 calls = %+v", calls)
	}
	outputs := map[string]string{"getCityNickname": "The Emerald City", "getCurrentWeatherAtLocation": "70f"}
	// Every output must come in one submission.
	_, err = c.Beta.Threads.Runs.SubmitToolOutputs(ctx, run.ThreadID, run.ID, openai.BetaThreadRunSubmitToolOutputsParams{
		ToolOutputs: []openai.BetaThreadRunSubmitToolOutputsParamsToolOutput{{ToolCallID: openai.String(calls[0].ID), Output: openai.String("x")}},
	})
	apiError(t, err, 400, "Expected tool outputs for call_ids")
	var all []openai.BetaThreadRunSubmitToolOutputsParamsToolOutput
	for _, tc := range calls {
		all = append(all, openai.BetaThreadRunSubmitToolOutputsParamsToolOutput{ToolCallID: openai.String(tc.ID), Output: openai.String(outputs[tc.Function.Name])})
	}
	if _, err := c.Beta.Threads.Runs.SubmitToolOutputs(ctx, run.ThreadID, run.ID, openai.BetaThreadRunSubmitToolOutputsParams{ToolOutputs: all}); err != nil {
		t.Fatal(err)
	}
	poll("completed")
	// Submitting again is refused: the run no longer waits.
	_, err = c.Beta.Threads.Runs.SubmitToolOutputs(ctx, run.ThreadID, run.ID, openai.BetaThreadRunSubmitToolOutputsParams{ToolOutputs: all})
	apiError(t, err, 400, `Runs in status "completed" do not accept tool outputs.`)

	msgs, err := c.Beta.Threads.Messages.List(ctx, run.ThreadID, openai.BetaThreadMessageListParams{})
	if err != nil {
		t.Fatal(err)
	}
	want := "Your favorite city, Seattle, WA, is also known as The Emerald City. The current weather there is 70f."
	if got := msgs.Data[0].Content[0].Text.Value; msgs.Data[0].Role != "assistant" || got != want {
		t.Errorf("answer = %q, want %q", got, want)
	}
	if n := sim.Stats().SubmitToolOutputs; n != 2 {
		t.Errorf("accepted submissions = %d, want 2", n)
	}
}

func TestAssistantsRunExpires(t *testing.T) {
	_, hs := newSim(t, platformsim.Options{})
	c := client(hs)
	ctx := t.Context()
	asst, err := c.Beta.Assistants.New(ctx, openai.BetaAssistantNewParams{Model: "gpt-4o"})
	if err != nil {
		t.Fatal(err)
	}
	run, err := c.Beta.Threads.NewAndRun(ctx, openai.BetaThreadNewAndRunParams{
		AssistantID: asst.ID,
		Metadata:    map[string]string{platformsim.SimTTLMetadataKey: "1s"},
		Thread: openai.BetaThreadNewAndRunParamsThread{Messages: []openai.BetaThreadNewAndRunParamsThreadMessage{{
			Role: "user", Content: openai.BetaThreadNewAndRunParamsThreadMessageContentUnion{OfString: openai.String("my favorite city")},
		}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	var r *openai.Run
	testutil.WaitForWhat(t, 5*time.Second, "the run to expire", func() bool {
		r, err = c.Beta.Threads.Runs.Get(ctx, run.ThreadID, run.ID)
		return err == nil && r.Status == "expired"
	})
	_, err = c.Beta.Threads.Runs.SubmitToolOutputs(ctx, run.ThreadID, run.ID, openai.BetaThreadRunSubmitToolOutputsParams{
		ToolOutputs: []openai.BetaThreadRunSubmitToolOutputsParamsToolOutput{{ToolCallID: openai.String("call_x"), Output: openai.String("x")}},
	})
	apiError(t, err, 400, `Runs in status "expired" do not accept tool outputs.`)
}

func TestResponsesFunctionCallLoop(t *testing.T) {
	sim, hs := newSim(t, platformsim.Options{})
	c := client(hs)
	ctx := t.Context()
	first, err := c.Responses.New(ctx, responses.ResponseNewParams{
		Model: "gpt-5.5",
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("What is my horoscope? I am an Aquarius.")},
	})
	if err != nil {
		t.Fatal(err)
	}
	var calls []responses.ResponseFunctionToolCall
	for _, it := range first.Output {
		if it.Type == "function_call" {
			calls = append(calls, it.AsFunctionCall())
		}
	}
	if first.Status != "completed" || len(calls) != 1 || calls[0].Name != "get_horoscope" || calls[0].Arguments != `{"sign":"Aquarius"}` {
		t.Fatalf("first response = %s %+v", first.Status, calls)
	}
	// A continuation without the output is refused.
	_, err = c.Responses.New(ctx, responses.ResponseNewParams{
		Model: "gpt-5.5", PreviousResponseID: openai.String(first.ID),
		Input: responses.ResponseNewParamsInputUnion{OfInputItemList: responses.ResponseInputParam{}},
	})
	apiError(t, err, 400, "No tool output found for function call "+calls[0].CallID)

	out := responses.ResponseInputItemParamOfFunctionCallOutput("Aquarius: Next Tuesday you will befriend a baby otter.")
	out.OfFunctionCallOutput.CallID = openai.String(calls[0].CallID)
	final, err := c.Responses.New(ctx, responses.ResponseNewParams{
		Model: "gpt-5.5", PreviousResponseID: openai.String(first.ID),
		Input: responses.ResponseNewParamsInputUnion{OfInputItemList: responses.ResponseInputParam{out}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := final.OutputText(); got != "Your horoscope: Aquarius: Next Tuesday you will befriend a baby otter." {
		t.Errorf("final = %q", got)
	}
	if final.PreviousResponseID != first.ID {
		t.Errorf("previous_response_id = %q", final.PreviousResponseID)
	}
	if n := sim.Stats().FunctionCallOutputs; n != 1 {
		t.Errorf("outputs accepted = %d, want 1", n)
	}
}

func TestResponsesBackgroundAndConversation(t *testing.T) {
	_, hs := newSim(t, platformsim.Options{})
	c := client(hs)
	ctx := t.Context()
	conv, err := c.Conversations.New(ctx, conversations.ConversationNewParams{})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Responses.New(ctx, responses.ResponseNewParams{
		Model: "gpt-5.5", Background: openai.Bool(true),
		Conversation: responses.ResponseNewParamsConversationUnion{OfString: openai.String(conv.ID)},
		Input:        responses.ResponseNewParamsInputUnion{OfString: openai.String("customer 123")},
	})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Status != "queued" {
		t.Fatalf("background response status = %s, want queued", resp.Status)
	}
	testutil.WaitForWhat(t, 5*time.Second, "the background response to complete", func() bool {
		resp, err = c.Responses.Get(ctx, resp.ID, responses.ResponseGetParams{})
		return err == nil && resp.Status == "completed"
	})
	items, err := c.Conversations.Items.List(ctx, conv.ID, conversations.ItemListParams{Order: "asc"})
	if err != nil {
		t.Fatal(err)
	}
	var pending int
	for _, it := range items.Data {
		if it.Type == "function_call" {
			pending++
		}
	}
	if pending != 2 {
		t.Fatalf("pending calls in the conversation = %d, want 2", pending)
	}
}

func TestFoundryProjectEndpointWithBearerToken(t *testing.T) {
	_, hs := newSim(t, platformsim.Options{APIKey: "entra-token"})
	c := openai.NewClient(option.WithBaseURL(hs.URL+"/api/projects/p1/openai/v1"), option.WithAPIKey("entra-token"), option.WithMaxRetries(0))
	resp, err := c.Responses.New(t.Context(), responses.ResponseNewParams{
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("horoscope please")},
	}, option.WithJSONSet("agent_reference", map[string]any{"type": "agent_reference", "name": "order-desk", "version": "3"}))
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Output) != 1 || resp.Output[0].Type != "function_call" {
		t.Fatalf("output = %+v", resp.Output)
	}

	wrong := openai.NewClient(option.WithBaseURL(hs.URL+"/api/projects/p1/openai/v1"), option.WithAPIKey("stale-token"), option.WithMaxRetries(0))
	_, err = wrong.Responses.Get(t.Context(), resp.ID, responses.ResponseGetParams{})
	apiError(t, err, http.StatusUnauthorized, "Incorrect API key")
}

func TestAzureEndpointWithAPIKey(t *testing.T) {
	_, hs := newSim(t, platformsim.Options{APIKey: "azure-key"})
	c := openai.NewClient(
		azure.WithEndpoint(hs.URL, "2025-05-15-preview"), azure.WithAPIKey("azure-key"), azure.WithUnsafeAllowHTTP(), option.WithMaxRetries(0),
	)
	resp, err := c.Responses.New(t.Context(), responses.ResponseNewParams{
		Model: "gpt-4o", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("hello")},
	})
	if err != nil {
		t.Fatal(err)
	}
	if resp.OutputText() == "" {
		t.Fatal("no answer")
	}
}

func TestWebhooksAreSignedAsTheSDKVerifies(t *testing.T) {
	const secret = "whsec_AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="
	got := make(chan *http.Request, 4)
	bodies := make(chan []byte, 4)
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- r
		bodies <- b
	}))
	defer hook.Close()
	_, hs := newSim(t, platformsim.Options{Webhook: &platformsim.Webhook{URL: hook.URL, Secret: secret}})
	c := client(hs)
	s, err := c.Beta.Agents.Sessions.New(t.Context(), openai.BetaAgentSessionNewParams{
		Environment: openai.EnvironmentParamUnion{OfParamNone: &openai.EnvironmentParamNone{}},
		Input:       openai.BetaAgentSessionNewParamsInputUnion{OfString: openai.String("customer 123")},
	})
	if err != nil {
		t.Fatal(err)
	}
	r := <-got
	body := <-bodies
	ev, err := c.Webhooks.Unwrap(body, r.Header, option.WithWebhookSecret(secret))
	if err != nil {
		t.Fatalf("the SDK rejects the simulator's webhook: %v", err)
	}
	if ev.Type != "agent.session.action_required" || ev.Data.ID != s.ID {
		t.Errorf("event = %s for %s, want action_required for %s", ev.Type, ev.Data.ID, s.ID)
	}
	// The fixture's bytes and signature verify with Sign too.
	h, _ := platformsim.Sign(secret, "wh_68a1f0d0b1c28190f0e1d2c3b4a59687", time.Unix(1767225612, 0),
		[]byte(`{"id":"evt_68a1f0d0b1c28190a9b8c7d6e5f4a3b2","object":"event","created_at":1767225612,"type":"agent.session.action_required","data":{"id":"as_01JQ8W4K2R7M5N3P9T6V0X1Y2Z","required_action":{"type":"function_call"}}}`))
	if got := h.Get("webhook-signature"); got != "v1,9LD1qqkfCJS6b3yWv4jnHD78IMYrcw6mi2zWzn+TkZM=" {
		t.Errorf("signature = %s, want the fixture's", got)
	}
}
