package exec_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolrelay/toolrelay/internal/testutil"
	"github.com/toolrelay/toolrelay/pkg/exec"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// deadLetters reads every dead letter recorded so far.
func (h *harness) deadLetters() []*protocol.DeadLetter {
	h.t.Helper()
	ctx := context.Background()
	s, err := h.js.Stream(ctx, protocol.DeadLetterStream)
	if err != nil {
		return nil
	}
	c, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		h.t.Fatal(err)
	}
	var out []*protocol.DeadLetter
	for {
		batch, err := c.FetchNoWait(100)
		if err != nil {
			h.t.Fatal(err)
		}
		n := 0
		for m := range batch.Messages() {
			n++
			d, err := protocol.DecodeDeadLetter(m.Data())
			if err != nil {
				h.t.Fatalf("dead letter does not decode: %v", err)
			}
			out = append(out, d)
		}
		if n == 0 {
			return out
		}
	}
}

func fastRetry() *exec.RetryPolicy {
	return &exec.RetryPolicy{MaxAttempts: 3, InitialBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond}
}

func TestRetryableErrorIsRetried(t *testing.T) {
	var runs atomic.Int32
	fn := exec.Function{Name: "flaky", Retry: fastRetry(), Handler: exec.HandlerFunc(func(ctx context.Context, inv *exec.Invocation) ([]byte, error) {
		if n := runs.Add(1); n < 3 {
			return nil, exec.Retryable(fmt.Errorf("backend busy (%d)", n))
		}
		a := inv.Attempt
		return fmt.Appendf(nil, "ok on attempt %d", a), nil
	})}
	h := start(t, "team-a", exec.Options{}, fn)
	res := h.result(h.call("team-a", "flaky", `{}`, time.Now().Add(time.Minute)), 10*time.Second)
	if !res.OK() || res.Output != "ok on attempt 3" || res.Attempt != 3 {
		t.Fatalf("result = %+v", res)
	}
	if dl := h.deadLetters(); len(dl) != 0 {
		t.Errorf("a call that succeeded left %d dead letters", len(dl))
	}
}

func TestExhaustedRetriesGiveOneFailureAndADeadLetter(t *testing.T) {
	var runs atomic.Int32
	fn := exec.Function{Name: "down", Retry: fastRetry(), Handler: exec.HandlerFunc(func(ctx context.Context, inv *exec.Invocation) ([]byte, error) {
		runs.Add(1)
		return nil, exec.Retryable(errors.New("the billing backend is down; try again later"))
	})}
	h := start(t, "team-a", exec.Options{}, fn)
	c := h.call("team-a", "down", `{}`, time.Now().Add(time.Minute))
	res := h.result(c, 10*time.Second)
	if res.OK() || res.Error.Message != "the billing backend is down; try again later" || res.Attempt != 3 {
		t.Fatalf("result = %+v", res)
	}
	var dl []*protocol.DeadLetter
	testutil.WaitForWhat(t, 5*time.Second, "the call to be dead-lettered as exhausted", func() bool { dl = h.deadLetters(); return len(dl) == 1 })
	if dl[0].Reason != protocol.ReasonExhausted || dl[0].Call.Key != c.Key || dl[0].Attempts != 3 {
		t.Errorf("dead letter = %+v", dl[0])
	}
	if n := runs.Load(); n != 3 {
		t.Errorf("ran %d times, want 3", n)
	}
}

func TestPanicLeavesADeadLetter(t *testing.T) {
	fn := exec.Function{Name: "boom", Handler: exec.HandlerFunc(func(ctx context.Context, inv *exec.Invocation) ([]byte, error) {
		panic("nil map")
	})}
	h := start(t, "team-a", exec.Options{}, fn)
	c := h.call("team-a", "boom", `{}`, time.Now().Add(time.Minute))
	if res := h.result(c, 10*time.Second); res.OK() {
		t.Fatal("panic produced a successful result")
	}
	var dl []*protocol.DeadLetter
	testutil.WaitForWhat(t, 5*time.Second, "the panicking call to be dead-lettered", func() bool { dl = h.deadLetters(); return len(dl) == 1 })
	if dl[0].Reason != protocol.ReasonPanic || dl[0].Call.Key != c.Key {
		t.Errorf("dead letter = %+v", dl[0])
	}
}

