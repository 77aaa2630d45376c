package exec

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/toolrelay/toolrelay/internal/backoff"
	"github.com/toolrelay/toolrelay/internal/firstwins"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// worker serves one function: it pulls calls with a prefetch no larger than
// its free slots (so AckWait clocks do not run on buffered calls) and runs
// each under the call's deadline.
type worker struct {
	e    *Executor
	fn   *Function
	cons jetstream.Consumer
	// apiPrefix reaches the control plane's JetStream API, where the
	// team's results are looked up.
	apiPrefix string
	attempts  attempts
	cancels   *cancels
	retry     RetryPolicy
	handler   Handler
	tel       *telemetry
	spanNames spanNames
	log       *slog.Logger
	// running holds the calls this process runs now, each closed when its
	// run ends: a redelivery of one of them waits instead of running it a
	// second time beside the first.
	runningMu sync.Mutex
	running   map[protocol.CallKey]chan struct{}
	// lastHealed is when the consumer was last recreated, and healRetry
	// spaces out recreations that follow one another (serve's alone).
	lastHealed time.Time
	healRetry  backoff.Backoff
}

// spanNames are the names of a worker's spans, built once.
type spanNames struct{ process, send string }

// claim records that this process runs key, returning the release that
// ends the claim, or the channel of the run already under way.
func (w *worker) claim(key protocol.CallKey) (release func(), busy <-chan struct{}) {
	w.runningMu.Lock()
	defer w.runningMu.Unlock()
	if ch, ok := w.running[key]; ok {
		return nil, ch
	}
	if w.running == nil {
		w.running = map[protocol.CallKey]chan struct{}{}
	}
	ch := make(chan struct{})
	w.running[key] = ch
	return func() {
		w.runningMu.Lock()
		delete(w.running, key)
		w.runningMu.Unlock()
		close(ch)
	}, nil
}

// awaitOwnRun settles a redelivery of a call this process is still running
// (it was stalled past its ack wait, say): it keeps the delivery alive
// until that run ends, then acknowledges it if the run recorded a result
// and hands it back otherwise, so the call is never run twice at once by
// one process.
func (w *worker) awaitOwnRun(ctx context.Context, d decision, busy <-chan struct{}) {
	d.log().Info("redelivered while this process still runs it; waiting for that run")
	tick := time.NewTicker(w.e.opts.AckWait / 3)
	defer tick.Stop()
	for {
		select {
		case <-busy:
			if w.resultRecorded(ctx, d.call) {
				_ = d.msg.Ack()
			} else {
				_ = d.msg.Nak()
			}
			return
		case <-tick.C:
			_ = d.msg.InProgress()
		case <-ctx.Done():
			return // shutting down: redelivered later
		}
	}
}

// serve runs the function's calls until ctx ends. A consumer that goes
// away under it (deleted, its stream recreated, a server started on a
// fresh store) is recreated (healConsumer) and serving goes on; serve
// returns an error only when it cannot go on at all (the connection
// closed), having reported it to failed at once: its running calls may
// take until Run cancels them to end.
func (w *worker) serve(ctx, hctx context.Context, failed func(error)) error {
	// A fixed pool of goroutines runs the calls: their stacks, grown once by
	// decoding and handling, are reused instead of regrown for every call.
	slots := make(chan struct{}, w.fn.Concurrency)
	work := make(chan jetstream.Msg)
	var running sync.WaitGroup
	for range w.fn.Concurrency {
		running.Go(func() {
			for msg := range work {
				w.handle(hctx, msg)
				<-slots
			}
		})
	}
	defer running.Wait()
	defer close(work)
	for {
		err := w.consume(ctx, slots, work)
		var lost *consumerLostError
		if !errors.As(err, &lost) {
			if err != nil {
				failed(err)
			}
			return err
		}
		if !w.healConsumer(ctx, lost) {
			return nil // stopped while healing
		}
	}
}

