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
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

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
	key := req.Key()
	if t, _, err := d.turns.get(ctx, key); err == nil {
		return t, nil
	} else if !errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, fmt.Errorf("dispatch: read turn %s: %w", key, err)
	}

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

	tctx := d.tel.startTurn(ctx, t)
	// Index the turn as open before recording it: the sweep then finds it
	// whatever step a crash interrupts (an index entry without a record is
	// dropped by the sweep).
	if _, err := d.open.Put(ctx, string(key), []byte(t.Deadline.Format(time.RFC3339Nano))); err != nil {
		return nil, fmt.Errorf("dispatch: index turn %s: %w", key, err)
	}
	if _, err := d.turns.create(ctx, t); errors.Is(err, errConflict) {
		d.tel.endTurn(key, StateCollecting, "") // another replica took it in
		existing, _, err := d.turns.get(ctx, key)
		return existing, err
	} else if err != nil {
		d.tel.endTurn(key, StateFailed, err.Error())
		return nil, fmt.Errorf("dispatch: record turn %s: %w", key, err)
	}
	ctx = tctx
	d.stage(StageTakenIn, key)
	channel := req.Channel
	if channel == "" {
		channel = "api"
	}
	d.tel.takenIn.Add(ctx, 1, metric.WithAttributes(attrPlatform.String(string(t.Ref.Platform)), attrChannel.String(channel)))
	d.gather.track(t)
	d.emit(Event{Kind: TurnStarted, Turn: t})
	d.log.InfoContext(tctx, "turn taken in", "turn", key, "platform", t.Ref.Platform, "scope", t.Scope, "calls", len(t.Calls),
		"deadline", t.Deadline, "channel", channel)

	if err := d.scheduleDeadline(ctx, t); err != nil {
		// The turn still completes when its results arrive; the resume
		// sweep re-arms the timer.
		d.log.Error("arming deadline failed", "turn", key, "err", err)
	}
	for k, cerr := range failures {
		c := t.call(k)
		d.recordFailure(ctx, t, c, cerr)
	}
	d.publishCalls(ctx, t, nil)
	d.stage(StagePublished, key)
	return t, nil
}

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
	c.Team = f.spec.Team
	if msg := f.validate(c.Arguments); msg != "" {
		return &protocol.CallError{Code: protocol.CodeInvalidArguments, Message: msg}
	}
	ok, err := d.served.served(ctx, c.Team, c.Name, d.opts.ServeGrace)
	if err != nil {
		d.log.Warn("cannot tell whether executors serve the function; publishing anyway", "fn", c.Name, "err", err)
		return nil
	}
	if !ok {
		return &protocol.CallError{Code: protocol.CodeUnavailable,
			Message: fmt.Sprintf("%s is unavailable: no executor is serving it right now. Continue without it, or try again later.", c.Name)}
	}
	return nil
}

// publishCalls publishes every call of t not rejected at intake and not in
// skip. Message IDs make a repeat (resume after a crash) a no-op on the
// server.
func (d *Dispatcher) publishCalls(ctx context.Context, t *Turn, skip map[protocol.CallKey]bool) {
	type pending struct {
		call    *TurnCall
		ack     jetstream.PubAckFuture
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
			select {
			case <-p.ack.Ok():
			case err := <-p.ack.Err():
				p.span.RecordError(err)
				p.span.SetStatus(codes.Error, "publish failed")
				d.publishFailed(ctx, t, p.call, err)
			case <-ctx.Done():
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
		ttl := time.Until(t.Deadline) + time.Minute
		f, err := d.js.PublishMsgAsync(msg, jetstream.WithMsgID(string(c.Key)), jetstream.WithMsgTTL(max(ttl, time.Second)))
		if err != nil {
			release()
			span.RecordError(err)
			span.SetStatus(codes.Error, "publish failed")
			span.End()
			d.publishFailed(ctx, t, c, err)
			continue
		}
		acks <- pending{c, f, release, span}
	}
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
	if err := recordResult(ctx, d.js, res); err != nil {
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

// recordResult publishes res so that the first result of a call wins.
func recordResult(ctx context.Context, js jetstream.JetStream, res *protocol.Result) error {
	data, err := protocol.EncodeResult(res)
	if err != nil {
		return err
	}
	m := nats.NewMsg(res.Subject())
	m.Data = data
	m.Header.Set(protocol.HeaderCallKey, string(res.Key))
	_, err = js.PublishMsg(ctx, m, jetstream.WithMsgID(string(res.Key)), jetstream.WithExpectLastSequencePerSubject(0))
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence {
		return nil // a result was recorded first
	}
	return err
}

func (d *Dispatcher) emit(e Event) {
	if d.opts.OnEvent != nil {
		d.opts.OnEvent(e)
	}
}