func TestRefusalGivesOneFailureAndNoDeadLetter(t *testing.T) {
	shipped := errors.New("order A-1 has already shipped; it can no longer be cancelled")
	refusing, err := exec.CommandHandler([]string{"sh", "-c", `echo "no customer has that email" >&2; exit 65`})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name       string
		err        error        // returned by a Go handler; nil: use handler
		handler    exec.Handler // a non-Go handler
		wantMsg    string       // the result's message contains it
		deadLetter string       // the reason expected, or "" for none
	}{
		{name: "Refuse", err: exec.Refuse(shipped), wantMsg: shipped.Error()},
		{name: "wrapped ErrRefused", err: fmt.Errorf("%w: %w", shipped, exec.ErrRefused), wantMsg: shipped.Error()},
		{name: "refusal beats retryable", err: exec.Refuse(exec.Retryable(shipped)), wantMsg: shipped.Error()},
		{name: "command exit 65", handler: refusing, wantMsg: "no customer has that email"},
		{name: "plain error", err: errors.New("the order database returned garbage"),
			wantMsg: "the order database returned garbage", deadLetter: protocol.ReasonPermanent},
	}
	var fns []exec.Function
	runs := make([]atomic.Int32, len(tests))
	for i, tc := range tests {
		fn := exec.Function{Name: fmt.Sprintf("fn_%d", i), Retry: fastRetry(), Handler: tc.handler}
		if tc.handler == nil {
			fn.Handler = exec.HandlerFunc(func(context.Context, *exec.Invocation) ([]byte, error) {
				runs[i].Add(1)
				return nil, tc.err
			})
		}
		fns = append(fns, fn)
	}
	h := start(t, "team-a", exec.Options{}, fns...)
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := h.call("team-a", fns[i].Name, `{}`, time.Now().Add(time.Minute))
			res := h.result(c, 10*time.Second)
			// A retry would have recorded nothing at attempt 1.
			if res.OK() || res.Error.Code != protocol.CodeFunctionError || !strings.Contains(res.Error.Message, tc.wantMsg) || res.Attempt != 1 {
				t.Fatalf("result = %+v; want one function_error at attempt 1 saying %q", res, tc.wantMsg)
			}
			if tc.handler == nil && runs[i].Load() != 1 {
				t.Errorf("ran %d times, want 1", runs[i].Load())
			}
			// The dead letter is recorded before the result, so with the
			// result in hand its absence is final.
			var got []string
			for _, d := range h.deadLetters() {
				if d.Call.Key == c.Key {
					got = append(got, d.Reason)
				}
			}
			var want []string
			if tc.deadLetter != "" {
				want = []string{tc.deadLetter}
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("dead letters for the call (-want +got):\n%s", diff)
			}
		})
	}
}

// sideEffect is a function with an effect that must happen at most once per
// call; the first run blocks until the executor running it shuts down.
func sideEffect(effects *atomic.Int32, started chan<- struct{}, reconcile exec.Handler) exec.Function {
	return exec.Function{
		Name: "issue_refund", SideEffects: true, Reconcile: reconcile,
		Handler: exec.HandlerFunc(func(ctx context.Context, inv *exec.Invocation) ([]byte, error) {
			if effects.Add(1) == 1 {
				started <- struct{}{}
				<-ctx.Done() // the executor dies mid-run
				return nil, ctx.Err()
			}
			return []byte("refunded"), nil
		}),
	}
}

func TestSideEffectFunctionNeverRunsTwice(t *testing.T) {
	var effects atomic.Int32
	started := make(chan struct{}, 1)
	fn := sideEffect(&effects, started, nil)
	h := start(t, "team-a", exec.Options{ShutdownTimeout: 10 * time.Millisecond}, fn)
	c := h.call("team-a", "issue_refund", `{}`, time.Now().Add(time.Minute))
	<-started
	// A second replica comes up; the first dies mid-run.
	h.run("team-a", exec.Options{ShutdownTimeout: 10 * time.Millisecond}, fn)
	h.stopFirst()
	res := h.result(c, 15*time.Second)
	if res.OK() || res.Error.Code != protocol.CodeUnavailable {
		t.Fatalf("result = %+v, want 'may have run' failure", res)
	}
	if n := effects.Load(); n != 1 {
		t.Fatalf("the side effect happened %d times", n)
	}
	var dl []*protocol.DeadLetter
	testutil.WaitForWhat(t, 5*time.Second, "the call to be dead-lettered as may-have-run", func() bool { dl = h.deadLetters(); return len(dl) == 1 })
	if dl[0].Reason != protocol.ReasonMayHaveRun {
		t.Errorf("dead letter reason = %s", dl[0].Reason)
	}
}

