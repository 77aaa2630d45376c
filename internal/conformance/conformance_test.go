package conformance_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"

	"github.com/toolrelay/toolrelay/internal/natstest"
	"github.com/toolrelay/toolrelay/internal/platformsim"
	"github.com/toolrelay/toolrelay/internal/testutil"
	"github.com/toolrelay/toolrelay/pkg/dispatch"
	"github.com/toolrelay/toolrelay/pkg/dispatch/openaiplatform"
	"github.com/toolrelay/toolrelay/pkg/dispatch/watch"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

const team = "geo"

// ackWait is the function consumers' ack wait: short, so that a delivery
// the executor never answers comes back within the test.
const ackWait = time.Second

// TestExecutorOnTheContractAlone runs one Responses turn with two calls
// through the real dispatcher and the platform simulator. The executor
// serving them follows docs/protocol.md with nothing but pkg/protocol and
// nats.go: it creates its call stream and consumers from the protocol's
// specs, claims and declares its functions, and answers:
//   - get_weather: the first attempt fails retryably (nak with a delay),
//     the second succeeds;
//   - get_time: the first attempt never answers (no ack, no progress), so
//     the server redelivers it after the ack wait, and the second succeeds.
func TestExecutorOnTheContractAlone(t *testing.T) {
	srv := natstest.Start(t)
	_, djs := srv.Connect(t)
	sim := platformsim.New(platformsim.Options{Model: &platformsim.Model{Scenarios: []platformsim.Scenario{{
		Name: "weather-and-time", Prompt: "weather and time",
		Steps: []platformsim.Step{{
			{Name: "get_weather", Arguments: `{"location":"Paris"}`},
			{Name: "get_time", Arguments: `{"location":"Paris"}`},
		}},
		Answer: `In Paris it is {{out "get_weather"}} at {{out "get_time"}}.`,
	}}}})
	hs := httptest.NewServer(sim)
	t.Cleanup(func() { hs.CloseClientConnections(); sim.Close(); hs.Close() })
	client := openai.NewClient(option.WithBaseURL(hs.URL+"/v1"), option.WithAPIKey("sk-test"))

	// The dispatcher provisions the shared streams and buckets; executors
	// look them up (docs/protocol.md, Streams).
	d, err := dispatch.New(djs, openaiplatform.New(client), dispatch.Options{Logger: testutil.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	watch.New(d, djs)
	ctx, cancel := context.WithCancel(context.Background())
	runErr := make(chan error, 1)
	go func() { runErr <- d.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-runErr; err != nil {
			t.Errorf("dispatcher Run: %v", err)
		}
	})
	testutil.WaitForWhat(t, 10*time.Second, "the dispatcher to be ready", d.Ready)

	nc, js := srv.Connect(t)
	x := &executor{t: t, nc: nc, js: js, instance: uuid.NewString(), deliveries: map[string][]int{}}
	x.functions = map[string]func(c *protocol.Call, attempt int) (output string, retry bool, silent bool){
		"get_weather": func(c *protocol.Call, attempt int) (string, bool, bool) {
			return "sunny", attempt == 1, false
		},
		"get_time": func(c *protocol.Call, attempt int) (string, bool, bool) {
			return "10:00", false, attempt == 1
		},
	}
	withdraw := x.start(t.Context())

	r, err := client.Responses.New(t.Context(), responses.ResponseNewParams{
		Model: "gpt-5.5", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("weather and time")},
	})
	if err != nil {
		t.Fatal(err)
	}
	w, err := d.Watch(t.Context(), dispatch.Ref{Platform: protocol.PlatformResponses, ResponseID: r.ID})
	if err != nil {
		t.Fatal(err)
	}
	testutil.WaitForWhat(t, 30*time.Second, "watch "+w.ID+" to end", func() bool {
		w, err = d.WatchStatus(t.Context(), w.ID)
		return err == nil && w.State != dispatch.WatchActive
	})
	if want := "In Paris it is sunny at 10:00."; w.State != dispatch.WatchCompleted || w.Answer != want {
		t.Errorf("watch %s %q (%s), want completed with %q", w.State, w.Answer, w.Error, want)
	}
	x.mu.Lock()
	got := fmt.Sprint(x.deliveries)
	x.mu.Unlock()
	if want := fmt.Sprint(map[string][]int{"get_time": {1, 2}, "get_weather": {1, 2}}); got != want {
		t.Errorf("deliveries (attempts per function) = %s, want %s: a nak with delay and a silent attempt each get one redelivery", got, want)
	}
	if st := sim.Stats(); st.FunctionCallOutputs != 2 {
		t.Errorf("platform took %d function call outputs, want 2", st.FunctionCallOutputs)
	}

	// Withdrawing on stop removes the declarations at once.
	withdraw()
	decls, err := js.KeyValue(t.Context(), protocol.DeclarationBucket)
	if err != nil {
		t.Fatal(err)
	}
	for name := range x.functions {
		if _, err := decls.Get(t.Context(), protocol.DeclarationKey(team, name, x.instance)); !errors.Is(err, jetstream.ErrKeyNotFound) {
			t.Errorf("declaration of %s after withdrawal: %v, want it gone", name, err)
		}
	}
}

