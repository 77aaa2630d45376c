package dispatch

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/codes"

	"github.com/toolrelay/toolrelay/internal/backoff"
	"github.com/toolrelay/toolrelay/internal/crashpoint"
	"github.com/toolrelay/toolrelay/internal/otelconv"
	"github.com/toolrelay/toolrelay/pkg/dispatch/internal/lifecycle"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// turnEnv is the world of the dispatcher's lifecycle engine (package
// lifecycle, docs/turns.md): the turn bucket, the gatherer, the platforms
// and the other replicas. The engine decides; this does what it decides.
type turnEnv struct{ d *Dispatcher }

var _ lifecycle.Env = turnEnv{}

func (turnEnv) Now() time.Time { return time.Now() }

func (e turnEnv) Go(f func(context.Context)) { e.d.background(f) }

func (turnEnv) After(d time.Duration, f func()) func() bool { return time.AfterFunc(d, f).Stop }

func (turnEnv) Sleep(ctx context.Context, d time.Duration) bool { return backoff.Sleep(ctx, d) }

// rec is t, recorded at revision rev, as the engine reads it.
func rec(t *Turn, rev uint64) *lifecycle.Rec {
	r := &lifecycle.Rec{Key: string(t.Key), State: t.State, Lease: t.lease, Deadline: t.Deadline, Rev: rev, Body: t}
	if o := t.out; o != nil {
		r.CutOff, r.Error = o.CutOff, o.Error
		for _, k := range o.TimedOut {
			r.TimedOut = append(r.TimedOut, string(k))
		}
	}
	return r
}

func (e turnEnv) Cached(key string) *lifecycle.Rec {
	if t, rev := e.d.gather.cached(protocol.TurnKey(key)); t != nil {
		return rec(t, rev)
	}
	return nil
}

func (e turnEnv) Load(ctx context.Context, key string) (*lifecycle.Rec, error) {
	t, rev, err := e.d.turns.get(ctx, protocol.TurnKey(key))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, lifecycle.ErrNotFound
	}
	if err != nil {
		return nil, err
	}
	if t.Open() {
		// Whatever brought the engine here (a hand-over, a timer, a
		// cancellation), this replica now gathers for the turn: the
		// results that come next reach it.
		e.d.gather.track(t, rev)
	}
	e.d.gather.replace(t, rev)
	return rec(t, rev), nil
}

// Write stores r's lifecycle fields on the turn it was read with. A write
// of a process that is stopping (a release, an outcome) is made all the
// same, for a moment.
func (e turnEnv) Write(ctx context.Context, r *lifecycle.Rec) (uint64, error) {
	t := r.Body.(*Turn).clone()
	t.State, t.lease = r.State, r.Lease
	if r.CutOff || len(r.TimedOut) > 0 || r.Error != "" || r.State.Closed() || t.out != nil {
		o := t.writeOutcome()
		o.CutOff, o.Error = r.CutOff, r.Error
		o.TimedOut = o.TimedOut[:0:0]
		for _, k := range r.TimedOut {
			o.TimedOut = append(o.TimedOut, protocol.CallKey(k))
		}
		if len(o.TimedOut) == 0 {
			o.TimedOut = nil
		}
		if r.State.Closed() {
			o.SubmittedAt = time.Now().UTC()
			if sub, ok := r.Outcome.(*Submission); ok && sub != nil {
				o.Next = sub.Next
			}
		}
	}
	if ctx.Err() != nil {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
		defer cancel()
	}
	rev, err := e.d.turns.update(ctx, t, r.Rev)
	if errors.Is(err, errConflict) {
		return 0, lifecycle.ErrConflict
	}
	if err == nil {
		r.Body = t
		e.d.gather.replace(t, rev)
		if r.Lease.Owner == e.d.instance && r.State == TurnSubmitting && r.Lease.Epoch > 1 {
			e.d.tel.takenOver.Add(ctx, 1)
		}
	}
	return rev, err
}

// releaseTimeout bounds a write made while the dispatcher stops.
const releaseTimeout = 2 * time.Second

func (e turnEnv) Complete(ctx context.Context, r *lifecycle.Rec) (bool, error) {
	t := r.Body.(*Turn)
	if e.d.gather.completeHere(t.Key) {
		return true, nil
	}
	ctx, cancel := context.WithTimeout(ctx, recheckTimeout)
	defer cancel()
	present, err := e.d.gather.present(ctx, t)
	return present == len(t.Calls), err
}

func (e turnEnv) Missing(ctx context.Context, r *lifecycle.Rec) ([]string, error) {
	// Bounded: a request whose answer a server restart lost must not hold
	// the turn's events up until the shutdown.
	ctx, cancel := context.WithTimeout(ctx, recheckTimeout)
	defer cancel()
	t := r.Body.(*Turn)
	recorded, err := e.d.gather.recorded(ctx, t, nil)
	if err != nil {
		return nil, err // looked at again in a moment
	}
	var missing []string
	for i := range t.Calls {
		if c := &t.Calls[i]; e.d.gather.local(t.Key, c.Key) == nil && !recorded[c.Key] {
			missing = append(missing, string(c.Key))
		}
	}
	return missing, nil
}

