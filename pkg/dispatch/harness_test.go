package dispatch_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/conversations"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/toolrelay/toolrelay/internal/lease"
	"github.com/toolrelay/toolrelay/internal/natstest"
	"github.com/toolrelay/toolrelay/internal/platformsim"
	"github.com/toolrelay/toolrelay/internal/provision"
	"github.com/toolrelay/toolrelay/internal/testutil"
	"github.com/toolrelay/toolrelay/pkg/dispatch"
	"github.com/toolrelay/toolrelay/pkg/dispatch/httpapi"
	"github.com/toolrelay/toolrelay/pkg/dispatch/openaiplatform"
	"github.com/toolrelay/toolrelay/pkg/dispatch/watch"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// env is a real JetStream server, the platform simulator and the means to
// run dispatchers and minimal executors against them. The executors here are
// written against the wire contract (pkg/protocol) alone, as a team in
// another language would.
type env struct {
	t      testing.TB
	srv    *natstest.Server
	js     jetstream.JetStream
	sim    *platformsim.Server
	simURL string
	client openai.Client
	// hook receives the simulator's webhooks and hands them to hookTo.
	hook   *httptest.Server
	hookTo atomic.Pointer[http.Handler]
	// keepers are the stand-in executors' declarations, sent again to
	// each dispatcher that starts so a test needs not wait for a renewal.
	keepersMu sync.Mutex
	keepers   []*lease.Keeper
}

const testWebhookSecret = "whsec_AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="

func newEnv(t *testing.T, scenarios ...platformsim.Scenario) *env {
	return newEnvWith(t, platformsim.Options{}, scenarios...)
}

// newEnvWith starts the simulator with opts; it sends its webhooks, signed
// with testWebhookSecret, to the handler set by e.webhooksTo.
func newEnvWith(t testing.TB, opts platformsim.Options, scenarios ...platformsim.Scenario) *env {
	t.Helper()
	srv := natstest.Start(t)
	_, js := srv.Connect(t)
	e := &env{t: t, srv: srv, js: js}
	e.hook = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if h := e.hookTo.Load(); h != nil {
			(*h).ServeHTTP(w, r)
			return
		}
		http.Error(w, "no dispatcher yet", http.StatusServiceUnavailable)
	}))
	t.Cleanup(e.hook.Close)
	opts.Model = &platformsim.Model{Scenarios: scenarios}
	opts.Webhook = &platformsim.Webhook{URL: e.hook.URL + "/webhooks/openai", Secret: testWebhookSecret}
	e.sim = platformsim.New(opts)
	hs := httptest.NewServer(e.sim)
	t.Cleanup(func() { hs.CloseClientConnections(); e.sim.Close(); hs.Close() })
	key := opts.APIKey
	if key == "" {
		key = "sk-test"
	}
	e.simURL = hs.URL
	e.client = openai.NewClient(option.WithBaseURL(hs.URL+"/v1"), option.WithAPIKey(key))
	return e
}

// webhooksTo sends the simulator's webhooks to d's HTTP API.
func (e *env) webhooksTo(d *dispatch.Dispatcher) {
	var h http.Handler = httpapi.New(d, httpapi.Options{})
	e.hookTo.Store(&h)
}

// dispatcher starts a dispatcher replica on its own connection; it stops
// when the test ends or when stop is called.
func (e *env) dispatcher(opts dispatch.Options) (d *dispatch.Dispatcher, stop func()) {
	e.t.Helper()
	return e.dispatcherOn(e.client, opts)
}

// dispatcherOn is dispatcher with the platforms reached through client
// (a proxy in front of the simulator, say).
func (e *env) dispatcherOn(client openai.Client, opts dispatch.Options) (d *dispatch.Dispatcher, stop func()) {
	e.t.Helper()
	if opts.Logger == nil {
		opts.Logger = testutil.Logger(e.t)
	}
	nc, js := e.srv.Connect(e.t)
	if opts.Webhooks == nil {
		opts.Webhooks = openaiplatform.Webhooks(testWebhookSecret)
	}
	d, err := dispatch.New(js, openaiplatform.New(client), opts)
	if err != nil {
		e.t.Fatal(err)
	}
	watch.New(d, js)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			e.t.Errorf("dispatcher Run: %v", err)
		}
		// Run has dropped its subscriptions; once the server has too, a
		// withdrawal sent after this stop hears at once that nobody
		// answers, instead of waiting its 2 s for this replica.
		_ = nc.Flush()
	}
	e.t.Cleanup(stop)
	testutil.WaitForWhat(e.t, 10*time.Second, "the dispatcher to be ready", d.Ready)
	e.redeclare()
	return d, stop
}

// redeclare sends every stand-in executor's declarations again, as their
// renewals would, to a dispatcher that has just become ready.
func (e *env) redeclare() {
	e.t.Helper()
	e.keepersMu.Lock()
	defer e.keepersMu.Unlock()
	for _, k := range e.keepers {
		if err := k.Renew(context.Background()); err != nil {
			e.t.Fatalf("declaring to the new dispatcher: %v", err)
		}
	}
}

