package exectest_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/toolrelay/toolrelay/pkg/exec"
	"github.com/toolrelay/toolrelay/pkg/exec/exectest"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

func TestRunAppliesTheExecutorsRules(t *testing.T) {
	fn := exec.Function{
		Name:       "greet",
		Parameters: []byte(`{"type":"object","properties":{"name":{"type":"string"}},"required":["name"]}`),
		Handler: exec.HandlerFunc(func(ctx context.Context, inv *exec.Invocation) ([]byte, error) {
			if got, ok := exec.InvocationFromContext(ctx); !ok || got != inv || inv.Call.CallID != "call_test" {
				return nil, errors.New("no invocation in context")
			}
			if strings.Contains(string(inv.Call.Arguments), "boom") {
				panic("boom")
			}
			if strings.Contains(string(inv.Call.Arguments), "slow") {
				<-ctx.Done()
				return nil, ctx.Err()
			}
			return []byte("hello"), nil
		}),
	}
	for _, tc := range []struct {
		name, args  string
		opts        exectest.Options
		code        protocol.ErrorCode // "" for success
		verdict     exectest.Verdict
		deadLetter  string
		notInOutput string
	}{
		{name: "ok", args: `{"name":"x"}`, verdict: exectest.Recorded},
		{name: "bad arguments", args: `{}`, code: protocol.CodeInvalidArguments, verdict: exectest.Recorded},
		{name: "panic", args: `{"name":"boom"}`, code: protocol.CodeFunctionError, verdict: exectest.DeadLettered,
			deadLetter: protocol.ReasonPanic, notInOutput: "boom"},
		{name: "deadline", args: `{"name":"slow"}`, opts: exectest.Options{Deadline: 50 * time.Millisecond},
			code: protocol.CodeTimeout, verdict: exectest.Recorded},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := exectest.Run(t, fn, tc.args, tc.opts)
			if tc.code == "" && (!res.OK() || res.Output != "hello") {
				t.Fatalf("result = %+v, want output hello", res.Result)
			}
			if tc.code != "" && (res.OK() || res.Error.Code != tc.code) {
				t.Fatalf("result = %+v, want %s", res.Result, tc.code)
			}
			if res.Verdict != tc.verdict || res.DeadLetter != tc.deadLetter {
				t.Errorf("verdict = %s (dead letter %q), want %s (%q)", res.Verdict, res.DeadLetter, tc.verdict, tc.deadLetter)
			}
			if tc.notInOutput != "" && strings.Contains(res.Error.Message, tc.notInOutput) {
				t.Errorf("message %q shows %q", res.Error.Message, tc.notInOutput)
			}
		})
	}
}

// The verdict says what the worker does with an error: retry it while
// attempts remain, refuse it, or fail it for good with a dead letter.
func TestRunClassifiesErrorsLikeTheWorker(t *testing.T) {
	busy := exec.Retryable(errors.New("the order service is busy"))
	fn := func(err error) exec.Function {
		return exec.Function{Name: "get_order", Retry: &exec.RetryPolicy{MaxAttempts: 3},
			Handler: exec.HandlerFunc(func(context.Context, *exec.Invocation) ([]byte, error) { return nil, err })}
	}
	for _, tc := range []struct {
		name       string
		err        error
		attempt    int
		verdict    exectest.Verdict
		deadLetter string
	}{
		{name: "retryable, first attempt", err: busy, attempt: 1, verdict: exectest.Retried},
		{name: "retryable, second attempt", err: busy, attempt: 2, verdict: exectest.Retried},
		{name: "retryable, last attempt", err: busy, attempt: 3, verdict: exectest.DeadLettered, deadLetter: protocol.ReasonExhausted},
		{name: "refused", err: exec.Refuse(errors.New("the order has shipped")), attempt: 1, verdict: exectest.Refused},
		{name: "refused and retryable", err: exec.Refuse(busy), attempt: 1, verdict: exectest.Refused},
		{name: "permanent", err: errors.New("no order B-7"), attempt: 1, verdict: exectest.DeadLettered, deadLetter: protocol.ReasonPermanent},
		{name: "executors died too often", err: nil, attempt: 6, verdict: exectest.DeadLettered, deadLetter: protocol.ReasonUndelivered},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := exectest.Run(t, fn(tc.err), `{}`, exectest.Options{Attempt: tc.attempt})
			if res.Verdict != tc.verdict || res.DeadLetter != tc.deadLetter {
				t.Errorf("verdict = %s (dead letter %q), want %s (%q)", res.Verdict, res.DeadLetter, tc.verdict, tc.deadLetter)
			}
			if res.OK() {
				t.Fatalf("result = %+v, want a failure", res.Result)
			}
			if tc.err != nil && (!errors.Is(res.Err, tc.err) || res.Error.Message != tc.err.Error()) {
				t.Errorf("Err = %v, message %q; want %v", res.Err, res.Error.Message, tc.err)
			}
			if tc.err == nil && res.Error.Code != protocol.CodeUnavailable {
				t.Errorf("code = %s, want unavailable", res.Error.Code)
			}
			if (res.Verdict == exectest.Retried) != (res.RetryIn > 0) {
				t.Errorf("RetryIn = %s with verdict %s", res.RetryIn, res.Verdict)
			}
		})
	}
}

