package exec_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/toolrelay/toolrelay/internal/natstest"
	"github.com/toolrelay/toolrelay/internal/provision"
	"github.com/toolrelay/toolrelay/internal/schema"
	"github.com/toolrelay/toolrelay/internal/testutil"
	"github.com/toolrelay/toolrelay/pkg/exec"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// nats-server keeps a few process-wide goroutines.
		goleak.IgnoreAnyFunction("github.com/nats-io/nats-server/v2/server.(*Server).Start"),
		goleak.IgnoreTopFunction("github.com/nats-io/nats-server/v2/server.(*fileStore).flushStreamStateLoop"),
		goleak.IgnoreAnyFunction("github.com/nats-io/nats-server/v2/server.(*stree)"),
	)
}

// harness is an executor on a real JetStream server, plus a way to send it
// calls the way the dispatcher does and read back the recorded results.
type harness struct {
	t       *testing.T
	srv     *natstest.Server
	js      jetstream.JetStream
	results jetstream.Stream
	// stopFirst stops the executor start began with.
	stopFirst func()
}

func start(t *testing.T, team string, opts exec.Options, fns ...exec.Function) *harness {
	t.Helper()
	srv := natstest.Start(t)
	_, js := srv.Connect(t)
	h := &harness{t: t, srv: srv, js: js}
	registrar(t, js)
	h.stopFirst = h.run(team, opts, fns...)
	return h
}

// registrar stands in for the dispatchers' side of declarations (which
// pkg/exec must not import): it stores each declare request's declarations
// in the declaration bucket, or deletes them on withdrawal, and accepts.
func registrar(t *testing.T, js jetstream.JetStream) {
	t.Helper()
	kv, err := provision.KeyValue(t.Context(), js, provision.DeclarationBucketConfig(provision.Options{}))
	if err != nil {
		t.Fatal(err)
	}
	sub, err := js.Conn().Subscribe(protocol.DeclareSubjectPrefix+".*", func(m *nats.Msg) {
		team, err := protocol.ParseDeclareSubject(m.Subject)
		var req *protocol.DeclareRequest
		if err == nil {
			req, err = protocol.DecodeDeclareRequest(team, m.Data)
		}
		reply := protocol.DeclareReply{Version: protocol.Version}
		if err != nil {
			reply.Error = err.Error()
		}
		for i := 0; req != nil && i < len(req.Declarations); i++ {
			d := &req.Declarations[i]
			if req.Op == protocol.DeclareWithdraw {
				_ = kv.Delete(context.Background(), d.Key())
			} else if data, err := protocol.EncodeDeclaration(d); err == nil {
				_, _ = kv.Put(context.Background(), d.Key(), data)
			}
			reply.Accepted = append(reply.Accepted, d.Spec.Name)
		}
		b, _ := json.Marshal(&reply)
		_ = m.Respond(b)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
}

// run starts one more executor process on the same server.
func (h *harness) run(team string, opts exec.Options, fns ...exec.Function) (stop func()) {
	h.t.Helper()
	if opts.Logger == nil {
		opts.Logger = testutil.Logger(h.t) // shown if the test fails
	}
	_, js := h.srv.Connect(h.t) // each executor has its own connection, like a process
	e, err := exec.New(js, team, opts)
	if err != nil {
		h.t.Fatal(err)
	}
	for _, f := range fns {
		if err := e.Register(f); err != nil {
			h.t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				h.t.Errorf("Run: %v", err)
			}
		})
	}
	h.t.Cleanup(stop)
	// Wait until the consumers exist, i.e. the executor is serving.
	testutil.WaitForWhat(h.t, 10*time.Second, team+"'s consumers and result stream to exist", func() bool {
		s, err := h.js.Stream(context.Background(), protocol.CallStream(team))
		if err != nil {
			return false
		}
		for _, f := range fns {
			if _, err := s.Consumer(context.Background(), f.Name); err != nil {
				return false
			}
		}
		h.results, err = h.js.Stream(context.Background(), protocol.ResultStream(team))
		return err == nil
	})
	return stop
}

func (h *harness) call(team, fn, args string, deadline time.Time) *protocol.Call {
	h.t.Helper()
	return h.callWith(team, fn, args, deadline, nil)
}

// callWith is call with headers on the message.
func (h *harness) callWith(team, fn, args string, deadline time.Time, header nats.Header) *protocol.Call {
	h.t.Helper()
	c := h.newCall(team, fn, args, deadline)
	h.publish(c, header)
	return c
}

