package demo

import (
	"context"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/toolrelay/toolrelay/internal/natstest"
	"github.com/toolrelay/toolrelay/internal/platformsim"
	"github.com/toolrelay/toolrelay/internal/telemetry"
	"github.com/toolrelay/toolrelay/internal/testutil"
	"github.com/toolrelay/toolrelay/pkg/dispatch"
	"github.com/toolrelay/toolrelay/pkg/dispatch/openaiplatform"
	"github.com/toolrelay/toolrelay/pkg/dispatch/watch"
	"github.com/toolrelay/toolrelay/pkg/exec"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// stack is a JetStream server, the simulator, a dispatcher and two executor
// replicas serving the seed functions, all reporting to one in-memory span
// recorder and one Prometheus registry.
type stack struct {
	rec     *tracetest.SpanRecorder
	tp      *sdktrace.TracerProvider
	d       *dispatch.Dispatcher
	client  openai.Client
	metrics *httptest.Server
}

func newStack(t *testing.T) *stack {
	t.Helper()
	srv := natstest.Start(t)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	mp, metrics, err := telemetry.Prometheus(nil)
	if err != nil {
		t.Fatal(err)
	}
	quiet := testutil.Logger(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{}, 3)
	t.Cleanup(func() {
		cancel()
		for range 3 {
			<-done
		}
	})
	for i := range 2 {
		_, js := srv.Connect(t)
		ex, err := exec.New(js, Team, exec.Options{Logger: quiet, Name: "exec-" + strconv.Itoa(i), TracerProvider: tp, MeterProvider: mp})
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range Functions() {
			if err := ex.Register(f); err != nil {
				t.Fatal(err)
			}
		}
		go func() { _ = ex.Run(ctx); done <- struct{}{} }()
	}
	sim := platformsim.New(platformsim.Options{Model: &platformsim.Model{Scenarios: []platformsim.Scenario{
		platformsim.CustomerScenario,
		{Name: "unknown customer", Prompt: "customer 999", Steps: []platformsim.Step{{{Name: "get_customer", Arguments: `{"customer_id":"999"}`}}}, Answer: `{{out "get_customer"}}`},
	}}})
	hs := httptest.NewServer(sim)
	t.Cleanup(func() { hs.CloseClientConnections(); sim.Close(); hs.Close() })
	client := openai.NewClient(option.WithBaseURL(hs.URL+"/v1"), option.WithAPIKey("k"))
	_, js := srv.Connect(t)
	d, err := dispatch.New(js, openaiplatform.New(client), dispatch.Options{Logger: quiet, TracerProvider: tp, MeterProvider: mp})
	if err != nil {
		t.Fatal(err)
	}
	watch.New(d, js)
	go func() { _ = d.Run(ctx); done <- struct{}{} }()
	deadline := time.Now().Add(20 * time.Second)
	for !(d.Ready() && registered(context.Background(), js)) {
		if time.Now().After(deadline) {
			t.Fatal("stack not ready")
		}
		time.Sleep(10 * time.Millisecond)
	}
	ms := httptest.NewServer(metrics)
	t.Cleanup(ms.Close)
	return &stack{rec: rec, tp: tp, d: d, client: client, metrics: ms}
}

func (s *stack) session(t *testing.T, ctx context.Context, prompt string) *dispatch.Watch {
	t.Helper()
	sess, err := s.client.Beta.Agents.Sessions.New(ctx, openai.BetaAgentSessionNewParams{
		Environment: openai.EnvironmentParamUnion{OfParamNone: &openai.EnvironmentParamNone{}},
		Input:       openai.BetaAgentSessionNewParamsInputUnion{OfString: openai.String(prompt)},
	})
	if err != nil {
		t.Fatal(err)
	}
	w, err := s.d.Watch(ctx, dispatch.Ref{Platform: protocol.PlatformAgents, SessionID: sess.ID})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for w.State == dispatch.WatchActive {
		if time.Now().After(deadline) {
			t.Fatal("watch did not end")
		}
		time.Sleep(10 * time.Millisecond)
		if w, err = s.d.WatchStatus(ctx, w.ID); err != nil {
			t.Fatal(err)
		}
	}
	return w
}

func attr(s sdktrace.ReadOnlySpan, key string) string {
	for _, a := range s.Attributes() {
		if string(a.Key) == key {
			return a.Value.Emit()
		}
	}
	return ""
}

func TestOneTracePerTurnAcrossDispatcherAndExecutors(t *testing.T) {
	s := newStack(t)
	// The watch request carries a traceparent: the turn is its child.
	parentCtx, parent := s.tp.Tracer("test").Start(context.Background(), "client request")
	w := s.session(t, parentCtx, "customer 123")
	parent.End()

	spans := traceOf(s.rec, w.Turns[0], 5*time.Second)
	if spans == nil {
		t.Fatal("no trace for the turn")
	}
	byName := map[string][]sdktrace.ReadOnlySpan{}
	for _, sp := range spans {
		if sp.SpanContext().TraceID() != parent.SpanContext().TraceID() {
			t.Fatalf("span %s is in another trace", sp.Name())
		}
		byName[sp.Name()] = append(byName[sp.Name()], sp)
	}
	turn := one(t, byName, "turn agents")
	if turn.Parent().SpanID() != parent.SpanContext().SpanID() {
		t.Error("the turn span is not a child of the watch request's traceparent")
	}
	if attr(turn, "toolrelay.session.id") == "" || attr(turn, "toolrelay.turn.key") != string(w.Turns[0]) {
		t.Errorf("turn attributes: %v", turn.Attributes())
	}
	submit := one(t, byName, "submit agents")
	if submit.Parent().SpanID() != turn.SpanContext().SpanID() || submit.SpanKind() != trace.SpanKindClient {
		t.Error("submit is not a CLIENT child of the turn")
	}
	for _, fn := range []string{"get_customer", "get_weather"} {
		send := one(t, byName, "send fncall.demo."+fn)
		process := one(t, byName, "process fncall.demo."+fn)
		execute := one(t, byName, "execute_tool "+fn)
		checks := []struct {
			child, parent sdktrace.ReadOnlySpan
			kind          trace.SpanKind
		}{{send, turn, trace.SpanKindProducer}, {process, send, trace.SpanKindConsumer}, {execute, process, trace.SpanKindInternal}}
		for _, c := range checks {
			if c.child.Parent().SpanID() != c.parent.SpanContext().SpanID() || c.child.SpanKind() != c.kind {
				t.Errorf("%s: parent %s kind %v, want child of %s with kind %v", c.child.Name(), c.child.Parent().SpanID(), c.child.SpanKind(), c.parent.Name(), c.kind)
			}
		}
		for _, sp := range []sdktrace.ReadOnlySpan{send, process} {
			if attr(sp, "messaging.system") != "nats" || attr(sp, "gen_ai.tool.name") != fn || attr(sp, "gen_ai.tool.call.id") == "" ||
				!strings.HasPrefix(attr(sp, "messaging.destination.name"), "fncall.demo.") {
				t.Errorf("%s attributes: %v", sp.Name(), sp.Attributes())
			}
		}
		if attr(execute, "gen_ai.operation.name") != "execute_tool" {
			t.Errorf("execute_tool attributes: %v", execute.Attributes())
		}
		// The result goes back: send fnresult under process, and the
		// dispatcher's process span under it.
		var resultSend sdktrace.ReadOnlySpan
		for _, sp := range byName["send fnresult.demo"] {
			if sp.Parent().SpanID() == process.SpanContext().SpanID() {
				resultSend = sp
			}
		}
		if resultSend == nil {
			t.Fatalf("no send fnresult under %s", process.Name())
		}
		found := false
		for _, sp := range byName["process fnresult.demo"] {
			found = found || sp.Parent().SpanID() == resultSend.SpanContext().SpanID()
		}
		if !found {
			t.Errorf("no dispatcher process span under the result of %s", fn)
		}
	}
	if attr(process0(byName), "messaging.destination.template") != "fncall.{team}.{function}" {
		t.Error("span names use the subject; the template attribute must hold the low-cardinality form")
	}
}

func process0(byName map[string][]sdktrace.ReadOnlySpan) sdktrace.ReadOnlySpan {
	return byName["process fncall.demo.get_customer"][0]
}

func one(t *testing.T, byName map[string][]sdktrace.ReadOnlySpan, name string) sdktrace.ReadOnlySpan {
	t.Helper()
	if n := len(byName[name]); n != 1 {
		t.Fatalf("%d spans named %q, want 1", n, name)
	}
	return byName[name][0]
}

func TestFailedCallSetsSpanStatus(t *testing.T) {
	s := newStack(t)
	w := s.session(t, context.Background(), "customer 999")
	spans := traceOf(s.rec, w.Turns[0], 5*time.Second)
	var execute sdktrace.ReadOnlySpan
	for _, sp := range spans {
		if sp.Name() == "execute_tool get_customer" {
			execute = sp
		}
	}
	if execute == nil || execute.Status().Code != codes.Error || len(execute.Events()) == 0 {
		t.Fatalf("execute_tool span = %v, want error status with the error recorded", execute)
	}
}

var metricLine = regexp.MustCompile(`(?m)^([a-z_]+)(\{[^}]*\})? ([0-9.e+-]+)$`)

func scrape(t *testing.T, url string) map[string]float64 {
	t.Helper()
	resp, err := httpGet(url)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, m := range metricLine.FindAllStringSubmatch(resp, -1) {
		v, _ := strconv.ParseFloat(m[3], 64)
		out[m[1]+m[2]] += v
	}
	return out
}

func sum(metrics map[string]float64, name string, labels ...string) float64 {
	var total float64
	for k, v := range metrics {
		if !strings.HasPrefix(k, name+"{") && k != name {
			continue
		}
		ok := true
		for _, l := range labels {
			ok = ok && strings.Contains(k, l)
		}
		if ok {
			total += v
		}
	}
	return total
}

func TestMetricsMoveWithTurns(t *testing.T) {
	s := newStack(t)
	before := scrape(t, s.metrics.URL)
	s.session(t, context.Background(), "customer 123")
	s.session(t, context.Background(), "customer 999")
	after := scrape(t, s.metrics.URL)
	checks := []struct {
		name   string
		labels []string
		delta  float64
	}{
		{"toolrelay_calls_total", []string{`outcome="ok"`, `function="get_weather"`}, 1},
		{"toolrelay_calls_total", []string{`outcome="function_error"`, `function="get_customer"`}, 1},
		{"toolrelay_turn_time_left_seconds_count", []string{`toolrelay_platform="agents"`}, 2},
		{"toolrelay_turn_duration_seconds_count", nil, 2},
		{"toolrelay_call_duration_seconds_count", []string{`function="get_customer"`}, 2},
		{"toolrelay_executor_calls_total", []string{`outcome="error"`}, 1},
	}
	for _, c := range checks {
		if d := sum(after, c.name, c.labels...) - sum(before, c.name, c.labels...); d != c.delta {
			t.Errorf("%s%v moved by %v, want %v", c.name, c.labels, d, c.delta)
		}
	}
	for _, gauge := range []string{"toolrelay_turns_open", "toolrelay_calls_queued", "toolrelay_calls_in_flight"} {
		if _, ok := after[gauge]; !ok && sum(after, gauge) == 0 && !hasMetric(after, gauge) {
			t.Errorf("gauge %s is not exported", gauge)
		}
	}
	// A closed turn leaves the index of open turns within a second (its
	// timer's roll-up marker expires).
	testutil.WaitForWhat(t, 10*time.Second, "toolrelay_turns_open to read 0", func() bool {
		m := scrape(t, s.metrics.URL)
		return hasMetric(m, "toolrelay_turns_open") && sum(m, "toolrelay_turns_open") == 0
	})
}

func hasMetric(m map[string]float64, name string) bool {
	for k := range m {
		if k == name || strings.HasPrefix(k, name+"{") {
			return true
		}
	}
	return false
}
