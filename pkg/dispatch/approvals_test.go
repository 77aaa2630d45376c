package dispatch_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/toolrelay/toolrelay/internal/apiauth"
	"github.com/toolrelay/toolrelay/internal/lease"
	"github.com/toolrelay/toolrelay/internal/platformsim"
	"github.com/toolrelay/toolrelay/internal/testutil"
	"github.com/toolrelay/toolrelay/pkg/dispatch"
	"github.com/toolrelay/toolrelay/pkg/dispatch/httpapi"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

const refundSchema = `{"type":"object","properties":{"order":{"type":"string"},"amount":{"type":"number"}},"required":["order","amount"]}`

// refundSpec is a side-effecting refund whose calls over 100 wait for the
// billing team or an admin.
func refundSpec(timeout time.Duration) protocol.FunctionSpec {
	return protocol.FunctionSpec{Version: protocol.Version, Name: "refund", Team: "billing", Parameters: json.RawMessage(refundSchema),
		Timeout: protocol.Duration(timeout), SideEffects: true, UpdatedAt: time.Now(),
		Approval: &protocol.ApprovalPolicy{When: "args.amount > 100"}}
}

// apiOf serves d's HTTP API with the tokens file at path.
func apiOf(t *testing.T, d *dispatch.Dispatcher, path string) *httptest.Server {
	t.Helper()
	file, err := apiauth.Open(path, apiauth.Options{Logger: slog.New(slog.DiscardHandler), Interval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(httpapi.New(d, httpapi.Options{Authenticator: file}))
	t.Cleanup(hs.Close)
	return hs
}

// decide posts a decision on key with token; it returns the status and
// the body.
func decide(t *testing.T, base, token string, key protocol.CallKey, verb, reason string) (int, []byte) {
	t.Helper()
	body, _ := json.Marshal(map[string]string{"reason": reason})
	req, _ := http.NewRequest(http.MethodPost, base+"/v1/approvals/"+string(key)+"/"+verb, bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// awaiting lists the held calls token sees awaiting a decision.
func awaiting(t *testing.T, base, token string) []httpapi.ApprovalView {
	t.Helper()
	got := do(t, http.MethodGet, base+"/v1/approvals", token, "")
	var list struct{ Approvals []httpapi.ApprovalView }
	if got.status != http.StatusOK || json.Unmarshal(got.body, &list) != nil {
		t.Fatalf("GET /v1/approvals: %d %s", got.status, got.body)
	}
	return list.Approvals
}

// A conversation asks for four refunds; the policy holds the three over
// 100 while the small one runs. The replica that took the turn in stops;
// on the other, the billing team approves one (it runs), denies one (the
// model reads who and why) and leaves one, which is denied automatically
// before the run's deadline; a token of another team can neither see nor
// decide them. The turn is submitted before the run expires, and the audit
// trail holds the requests, the decisions and the side-effecting runs.
func TestApprovalsApproveDenyAndTimeOutAcrossReplicas(t *testing.T) {
	t.Parallel()
	e := newEnv(t, platformsim.Scenario{Name: "refunds", Prompt: "refund four orders",
		Steps: []platformsim.Step{{
			{Name: "refund", As: "approved", Arguments: `{"order":"o-1","amount":500}`},
			{Name: "refund", As: "denied", Arguments: `{"order":"o-2","amount":700}`},
			{Name: "refund", As: "undecided", Arguments: `{"order":"o-3","amount":900}`},
			{Name: "refund", As: "small", Arguments: `{"order":"o-4","amount":5}`},
		}},
		Answer: `approved: {{out "approved"}} | denied: {{out "denied"}} | undecided: {{out "undecided"}} | small: {{out "small"}}`})
	// Its run expires in 60 s: deadline 15 s before (a quarter of the time
	// left); the refund's timeout of 20 s puts the auto-deny 25 s after
	// intake, the window for the replica change and the decisions.
	e.declareSpec(refundSpec(20*time.Second), "billing-exec", "b1")
	ranFor := make(chan string, 8)
	e.serve("billing", []string{"refund"}, func(c *protocol.Call) (string, bool) {
		var args struct{ Order string }
		_ = json.Unmarshal(c.Arguments, &args)
		ranFor <- args.Order
		return `"refunded ` + args.Order + `"`, false
	})
	path := filepath.Join(t.TempDir(), "tokens.txt")
	tokens := tokensFile(t, path, "admin", "billing", "orders")
	announced, err := e.js.Conn().SubscribeSync(protocol.ApprovalRequestedSubject("billing"))
	if err != nil {
		t.Fatal(err)
	}

	tp := sdktrace.NewTracerProvider()
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	d1, stop1 := e.dispatcher(dispatch.Options{Name: "d1", TracerProvider: tp})
	d2, _ := e.dispatcher(dispatch.Options{Name: "d2", TracerProvider: tp})
	api2 := apiOf(t, d2, path)
	ref := e.assistantsRun("refund four orders", map[string]string{platformsim.SimTTLMetadataKey: "60s"})
	w, err := d1.Watch(t.Context(), ref)
	if err != nil {
		t.Fatal(err)
	}

	var held []httpapi.ApprovalView
	testutil.WaitForWhat(t, 10*time.Second, "three refunds awaiting approval", func() bool {
		held = awaiting(t, api2.URL, tokens["billing"])
		return len(held) == 3
	})
	nextRun := func(what string) string {
		t.Helper()
		select {
		case got := <-ranFor:
			return got
		case <-time.After(10 * time.Second):
			t.Fatalf("no refund ran in 10 s; want %s", what)
			return ""
		}
	}
	if got := nextRun("o-4"); got != "o-4" {
		t.Fatalf("ran %s first; want only o-4 (5, under the condition) to run unapproved", got)
	}
	byOrder := map[string]httpapi.ApprovalView{}
	for _, h := range held {
		var args struct{ Order string }
		_ = json.Unmarshal(h.Arguments, &args)
		byOrder[args.Order] = h
		if h.State != dispatch.ApprovalAwaiting || h.Team != "billing" || h.Condition != "args.amount > 100" ||
			h.TimeLeftMS <= 0 || !h.AutoDenyAt.Before(h.Deadline) || !slices.Equal(h.Approvers, []string{"admin", "team"}) {
			t.Errorf("held call %+v", h)
		}
	}
	if msg, err := announced.NextMsg(5 * time.Second); err != nil || !bytes.Contains(msg.Data, []byte(`"awaiting_approval"`)) {
		t.Errorf("announcement on %s: %v %v", protocol.ApprovalRequestedSubject("billing"), msg, err)
	}
	if got := awaiting(t, api2.URL, tokens["orders"]); len(got) != 0 {
		t.Errorf("the orders team sees %d of billing's held calls", len(got))
	}

	// The replica that took the turn in goes; the other decides.
	stop1()
	approved, denied := byOrder["o-1"].CallKey, byOrder["o-2"].CallKey
	if status, body := decide(t, api2.URL, tokens["orders"], approved, "approve", ""); status != http.StatusNotFound {
		t.Errorf("the orders team approving billing's call: %d %s, want 404", status, body)
	}
	if status, body := decide(t, api2.URL, tokens["billing"], approved, "approve", "checked with the customer"); status != http.StatusOK {
		t.Fatalf("approve: %d %s", status, body)
	}
	if status, body := decide(t, api2.URL, tokens["billing"], denied, "deny", "over the refund limit"); status != http.StatusOK {
		t.Fatalf("deny: %d %s", status, body)
	}
	// A second decision loses to the first, and says how it went.
	if status, body := decide(t, api2.URL, tokens["admin"], denied, "approve", ""); status != http.StatusConflict || !strings.Contains(string(body), "denied by billing") {
		t.Errorf("a second decision: %d %s, want 409 naming the first", status, body)
	}
	if got := nextRun("o-1"); got != "o-1" {
		t.Fatalf("ran %s after the approval, want o-1", got)
	}

	testutil.WaitForWhat(t, 60*time.Second, "the watch to end", func() bool {
		w, err = d2.WatchStatus(t.Context(), w.ID)
		return err == nil && w.State != dispatch.WatchActive
	})
	if w.State != dispatch.WatchCompleted {
		t.Fatalf("watch %s (%s), want completed before the run expired", w.State, w.Error)
	}
	for _, want := range []string{`approved: "refunded o-1"`, `billing denied it: over the refund limit`,
		`undecided: {"error":{"type":"denied","message":"refund was not run: it needs a person's approval, and nobody approved it in time.`,
		`small: "refunded o-4"`} {
		if !strings.Contains(w.Answer, want) {
			t.Errorf("answer %q lacks %q", w.Answer, want)
		}
	}
	select {
	case got := <-ranFor:
		t.Errorf("ran %s, which nobody approved", got)
	default:
	}
	// An approval after the automatic denial changes nothing.
	if status, body := decide(t, api2.URL, tokens["billing"], byOrder["o-3"].CallKey, "approve", ""); status != http.StatusConflict ||
		!strings.Contains(string(body), "not approved in time") {
		t.Errorf("approving after the auto-deny: %d %s, want 409 saying it was not approved in time", status, body)
	}

	// The audit trail, read as the billing team: every request, decision
	// and run of the side-effecting refund; none of it for another team.
	kinds := map[string]int{}
	var runs []dispatch.AuditEntry
	testutil.WaitForWhat(t, 5*time.Second, "the audit trail to hold three requests, three decisions and two runs", func() bool {
		clear(kinds)
		runs = runs[:0]
		got := do(t, http.MethodGet, api2.URL+"/v1/audit?team=billing", tokens["billing"], "")
		sc := bufio.NewScanner(bytes.NewReader(got.body))
		for sc.Scan() {
			var en dispatch.AuditEntry
			if err := json.Unmarshal(sc.Bytes(), &en); err != nil {
				t.Fatalf("audit line %q: %v", sc.Text(), err)
			}
			kinds[en.Kind]++
			if en.Kind == "run" {
				runs = append(runs, en)
			}
		}
		return kinds["requested"] == 3 && kinds["approved"] == 1 && kinds["denied"] == 1 && kinds["expired"] == 1 && kinds["run"] == 2
	})
	for _, r := range runs {
		if r.Outcome != "ok" || r.Function != "refund" || r.CallKey == "" || r.TraceID == "" {
			t.Errorf("run entry %+v", r)
		}
	}
	if got := do(t, http.MethodGet, api2.URL+"/v1/audit?team=billing", tokens["orders"], ""); got.status != http.StatusForbidden {
		t.Errorf("the orders team reading billing's audit trail: %d, want 403", got.status)
	}
	if got := do(t, http.MethodGet, api2.URL+"/v1/audit", tokens["orders"], ""); got.status != http.StatusOK || len(got.body) != 0 {
		t.Errorf("the orders team's own audit trail: %d %q, want empty", got.status, got.body)
	}
}

// A call held when its turn's deadline leaves no time to ask is denied at
// once, without waiting for anyone.
func TestApprovalWithNoTimeToAskIsDeniedAtOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t, platformsim.Scenario{Name: "late refund", Prompt: "refund late",
		Steps:  []platformsim.Step{{{Name: "refund", Arguments: `{"order":"o-9","amount":500}`}}},
		Answer: `{{out "refund"}}`})
	e.declareSpec(refundSpec(time.Minute), "billing-exec", "b1") // a minute to run, in a 40 s run
	ran := e.serve("billing", []string{"refund"}, func(*protocol.Call) (string, bool) { return `"refunded"`, false })
	d, _ := e.dispatcher(dispatch.Options{})
	// Denied at once: a call waiting for its turn's deadline would read
	// "timed out" instead.
	w := finish(t, d, e.assistantsRun("refund late", map[string]string{platformsim.SimTTLMetadataKey: "40s"}), 25*time.Second)
	if w.State != dispatch.WatchCompleted || !strings.Contains(w.Answer, "nobody approved it in time") {
		t.Errorf("watch %s %q; want it denied at once, not approved in time", w.State, w.Answer)
	}
	if ran.Load() != 0 {
		t.Errorf("the refund ran %d times", ran.Load())
	}
	entries, err := d.Audit(t.Context(), dispatch.Caller{Name: "ops", Admin: true}, dispatch.AuditQuery{Team: "billing"})
	var kinds []string
	for _, en := range entries {
		kinds = append(kinds, en.Kind)
	}
	if err != nil || !slices.Equal(kinds, []string{"requested", "expired"}) {
		t.Errorf("audit trail %v (%v), want the request and its automatic denial", kinds, err)
	}
}

// A declaration whose condition does not compile is refused by the
// dispatcher, naming the function and the condition, whatever library sent
// it, and claims no name.
func TestDispatcherRefusesABadApprovalCondition(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.dispatcher(dispatch.Options{})
	spec := refundSpec(0)
	spec.Approval.When = "args.amount >"
	_, err := lease.Declare(t.Context(), e.js.Conn(), "billing", []*protocol.Declaration{{Version: protocol.Version, Spec: spec,
		Instance: "b1", Executor: "ts-exec", StartedAt: time.Now()}}, testutil.Logger(t))
	var refused *lease.RefusedError
	if !errors.As(err, &refused) || !strings.Contains(err.Error(), "function refund: approval: when") {
		t.Fatalf("declaring a bad condition: %v, want a refusal naming refund's condition", err)
	}
	fns, err := dispatch.Registry(t.Context(), e.js)
	if err != nil || len(fns) != 0 {
		t.Fatalf("registry %+v (%v), want empty", fns, err)
	}
}

// A held call waits and runs once approved on every platform the
// dispatcher drives, and on MCP's direct calls.
func TestApprovalOnEachPlatform(t *testing.T) {
	t.Parallel()
	e := newEnv(t, platformsim.Scenario{Name: "one refund", Prompt: "refund one order",
		Steps:  []platformsim.Step{{{Name: "refund", Arguments: `{"order":"o-7","amount":250}`}}},
		Answer: `{{out "refund"}}`})
	e.declareSpec(refundSpec(5*time.Second), "billing-exec", "b1")
	e.serve("billing", []string{"refund"}, func(c *protocol.Call) (string, bool) { return `"refunded o-7"`, false })
	d, _ := e.dispatcher(dispatch.Options{})
	billing := dispatch.Caller{Name: "billing-oncall", Teams: []string{"billing"}}
	approveNext := func(t *testing.T) {
		t.Helper()
		var held []*dispatch.Approval
		testutil.WaitForWhat(t, 10*time.Second, "the refund to await approval", func() bool {
			var err error
			held, err = d.Approvals(t.Context(), billing, dispatch.ApprovalQuery{})
			return err == nil && len(held) == 1
		})
		if _, err := d.Decide(t.Context(), billing, held[0].CallKey, dispatch.Decision{Approve: true}); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name string
		ref  func() dispatch.Ref
	}{
		{"agents", func() dispatch.Ref { return e.session("refund one order") }},
		{"assistants", func() dispatch.Ref { return e.assistantsRun("refund one order", nil) }},
		{"responses", func() dispatch.Ref { return e.response("refund one order") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, err := d.Watch(t.Context(), tc.ref())
			if err != nil {
				t.Fatal(err)
			}
			approveNext(t)
			testutil.WaitForWhat(t, 20*time.Second, "the watch to end", func() bool {
				w, err = d.WatchStatus(t.Context(), w.ID)
				return err == nil && w.State != dispatch.WatchActive
			})
			if w.State != dispatch.WatchCompleted || !strings.Contains(w.Answer, "refunded o-7") {
				t.Errorf("watch %s %q (%s), want the approved refund's answer", w.State, w.Answer, w.Error)
			}
		})
	}
	t.Run("mcp", func(t *testing.T) {
		done := make(chan *protocol.Result, 1)
		go func() {
			r, err := d.Call(t.Context(), dispatch.DirectCall{Function: "refund", Arguments: json.RawMessage(`{"order":"o-7","amount":250}`), Timeout: time.Minute})
			if err != nil {
				t.Error(err)
			}
			done <- r
		}()
		approveNext(t)
		select {
		case r := <-done:
			if r == nil || r.Output != `"refunded o-7"` {
				t.Errorf("direct call: %+v, want the refund's output", r)
			}
		case <-time.After(20 * time.Second):
			t.Fatal("the approved direct call did not return in 20 s")
		}
	})
}

// Deciders racing on one held call, on two replicas: exactly one decision
// wins, every other gets ErrDecided naming it, and the call runs or fails
// once, as the winner said.
func TestConcurrentDecisionsYieldOneOutcome(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.declareSpec(refundSpec(5*time.Second), "billing-exec", "b1")
	ran := e.serve("billing", []string{"refund"}, func(c *protocol.Call) (string, bool) { return `"refunded"`, false })
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	d1, _ := e.dispatcher(dispatch.Options{Name: "d1", MeterProvider: mp})
	d2, _ := e.dispatcher(dispatch.Options{Name: "d2", MeterProvider: mp})
	started, err := d1.StartCall(t.Context(), "race", dispatch.DirectCall{Function: "refund",
		Arguments: json.RawMessage(`{"order":"o-1","amount":500}`), Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	admin := dispatch.Caller{Name: "ops", Admin: true}
	var held []*dispatch.Approval
	testutil.WaitForWhat(t, 10*time.Second, "the refund to await approval", func() bool {
		held, err = d2.Approvals(t.Context(), admin, dispatch.ApprovalQuery{})
		return err == nil && len(held) == 1
	})
	const deciders = 8
	type outcome struct {
		a   *dispatch.Approval
		err error
	}
	outcomes := make(chan outcome, deciders)
	for i := range deciders {
		d := []*dispatch.Dispatcher{d1, d2}[i%2]
		go func() {
			a, err := d.Decide(context.Background(), dispatch.Caller{Name: fmt.Sprintf("person-%d", i), Admin: true}, held[0].CallKey,
				dispatch.Decision{Approve: i%3 != 0, Reason: "decider " + strconv.Itoa(i)})
			outcomes <- outcome{a, err}
		}()
	}
	var won *dispatch.Approval
	for range deciders {
		o := <-outcomes
		switch {
		case o.err == nil && won == nil:
			won = o.a
		case o.err == nil:
			t.Fatalf("two decisions won: %s and %s", won.DecidedBy, o.a.DecidedBy)
		case !errors.Is(o.err, dispatch.ErrDecided):
			t.Fatalf("a losing decision: %v, want ErrDecided", o.err)
		}
	}
	if won == nil {
		t.Fatal("no decision won")
	}
	wctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	res, err := d2.StartedCall(wctx, "race", started.Key, true)
	if err != nil || res.Result == nil {
		t.Fatalf("the call's outcome: %+v, %v", res, err)
	}
	if approved := won.State == dispatch.ApprovalApproved; approved != res.Result.OK() || (approved && ran.Load() != 1) || (!approved && ran.Load() != 0) {
		t.Errorf("%s by %s, but the call's result is %+v after %d runs", won.State, won.DecidedBy, res.Result, ran.Load())
	}
	counted := counterBy(t, reader, "toolrelay.approvals", attribute.Key("toolrelay.outcome"))
	if want := map[string]int64{"requested": 1, string(won.State): 1}; !maps.Equal(counted, want) {
		t.Errorf("toolrelay.approvals by outcome %v, want %v", counted, want)
	}
}