// Prepare gathers the outputs a submission of the turn carries, once:
// the results seen here, and the others read from the streams.
func (e turnEnv) Prepare(ctx context.Context, r *lifecycle.Rec) error {
	d := e.d
	t := r.Body.(*Turn)
	st := d.gather.track(t, r.Rev)
	if d.gather.outputsOf(st) != nil {
		return nil
	}
	outputs, err := d.outputs(ctx, t)
	if err != nil {
		return prepareFailed(ctx, t, err, time.Now())
	}
	d.gather.keepOutputs(st, outputs)
	return nil
}

// prepareFailed is what gathering t's outputs failing with err at now
// means for the turn: cut off by the shutdown, or JetStream unavailable
// for longer than one read waits (a failover, an outage), it is tried
// again while the run has time left, as the results are recorded and
// failing the turn would throw its whole submission away; anything else
// fails it.
func prepareFailed(ctx context.Context, t *Turn, err error, now time.Time) error {
	if errors.Is(context.Cause(ctx), errShutdown) || errors.Is(err, ErrUnavailable) && t.ExpiresAt.Sub(now) > submitLeeway+minResultRead {
		return &lifecycle.RetryError{Wait: time.Second, Err: err}
	}
	return err
}

// Submit makes one attempt at submitting the turn's outputs to its
// platform. While the platform has not answered, keep is called every
// lifecycle.KeepEvery, and a lease lost stops the wait.
func (e turnEnv) Submit(ctx context.Context, r *lifecycle.Rec, keep func() bool) (any, error) {
	d := e.d
	t := r.Body.(*Turn)
	st := d.gather.track(t, r.Rev)
	outputs := d.gather.outputsOf(st)
	ctx, span := d.tel.tracer.Start(d.tel.turnContext(ctx, t), d.tel.submitNames.Get(string(t.Ref.Platform), ""), otelconv.ClientSpan...)
	defer span.End()
	if span.IsRecording() {
		span.SetAttributes(append(refAttrs(t.Ref), attrTurnKey.String(string(t.Key)), attrPlatform.String(string(t.Ref.Platform)),
			attrCalls.Int(len(t.Calls)), attrCutOff.Bool(r.CutOff), attrTimeLeft.Int64(time.Until(t.ExpiresAt).Milliseconds()))...)
	}
	p := d.platforms[t.Ref.Platform]
	if p == nil {
		return nil, fmt.Errorf("dispatch: no adapter for platform %q", t.Ref.Platform)
	}
	if st.submitting.tried > 0 || r.Lease.Epoch > 1 {
		ctx = WithRepeated(ctx)
	}
	st.submitting.tried++
	sub, err := attempt(ctx, p, t, outputs, keep)
	if err == nil {
		crashpoint.Reached(crashpoint.Submitted, e.d.opts.Name, string(t.Key))
		return sub, nil
	}
	span.RecordError(err)
	span.SetStatus(codes.Error, "submission failed")
	if errors.Is(context.Cause(ctx), errShutdown) || errors.Is(err, errLeaseLost) {
		// Cut off by the shutdown, or by another replica taking the turn:
		// the restart or that replica submits again with the same ids.
		return nil, &lifecycle.RetryError{Wait: time.Second, Err: err}
	}
	var pe *PlatformError
	if !errors.As(err, &pe) || !pe.Retryable {
		return nil, err
	}
	st.submitting.attempts++
	wait, ok := retryWait(time.Until(t.ExpiresAt), d.gather.nextBackoff(st), pe.RetryAfter)
	if !ok {
		return nil, fmt.Errorf("%w (gave up after %d attempts: the run expires before another)", err, st.submitting.attempts)
	}
	return nil, &lifecycle.RetryError{Wait: wait, Err: err}
}

// errLeaseLost ends an attempt whose turn another replica took over while
// the platform had not answered.
var errLeaseLost = errors.New("dispatch: another replica took the turn over while its platform had not answered")

// attempt makes one request to p, ended by the run's expiry and by its own
// timeout, keeping the turn's lease while it waits.
func attempt(ctx context.Context, p Platform, t *Turn, outputs []Output, keep func() bool) (*Submission, error) {
	actx, cancel := context.WithDeadline(ctx, earliest(t.ExpiresAt, time.Now().Add(submitAttemptTimeout)))
	defer cancel()
	type answer struct {
		sub *Submission
		err error
	}
	done := make(chan answer, 1)
	go func() {
		sub, err := p.Submit(actx, t, outputs)
		done <- answer{sub, err}
	}()
	tick := time.NewTimer(lifecycle.KeepEvery)
	defer tick.Stop()
	for {
		select {
		case a := <-done:
			return a.sub, a.err
		case <-tick.C:
			if !keep() {
				cancel()
				<-done
				return nil, errLeaseLost
			}
			tick.Reset(lifecycle.KeepEvery)
		}
	}
}