// consume pulls calls from the consumer into work until ctx ends (nil),
// the consumer is gone (a *consumerLostError) or the connection closed.
func (w *worker) consume(ctx context.Context, slots chan struct{}, work chan<- jetstream.Msg) error {
	// Short pull expiry: heartbeats every 2.5s, so a pull lost with a server
	// (failover) is noticed and re-issued within seconds.
	it, err := w.cons.Messages(jetstream.PullMaxMessages(w.fn.Concurrency), jetstream.PullExpiry(5*time.Second))
	if err != nil {
		if gone := w.consumerGone(ctx, err); gone != nil {
			return gone
		}
		return fmt.Errorf("exec: consume %s: %w", w.fn.Name, err)
	}
	stop := context.AfterFunc(ctx, it.Drain)
	defer stop()
	// Drain lets Next hand out what is buffered, each handed back at once.
	// Without a connection the drain never completes, so every Next runs
	// under nexts, which ends drainWait after ctx: the iterator is then
	// stopped, and what it still held is redelivered after its ack wait.
	nexts, endNexts := context.WithCancel(context.WithoutCancel(ctx))
	defer endNexts()
	stopGrace := context.AfterFunc(ctx, func() {
		t := time.NewTimer(drainWait)
		defer t.Stop()
		select {
		case <-t.C:
			endNexts()
		case <-nexts.Done():
		}
	})
	defer stopGrace()

	// A connection closed while every slot is busy is noticed at once,
	// not when a running call ends.
	nc := w.e.js.Conn()
	closed := nc.StatusChanged(nats.CLOSED)
	defer nc.RemoveStatusListener(closed)

	var lastErr error // the pull error before the iterator closed, if any
	for {
		// Take a slot before pulling, so a call is only fetched when it can
		// start. After shutdown began, Next returns what is still buffered
		// and then ErrMsgIteratorClosed.
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
		case <-closed:
			it.Stop()
			if ctx.Err() != nil {
				return nil // stopping anyway
			}
			return fmt.Errorf("exec: consuming %s stopped: %w", w.fn.Name, nats.ErrConnectionClosed)
		}
		msg, err := it.Next(jetstream.NextContext(nexts))
		if nexts.Err() != nil && errors.Is(err, context.Canceled) {
			w.log.Warn("consumer not drained in time (is NATS away?); its buffered calls are redelivered after their ack wait",
				"fn", w.fn.Name, "after", drainWait.String())
			it.Stop()
			return nil
		}
		if errors.Is(err, jetstream.ErrMsgIteratorClosed) {
			if ctx.Err() != nil {
				return nil
			}
			<-slots
			if errors.Is(err, jetstream.ErrConnectionClosed) {
				return fmt.Errorf("exec: consuming %s stopped: %w", w.fn.Name, errors.Join(lastErr, err))
			}
			// Closed by the server's word (the consumer deleted, a pull
			// it refused): start over with the consumer as it is now.
			return &consumerLostError{cause: errors.Join(lastErr, err)}
		}
		if ctx.Err() != nil {
			if err == nil {
				_ = msg.Nak() // let another replica have it now
			}
			continue
		}
		if err != nil {
			<-slots
			lastErr = err
			if mayBeGone(err) {
				// A pull answered by nobody, or heartbeats that stopped:
				// the consumer (or its stream) may be gone for good, as
				// after a server started on a fresh store.
				if gone := w.consumerGone(ctx, err); gone != nil {
					it.Stop()
					return gone
				}
			}
			w.log.Warn("pull failed; retrying", "err", err)
			continue
		}
		work <- msg
	}
}

// drainWait bounds how long a stopping worker waits for its consumer to
// drain: a round trip to the server when it is there.
const drainWait = time.Second

// staleCall is how long a call may wait in the queue before a delivery of
// it, even a first one, checks that its result is not recorded already.
const staleCall = time.Second

// crashAllowance is how many deliveries beyond MaxAttempts a call gets for
// executors that died mid-run (those attempts end in no result at all).
const crashAllowance = 2

