package dispatch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/toolrelay/toolrelay/internal/firstwins"
	"github.com/toolrelay/toolrelay/internal/provision"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// Intake takes in a required action: it records the turn, arms its deadline
// and publishes one call per function call. Calls that cannot work (unknown
// function, arguments that are not JSON or break the schema) get a failed
// result at once and run nowhere.
//
// Intake is idempotent: the same required action seen again (another
// channel, another replica) returns the existing turn.
func (d *Dispatcher) Intake(ctx context.Context, req *TurnRequest) (*Turn, error) {
	if _, ok := d.platforms[req.Ref.Platform]; !ok {
		return nil, fmt.Errorf("dispatch: no adapter for platform %q", req.Ref.Platform)
	}
	if len(req.Calls) == 0 {
		return nil, errors.New("dispatch: a turn needs at least one call")
	}
	// No read first: the record's compare-and-set create tells a duplicate
	// (the same action from another channel or replica) apart, and saves a
	// round trip on every new turn.
	key := req.Key()
	now := time.Now()
	t := &Turn{
		Version: protocol.Version, Key: key, Ref: req.Ref, Scope: req.Scope, TurnID: req.TurnID,
		State: StateCollecting, CreatedAt: now.UTC(), ExpiresAt: req.ExpiresAt,
	}
	if t.ExpiresAt.IsZero() {
		t.ExpiresAt = now.Add(d.opts.RunTTL)
	}
	t.ExpiresAt = t.ExpiresAt.UTC()
	t.Deadline = t.ExpiresAt.Add(-d.margin(t.ExpiresAt.Sub(now)))

	// Resolve every call first: the record must say which team owns each.
	failures := map[protocol.CallKey]*protocol.CallError{}
	seen := map[string]bool{}
	for _, c := range req.Calls {
		tc := TurnCall{ID: c.ID, Name: c.Name, Key: key.Call(c.ID), Team: protocol.SystemTeam, Arguments: c.Arguments}
		if seen[c.ID] {
			return nil, fmt.Errorf("dispatch: call ID %q appears twice in one turn", c.ID)
		}
		seen[c.ID] = true
		if cerr := d.resolve(ctx, &tc); cerr != nil {
			failures[tc.Key] = cerr
			tc.Rejected = true
		}
		if !json.Valid(tc.Arguments) {
			tc.Arguments = mustJSONString(string(tc.Arguments))
		}
		t.Calls = append(t.Calls, tc)
	}

	tctx, span := d.tel.startTurn(ctx, t)
	rev, err := d.record(ctx, t)
	if errors.Is(err, errConflict) {
		span.SetAttributes(attrOutcome.String("duplicate"))
		span.End() // another channel or replica took it in
		existing, _, err := d.turns.get(ctx, key)
		return existing, err
	} else if err != nil {
		span.SetStatus(codes.Error, err.Error())
		span.End()
		return nil, fmt.Errorf("dispatch: record turn %s: %w", key, err)
	}
	d.tel.keepTurn(key, span)
	ctx = tctx
	d.stage(StageTakenIn, key)
	channel := req.Channel
	if channel == "" {
		channel = "api"
	}
	d.tel.takenIn.Add(ctx, 1, d.tel.sets.Get(attrPlatform.String(string(t.Ref.Platform)), attrChannel.String(channel)))
	d.gather.track(t, rev)
	d.emit(Event{Kind: TurnStarted, Turn: t})
	d.log.InfoContext(tctx, "turn taken in", "turn", key, "platform", t.Ref.Platform, "scope", t.Scope, "calls", len(t.Calls),
		"deadline", t.Deadline, "channel", channel)

	for k, cerr := range failures {
		c := t.call(k)
		d.recordFailure(ctx, t, c, cerr)
	}
	d.publishCalls(ctx, t, nil)
	d.stage(StagePublished, key)
	return t, nil
}

// record makes the turn durable: its deadline timer and its record (created
// by compare-and-set: errConflict if it exists) are published together, and
// the calls only go out once both are stored. The timer's subjects are also
// the index of open turns the sweep reads. It returns the record's
// revision.
func (d *Dispatcher) record(ctx context.Context, t *Turn) (uint64, error) {
	b, err := encodeTurn(t)
	if err != nil {
		return 0, err
	}
	sent := time.Now()
	timer, err := d.scheduleDeadlineAsync(t)
	if err != nil {
		return 0, err
	}
	rec, err := d.js.PublishAsync(kvSubject(provision.TurnBucket, string(t.Key)), b, jetstream.WithExpectLastSequencePerSubject(0))
	if err != nil {
		return 0, err
	}
	ack, err := awaitAck(ctx, rec, sent)
	if firstwins.Lost(err) {
		return 0, errConflict
	}
	if err != nil {
		return 0, err
	}
	if _, err := awaitAck(ctx, timer, sent); err != nil {
		// The record exists: try once more, synchronously. The turn still
		// completes when its results arrive, but without a timer it has no
		// deadline and the sweep does not see it.
		if err := d.scheduleDeadline(ctx, t); err != nil {
			d.log.ErrorContext(ctx, "arming deadline failed; the turn has no deadline", "turn", t.Key, "err", err)
		}
	}
	return ack.Sequence, nil
}