// Tell asks the replica owning a turn to look at it: another replica
// received a result of it, or its deadline. With no owner (a stopping
// replica released the turn), it asks whichever other replica hears first.
// A replica of a version before the lease ("old:...") is not told; it
// looks at the stream itself.
func (e turnEnv) Tell(owner, key string) {
	if strings.HasPrefix(owner, "old:") {
		return
	}
	subject := handoverSubject
	if owner != "" {
		subject = tellSubject(leaseInstance(owner))
	}
	if err := e.d.js.Conn().Publish(subject, []byte(key)); err != nil {
		e.d.log.Debug("telling another replica to look at a turn failed", "turn", key, "owner", owner, "err", err)
	}
	e.d.tel.passedOn.Add(context.Background(), 1)
}

// tellSubject is where the replica instance hears of turns it owns that
// another replica has news of.
func tellSubject(instance string) string { return replicaSubject(instance, "turns") }

// handoverSubject is where the replicas, as one queue group, hear of the
// turns a stopping replica released: one of them looks at each at once,
// rather than the sweep later.
const handoverSubject = "toolrelay.dispatcher.any.turns"

// serveTells hears of the turns this replica owns that another replica
// has news of: on its own subject, and, from a replica of the version
// before the lease (which reads this replica's leases as holds), as the
// call keys of results it received. stopHandovers stops hearing of the
// turns another replica released (before this one releases its own, so
// that they go to the others); stop stops the rest.
func (d *Dispatcher) serveTells() (stopHandovers, stop func(), err error) {
	heard := func(m *nats.Msg) {
		if key := protocol.TurnKey(m.Data); key.Validate() == nil {
			d.engine.Close(string(key))
		}
	}
	stopTells, err := d.hear(tellSubject(leaseInstance(d.instance)), "", heard)
	if err != nil {
		return nil, nil, err
	}
	stopOld, err := d.hear(replicaSubject(leaseInstance(d.instance), "results"), "", func(m *nats.Msg) {
		key := protocol.CallKey(m.Data)
		if key.Validate() != nil {
			return
		}
		d.gather.recheckSoon(key.Turn())
	})
	if err != nil {
		stopTells()
		return nil, nil, err
	}
	stopHandovers, err = d.hear(handoverSubject, queueGroup, heard)
	if err != nil {
		stopTells()
		stopOld()
		return nil, nil, err
	}
	return stopHandovers, func() { stopTells(); stopOld() }, nil
}

// Closed finishes, in this process, a turn the engine closed or found
// closed.
func (e turnEnv) Closed(r *lifecycle.Rec, here bool) {
	d := e.d
	t := r.Body.(*Turn)
	if !here {
		d.closedElsewhere(t.Key)
		return
	}
	outputs, submitted := d.gather.submittedOutputs(t.Key)
	d.closing.closed(t, outputs)
	if !submitted {
		d.finished(t, true) // cancelled: its caller tells the executors
		return
	}
	now := time.Now().UTC()
	ctx := d.tel.turnContext(context.Background(), t)
	d.tel.submitted(ctx, t, outputs, t.State, now)
	cutOff := t.Outcome().CutOff
	defer d.finished(t, cutOff)
	ev := Event{Kind: EventTurnSubmitted, Turn: t, Latency: now.Sub(t.CreatedAt), TimeLeft: t.ExpiresAt.Sub(now)}
	if t.State == TurnFailed {
		ev.Kind = EventTurnFailed
		d.log.ErrorContext(ctx, "submission failed", "turn", t.Key, "platform", t.Ref.Platform, "err", t.Outcome().Error)
	} else {
		d.log.InfoContext(ctx, "turn submitted", "turn", t.Key, "platform", t.Ref.Platform,
			"latency_ms", ev.Latency.Milliseconds(), "time_left_s", int64(ev.TimeLeft.Seconds()), "cut_off", cutOff)
	}
	d.emit(ev)
}

// queueGroup is the queue group the replicas share where one of them
// answers.
const queueGroup = "toolrelay-dispatchers"

// replicaSubject is the subject of one replica's (or process's) id and
// what it hears there; the id is free text (a host name has dots), so the
// subject carries a digest of it.
func replicaSubject(id, what string) string {
	return "toolrelay.dispatcher." + replicaDigest(id) + "." + what
}

// replicaDigest names a replica (or process) id in subjects and consumer
// names, which may not carry its dots.
func replicaDigest(id string) string {
	sum := sha256.Sum256([]byte(id))
	return hex.EncodeToString(sum[:12])
}

// hear subscribes handle to subject on the dispatcher's connection, in
// the queue group queue if not empty, and returns once the server has the
// subscription.
func (d *Dispatcher) hear(subject, queue string, handle nats.MsgHandler) (stop func(), err error) {
	nc := d.js.Conn()
	sub, err := nc.QueueSubscribe(subject, queue, handle)
	if err != nil {
		return nil, err
	}
	if err := nc.FlushTimeout(declareTimeout); err != nil {
		_ = sub.Unsubscribe()
		return nil, err
	}
	return func() { _ = sub.Unsubscribe() }, nil
}