// handle carries one delivery from decoding to its ack, nak or term. Its
// checks run in an order that matters (a recorded result, a cancelled
// run, the deadline, the schema, side-effect marks, then the handler), so
// they stay in one function; what each step decides lives in precheck,
// guardSideEffects, retryIn and the decision type.
func (w *worker) handle(ctx context.Context, msg jetstream.Msg) {
	attempt := 1
	var stored time.Time
	if meta, err := msg.Metadata(); err == nil {
		attempt, stored = int(meta.NumDelivered), meta.Timestamp
	}
	var replay int
	if h := msg.Headers().Get(protocol.HeaderReplay); h != "" {
		replay, _ = strconv.Atoi(h)
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
	ctx, span := w.tel.process(ctx, w.spanNames.process, msg.Subject(), w.fn.Name, msg.Headers(), call, attempt, w.e.opts.Name)
	defer span.End()
	if attempt > 1 {
		w.tel.redeliveries.Add(ctx, 1, metric.WithAttributes(attrFunction.String(call.Function)))
	}
	log := w.logFor(call, attempt, replay)
	d := decision{w: w, msg: msg, call: call, attempt: attempt, replay: replay, log: log, span: span}

	// A redelivery, or a call that waited in the queue a while, may have
	// its result already: run before its consumer was recreated (which
	// delivers it again as a first attempt), or failed by a dispatcher as
	// unavailable while no executor served the function.
	if replay == 0 && (attempt > 1 || time.Since(stored) > staleCall) && w.resultRecorded(ctx, call) {
		log().Info("result already recorded; skipping the call")
		_ = msg.Ack()
		return
	}
	release, busy := w.claim(call.Key)
	if busy != nil {
		w.awaitOwnRun(ctx, d, busy)
		return
	}
	defer release()
	now := time.Now()
	if why, ok := w.cancels.cancelled(call.Key.Turn()); ok && replay == 0 {
		d.finish(ctx, protocol.NewFailure(call, protocol.CodeUnavailable,
			fmt.Sprintf("%s was not run: it was cancelled before it started (%s).", call.Function, why), now), "")
		return
	}
	if res, reason := w.fn.precheck(call, msg.Headers().Get(protocol.HeaderSchema), attempt, w.retry, now); res != nil {
		if res.Error.Code == protocol.CodeInvalidArguments {
			log().Warn("refusing call with invalid arguments")
		}
		d.finish(ctx, res, reason)
		return
	}

	if w.fn.SideEffects && replay == 0 && !w.guardSideEffects(ctx, d, now) {
		return
	}

	cctx, untrack := w.cancels.track(ctx, call.Key)
	o := invoke(cctx, w.handler, call, attempt, w.fn.Timeout, w.e.opts.AckWait/3, func() { _ = msg.InProgress() }, w.e.opts.Name, log)
	cancelledByPlatform := errors.Is(context.Cause(cctx), ErrCallCancelled)
	untrack()
	if cancelledByPlatform && !o.cancelled {
		why, _ := w.cancels.cancelled(call.Key.Turn())
		log().Info("the call was cancelled", "reason", why)
		o.res.Error = &protocol.CallError{Code: protocol.CodeUnavailable,
			Message: fmt.Sprintf("%s was cancelled: %s.", call.Function, why)}
		o.res.Output, o.retry, o.panicked = "", false, false
		d.finish(ctx, o.res, "")
		return
	}
	if o.cancelled {
		// Shutdown cut the run short: hand the call to another replica. A
		// side-effect function's mark stays "running", so the next attempt
		// reconciles instead of re-running it.
		_ = msg.Nak()
		return
	}
	if delay, ok := w.retry.retryIn(o, attempt, call.Deadline); ok && replay == 0 {
		if w.fn.SideEffects {
			if err := w.attempts.mark(ctx, call.Key, attemptRetryable, attempt, w.e.opts.Name); err != nil {
				log().Warn("cannot record the failed attempt", "err", err)
			}
		}
		log().Info("retryable error; retrying", "delay", delay.String(), "err", o.err)
		_ = msg.NakWithDelay(delay)
		return
	}
	d.conclude(ctx, o)
}

// guardSideEffects keeps a side-effect function from running twice for one
// call: an earlier attempt that may have run goes to Reconcile, or fails the
// call. It reports whether the handler should run now; when not, it has
// dealt with the delivery.
func (w *worker) guardSideEffects(ctx context.Context, d decision, now time.Time) bool {
	may, rev, err := w.attempts.mayHaveRun(ctx, d.call.Key)
	if err != nil {
		d.log().Warn("cannot tell whether an earlier attempt ran; retrying later", "err", err)
		_ = d.msg.NakWithDelay(time.Second)
		return false
	}
	if may {
		if w.fn.Reconcile == nil {
			d.log().Warn("an earlier attempt may have run; not re-running a side-effect function")
			d.finish(ctx, mayHaveRunFailure(d.call, now), protocol.ReasonMayHaveRun)
			return false
		}
		o := invoke(ctx, w.fn.Reconcile, d.call, d.attempt, w.fn.Timeout, w.e.opts.AckWait/3, func() { _ = d.msg.InProgress() }, w.e.opts.Name, d.log)
		if o.cancelled {
			_ = d.msg.Nak()
			return false
		}
		if !errors.Is(o.err, ErrDidNotRun) {
			d.log().Info("reconciled an attempt that may have run", "ok", o.res.OK())
			d.conclude(ctx, o)
			return false
		}
		d.log().Info("reconcile found no effect; running the call")
	}
	if err := w.attempts.start(ctx, d.call.Key, rev, d.attempt, w.e.opts.Name); errors.Is(err, errAttemptRaced) {
		// The other attempt runs the call and answers it; this delivery is
		// stale (it outlived its ack wait), so leave it unacknowledged:
		// should the other attempt die too, the next delivery finds its
		// mark and does not run the call blindly.
		d.log().Warn("another attempt of this call started meanwhile; leaving the call to it")
		return false
	} else if err != nil {
		d.log().Warn("cannot record the attempt; retrying later", "err", err)
		_ = d.msg.NakWithDelay(time.Second)
		return false
	}
	return true
}

// logger returns the logger of one delivery, made when something is to be
// logged: formatting a call's attributes costs more than the rest of a
// no-op call's bookkeeping, and most deliveries log nothing.
type logger func() *slog.Logger

// logFor returns the logger of a delivery of call.
func (w *worker) logFor(call *protocol.Call, attempt, replay int) logger {
	return func() *slog.Logger {
		log := w.log.With("call_key", call.Key, "call_id", call.CallID, "attempt", attempt)
		if replay > 0 {
			log = log.With("replay", replay)
		}
		return log
	}
}

// decision carries one delivery to its end.
type decision struct {
	w       *worker
	msg     jetstream.Msg
	call    *protocol.Call
	attempt int
	replay  int
	log     logger
	span    trace.Span
}

// conclude records a run's final outcome, with a dead letter when it
// failed for good.
func (d decision) conclude(ctx context.Context, o outcome) {
	reason := o.deadLetterReason()
	d.finish(ctx, o.res, reason)
}

// finish records the result (first result wins), after the dead letter
// when there is one, and then acks the call. If either cannot be recorded,
// the call is left for redelivery. A replay's outcome goes to the dead
// letters only: its turn is long closed.
func (d decision) finish(ctx context.Context, res *protocol.Result, reason string) {
	js := d.w.e.js
	if d.replay > 0 {
		if err := d.persist(ctx, func(ctx context.Context) error {
			return deadLetter(ctx, js, d.call, res, protocol.ReasonReplayed, d.attempt, d.replay, d.w.e.opts.Name)
		}); err != nil {
			d.log().Error("could not record the replay's outcome; it will be redelivered", "err", err)
			_ = d.msg.NakWithDelay(time.Second)
			return
		}
		_ = d.msg.Ack()
		return
	}
	if reason != "" {
		if err := d.persist(ctx, func(ctx context.Context) error {
			return deadLetter(ctx, js, d.call, res, reason, d.attempt, 0, d.w.e.opts.Name)
		}); err != nil {
			d.log().ErrorContext(ctx, "could not record the dead letter; call will be redelivered", "err", err)
			_ = d.msg.NakWithDelay(time.Second)
			return
		}
		d.w.tel.deadLetters.Add(ctx, 1, metric.WithAttributes(attrFunction.String(d.call.Function), attrReason.String(reason)))
		d.span.AddEvent("dead letter", trace.WithAttributes(attrReason.String(reason)))
	}
	if res.Error != nil {
		d.span.SetStatus(codes.Error, string(res.Error.Code))
	}
	if d.span.IsRecording() {
		d.span.SetAttributes(attrOutcome.String(outcomeOf(res)))
	}
	header := nats.Header{}
	send := d.w.tel.send(ctx, d.w.spanNames.send, res, header)
	err := d.persist(ctx, func(ctx context.Context) error {
		return firstwins.Record(ctx, js.Conn(), res, header, d.call.ResultTTL(time.Now()))
	})
	send.End()
	if err != nil {
		d.log().Error("could not record result; call will be redelivered", "err", err)
		_ = d.msg.NakWithDelay(time.Second)
		return
	}
	if err := d.msg.Ack(); err != nil {
		// The result is recorded: a redelivery finds it and skips the call.
		d.log().Warn("ack failed after recording the result", "err", err)
	}
	if res.Error != nil {
		d.log().Info("call failed", "code", res.Error.Code, "dead_letter", reason)
	}
}

// persistFor is how long a publication of an outcome is retried at least,
// even past the call's deadline (a late result is still worth recording).
const persistFor = 30 * time.Second

// persist runs publish until it succeeds, retrying with backoff until the
// call's deadline (and for at least persistFor) and keeping the delivery
// alive meanwhile. An outcome in hand is not thrown away because a server
// is failing over: dropping it would mean running the handler again, and a
// side-effect function would then fail as "may have run".
func (d decision) persist(ctx context.Context, publish func(context.Context) error) error {
	ackWait := d.w.e.opts.AckWait
	giveUp := time.Now().Add(persistFor)
	if d.call.Deadline.After(giveUp) {
		giveUp = d.call.Deadline
	}
	retry := backoff.Backoff{Initial: 100 * time.Millisecond, Max: min(2*time.Second, ackWait/3)}
	for {
		wait := retry.Next()
		pctx, cancel := context.WithTimeout(ctx, min(5*time.Second, ackWait/3))
		err := publish(pctx)
		cancel()
		if err == nil || errors.Is(err, protocol.ErrMalformed) || errors.Is(err, nats.ErrConnectionClosed) ||
			ctx.Err() != nil || time.Now().Add(wait).After(giveUp) {
			return err
		}
		d.log().Warn("recording the outcome failed; retrying", "err", err, "in", wait.String())
		_ = d.msg.InProgress() // each try takes under AckWait/3
		if !backoff.Sleep(ctx, wait) {
			return errors.Join(err, ctx.Err())
		}
	}
}

func outcomeOf(res *protocol.Result) string {
	if res.Error != nil {
		return string(res.Error.Code)
	}
	return "ok"
}

// resultRecorded reports whether the call's result is recorded already. A
// lookup that fails counts as not recorded: the call runs (or, for a side
// effect, its attempt mark decides).
func (w *worker) resultRecorded(ctx context.Context, call *protocol.Call) bool {
	ok, err := firstwins.Recorded(ctx, w.e.js.Conn(), w.apiPrefix, call.Team, call.Key)
	if err != nil {
		w.log.WarnContext(ctx, "cannot tell whether the call's result is recorded; running it", "call", call.Key, "err", err)
	}
	return ok
}
