package dispatch_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/toolrelay/toolrelay/internal/platformsim"
	"github.com/toolrelay/toolrelay/internal/testutil"
	"github.com/toolrelay/toolrelay/pkg/dispatch"
	"github.com/toolrelay/toolrelay/pkg/dispatch/httpapi"
	"github.com/toolrelay/toolrelay/pkg/dispatch/openaiplatform"
	"github.com/toolrelay/toolrelay/pkg/dispatch/watch"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

var customerFunctions = []string{"get_customer", "get_weather"}

func customerEnv(t *testing.T, opts platformsim.Options) (*env, func() int32) {
	e := newEnvWith(t, opts, platformsim.CustomerScenario)
	for _, fn := range customerFunctions {
		e.register("demo", fn, `{"type":"object"}`)
	}
	ran := e.serve("demo", customerFunctions, func(c *protocol.Call) (string, bool) {
		return map[string]string{"get_customer": `{"name":"Ada","plan":"pro"}`, "get_weather": `{"location":"Paris","conditions":"sun","temperature":"20c"}`}[c.Function], false
	})
	return e, func() int32 { return ran.Load() }
}

// sessionAnswer waits for the session to go idle and returns its answer.
func (e *env) sessionAnswer(id string) string {
	e.t.Helper()
	var answer string
	testutil.WaitForWhat(e.t, 20*time.Second, "session "+id+" to be idle with the assistant's answer", func() bool {
		s, err := e.client.Beta.Agents.Sessions.Get(context.Background(), id)
		if err != nil || s.Status != "idle" {
			return false
		}
		items, err := e.client.Beta.Agents.Sessions.Items.List(context.Background(), id, openai.BetaAgentSessionItemListParams{Limit: openai.Int(1)})
		if err != nil || len(items.Data) == 0 {
			return false
		}
		answer = items.Data[0].RawJSON()
		return strings.Contains(answer, `"role":"assistant"`)
	})
	return answer
}

func TestSignedWebhookDrivesTheTurn(t *testing.T) {
	t.Parallel()
	e, ran := customerEnv(t, platformsim.Options{})
	d, _ := e.dispatcher(dispatch.Options{})
	e.webhooksTo(d)
	ref := e.session("customer 123") // no watch: the webhook is the only channel
	if answer := e.sessionAnswer(ref.SessionID); !strings.Contains(answer, "Customer 123 is Ada on the pro plan") {
		t.Fatalf("answer = %s", answer)
	}
	if n := e.sim.Stats().ToolResults; n != 2 || ran() != 2 {
		t.Errorf("tool results %d, runs %d; want 2 and 2", n, ran())
	}
	// The simulator records a delivery once the dispatcher's answer is
	// back, which can be after the turn it started was submitted.
	var hooks []platformsim.WebhookEvent
	testutil.WaitForWhat(t, 5*time.Second, "the simulator to record the webhook's delivery", func() bool { hooks = e.sim.Webhooks(); return len(hooks) > 0 })
	if hooks[0].Status != http.StatusOK {
		t.Errorf("webhook deliveries = %+v", hooks)
	}
}

// post sends a webhook to d and returns the status and body.
func post(t *testing.T, d *dispatch.Dispatcher, body []byte, h http.Header) (int, string) {
	t.Helper()
	req := httptest.NewRequest(http.MethodPost, "/webhooks/openai", bytes.NewReader(body))
	for k, v := range h {
		req.Header[k] = v
	}
	rec := httptest.NewRecorder()
	httpapi.New(d, httpapi.Options{}).ServeHTTP(rec, req)
	b, _ := io.ReadAll(rec.Body)
	return rec.Code, string(b)
}