// newCall is a call of fn in a turn of its own, not yet published.
func (h *harness) newCall(team, fn, args string, deadline time.Time) *protocol.Call {
	callID := "call_" + strings.ReplaceAll(time.Now().Format("150405.000000000"), ".", "")
	turn := protocol.NewTurnKey(protocol.PlatformResponses, "resp_test", []string{callID})
	return &protocol.Call{
		Version: protocol.Version, Key: turn.Call(callID), Platform: protocol.PlatformResponses,
		Scope: "resp_test", CallID: callID, Team: team, Function: fn,
		Arguments: json.RawMessage(args), Deadline: deadline, CreatedAt: time.Now(),
	}
}

// publish publishes c with header on its subject, as a dispatcher does.
func (h *harness) publish(c *protocol.Call, header nats.Header) {
	h.t.Helper()
	data, err := protocol.EncodeCall(c)
	if err != nil {
		h.t.Fatal(err)
	}
	m := &nats.Msg{Subject: c.Subject(), Data: data, Header: header}
	if _, err := h.js.PublishMsg(context.Background(), m, jetstream.WithMsgID(string(c.Key))); err != nil {
		h.t.Fatal(err)
	}
}

func (h *harness) result(c *protocol.Call, within time.Duration) *protocol.Result {
	h.t.Helper()
	var res *protocol.Result
	testutil.WaitForWhat(h.t, within, "the result of call "+string(c.Key), func() bool {
		m, err := h.results.GetLastMsgForSubject(context.Background(), c.ResultSubject())
		if err != nil {
			return false
		}
		res, err = protocol.DecodeResult(m.Data)
		if err != nil {
			h.t.Fatalf("recorded result does not decode: %v", err)
		}
		return true
	})
	return res
}

func echo() exec.Function {
	return exec.Function{
		Name: "echo",
		Handler: exec.HandlerFunc(func(ctx context.Context, inv *exec.Invocation) ([]byte, error) {
			return inv.Call.Arguments, nil
		}),
	}
}

func TestCallRunsAndResultIsRecorded(t *testing.T) {
	h := start(t, "team-a", exec.Options{}, echo())
	c := h.call("team-a", "echo", `{"x":1}`, time.Now().Add(time.Minute))
	res := h.result(c, 10*time.Second)
	if !res.OK() || res.Output != `{"x":1}` {
		t.Fatalf("result = %+v", res)
	}
	if res.Key != c.Key || res.CallID != c.CallID || res.Attempt != 1 {
		t.Errorf("result identity = %s %s attempt %d", res.Key, res.CallID, res.Attempt)
	}
}

// A result carries the Nats-TTL its call's keep_result_until gives; a call
// without one (from an older dispatcher) gets a result without, and one
// whose keep_result_until has passed still gets the least TTL.
func TestResultCarriesTheCallsTTL(t *testing.T) {
	h := start(t, "team-a", exec.Options{}, echo())
	for _, tc := range []struct {
		name   string
		keep   time.Duration // from now; 0: none
		lo, hi time.Duration
	}{
		{"twenty minutes", 20 * time.Minute, 20*time.Minute - 10*time.Second, 20*time.Minute + time.Second},
		{"passed", -time.Hour, protocol.ResultMinTTL, protocol.ResultMinTTL},
		{"far off", 30 * 24 * time.Hour, protocol.ResultMaxAge, protocol.ResultMaxAge},
		{"none", 0, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := h.newCall("team-a", "echo", `{}`, time.Now().Add(time.Minute))
			if tc.keep != 0 {
				c.KeepResultUntil = time.Now().Add(tc.keep)
			}
			h.publish(c, nil)
			h.result(c, 10*time.Second)
			m, err := h.results.GetLastMsgForSubject(t.Context(), c.ResultSubject())
			if err != nil {
				t.Fatal(err)
			}
			var ttl time.Duration
			if v := m.Header.Get(jetstream.MsgTTLHeader); v != "" {
				if ttl, err = time.ParseDuration(v); err != nil {
					t.Fatalf("Nats-TTL %q: %v", v, err)
				}
			}
			if ttl < tc.lo || ttl > tc.hi {
				t.Errorf("Nats-TTL = %s, want between %s and %s", ttl, tc.lo, tc.hi)
			}
		})
	}
}

