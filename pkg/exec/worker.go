package exec

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// worker serves one function: it pulls calls with a prefetch no larger than
// its free slots (so AckWait clocks do not run on buffered calls) and runs
// each under the call's deadline.
type worker struct {
	e       *Executor
	fn      *Function
	cons    jetstream.Consumer
	results jetstream.Stream
	handler Handler
	log     *slog.Logger
}

func (w *worker) serve(ctx, hctx context.Context) error {
	it, err := w.cons.Messages(jetstream.PullMaxMessages(w.fn.Concurrency))
	if err != nil {
		return fmt.Errorf("exec: consume %s: %w", w.fn.Name, err)
	}
	stop := context.AfterFunc(ctx, it.Drain)
	defer stop()

	slots := make(chan struct{}, w.fn.Concurrency)
	var running sync.WaitGroup
	defer running.Wait()
	for {
		// Take a slot before pulling, so a call is only fetched when it can
		// start. After shutdown began, Next returns what is still buffered
		// and then ErrMsgIteratorClosed.
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
		}
		msg, err := it.Next()
		if errors.Is(err, jetstream.ErrMsgIteratorClosed) {
			return nil
		}
		if ctx.Err() != nil {
			if err == nil {
				_ = msg.Nak() // let another replica have it now
			}
			continue
		}
		if err != nil {
			w.log.Warn("pull failed; retrying", "err", err)
			<-slots
			continue
		}
		running.Go(func() {
			defer func() { <-slots }()
			w.handle(hctx, msg)
		})
	}
}

func (w *worker) handle(ctx context.Context, msg jetstream.Msg) {
	attempt := 1
	if meta, err := msg.Metadata(); err == nil {
		attempt = int(meta.NumDelivered)
	}
	call, err := protocol.DecodeCall(msg.Data())
	if err == nil && (call.Team != w.e.team || call.Function != w.fn.Name) {
		err = fmt.Errorf("call for %s/%s arrived on %s", call.Team, call.Function, msg.Subject())
	}
	if err != nil {
		// Without a valid envelope there is no call to answer; the turn's
		// deadline fails it. Terminate so it is not redelivered forever.
		w.log.Error("dropping malformed call", "subject", msg.Subject(), "size", len(msg.Data()), "err", err)
		_ = msg.TermWithReason("malformed call envelope")
		return
	}
	log := w.log.With("call_key", call.Key, "call_id", call.CallID, "attempt", attempt)

	if attempt > 1 && w.resultRecorded(ctx, call) {
		log.Info("result already recorded; skipping redelivered call")
		_ = msg.Ack()
		return
	}
	now := time.Now()
	if !now.Before(call.Deadline) {
		res := protocol.NewFailure(call, protocol.CodeTimeout,
			fmt.Sprintf("%s was not started: its deadline passed while it waited to run. Try again later or with a simpler request.", call.Function), now)
		w.finish(ctx, msg, res, log)
		return
	}

	// The dispatcher validated the arguments; checking again means a call
	// published by anything else cannot feed a function bad input.
	if problem := w.fn.schema.Check(call.Arguments); problem != "" {
		log.Warn("refusing call with invalid arguments")
		w.finish(ctx, msg, protocol.NewFailure(call, protocol.CodeInvalidArguments, problem, now), log)
		return
	}
	res, cancelled := w.run(ctx, msg, call, attempt, log)
	if cancelled {
		// Shutdown cut the run short: hand the call to another replica.
		_ = msg.Nak()
		return
	}
	w.finish(ctx, msg, res, log)
}

