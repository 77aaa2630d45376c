package lease

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolrelay/toolrelay/internal/natstest"
	"github.com/toolrelay/toolrelay/internal/testutil"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

func declaration(instance string) *protocol.Declaration {
	return &protocol.Declaration{Version: protocol.Version, Instance: instance, Executor: instance, StartedAt: time.Now(),
		Spec: protocol.FunctionSpec{Version: protocol.Version, Name: "get_order", Team: "orders",
			Parameters: json.RawMessage(`{"type":"object"}`), UpdatedAt: time.Now()}}
}

// dispatcher stands in for the dispatchers' side of the exchange: it hands
// each request to the test and answers with what answer returns.
func dispatcher(t *testing.T, nc *nats.Conn, answer func(*protocol.DeclareRequest) protocol.DeclareReply) <-chan *protocol.DeclareRequest {
	t.Helper()
	got := make(chan *protocol.DeclareRequest, 16)
	sub, err := nc.Subscribe(protocol.DeclareSubject("orders"), func(m *nats.Msg) {
		req, err := protocol.DecodeDeclareRequest("orders", m.Data)
		if err != nil {
			t.Errorf("malformed request: %v", err)
			return
		}
		reply := answer(req)
		b, _ := json.Marshal(&reply)
		_ = m.Respond(b)
		got <- req
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return got
}

func accept(req *protocol.DeclareRequest) protocol.DeclareReply {
	reply := protocol.DeclareReply{Version: protocol.Version}
	for _, d := range req.Declarations {
		reply.Accepted = append(reply.Accepted, d.Spec.Name)
	}
	return reply
}

func next(t *testing.T, got <-chan *protocol.DeclareRequest) *protocol.DeclareRequest {
	t.Helper()
	select {
	case req := <-got:
		return req
	case <-time.After(10 * time.Second):
		t.Fatal("no request reached the dispatcher")
		return nil
	}
}

// Declare sends the declarations, Run renews them, Withdraw takes them back.
func TestDeclareRenewWithdraw(t *testing.T) {
	nc, _ := natstest.Start(t).Connect(t)
	ctx := t.Context()
	got := dispatcher(t, nc, accept)
	k, err := Declare(ctx, nc, "orders", []*protocol.Declaration{declaration("one")}, testutil.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	if req := next(t, got); req.Op != protocol.DeclareServe || req.Declarations[0].Key() != protocol.DeclarationKey("orders", "get_order", "one") {
		t.Fatalf("first request %+v, want a declaration of orders.get_order.one", req)
	}
	k.every = 50 * time.Millisecond
	rctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { k.Run(rctx); close(done) }()
	if req := next(t, got); req.Op != protocol.DeclareServe {
		t.Fatalf("renewal %+v, want a declaration again", req)
	}
	stop()
	<-done
	if err := k.Withdraw(ctx); err != nil {
		t.Fatal(err)
	}
	for req := next(t, got); req.Op != protocol.DeclareWithdraw; req = next(t, got) {
	}
}

// A refusal (another team owns the name) is an error the executor can name.
func TestRefusalIsReported(t *testing.T) {
	nc, _ := natstest.Start(t).Connect(t)
	dispatcher(t, nc, func(req *protocol.DeclareRequest) protocol.DeclareReply {
		return protocol.DeclareReply{Version: protocol.Version,
			Refused: []protocol.Refusal{{Function: "get_order", Owner: "billing", Reason: "get_order is owned by team \"billing\""}}}
	})
	_, err := Declare(t.Context(), nc, "orders", []*protocol.Declaration{declaration("one")}, testutil.Logger(t))
	var refused *RefusedError
	if !errors.As(err, &refused) || refused.Refusals[0].Owner != "billing" {
		t.Fatalf("err = %v, want a RefusedError naming billing", err)
	}
}

// With no dispatcher running, Declare does not fail: the keeper declares
// again soon, and the first dispatcher to start gets the declaration.
// Nothing is wrong yet, so nothing is logged above INFO: dispatchers
// starting take seconds (startQuiet).
func TestNoDispatcherYet(t *testing.T) {
	nc, _ := natstest.Start(t).Connect(t)
	ctx := t.Context()
	var logs testutil.Buffer
	k, err := Declare(ctx, nc, "orders", []*protocol.Declaration{declaration("early")}, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatalf("Declare without a dispatcher: %v, want nil", err)
	}
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	go k.Run(rctx)
	got := dispatcher(t, nc, accept)
	if req := next(t, got); req.Declarations[0].Instance != "early" {
		t.Fatalf("request %+v, want the early declaration", req)
	}
	if out := logs.String(); !strings.Contains(out, "level=INFO msg=\"no dispatcher answered") || strings.Contains(out, "level=WARN") {
		t.Errorf("an executor started before its dispatcher logged:\n%s\nwant INFO only", out)
	}
}

// A dispatcher that answers the first declaration with an error (it could
// not write the registry) does not stop the executor: the protocol says
// to send it again, and the keeper does, soon.
func TestDispatcherErrorIsDeclaredAgain(t *testing.T) {
	nc, _ := natstest.Start(t).Connect(t)
	ctx := t.Context()
	var answered int
	got := dispatcher(t, nc, func(req *protocol.DeclareRequest) protocol.DeclareReply {
		answered++
		if answered == 1 {
			return protocol.DeclareReply{Version: protocol.Version, Error: "declare get_order: nats: JetStream system temporarily unavailable"}
		}
		return accept(req)
	})
	k, err := Declare(ctx, nc, "orders", []*protocol.Declaration{declaration("one")}, testutil.Logger(t))
	if err != nil {
		t.Fatalf("Declare answered with a dispatcher error: %v, want nil (declare again)", err)
	}
	next(t, got)
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	go k.Run(rctx)
	if req := next(t, got); req.Op != protocol.DeclareServe || req.Declarations[0].Instance != "one" {
		t.Fatalf("request %+v, want the declaration again", req)
	}
}

// Suspend withdraws one function's declaration and leaves it out of the
// renewals; Resume declares it again.
func TestSuspendAndResumeOneFunction(t *testing.T) {
	nc, _ := natstest.Start(t).Connect(t)
	ctx := t.Context()
	got := dispatcher(t, nc, accept)
	other := declaration("one")
	other.Spec.Name = "get_invoice"
	k, err := Declare(ctx, nc, "orders", []*protocol.Declaration{declaration("one"), other}, testutil.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	next(t, got)
	names := func(req *protocol.DeclareRequest) (out []string) {
		for _, d := range req.Declarations {
			out = append(out, d.Spec.Name)
		}
		return out
	}
	if err := k.Suspend(ctx, "get_order"); err != nil {
		t.Fatal(err)
	}
	if req := next(t, got); req.Op != protocol.DeclareWithdraw || !slices.Equal(names(req), []string{"get_order"}) {
		t.Fatalf("after Suspend: %s %v, want the withdrawal of get_order", req.Op, names(req))
	}
	if err := k.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	if req := next(t, got); req.Op != protocol.DeclareServe || !slices.Equal(names(req), []string{"get_invoice"}) {
		t.Fatalf("renewal: %s %v, want get_invoice alone", req.Op, names(req))
	}
	if err := k.Resume(ctx, "get_order"); err != nil {
		t.Fatal(err)
	}
	if req := next(t, got); req.Op != protocol.DeclareServe || !slices.Equal(names(req), []string{"get_order", "get_invoice"}) {
		t.Fatalf("after Resume: %s %v, want both declared", req.Op, names(req))
	}
}

// An executor of more functions than one request may hold, or of schemas
// too large for one message, declares, renews and withdraws them in as
// many requests as the protocol's bounds need, each within them (the
// stand-in dispatcher decodes each as a dispatcher does), and every
// declaration in exactly one.
func TestManyDeclarationsGoInSeveralRequests(t *testing.T) {
	nc, _ := natstest.Start(t).Connect(t)
	got := dispatcher(t, nc, accept)
	big := `{"type":"object","description":"` + strings.Repeat("x", 60<<10) + `"}`
	for _, c := range []struct {
		name   string
		n      int
		schema string
		want   int // requests
	}{
		{"600 small", 600, `{"type":"object"}`, 3},
		{"40 of 60 KB", 40, big, 3},
	} {
		decls := make([]*protocol.Declaration, c.n)
		for i := range decls {
			d := declaration("many")
			d.Spec.Name = fmt.Sprintf("fn_%04d", i)
			d.Spec.Parameters = json.RawMessage(c.schema)
			decls[i] = d
		}
		k, err := Declare(t.Context(), nc, "orders", decls, testutil.Logger(t))
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		count := func(op protocol.DeclareOp) {
			t.Helper()
			seen := map[string]int{}
			for range c.want {
				req := next(t, got)
				if req.Op != op {
					t.Fatalf("%s: a %s request among the %s ones", c.name, req.Op, op)
				}
				for _, d := range req.Declarations {
					seen[d.Spec.Name]++
				}
			}
			if len(seen) != c.n {
				t.Errorf("%s, %s: %d functions in %d requests; want all %d", c.name, op, len(seen), c.want, c.n)
			}
			for name, n := range seen {
				if n != 1 {
					t.Errorf("%s, %s: %s in %d requests", c.name, op, name, n)
				}
			}
		}
		count(protocol.DeclareServe)
		if err := k.Renew(t.Context()); err != nil {
			t.Fatal(err)
		}
		count(protocol.DeclareServe)
		if err := k.Withdraw(t.Context()); err != nil {
			t.Fatal(err)
		}
		count(protocol.DeclareWithdraw)
		select {
		case req := <-got:
			t.Errorf("%s: a request more than the %d needed: %s of %d", c.name, c.want, req.Op, len(req.Declarations))
		default:
		}
	}
}

// A request the dispatcher fails does not keep the process's other
// requests from being sent: their declarations would lapse with it.
func TestAFailedRequestDoesNotHoldBackTheOthers(t *testing.T) {
	nc, _ := natstest.Start(t).Connect(t)
	got := dispatcher(t, nc, func(req *protocol.DeclareRequest) protocol.DeclareReply {
		if req.Declarations[0].Spec.Name == "fn_0000" {
			return protocol.DeclareReply{Version: protocol.Version, Error: "declare fn_0000: nats: timeout"}
		}
		return accept(req)
	})
	decls := make([]*protocol.Declaration, 2*protocol.MaxDeclarations)
	for i := range decls {
		d := declaration("many")
		d.Spec.Name = fmt.Sprintf("fn_%04d", i)
		decls[i] = d
	}
	k, err := Declare(t.Context(), nc, "orders", decls, testutil.Logger(t))
	if err != nil {
		t.Fatalf("Declare answered with a dispatcher error: %v, want nil (declare again)", err)
	}
	next(t, got)
	if req := next(t, got); req.Declarations[0].Spec.Name != fmt.Sprintf("fn_%04d", protocol.MaxDeclarations) {
		t.Fatalf("second request starts with %s, want the second batch", req.Declarations[0].Spec.Name)
	}
	var failed *dispatcherError
	if err := k.Renew(t.Context()); !errors.As(err, &failed) {
		t.Fatalf("Renew: %v, want the first request's failure", err)
	}
	for range 2 {
		next(t, got)
	}
}