// Arguments are checked once: an executor trusts the dispatcher's check
// only when the call names the executor's own schema. A call that names
// another (checked against another version's schema in a rollout) or none
// (published by something else) is checked again.
func TestArgumentsAreCheckedAgainUnlessTheCallNamesThisSchema(t *testing.T) {
	params := `{"type":"object","properties":{"x":{"type":"integer"}},"required":["x"]}`
	fn := echo()
	fn.Parameters = json.RawMessage(params)
	h := start(t, "team-a", exec.Options{}, fn)
	deadline := time.Now().Add(time.Minute)
	for name, header := range map[string]nats.Header{
		"no schema named":      nil,
		"another schema named": {protocol.HeaderSchema: []string{schema.Digest([]byte(`{"type":"object"}`))}},
	} {
		res := h.result(h.callWith("team-a", "echo", `{"y":1}`, deadline, header), 10*time.Second)
		if res.OK() || res.Error.Code != protocol.CodeInvalidArguments {
			t.Errorf("%s: result %+v, want invalid_arguments", name, res)
		}
	}
	// Vouched for against this very schema: not checked again (arguments
	// the schema refuses show it, as nothing else would let them through).
	res := h.result(h.callWith("team-a", "echo", `{"y":1}`, deadline, nats.Header{protocol.HeaderSchema: []string{schema.Digest([]byte(params))}}), 10*time.Second)
	if !res.OK() || res.Output != `{"y":1}` {
		t.Errorf("call checked against this schema: result %+v, want it run without a second check", res)
	}
}

func TestHandlerPastDeadlineIsCancelled(t *testing.T) {
	var sawCancel atomic.Bool
	slow := exec.Function{Name: "slow", Handler: exec.HandlerFunc(func(ctx context.Context, inv *exec.Invocation) ([]byte, error) {
		<-ctx.Done()
		sawCancel.Store(true)
		return nil, ctx.Err()
	})}
	h := start(t, "team-a", exec.Options{}, slow)
	c := h.call("team-a", "slow", `{}`, time.Now().Add(300*time.Millisecond))
	res := h.result(c, 10*time.Second)
	if res.OK() || res.Error.Code != protocol.CodeTimeout {
		t.Fatalf("result = %+v, want timeout", res)
	}
	if !sawCancel.Load() {
		t.Error("handler context was not cancelled")
	}
}

func TestCallPastDeadlineDoesNotRun(t *testing.T) {
	var ran atomic.Int32
	fn := exec.Function{Name: "never", Handler: exec.HandlerFunc(func(ctx context.Context, inv *exec.Invocation) ([]byte, error) {
		ran.Add(1)
		return []byte("ran"), nil
	})}
	h := start(t, "team-a", exec.Options{}, fn)
	c := h.call("team-a", "never", `{}`, time.Now().Add(-time.Second))
	res := h.result(c, 10*time.Second)
	if res.OK() || res.Error.Code != protocol.CodeTimeout || !strings.Contains(res.Error.Message, "not started") {
		t.Fatalf("result = %+v", res)
	}
	if ran.Load() != 0 {
		t.Error("handler ran after the deadline")
	}
}

func TestPanicYieldsOneFailedResult(t *testing.T) {
	fn := exec.Function{Name: "boom", Handler: exec.HandlerFunc(func(ctx context.Context, inv *exec.Invocation) ([]byte, error) {
		panic("secret internal state")
	})}
	h := start(t, "team-a", exec.Options{}, fn)
	c := h.call("team-a", "boom", `{}`, time.Now().Add(time.Minute))
	res := h.result(c, 10*time.Second)
	if res.OK() || res.Error.Code != protocol.CodeFunctionError {
		t.Fatalf("result = %+v", res)
	}
	if strings.Contains(res.Error.Message, "secret") {
		t.Errorf("panic value leaked to the model: %s", res.Error.Message)
	}
}

func TestHandlerErrorReachesTheModel(t *testing.T) {
	fn := exec.Function{Name: "fails", Handler: exec.HandlerFunc(func(ctx context.Context, inv *exec.Invocation) ([]byte, error) {
		return nil, errors.New("customer 42 not found; ask for the customer number")
	})}
	h := start(t, "team-a", exec.Options{}, fn)
	res := h.result(h.call("team-a", "fails", `{}`, time.Now().Add(time.Minute)), 10*time.Second)
	if res.OK() || res.Error.Message != "customer 42 not found; ask for the customer number" {
		t.Fatalf("result = %+v", res)
	}
}