// register announces a function in the registry as an executor does: the
// team's claim, and a declaration of this test's stand-in executor, kept
// alive until the test ends.
func (e *env) register(team, name, schema string) {
	e.t.Helper()
	e.declare(team, name, schema, "test-executor", uuid.NewString())
}

// declare claims name for team and declares it as served by one executor
// process (instance); the returned stop withdraws the declaration, as the
// process stopping would.
func (e *env) declare(team, name, schema, executor, instance string) (stop func()) {
	e.t.Helper()
	return e.declareSpec(protocol.FunctionSpec{
		Version: protocol.Version, Name: name, Team: team, Parameters: json.RawMessage(schema), UpdatedAt: time.Now(),
	}, executor, instance)
}

// declareSpec is declare with the whole of the function's spec.
func (e *env) declareSpec(spec protocol.FunctionSpec, executor, instance string) (stop func()) {
	e.t.Helper()
	ctx := context.Background()
	team, name := spec.Team, spec.Name
	keeper, err := lease.Declare(ctx, e.js.Conn(), team, []*protocol.Declaration{{Version: protocol.Version, Spec: spec,
		Instance: instance, Executor: executor, StartedAt: time.Now()}}, testutil.Logger(e.t))
	if err != nil {
		e.t.Fatal(err)
	}
	e.keepersMu.Lock()
	e.keepers = append(e.keepers, keeper)
	e.keepersMu.Unlock()
	kctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { keeper.Run(kctx); close(done) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			e.keepersMu.Lock()
			e.keepers = slices.DeleteFunc(e.keepers, func(k *lease.Keeper) bool { return k == keeper })
			e.keepersMu.Unlock()
			cancel()
			<-done
			// With the dispatcher stopped already nobody answers, and
			// the lease lapses instead.
			if err := keeper.Withdraw(ctx); err != nil && !errors.Is(err, nats.ErrNoResponders) && !errors.Is(err, context.DeadlineExceeded) {
				e.t.Errorf("withdraw %s: %v", name, err)
			}
		})
	}
	e.t.Cleanup(stop)
	return stop
}

// serve runs a minimal executor for the named functions of team, with one
// durable consumer per function like a real executor: it answers each call
// with fn's output (or error message, when fails is true); an empty output
// means never answering. It returns the number of calls it ran.
func (e *env) serve(team string, functions []string, fn func(c *protocol.Call) (string, bool)) *atomic.Int32 {
	e.t.Helper()
	return e.serveWith(team, functions, func(c *protocol.Call, _ int) (*protocol.Result, bool) {
		out, failed := fn(c)
		if out == "" && !failed {
			return nil, false // never answers: leaves the call to the deadline
		}
		res := &protocol.Result{Version: protocol.Version, Key: c.Key, CallID: c.CallID, Team: c.Team, Function: c.Function,
			Output: out, FinishedAt: time.Now()}
		if failed {
			res.Output, res.Error = "", &protocol.CallError{Code: protocol.CodeFunctionError, Message: out}
		}
		return res, false
	})
}

// serveWith is serve with fn writing the whole result of each delivery
// (attempt counts from 1). A nil result leaves the call unanswered; retry
// asks for the call again at once, as a failed attempt does.
func (e *env) serveWith(team string, functions []string, fn func(c *protocol.Call, attempt int) (res *protocol.Result, retry bool)) *atomic.Int32 {
	e.t.Helper()
	ctx := context.Background()
	s, err := provision.Stream(ctx, e.js, provision.CallStreamConfig(team, provision.Options{}))
	if err != nil {
		e.t.Fatal(err)
	}
	if _, err := provision.Stream(ctx, e.js, provision.ResultStreamConfig(team, 0, provision.Options{})); err != nil {
		e.t.Fatal(err)
	}
	var ran atomic.Int32
	for _, name := range functions {
		cons, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
			Durable: name, FilterSubject: protocol.CallSubject(team, name), AckPolicy: jetstream.AckExplicitPolicy,
		})
		if err != nil {
			e.t.Fatal(err)
		}
		cc, err := cons.Consume(func(msg jetstream.Msg) {
			c, err := protocol.DecodeCall(msg.Data())
			if err != nil {
				e.t.Errorf("executor got a malformed call: %v", err)
				_ = msg.Term()
				return
			}
			attempt := 1
			if md, err := msg.Metadata(); err == nil {
				attempt = int(md.NumDelivered)
			}
			ran.Add(1)
			res, retry := fn(c, attempt)
			if retry {
				_ = msg.Nak()
				return
			}
			if res == nil {
				return // never answers: leaves the call to the deadline
			}
			data, err := protocol.EncodeResult(res)
			if err != nil {
				e.t.Errorf("encode result: %v", err)
				return
			}
			opts := []jetstream.PublishOpt{jetstream.WithMsgID(string(res.Key)), jetstream.WithExpectLastSequencePerSubject(0)}
			if ttl := c.ResultTTL(time.Now()); ttl > 0 {
				opts = append(opts, jetstream.WithMsgTTL(ttl))
			}
			if _, err := e.js.Publish(ctx, res.Subject(), data, opts...); err != nil {
				e.t.Logf("publish result: %v", err)
			}
			_ = msg.Ack()
		}, jetstream.PullMaxMessages(16))
		if err != nil {
			e.t.Fatal(err)
		}
		e.t.Cleanup(cc.Stop)
	}
	return &ran
}