// executor is an executor of team written from docs/protocol.md.
type executor struct {
	t         *testing.T
	nc        *nats.Conn
	js        jetstream.JetStream
	instance  string
	functions map[string]func(c *protocol.Call, attempt int) (output string, retry, silent bool)

	mu         sync.Mutex
	deliveries map[string][]int // function → attempt numbers delivered
}

const schema = `{"type":"object","properties":{"location":{"type":"string"}},"required":["location"]}`

// start provisions, claims, consumes and declares; the returned func stops
// renewing and withdraws the declarations.
func (x *executor) start(ctx context.Context) (withdraw func()) {
	t := x.t
	t.Helper()
	// The team's call stream, from the spec, through JetStream's JSON API
	// names: what a client in any language sends.
	var scfg jetstream.StreamConfig
	fromAPIJSON(t, streamAPI(protocol.CallStreamSpec(team)), &scfg)
	stream, err := x.js.CreateStream(ctx, scfg)
	if err != nil {
		t.Fatal(err)
	}
	started := time.Now().UTC()
	var decls []*protocol.Declaration
	var consumers []jetstream.ConsumeContext
	for name, run := range x.functions {
		spec := protocol.FunctionSpec{Version: protocol.Version, Name: name, Team: team, Parameters: json.RawMessage(schema),
			MaxConcurrency: 4, UpdatedAt: started}
		var ccfg jetstream.ConsumerConfig
		fromAPIJSON(t, consumerAPI(protocol.FunctionConsumerSpec(team, name, spec.MaxConcurrency, ackWait)), &ccfg)
		cons, err := stream.CreateOrUpdateConsumer(ctx, ccfg)
		if err != nil {
			t.Fatal(err)
		}
		// Consume keeps a pull request waiting, so the dispatcher sees the
		// function served.
		cc, err := cons.Consume(func(msg jetstream.Msg) { x.handle(ctx, name, run, msg) },
			jetstream.PullMaxMessages(spec.MaxConcurrency))
		if err != nil {
			t.Fatal(err)
		}
		consumers = append(consumers, cc)
		decls = append(decls, &protocol.Declaration{Version: protocol.Version, Spec: spec, Instance: x.instance,
			Executor: "conformance", StartedAt: started})
	}

	// Declare, and renew every LeaseRenewal: a request to the dispatchers,
	// which own the registry, answered with what they stored.
	request := protocol.DeclareRequest{Version: protocol.Version, Op: protocol.DeclareServe}
	for _, d := range decls {
		request.Declarations = append(request.Declarations, *d)
	}
	send := func(op protocol.DeclareOp) error {
		request.Op = op
		body, err := json.Marshal(&request)
		if err != nil {
			return err
		}
		m, err := x.nc.Request(protocol.DeclareSubject(team), body, 2*time.Second)
		if err != nil {
			return err
		}
		var reply protocol.DeclareReply
		if err := json.Unmarshal(m.Data, &reply); err != nil {
			return err
		}
		if reply.Error != "" || len(reply.Refused) > 0 || len(reply.Accepted) != len(decls) {
			return fmt.Errorf("declare %s: %+v", op, reply)
		}
		return nil
	}
	put := func() {
		if err := send(protocol.DeclareServe); err != nil {
			t.Logf("renewing the declarations: %v", err)
		}
	}
	if err := send(protocol.DeclareServe); err != nil {
		t.Fatal(err)
	}
	renew, stopRenewing := context.WithCancel(ctx)
	renewed := make(chan struct{})
	go func() {
		defer close(renewed)
		tick := time.NewTicker(protocol.LeaseRenewal)
		defer tick.Stop()
		for {
			select {
			case <-renew.Done():
				return
			case <-tick.C:
				put()
			}
		}
	}()
	var once sync.Once
	withdraw = func() {
		once.Do(func() {
			stopRenewing()
			<-renewed
			if err := send(protocol.DeclareWithdraw); err != nil {
				t.Errorf("withdraw: %v", err)
			}
			for _, cc := range consumers {
				cc.Stop()
				<-cc.Closed()
			}
		})
	}
	t.Cleanup(withdraw)
	return withdraw
}