func TestReconcileDecidesForAnAttemptThatMayHaveRun(t *testing.T) {
	var effects, reconciled atomic.Int32
	started := make(chan struct{}, 1)
	fn := sideEffect(&effects, started, exec.HandlerFunc(func(ctx context.Context, inv *exec.Invocation) ([]byte, error) {
		reconciled.Add(1)
		return []byte("refund r-1 already issued"), nil
	}))
	h := start(t, "team-a", exec.Options{ShutdownTimeout: 10 * time.Millisecond}, fn)
	c := h.call("team-a", "issue_refund", `{}`, time.Now().Add(time.Minute))
	<-started
	h.run("team-a", exec.Options{ShutdownTimeout: 10 * time.Millisecond}, fn)
	h.stopFirst()
	res := h.result(c, 15*time.Second)
	if !res.OK() || res.Output != "refund r-1 already issued" {
		t.Fatalf("result = %+v", res)
	}
	if effects.Load() != 1 || reconciled.Load() != 1 {
		t.Errorf("effects %d, reconciled %d; want 1 and 1", effects.Load(), reconciled.Load())
	}
}

func TestReplicasShareTheLoad(t *testing.T) {
	fn := func() exec.Function {
		return exec.Function{Name: "work", Concurrency: 1, Handler: exec.HandlerFunc(func(ctx context.Context, inv *exec.Invocation) ([]byte, error) {
			time.Sleep(20 * time.Millisecond)
			return []byte("done"), nil
		})}
	}
	h := start(t, "team-a", exec.Options{Name: "one"}, fn())
	h.run("team-a", exec.Options{Name: "two"}, fn())
	var calls []*protocol.Call
	for i := range 20 {
		calls = append(calls, h.call("team-a", "work", fmt.Sprintf(`{"i":%d}`, i), time.Now().Add(time.Minute)))
	}
	by := map[string]int{}
	for _, c := range calls {
		by[h.result(c, 20*time.Second).Executor]++
	}
	if by["one"] == 0 || by["two"] == 0 || by["one"]+by["two"] != 20 {
		t.Errorf("calls by executor = %v; want both to take a share of 20", by)
	}
}

func TestGlobalConcurrencyCapHoldsAcrossReplicas(t *testing.T) {
	const limit, total = 2, 24
	var running, peak atomic.Int32
	// Calls hold their slots until release closes, so the cap is reached
	// and stays reached while the rest wait behind it.
	release := make(chan struct{})
	fn := func() exec.Function {
		return exec.Function{Name: "capped", Concurrency: 4, MaxConcurrency: limit,
			Handler: exec.HandlerFunc(func(ctx context.Context, inv *exec.Invocation) ([]byte, error) {
				n := running.Add(1)
				defer running.Add(-1)
				for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
				}
				select {
				case <-release:
					return []byte("ok"), nil
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			})}
	}
	h := start(t, "team-a", exec.Options{}, fn())
	h.run("team-a", exec.Options{}, fn())
	h.run("team-a", exec.Options{}, fn())
	releaseAll := sync.OnceFunc(func() { close(release) })
	t.Cleanup(releaseAll) // runs before the executors stop
	var calls []*protocol.Call
	for i := range total {
		calls = append(calls, h.call("team-a", "capped", fmt.Sprintf(`{"i":%d}`, i), time.Now().Add(time.Minute)))
	}
	// Three replicas with 12 free slots between them keep asking for calls
	// (waiting pulls) while calls are queued: only the cap holds them back.
	ctx := context.Background()
	held := func() (bool, string) {
		cons, err := h.js.Consumer(ctx, protocol.CallStream("team-a"), "capped")
		if err != nil {
			return false, err.Error()
		}
		info, err := cons.Info(ctx)
		if err != nil {
			return false, err.Error()
		}
		n := running.Load()
		return n == limit && info.NumAckPending == limit && info.NumPending == total-limit && info.NumWaiting > 0,
			fmt.Sprintf("running %d (peak %d), delivered %d, queued %d, waiting pulls %d", n, peak.Load(),
				info.NumAckPending, info.NumPending, info.NumWaiting)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		ok, state := held()
		if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the cap of %d was not reached and held within 10s: %s", limit, state)
		}
	}
	if p := peak.Load(); p != limit {
		t.Fatalf("%d calls ran at once across three replicas with calls waiting; the cap is %d", p, limit)
	}
	releaseAll()
	for _, c := range calls {
		if res := h.result(c, 30*time.Second); !res.OK() {
			t.Fatalf("result = %+v", res)
		}
	}
	if p := peak.Load(); p != limit {
		t.Errorf("%d calls ran at once across three replicas; the cap is %d", p, limit)
	}
}

func TestShutdownFinishesRunningCalls(t *testing.T) {
	release := make(chan struct{})
	started := make(chan struct{}, 1)
	fn := exec.Function{Name: "steady", Handler: exec.HandlerFunc(func(ctx context.Context, inv *exec.Invocation) ([]byte, error) {
		started <- struct{}{}
		<-release
		return []byte("finished"), nil
	})}
	h := start(t, "team-a", exec.Options{ShutdownTimeout: 10 * time.Second}, fn)
	c := h.call("team-a", "steady", `{}`, time.Now().Add(time.Minute))
	<-started
	stopped := make(chan struct{})
	go func() { h.stopFirst(); close(stopped) }()
	close(release)
	<-stopped
	if res := h.result(c, 5*time.Second); !res.OK() || res.Output != "finished" {
		t.Fatalf("result = %+v", res)
	}
}

