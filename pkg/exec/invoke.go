package exec

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"time"
	"unicode/utf8"

	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// outcome is what one run of a handler came to.
type outcome struct {
	res *protocol.Result
	// retry: the handler returned a retryable error.
	retry bool
	// refused: the handler refused the call (ErrRefused); never retried.
	refused bool
	// panicked: the handler panicked (res says so, without the value).
	panicked bool
	// cancelled: shutdown cut the run short; there is no result.
	cancelled bool
	err       error
}

// abandonGrace is how long a handler may run past its deadline before the
// executor stops waiting for it.
const abandonGrace = 2 * time.Second

// invoke runs h for call under the call's deadline (and timeout), calling
// heartbeat periodically, and turns whatever it returns, or a panic, into a
// result. It is the one place where a handler runs.
//
// It is longer than most functions here on purpose: the run, its
// heartbeat, the abandon timer and the mapping of what came back to a
// result are one sequence whose order matters (the shutdown check must
// come before any result is built), and reads best in one piece.
func invoke(ctx context.Context, h Handler, call *protocol.Call, attempt int, timeout time.Duration,
	every time.Duration, heartbeat func(), executor string, log logger) outcome {
	deadline := call.Deadline
	if timeout > 0 {
		deadline = minTime(deadline, time.Now().Add(timeout))
	}
	rctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	inv := &Invocation{Call: call, Attempt: attempt}
	rctx = context.WithValue(rctx, invocationKey, inv)

	type ret struct {
		out      []byte
		err      error
		panicked bool
	}
	done := make(chan ret, 1)
	started := time.Now()
	go func() {
		defer func() {
			if p := recover(); p != nil {
				log().Error("handler panicked", "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
				done <- ret{panicked: true}
			}
		}()
		out, err := h.Handle(rctx, inv)
		done <- ret{out: out, err: err}
	}()
	// One timer, for whichever comes first: the next heartbeat, or the
	// abandoning of a handler that ignores its context (shortly after the
	// deadline, so the call still gets its timeout result).
	abandonAt := time.Now().Add(time.Until(deadline) + abandonGrace) // monotonic: a clock step moves nothing
	next := func() time.Duration {
		left := time.Until(abandonAt)
		if heartbeat != nil && every > 0 {
			return min(every, left)
		}
		return left
	}
	timer := time.NewTimer(next())
	defer timer.Stop()
	var r ret
wait:
	for {
		select {
		case r = <-done:
			break wait
		case <-timer.C:
			if !time.Now().Before(abandonAt) {
				log().Error("handler ignored its context past the deadline; abandoning it", "grace", abandonGrace.String())
				r = ret{err: context.DeadlineExceeded}
				break wait
			}
			if heartbeat != nil {
				heartbeat()
			}
			timer.Reset(next())
		}
	}
	if errors.Is(context.Cause(ctx), ErrShutdown) {
		return outcome{cancelled: true}
	}

	res := &protocol.Result{
		Version: protocol.Version, Key: call.Key, CallID: call.CallID, Team: call.Team, Function: call.Function,
		Executor: executor, Attempt: attempt, StartedAt: started.UTC(), FinishedAt: time.Now().UTC(),
	}
	o := outcome{res: res, err: r.err}
	fail := func(code protocol.ErrorCode, msg string) {
		res.Error = &protocol.CallError{Code: code, Message: protocol.Truncate(msg, 4096)}
	}
	switch {
	case r.panicked:
		o.panicked = true
		fail(protocol.CodeFunctionError, fmt.Sprintf("%s failed with an internal error. Do not call it again with the same arguments.", call.Function))
	case r.err != nil && errors.Is(rctx.Err(), context.DeadlineExceeded):
		fail(protocol.CodeTimeout, fmt.Sprintf("%s timed out after %s. Try a narrower request, or continue without this result.",
			call.Function, time.Since(started).Round(time.Millisecond)))
	case r.err != nil && errors.Is(r.err, ErrInvalidArguments) && !errors.Is(r.err, ErrRefused):
		fail(protocol.CodeInvalidArguments, r.err.Error())
	case r.err != nil:
		msg := r.err.Error()
		if msg == "" || !utf8.ValidString(msg) {
			msg = call.Function + " failed."
		}
		o.refused = errors.Is(r.err, ErrRefused)
		o.retry = !o.refused && errors.Is(r.err, ErrRetryable)
		fail(protocol.CodeFunctionError, msg)
	case !utf8.Valid(r.out):
		fail(protocol.CodeFunctionError, fmt.Sprintf("%s returned output that is not valid UTF-8.", call.Function))
	default:
		res.Output = protocol.Truncate(string(r.out), protocol.MaxOutputSize)
	}
	return o
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// precheck returns the failure of a call that must not run — its deadline
// passed, its arguments break the schema, or its executors died running it
// too often — with the dead-letter reason it carries, or nil. The worker and
// package exectest both ask it, so a test sees the executor's rules.
//
// checked is the call's protocol.HeaderSchema: the digest of the schema the
// dispatcher checked the arguments against.
func (f *Function) precheck(call *protocol.Call, checked string, attempt int, retry RetryPolicy, now time.Time) (*protocol.Result, string) {
	if !now.Before(call.Deadline) {
		return protocol.NewFailure(call, protocol.CodeTimeout,
			fmt.Sprintf("%s was not started: its deadline passed while it waited to run. Try again later or with a simpler request.", call.Function), now), ""
	}
	// The dispatcher validated the arguments. Unless it says it did so
	// against this very schema, they are checked again: a call published
	// by anything else, or checked against another version's schema while
	// two run side by side, cannot feed the function bad input. (Only the
	// dispatchers and the team itself may publish its calls, so a forged
	// header fools no one but its author.)
	if checked != f.schema.Digest() {
		if problem := f.schema.Check(call.Arguments); problem != "" {
			return protocol.NewFailure(call, protocol.CodeInvalidArguments, problem, now), ""
		}
	}
	if attempt > retry.MaxAttempts+crashAllowance {
		return protocol.NewFailure(call, protocol.CodeUnavailable,
				fmt.Sprintf("%s could not be completed: its executors stopped %d times while running it. Continue without it.", call.Function, attempt-1), now),
			protocol.ReasonUndelivered
	}
	return nil, ""
}

// mayHaveRunFailure is the result of a side-effect call whose earlier
// attempt may have run, when the function has no Reconcile hook.
func mayHaveRunFailure(call *protocol.Call, now time.Time) *protocol.Result {
	return protocol.NewFailure(call, protocol.CodeUnavailable,
		fmt.Sprintf("%s may have run already (an earlier attempt was interrupted) and was not retried, to avoid doing it twice. Check whether its effect happened before calling it again.", call.Function), now)
}

// retryIn reports whether the worker runs the call again after o, and
// after how long: o is retryable, attempts remain and the deadline leaves
// room for the backoff.
func (p RetryPolicy) retryIn(o outcome, attempt int, deadline time.Time) (time.Duration, bool) {
	if !o.retry || attempt >= p.MaxAttempts {
		return 0, false
	}
	delay := p.backoff(attempt)
	return delay, time.Until(deadline) > delay+time.Second
}

// deadLetterReason is why a final outcome leaves a dead letter, or "" when
// it leaves none.
func (o outcome) deadLetterReason() string {
	switch {
	case o.panicked:
		return protocol.ReasonPanic
	case o.retry:
		return protocol.ReasonExhausted
	case o.refused:
		// An expected refusal: the model is told, no operator needs to be.
		return ""
	case o.res.Error != nil && o.res.Error.Code == protocol.CodeFunctionError:
		return protocol.ReasonPermanent
	}
	return ""
}