// response starts a Responses conversation with prompt and returns its ref.
func (e *env) response(prompt string) dispatch.Ref {
	e.t.Helper()
	r, err := e.client.Responses.New(context.Background(), responses.ResponseNewParams{
		Model: "gpt-5.5", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String(prompt)},
	})
	if err != nil {
		e.t.Fatal(err)
	}
	return dispatch.Ref{Platform: protocol.PlatformResponses, ResponseID: r.ID}
}

// conversation starts a Responses conversation object (a `conversation`,
// not a chain of previous_response_id) with prompt and returns its ref.
func (e *env) conversation(prompt string) dispatch.Ref {
	e.t.Helper()
	ctx := context.Background()
	conv, err := e.client.Conversations.New(ctx, conversations.ConversationNewParams{})
	if err != nil {
		e.t.Fatal(err)
	}
	if _, err := e.client.Responses.New(ctx, responses.ResponseNewParams{Model: "gpt-5.5",
		Conversation: responses.ResponseNewParamsConversationUnion{OfString: openai.String(conv.ID)},
		Input:        responses.ResponseNewParamsInputUnion{OfString: openai.String(prompt)}}); err != nil {
		e.t.Fatal(err)
	}
	return dispatch.Ref{Platform: protocol.PlatformResponses, Conversation: conv.ID, Model: "gpt-5.5"}
}

// assistantsRun starts an Assistants run with prompt; metadata may set the
// simulator's run TTL.
func (e *env) assistantsRun(prompt string, metadata map[string]string) dispatch.Ref {
	e.t.Helper()
	r, err := platformsim.StartAssistantsRun(context.Background(), e.client, prompt, metadata)
	if err != nil {
		e.t.Fatal(err)
	}
	return dispatch.Ref{Platform: protocol.PlatformAssistants, ThreadID: r.ThreadID, RunID: r.ID}
}

// session starts an Agents session with prompt.
func (e *env) session(prompt string) dispatch.Ref {
	e.t.Helper()
	s, err := e.client.Beta.Agents.Sessions.New(context.Background(), openai.BetaAgentSessionNewParams{
		Environment: openai.EnvironmentParamUnion{OfParamNone: &openai.EnvironmentParamNone{}},
		Input:       openai.BetaAgentSessionNewParamsInputUnion{OfString: openai.String(prompt)},
	})
	if err != nil {
		e.t.Fatal(err)
	}
	return dispatch.Ref{Platform: protocol.PlatformAgents, SessionID: s.ID}
}

// finish watches ref with d and waits until the watch ends.
func finish(t *testing.T, d *dispatch.Dispatcher, ref dispatch.Ref, within time.Duration) *dispatch.Watch {
	t.Helper()
	w, err := d.Watch(context.Background(), ref)
	if err != nil {
		t.Fatal(err)
	}
	testutil.WaitForWhat(t, within, "watch "+w.ID+" to end", func() bool {
		w, err = d.WatchStatus(context.Background(), w.ID)
		return err == nil && w.State != dispatch.WatchActive
	})
	return w
}

// counter reads the total of an int64 counter (all attribute sets) from r;
// 0 if it was never added to.
func counter(t *testing.T, r *sdkmetric.ManualReader, name string) int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	var total int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			sum, ok := m.Data.(metricdata.Sum[int64])
			if !ok {
				t.Fatalf("metric %s is a %T, not an int64 counter", name, m.Data)
			}
			for _, dp := range sum.DataPoints {
				total += dp.Value
			}
		}
	}
	return total
}

// counterBy reads an int64 counter from r, summed by the value of one
// attribute.
func counterBy(t *testing.T, r *sdkmetric.ManualReader, name string, attr attribute.Key) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	for _, m := range collected(t, r, name) {
		for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
			v, _ := dp.Attributes.Value(attr)
			out[v.AsString()] += dp.Value
		}
	}
	return out
}

// histogramCountBy reads how many values the histogram name recorded, by
// the value of attr.
func histogramCountBy(t *testing.T, r *sdkmetric.ManualReader, name string, attr attribute.Key) map[string]uint64 {
	t.Helper()
	out := map[string]uint64{}
	for _, m := range collected(t, r, name) {
		for _, dp := range m.Data.(metricdata.Histogram[float64]).DataPoints {
			v, _ := dp.Attributes.Value(attr)
			out[v.Emit()] += dp.Count
		}
	}
	return out
}

// collected is what r has of the instrument name.
func collected(t *testing.T, r *sdkmetric.ManualReader, name string) []metricdata.Metrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	var out []metricdata.Metrics
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == name {
				out = append(out, m)
			}
		}
	}
	return out
}