// MayHaveRun runs the Reconcile hook; ErrDidNotRun hands over to the
// handler, and a function without a hook fails the call with a dead letter.
func TestRunReconcilesAnAttemptThatMayHaveRun(t *testing.T) {
	var ran atomic.Int32
	refund := func(reconcile exec.Handler) exec.Function {
		return exec.Function{Name: "issue_refund", SideEffects: true, Reconcile: reconcile,
			Handler: exec.HandlerFunc(func(context.Context, *exec.Invocation) ([]byte, error) {
				ran.Add(1)
				return []byte("refunded"), nil
			})}
	}
	found := exec.HandlerFunc(func(ctx context.Context, inv *exec.Invocation) ([]byte, error) {
		return []byte("already refunded as " + string(inv.Call.Key)), nil
	})
	notFound := exec.HandlerFunc(func(context.Context, *exec.Invocation) ([]byte, error) { return nil, exec.ErrDidNotRun })
	opts := exectest.Options{MayHaveRun: true, Attempt: 2}

	if res := exectest.Run(t, refund(found), `{}`, opts); !res.OK() || !strings.HasPrefix(res.Output, "already refunded as ") || ran.Load() != 0 {
		t.Errorf("effect found: %+v, handler ran %d times", res.Result, ran.Load())
	}
	if res := exectest.Run(t, refund(notFound), `{}`, opts); !res.OK() || res.Output != "refunded" || ran.Load() != 1 {
		t.Errorf("no effect: %+v, handler ran %d times", res.Result, ran.Load())
	}
	res := exectest.Run(t, refund(nil), `{}`, opts)
	if res.OK() || res.Error.Code != protocol.CodeUnavailable || res.DeadLetter != protocol.ReasonMayHaveRun || ran.Load() != 1 {
		t.Errorf("no hook: %+v, dead letter %q, handler ran %d times", res.Result, res.DeadLetter, ran.Load())
	}
	if res := exectest.Run(t, refund(nil), `{}`, exectest.Options{}); !res.OK() || ran.Load() != 2 {
		t.Errorf("first attempt: %+v", res.Result)
	}
}

func ExampleCall() {
	fn := exec.Function{
		Name: "get_city",
		Handler: exec.HandlerFunc(func(ctx context.Context, inv *exec.Invocation) ([]byte, error) {
			return []byte("Seattle, WA for " + inv.Call.CallID), nil
		}),
	}
	out, _ := fn.Handler.Handle(context.Background(), &exec.Invocation{Call: exectest.Call(fn, `{}`, exectest.Options{}), Attempt: 1})
	fmt.Println(string(out))
	// Output: Seattle, WA for call_test
}