// run runs the handler under the call's deadline with heartbeats, and turns
// whatever it returns (or a panic) into a result.
func (w *worker) run(ctx context.Context, msg jetstream.Msg, call *protocol.Call, attempt int, log *slog.Logger) (res *protocol.Result, cancelled bool) {
	deadline := call.Deadline
	if w.fn.Timeout > 0 {
		deadline = minTime(deadline, time.Now().Add(w.fn.Timeout))
	}
	rctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	inv := &Invocation{Function: call.Function, Arguments: call.Arguments, Call: call, Attempt: attempt}
	rctx = context.WithValue(rctx, invocationKey, inv)

	hb := time.NewTicker(w.e.opts.AckWait / 3)
	defer hb.Stop()
	type outcome struct {
		out []byte
		err error
	}
	done := make(chan outcome, 1)
	started := time.Now()
	go func() {
		defer func() {
			if p := recover(); p != nil {
				log.Error("handler panicked", "panic", p, "stack", string(debug.Stack()))
				done <- outcome{err: errPanic}
			}
		}()
		out, err := w.handler.Handle(rctx, inv)
		done <- outcome{out, err}
	}()
	// A handler that ignores its context is abandoned shortly after the
	// deadline, so the call still gets its timeout result.
	abandon := time.NewTimer(time.Until(deadline) + abandonGrace)
	defer abandon.Stop()
	var o outcome
wait:
	for {
		select {
		case o = <-done:
			break wait
		case <-hb.C:
			_ = msg.InProgress()
		case <-abandon.C:
			log.Error("handler ignored its context past the deadline; abandoning it", "grace", abandonGrace)
			o = outcome{err: context.DeadlineExceeded}
			break wait
		}
	}
	if errors.Is(context.Cause(ctx), ErrShutdown) {
		return nil, true
	}

	res = &protocol.Result{
		Version: protocol.Version, Key: call.Key, CallID: call.CallID,
		Team: call.Team, Function: call.Function,
		Executor: w.e.opts.Name, Attempt: attempt,
		StartedAt: started.UTC(), FinishedAt: time.Now().UTC(),
	}
	switch {
	case o.err != nil && errors.Is(rctx.Err(), context.DeadlineExceeded):
		res.Error = &protocol.CallError{Code: protocol.CodeTimeout,
			Message: fmt.Sprintf("%s timed out after %s. Try a narrower request, or continue without this result.", call.Function, time.Since(started).Round(time.Millisecond))}
	case errors.Is(o.err, errPanic):
		res.Error = &protocol.CallError{Code: protocol.CodeFunctionError,
			Message: fmt.Sprintf("%s failed with an internal error. Do not retry it with the same arguments.", call.Function)}
	case o.err != nil:
		msg := o.err.Error()
		if msg == "" || !utf8.ValidString(msg) {
			msg = call.Function + " failed."
		}
		res.Error = &protocol.CallError{Code: protocol.CodeFunctionError, Message: protocol.Truncate(msg, 4096)}
	case !utf8.Valid(o.out):
		res.Error = &protocol.CallError{Code: protocol.CodeFunctionError,
			Message: fmt.Sprintf("%s returned output that is not valid UTF-8.", call.Function)}
	default:
		res.Output = protocol.Truncate(string(o.out), protocol.MaxOutputSize)
	}
	return res, false
}

var errPanic = errors.New("exec: handler panicked")

// abandonGrace is how long a handler may run past its deadline before the
// executor stops waiting for it.
const abandonGrace = 2 * time.Second

// finish records the result (first result wins) and then acks the call. If
// the result cannot be recorded, the call is left for redelivery.
func (w *worker) finish(ctx context.Context, msg jetstream.Msg, res *protocol.Result, log *slog.Logger) {
	if err := recordResult(ctx, w.e.js, res); err != nil {
		log.Error("could not record result; call will be redelivered", "err", err)
		_ = msg.NakWithDelay(time.Second)
		return
	}
	if err := msg.Ack(); err != nil {
		// The result is recorded: a redelivery finds it and skips the call.
		log.Warn("ack failed after recording the result", "err", err)
	}
	if res.Error != nil {
		log.Info("call failed", "code", res.Error.Code)
	}
}

// recordResult publishes res so that the first result of a call wins: a
// second result is refused by the server (wrong last sequence), and a retried
// identical publish is deduplicated by its message ID.
func recordResult(ctx context.Context, js jetstream.JetStream, res *protocol.Result) error {
	data, err := protocol.EncodeResult(res)
	if err != nil {
		return err
	}
	m := &nats.Msg{Subject: res.Subject(), Data: data, Header: nats.Header{}}
	m.Header.Set(protocol.HeaderCallKey, string(res.Key))
	var last error
	for attempt := range 4 {
		if attempt > 0 {
			select {
			case <-time.After(time.Duration(attempt) * 200 * time.Millisecond):
			case <-ctx.Done():
				return errors.Join(last, ctx.Err())
			}
		}
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := js.PublishMsg(pctx, m, jetstream.WithMsgID(string(res.Key)), jetstream.WithExpectLastSequencePerSubject(0))
		cancel()
		if err == nil || isAlreadyRecorded(err) {
			return nil
		}
		last = err
	}
	return last
}

func isAlreadyRecorded(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence
}

func (w *worker) resultRecorded(ctx context.Context, call *protocol.Call) bool {
	_, err := w.results.GetLastMsgForSubject(ctx, call.ResultSubject())
	return err == nil
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