// unindex removes a closed turn's timer: it will not fire, and the turn
// leaves the index of open turns. Each timer subject gets a roll-up marker
// (which replaces the message on its subject, and so cancels a schedule)
// that itself expires a second later; the publishes are not awaited, and
// whatever they miss the sweep removes.
func (d *Dispatcher) unindex(key protocol.TurnKey, fired bool) {
	subjects := []string{timerScheduleSubject(key)}
	if fired {
		subjects = append(subjects, timerFireSubject(key))
	}
	for _, subj := range subjects {
		m := nats.NewMsg(subj)
		m.Header.Set(jetstream.MsgRollup, jetstream.MsgRollupSubject)
		if _, err := d.js.PublishMsgAsync(m, jetstream.WithMsgTTL(time.Second)); err != nil {
			d.log.Debug("removing a closed turn's timer failed; the sweep will", "turn", key, "err", err)
		}
	}
}

// kvSubject is where a KV bucket stores key (ADR-8): writing there is a KV
// put that can go out asynchronously, beside other writes.
func kvSubject(bucket, key string) string { return "$KV." + bucket + "." + key }

// margin is how long before expiry to submit, given the time left.
func (d *Dispatcher) margin(left time.Duration) time.Duration {
	return min(d.opts.SubmitMargin, max(left/4, 0))
}

// resolve finds the team of a call and validates its arguments; it returns
// the failure the model should see, or nil.
func (d *Dispatcher) resolve(ctx context.Context, c *TurnCall) *protocol.CallError {
	if err := protocol.ValidateFunctionName(c.Name); err != nil {
		return &protocol.CallError{Code: protocol.CodeUnknownFunction,
			Message: fmt.Sprintf("There is no function named %q. Use one of the functions you were given.", c.Name)}
	}
	f, err := d.registry.lookup(ctx, c.Name)
	if err != nil {
		return &protocol.CallError{Code: protocol.CodeUnavailable,
			Message: fmt.Sprintf("%s is unavailable right now. Try again later or continue without it.", c.Name)}
	}
	if f == nil {
		return &protocol.CallError{Code: protocol.CodeUnknownFunction,
			Message: fmt.Sprintf("There is no function named %q. Use one of the functions you were given.", c.Name)}
	}
	c.Team = f.team
	// Arguments are checked against what live executors declare; with none
	// alive there is nothing to run them, so wait a moment for one.
	if f = d.registry.awaitLive(ctx, f, d.opts.ServeGrace); len(f.live) == 0 {
		return notServed(c.Name)
	}
	if msg := f.validate(c.Arguments); msg != "" {
		return &protocol.CallError{Code: protocol.CodeInvalidArguments, Message: msg}
	}
	ok, err := d.served.served(ctx, c.Team, c.Name, d.opts.ServeGrace)
	if err != nil {
		d.log.Warn("cannot tell whether executors serve the function; publishing anyway", "fn", c.Name, "err", err)
		return nil
	}
	if !ok {
		return notServed(c.Name)
	}
	return nil
}

// notServed is the failure of a call to a function no executor serves.
func notServed(name string) *protocol.CallError {
	return &protocol.CallError{Code: protocol.CodeUnavailable,
		Message: fmt.Sprintf("%s is unavailable: no executor is serving it right now. Continue without it, or try again later.", name)}
}

// publishCalls publishes every call of t not rejected at intake and not in
// skip. Message IDs make a repeat (resume after a crash) a no-op on the
// server.
func (d *Dispatcher) publishCalls(ctx context.Context, t *Turn, skip map[protocol.CallKey]bool) {
	type pending struct {
		call    *TurnCall
		msg     *nats.Msg
		ack     jetstream.PubAckFuture
		sent    time.Time
		release func()
		span    trace.Span
	}
	ctx = d.tel.turnContext(ctx, t)
	// Acks are awaited beside the publishing loop, so slots come back as
	// acks arrive even while the loop waits for one.
	acks := make(chan pending, len(t.Calls))
	done := make(chan struct{})
	go func() {
		defer close(done)
		for p := range acks {
			if _, err := awaitAck(ctx, p.ack, p.sent); err != nil && ctx.Err() == nil {
				if err = d.republish(ctx, t, p.call, p.msg, err); err != nil {
					p.span.RecordError(err)
					p.span.SetStatus(codes.Error, "publish failed")
					d.publishFailed(ctx, t, p.call, err)
				}
			}
			p.span.End()
			p.release()
		}
	}()
	defer func() { close(acks); <-done }()
	for i := range t.Calls {
		c := &t.Calls[i]
		if c.Rejected || skip[c.Key] {
			continue
		}
		msg, err := d.callMsg(t, c)
		if err != nil {
			d.recordFailure(ctx, t, c, &protocol.CallError{Code: protocol.CodeInvalidArguments, Message: err.Error()})
			continue
		}
		release, err := d.limiter.acquire(ctx, c.Team)
		if err != nil {
			return // shutting down; the sweep re-publishes
		}
		span := d.tel.send(ctx, c, msg.Header, len(msg.Data))
		sent := time.Now()
		f, err := d.js.PublishMsgAsync(msg, callPubOpts(t, c)...)
		if err == nil {
			acks <- pending{c, msg, f, sent, release, span}
			continue
		}
		if err = d.republish(ctx, t, c, msg, err); err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, "publish failed")
			d.publishFailed(ctx, t, c, err)
		}
		span.End()
		release()
	}
}