func TestRegisterRejectsBadFunctions(t *testing.T) {
	e, err := exec.New(nil, "team-a", exec.Options{})
	if err != nil {
		t.Fatal(err)
	}
	h := exec.HandlerFunc(func(context.Context, *exec.Invocation) ([]byte, error) { return nil, nil })
	for name, f := range map[string]exec.Function{
		"subject injection": {Name: "a.b", Handler: h},
		"wildcard":          {Name: "a*", Handler: h},
		"no handler":        {Name: "ok"},
		"bad schema":        {Name: "ok", Handler: h, Parameters: json.RawMessage(`"x"`)},
		"not an object":     {Name: "ok", Handler: h, Parameters: json.RawMessage(`{"type":"array","items":{"type":"string"}}`)},
		"bad condition":     {Name: "ok", Handler: h, Approval: &protocol.ApprovalPolicy{When: "args.amount >"}},
		"empty approval":    {Name: "ok", Handler: h, Approval: &protocol.ApprovalPolicy{}},
	} {
		if err := e.Register(f); err == nil {
			t.Errorf("%s: Register accepted it", name)
		}
	}
	if _, err := exec.New(nil, "Team.A", exec.Options{}); err == nil {
		t.Error("New accepted an invalid team name")
	}
	// A schema the metaschema refuses names the function once.
	err = e.Register(exec.Function{Name: "roll_dice", Handler: h, Parameters: json.RawMessage(`{"type":"object","properties":{"n":{"type":"intger"}}}`)})
	if err == nil {
		t.Fatal("Register accepted a type that does not exist")
	}
	if msg := err.Error(); !strings.HasPrefix(msg, "exec: schema of roll_dice: not a valid JSON Schema:") || strings.Count(msg, "roll_dice") != 1 {
		t.Errorf("Register of an invalid schema: %q, want it to name the function once", msg)
	}
	// A misspelt keyword would leave the arguments unchecked (JSON Schema
	// ignores unknown keys): it is refused, with the keyword meant.
	err = e.Register(exec.Function{Name: "get_invoice", Handler: h, Parameters: json.RawMessage(`{"type":"object","properties":{"invoice_id":{"type":"string"}},"requird":["invoice_id"]}`)})
	if want := `exec: function get_invoice: parameters: unknown keyword "requird" at /requird (did you mean "required"?)`; err == nil || err.Error() != want {
		t.Errorf("Register of a misspelt keyword: %v, want %s", err, want)
	}
	// Tool text over its bounds or with hidden characters is refused at
	// Register, naming the bound or the character.
	for name, tc := range map[string]struct {
		f    exec.Function
		want string
	}{
		"long description": {exec.Function{Name: "ok", Handler: h, Description: strings.Repeat("x", protocol.MaxDescriptionSize+1)}, "MaxDescriptionSize"},
		"bidi override":    {exec.Function{Name: "ok", Handler: h, Description: "refund \u202e"}, "U+202E"},
		"hidden parameter": {exec.Function{Name: "ok", Handler: h, Parameters: json.RawMessage(`{"type":"object","title":"\u200b"}`)}, "/title: U+200B"},
	} {
		if err := e.Register(tc.f); !errors.Is(err, protocol.ErrToolText) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Register: %v, want an error wrapping protocol.ErrToolText naming %s", name, err, tc.want)
		}
	}
}

func TestMiddlewareOrderAndInvocationContext(t *testing.T) {
	var order []string
	mw := func(name string) exec.Middleware {
		return func(next exec.Handler) exec.Handler {
			return exec.HandlerFunc(func(ctx context.Context, inv *exec.Invocation) ([]byte, error) {
				order = append(order, name)
				return next.Handle(ctx, inv)
			})
		}
	}
	fn := exec.Function{Name: "ctx", Handler: exec.HandlerFunc(func(ctx context.Context, inv *exec.Invocation) ([]byte, error) {
		got, ok := exec.InvocationFromContext(ctx)
		if !ok || got != inv {
			return nil, errors.New("no invocation in context")
		}
		if _, ok := ctx.Deadline(); !ok {
			return nil, errors.New("no deadline")
		}
		return []byte(inv.Call.CallID), nil
	})}
	h := start(t, "team-a", exec.Options{Middleware: []exec.Middleware{mw("outer"), mw("inner")}}, fn)
	c := h.call("team-a", "ctx", `{}`, time.Now().Add(time.Minute))
	if res := h.result(c, 10*time.Second); res.Output != c.CallID {
		t.Fatalf("result = %+v", res)
	}
	if strings.Join(order, ",") != "outer,inner" {
		t.Errorf("middleware order = %v", order)
	}
}