func TestForgedStaleAndReplayedWebhooks(t *testing.T) {
	t.Parallel()
	e, ran := customerEnv(t, platformsim.Options{})
	d, _ := e.dispatcher(dispatch.Options{}) // webhooks are not routed: the test sends them
	ref := e.session("customer 123")
	testutil.WaitForWhat(t, 5*time.Second, "the session to require action", func() bool {
		s, err := e.client.Beta.Agents.Sessions.Get(context.Background(), ref.SessionID)
		return err == nil && s.Status == "requires_action"
	})
	body := platformsim.WebhookBody("evt_1", "agent.session.action_required", map[string]any{"id": ref.SessionID, "required_action": map[string]string{"type": "function_call"}})
	signed := func(secret, id string, at time.Time) http.Header {
		h, err := platformsim.Sign(secret, id, at, body)
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	for name, h := range map[string]http.Header{
		"wrong secret":     signed("whsec_AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE=", "wh_1", time.Now()),
		"stale timestamp":  signed(testWebhookSecret, "wh_1", time.Now().Add(-6*time.Minute)),
		"future timestamp": signed(testWebhookSecret, "wh_1", time.Now().Add(6*time.Minute)),
		"no signature":     {"webhook-id": {"wh_1"}, "webhook-timestamp": {"1767225612"}},
	} {
		if code, _ := post(t, d, body, h); code != http.StatusUnauthorized {
			t.Errorf("%s: status %d, want 401", name, code)
		}
	}
	tampered := signed(testWebhookSecret, "wh_1", time.Now())
	if code, _ := post(t, d, bytes.Replace(body, []byte("action_required"), []byte("action_requirex"), 1), tampered); code != http.StatusUnauthorized {
		t.Errorf("tampered body: status %d, want 401", code)
	}
	if ran() != 0 || e.sim.Stats().ToolResults != 0 {
		t.Fatalf("a refused webhook caused work: %d runs, %d results", ran(), e.sim.Stats().ToolResults)
	}

	good := signed(testWebhookSecret, "wh_2", time.Now())
	if code, resp := post(t, d, body, good); code != http.StatusOK || !strings.Contains(resp, "accepted") {
		t.Fatalf("valid webhook: %d %s", code, resp)
	}
	e.sessionAnswer(ref.SessionID)
	if code, resp := post(t, d, body, good); code != http.StatusOK || !strings.Contains(resp, "duplicate") {
		t.Errorf("replayed webhook-id: %d %s, want 200 duplicate", code, resp)
	}
	if n := e.sim.Stats().ToolResults; n != 2 || ran() != 2 {
		t.Errorf("after the replay: %d tool results, %d runs; want 2 and 2", n, ran())
	}
}

func TestOneActionByWebhookStreamAndWatchIsOneTurn(t *testing.T) {
	t.Parallel()
	e, ran := customerEnv(t, platformsim.Options{ModelLatency: 20 * time.Millisecond})
	d, _ := e.dispatcher(dispatch.Options{PollInterval: 5 * time.Millisecond})
	e.webhooksTo(d)
	ref := e.session("customer 123")
	w := finish(t, d, ref, 20*time.Second) // the watch polls and follows the event stream
	if w.State != dispatch.WatchCompleted || !strings.Contains(w.Answer, "Customer 123 is Ada") {
		t.Fatalf("watch %s %q %s", w.State, w.Answer, w.Error)
	}
	if len(w.Turns) != 1 {
		t.Errorf("the watch saw %d turns, want 1", len(w.Turns))
	}
	if n := e.sim.Stats().ToolResults; n != 2 || ran() != 2 {
		t.Errorf("%d tool results, %d runs; want 2 and 2 (one turn)", n, ran())
	}
	// The platform records a webhook once its delivery is answered, which
	// may be after the turn it announced was taken in from the stream.
	var hooks []platformsim.WebhookEvent
	testutil.WaitForWhat(t, 10*time.Second, "the simulator to record the webhook's delivery", func() bool { hooks = e.sim.Webhooks(); return len(hooks) > 0 })
	if len(hooks) != 1 || hooks[0].Status != http.StatusOK {
		t.Errorf("webhooks = %+v", hooks)
	}
}

func TestFoundryProjectEndpointWithBearerToken(t *testing.T) {
	t.Parallel()
	e := newEnvWith(t, platformsim.Options{APIKey: "entra-token"}, platformsim.HoroscopeScenario)
	e.register("demo", "get_horoscope", `{"type":"object","properties":{"sign":{"type":"string"}},"required":["sign"]}`)
	e.serve("demo", []string{"get_horoscope"}, func(c *protocol.Call) (string, bool) { return "Aquarius: otters", false })
	// The dispatcher reaches the platform the Foundry way: the project's
	// /openai/v1 base URL and a bearer token the simulator checks.
	foundry := openai.NewClient(option.WithBaseURL(e.simURL+"/api/projects/p1/openai/v1"), option.WithAPIKey("entra-token"))
	_, js := e.srv.Connect(t)
	d, err := dispatch.New(js, openaiplatform.New(foundry), dispatch.Options{Logger: testutil.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	watch.New(d, js)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	defer func() { cancel(); <-done }()
	testutil.WaitForWhat(t, 10*time.Second, "the dispatcher to be ready", d.Ready)
	e.redeclare()
	r, err := foundry.Responses.New(context.Background(), responses.ResponseNewParams{
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("my horoscope")},
	}, option.WithJSONSet("agent_reference", map[string]any{"type": "agent_reference", "name": "order-desk", "version": "3"}))
	if err != nil {
		t.Fatal(err)
	}
	w := finish(t, d, dispatch.Ref{Platform: protocol.PlatformResponses, ResponseID: r.ID, Agent: &dispatch.AgentReference{Name: "order-desk", Version: "3"}}, 20*time.Second)
	if w.State != dispatch.WatchCompleted || w.Answer != "Your horoscope: Aquarius: otters" {
		t.Fatalf("watch %s %q %s", w.State, w.Answer, w.Error)
	}
	if rej := e.sim.Stats().Rejected; rej != 0 {
		t.Errorf("the platform rejected %d requests", rej)
	}
}

func TestWatchOverNATSRequestReply(t *testing.T) {
	t.Parallel()
	e := newEnv(t, platformsim.HoroscopeScenario)
	e.register("demo", "get_horoscope", `{"type":"object"}`)
	e.serve("demo", []string{"get_horoscope"}, func(c *protocol.Call) (string, bool) { return "otters", false })
	e.dispatcher(dispatch.Options{})
	nc, _ := e.srv.Connect(t)
	ref := e.response("my horoscope")
	m, err := nc.Request(protocol.WatchSubject, []byte(`{"platform":"responses","response_id":"`+ref.ResponseID+`"}`), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var started struct {
		Status int    `json:"status"`
		ID     string `json:"id"`
	}
	if err := json.Unmarshal(m.Data, &started); err != nil || started.Status != http.StatusAccepted || started.ID == "" {
		t.Fatalf("reply %s", m.Data)
	}
	testutil.WaitForWhat(t, 20*time.Second, "the watch's status over NATS to say completed with the output", func() bool {
		m, err := nc.Request(protocol.WatchStatusSubject, []byte(`{"id":"`+started.ID+`"}`), 5*time.Second)
		return err == nil && strings.Contains(string(m.Data), `"state":"completed"`) && strings.Contains(string(m.Data), "otters")
	})
	m, err = nc.Request(protocol.WatchSubject, []byte(`{"platform":"responses"}`), 5*time.Second)
	if err != nil || !strings.Contains(string(m.Data), `"field":"response_id"`) || !strings.Contains(string(m.Data), `"status":400`) {
		t.Errorf("bad request reply: %s %v", m.Data, err)
	}
}

// Found by a failure under load: a session's event stream does not replay
// what came before it opened, so a required action that fired between the
// watch's first poll and the stream opening was left to the next poll (an
// hour here). The stream's opening now brings a poll.
func TestAnActionBeforeTheStreamOpensIsPolledAtOnce(t *testing.T) {
	t.Parallel()
	e, _ := customerEnv(t, platformsim.Options{ModelLatency: 200 * time.Millisecond})
	sim, err := url.Parse(e.simURL)
	if err != nil {
		t.Fatal(err)
	}
	// The event stream reaches the simulator only once the session waits
	// for its calls.
	proxy := httputil.NewSingleHostReverseProxy(sim)
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/events") {
			id := strings.Split(r.URL.Path, "/")[4] // /v1/agents/sessions/{id}/events
			testutil.WaitForWhat(t, 20*time.Second, "the session to require action", func() bool {
				s, err := e.client.Beta.Agents.Sessions.Get(r.Context(), id)
				return err == nil && s.Status == "requires_action"
			})
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(func() { front.CloseClientConnections(); front.Close() })
	reader := sdkmetric.NewManualReader()
	d, _ := e.dispatcherOn(openai.NewClient(option.WithBaseURL(front.URL+"/v1"), option.WithAPIKey("sk-test")),
		dispatch.Options{PollInterval: time.Hour, MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))})
	w, err := d.Watch(context.Background(), e.session("customer 123"))
	if err != nil {
		t.Fatal(err)
	}
	testutil.WaitForWhat(t, 20*time.Second, "the turn to be taken in", func() bool {
		got := takenIn(t, reader)
		return got["poll"]+got["stream"] == 1
	})
	if got := takenIn(t, reader); got["poll"] != 1 {
		t.Errorf("taken in by %v; want the poll the stream's opening brought", got)
	}
	if got, err := d.WatchStatus(context.Background(), w.ID); err != nil || len(got.Turns) != 1 {
		t.Errorf("watch %+v, %v; want its turn listed", got, err)
	}
}

// takenIn reads the toolrelay.turns.taken_in counter by channel.
func takenIn(t *testing.T, r *sdkmetric.ManualReader) map[string]int64 {
	return counterBy(t, r, "toolrelay.turns.taken_in", "channel")
}

func TestEventStreamTakesTheTurnIn(t *testing.T) {
	t.Parallel()
	e, _ := customerEnv(t, platformsim.Options{ModelLatency: 200 * time.Millisecond})
	reader := sdkmetric.NewManualReader()
	// Polls are far apart and no webhook is routed: only the session's
	// event stream can report the required action before the next poll.
	d, _ := e.dispatcher(dispatch.Options{PollInterval: time.Hour, MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))})
	ref := e.session("customer 123")
	w, err := d.Watch(context.Background(), ref)
	if err != nil {
		t.Fatal(err)
	}
	testutil.WaitForWhat(t, 20*time.Second, "a turn taken in from the event stream", func() bool { return takenIn(t, reader)["stream"] == 1 })
	testutil.WaitForWhat(t, 20*time.Second, "the watch to list its turn", func() bool {
		got, err := d.WatchStatus(context.Background(), w.ID)
		if err != nil {
			t.Fatalf("reading watch %s: %v", w.ID, err) // Watch stored it: it must be readable
		}
		w = got
		return len(w.Turns) == 1
	})
	if got := takenIn(t, reader); got["poll"] != 0 || got["webhook"] != 0 {
		t.Errorf("taken in by %v; want the stream only", got)
	}
}