func callPubOpts(t *Turn, c *TurnCall) []jetstream.PublishOpt {
	ttl := time.Until(t.Deadline) + time.Minute
	return []jetstream.PublishOpt{jetstream.WithMsgID(protocol.CallMsgID(c.Key)), jetstream.WithMsgTTL(max(ttl, time.Second))}
}

// republish retries a call whose publication failed, while the failure may
// pass (a stream leader being elected after a server went away, a timeout)
// and until the turn's deadline at the latest. The message ID makes a
// retry of a publish that did land a no-op. It returns nil once the call
// is stored.
func (d *Dispatcher) republish(ctx context.Context, t *Turn, c *TurnCall, msg *nats.Msg, first error) error {
	if !mayPass(first) {
		return first // a full queue, a call too large: retrying cannot help
	}
	ctx, cancel := context.WithDeadline(ctx, t.Deadline)
	defer cancel()
	_, err := whileUnavailable(ctx, d.unavailableFor, func(ctx context.Context) (*jetstream.PubAck, error) {
		return d.js.PublishMsg(ctx, msg, callPubOpts(t, c)...)
	})
	return err
}

func (d *Dispatcher) callMsg(t *Turn, c *TurnCall) (*nats.Msg, error) {
	call := &protocol.Call{
		Version: protocol.Version, Key: c.Key, Platform: t.Ref.Platform, Scope: t.Scope, CallID: c.ID,
		Team: c.Team, Function: c.Name, Arguments: c.Arguments, Deadline: t.Deadline, CreatedAt: t.CreatedAt,
	}
	data, err := protocol.EncodeCall(call)
	if err != nil {
		return nil, fmt.Errorf("The arguments for %s could not be sent (%v). Call it again with smaller arguments.", c.Name, err)
	}
	m := nats.NewMsg(call.Subject())
	m.Data = data
	m.Header.Set(protocol.HeaderCallKey, string(c.Key))
	m.Header.Set(protocol.HeaderDeadline, t.Deadline.Format(time.RFC3339Nano))
	m.Header.Set(protocol.HeaderFunction, c.Name)
	return m, nil
}

// publishFailed fails a call whose publication JetStream refused (no
// stream for the team, a full queue): the model learns at once.
func (d *Dispatcher) publishFailed(ctx context.Context, t *Turn, c *TurnCall, err error) {
	d.log.Error("publishing call failed", "turn", t.Key, "call_key", c.Key, "fn", c.Name, "err", err)
	msg := fmt.Sprintf("%s is unavailable right now (its queue did not accept the call). Try again later or continue without it.", c.Name)
	if errors.Is(err, jetstream.ErrNoStreamResponse) {
		msg = fmt.Sprintf("%s is unavailable: no executor serves it. Continue without it.", c.Name)
	}
	d.recordFailure(ctx, t, c, &protocol.CallError{Code: protocol.CodeUnavailable, Message: msg})
}

// recordFailure records a failed result for c, first-wins like any result.
func (d *Dispatcher) recordFailure(ctx context.Context, t *Turn, c *TurnCall, cerr *protocol.CallError) {
	res := &protocol.Result{
		Version: protocol.Version, Key: c.Key, CallID: c.ID, Team: c.Team, Function: safeName(c.Name),
		Error: cerr, Executor: "dispatcher/" + d.opts.Name, FinishedAt: time.Now().UTC(),
	}
	if err := firstwins.Record(ctx, d.js, res, nil); err != nil {
		// The deadline still closes the turn with a failure for this call.
		d.log.Error("recording failure result failed", "turn", t.Key, "call_key", c.Key, "err", err)
	}
}

// safeName keeps a result valid even for a call whose name is not a valid
// function name (the model made one up).
func safeName(name string) string {
	if protocol.ValidateFunctionName(name) == nil {
		return name
	}
	return "invalid_function_name"
}

func mustJSONString(s string) json.RawMessage {
	b, _ := json.Marshal(s)
	return b
}

func (d *Dispatcher) emit(e Event) {
	if d.opts.OnEvent != nil {
		d.opts.OnEvent(e)
	}
}