func TestDeadLettersCanBeListedAndReplayed(t *testing.T) {
	var fixed atomic.Bool
	fn := exec.Function{Name: "charge", SideEffects: true, Handler: exec.HandlerFunc(func(ctx context.Context, inv *exec.Invocation) ([]byte, error) {
		if !fixed.Load() {
			return nil, errors.New("card processor rejected the request")
		}
		return []byte("charged"), nil
	})}
	h := start(t, "team-a", exec.Options{}, fn)
	c := h.call("team-a", "charge", `{}`, time.Now().Add(time.Minute))
	if res := h.result(c, 10*time.Second); res.OK() {
		t.Fatal("first run should fail")
	}
	var dl []*protocol.DeadLetter
	testutil.WaitForWhat(t, 5*time.Second, "team-a's call to be dead-lettered", func() bool {
		var err error
		dl, err = exec.NewDeadLetters(h.js).List(context.Background(), "team-a")
		return err == nil && len(dl) == 1
	})
	if dl[0].Reason != protocol.ReasonPermanent || dl[0].Result.Error.Message != "card processor rejected the request" {
		t.Fatalf("dead letter = %+v", dl[0])
	}
	if other, _ := exec.NewDeadLetters(h.js).List(context.Background(), "team-b"); len(other) != 0 {
		t.Errorf("team-b sees %d of team-a's dead letters", len(other))
	}

	fixed.Store(true) // the operator fixed the card processor
	n, err := exec.NewDeadLetters(h.js).Replay(context.Background(), c.Key, time.Minute)
	if err != nil || n != 1 {
		t.Fatalf("Replay = %d, %v", n, err)
	}
	testutil.WaitForWhat(t, 10*time.Second, "the replayed call's second dead letter", func() bool {
		dl, _ = exec.NewDeadLetters(h.js).List(context.Background(), "team-a")
		return len(dl) == 2
	})
	if r := dl[1]; r.Replay != 1 || r.Reason != protocol.ReasonReplayed || !r.Result.OK() || r.Result.Output != "charged" {
		t.Errorf("replay record = %+v", r)
	}
	if _, err := exec.NewDeadLetters(h.js).Replay(context.Background(), protocol.NewTurnKey("agents", "x", nil).Call("y"), time.Minute); !errors.Is(err, exec.ErrNoDeadLetter) {
		t.Errorf("replaying an unknown key: %v", err)
	}
}

// When the result cannot be stored for a while (its stream is gone, as
// while a server fails over), the executor keeps the result it has and
// stores it once it can: the side effect happens once and succeeds.
func TestResultIsKeptUntilItCanBeStored(t *testing.T) {
	var effects atomic.Int32
	ran := make(chan struct{}, 1)
	fn := exec.Function{Name: "issue_refund", SideEffects: true,
		Handler: exec.HandlerFunc(func(context.Context, *exec.Invocation) ([]byte, error) {
			effects.Add(1)
			ran <- struct{}{}
			return []byte("refunded"), nil
		})}
	h := start(t, "team-a", exec.Options{AckWait: 3 * time.Second}, fn)
	ctx := context.Background()
	cfg := h.results.CachedInfo().Config
	if err := h.js.DeleteStream(ctx, protocol.ResultStream("team-a")); err != nil {
		t.Fatal(err)
	}
	c := h.call("team-a", "issue_refund", `{}`, time.Now().Add(time.Minute))
	<-ran
	ranAt := time.Now()
	// The outage outlasts AckWait: the delivery must be kept alive
	// meanwhile, or JetStream hands the call out again.
	testutil.WaitForWhat(t, 10*time.Second, "the call to stay unacknowledged past AckWait without a redelivery", func() bool {
		cons, err := h.js.Consumer(ctx, protocol.CallStream("team-a"), "issue_refund")
		if err != nil {
			return false
		}
		info := cons.CachedInfo()
		if info.NumRedelivered > 0 {
			t.Fatalf("the call was redelivered while its result waited to be stored")
		}
		return info.NumAckPending == 1 && time.Since(ranAt) > 4*time.Second
	})
	var err error
	if h.results, err = h.js.CreateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	res := h.result(c, 15*time.Second)
	if !res.OK() || res.Output != "refunded" {
		t.Fatalf("result = %+v, want the handler's output", res)
	}
	if n := effects.Load(); n != 1 {
		t.Fatalf("the side effect happened %d times", n)
	}
}