// handle follows "Handling a delivery" in docs/protocol.md.
func (x *executor) handle(ctx context.Context, name string, run func(*protocol.Call, int) (string, bool, bool), msg jetstream.Msg) {
	t := x.t
	call, err := protocol.DecodeCall(msg.Data())
	if err == nil && (call.Team != team || call.Function != name) {
		err = fmt.Errorf("call for %s/%s on %s", call.Team, call.Function, msg.Subject())
	}
	if err != nil {
		t.Errorf("malformed call: %v", err)
		_ = msg.TermWithReason("malformed call envelope")
		return
	}
	if got := msg.Headers().Get(protocol.HeaderCallKey); got != string(call.Key) {
		t.Errorf("call header %s = %q, want %q", protocol.HeaderCallKey, got, call.Key)
	}
	if got := msg.Headers().Get(protocol.HeaderFunction); got != name {
		t.Errorf("call header %s = %q, want %q", protocol.HeaderFunction, got, name)
	}
	if got := msg.Headers().Get(protocol.HeaderDeadline); got != call.Deadline.Format(time.RFC3339Nano) {
		t.Errorf("call header %s = %q, want the envelope's deadline %s", protocol.HeaderDeadline, got, call.Deadline.Format(time.RFC3339Nano))
	}
	if got := msg.Headers().Get(jetstream.MsgIDHeader); got != protocol.CallMsgID(call.Key) {
		t.Errorf("call's message ID = %q, want %q", got, protocol.CallMsgID(call.Key))
	}
	if ttl, err := time.ParseDuration(msg.Headers().Get(jetstream.MsgTTLHeader)); err != nil || time.Now().Add(ttl).Before(call.Deadline) {
		t.Errorf("call's TTL %q does not outlast its deadline %s", msg.Headers().Get(jetstream.MsgTTLHeader), call.Deadline)
	}
	meta, err := msg.Metadata()
	if err != nil {
		t.Errorf("metadata: %v", err)
		return
	}
	attempt := int(meta.NumDelivered)
	x.mu.Lock()
	x.deliveries[name] = append(x.deliveries[name], attempt)
	x.mu.Unlock()

	if attempt > 1 {
		// A direct get of the result subject: a reply without a Status
		// header is the recorded result.
		m, err := x.nc.RequestWithContext(ctx, protocol.ResultGetSubject(protocol.DefaultAPIPrefix, team, call.Key), nil)
		if err == nil && m.Header.Get("Status") == "" {
			_ = msg.Ack() // answered already: must not run again
			return
		}
	}
	started := time.Now().UTC()
	if !started.Before(call.Deadline) {
		x.record(ctx, msg, protocol.NewFailure(call, protocol.CodeTimeout, name+" was not started before its deadline.", started))
		return
	}
	output, retry, silent := run(call, attempt)
	switch {
	case silent:
		return // no ack, no progress: redelivered after the ack wait
	case retry:
		_ = msg.NakWithDelay(200 * time.Millisecond)
		return
	}
	x.record(ctx, msg, &protocol.Result{Version: protocol.Version, Key: call.Key, CallID: call.CallID, Team: call.Team,
		Function: call.Function, Output: output, Executor: "conformance/" + x.instance, Attempt: attempt,
		StartedAt: started, FinishedAt: time.Now().UTC()})
}

// record publishes res first-wins, then acks: "A result".
func (x *executor) record(ctx context.Context, msg jetstream.Msg, res *protocol.Result) {
	data, err := protocol.EncodeResult(res)
	if err != nil {
		x.t.Errorf("encode result: %v", err)
		return
	}
	m := nats.NewMsg(res.Subject())
	m.Data = data
	m.Header.Set(protocol.HeaderCallKey, string(res.Key))
	_, err = x.js.PublishMsg(ctx, m, jetstream.WithMsgID(protocol.ResultMsgID(res.Key)), jetstream.WithExpectLastSequencePerSubject(0))
	var apiErr *jetstream.APIError
	if err != nil && !(errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)) {
		x.t.Logf("recording result of %s failed; redelivery will retry: %v", res.Key, err)
		_ = msg.NakWithDelay(time.Second)
		return
	}
	_ = msg.Ack()
}

// streamAPI and consumerAPI spell a spec in JetStream's JSON API, the
// request any client sends to create it (durations in nanoseconds).
func streamAPI(s protocol.StreamSpec) map[string]any {
	return map[string]any{
		"name": s.Name, "description": s.Description, "subjects": s.Subjects,
		"retention": s.Retention, "discard": s.Discard, "storage": "file", "num_replicas": 1,
		"max_msgs_per_subject": s.MaxMsgsPerSubject, "discard_new_per_subject": s.DiscardNewPerSubject,
		"max_age": s.MaxAge, "duplicate_window": s.Duplicates, "max_msg_size": s.MaxMsgSize,
		"allow_msg_ttl": s.AllowMsgTTL, "allow_direct": s.AllowDirect,
	}
}

func consumerAPI(c protocol.ConsumerSpec) map[string]any {
	return map[string]any{
		"durable_name": c.Durable, "description": c.Description, "filter_subject": c.FilterSubject,
		"ack_policy": c.AckPolicy, "deliver_policy": c.DeliverPolicy, "ack_wait": c.AckWait,
		"max_deliver": c.MaxDeliver, "max_ack_pending": c.MaxAckPending,
	}
}

func fromAPIJSON(t *testing.T, api map[string]any, into any) {
	t.Helper()
	b, err := json.Marshal(api)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, into); err != nil {
		t.Fatalf("JetStream does not read %s: %v", b, err)
	}
}
