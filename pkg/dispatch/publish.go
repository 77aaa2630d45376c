package dispatch

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/toolrelay/toolrelay/internal/jspub"
	"github.com/toolrelay/toolrelay/internal/jsretry"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// publishCalls publishes every call of t not rejected at intake and not in
// skip. Message IDs make a repeat (resume after a crash) a no-op on the
// server. checked, when not nil, holds in the order of t.Calls the digest
// of the schema each call's arguments were checked against at intake; a
// call published again without it is checked by its executor.
func (d *Dispatcher) publishCalls(ctx context.Context, t *Turn, skip map[protocol.CallKey]bool, checked []string) {
	ctx = d.tel.turnContext(ctx, t)
	// Publications go out without waiting, and their acknowledgements are
	// awaited once the turn's calls are out, in order. A call that finds
	// no free slot first settles this turn's own oldest publications,
	// which hold slots; the limiter is only waited on with none held, so
	// turns waiting for slots never hold each other's.
	var pending []pendingCall
	settleOldest := func() {
		d.settleCall(ctx, t, pending[0])
		pending = pending[1:]
	}
	defer func() {
		for len(pending) > 0 {
			settleOldest()
		}
	}()
	deadline := t.Deadline.Format(time.RFC3339Nano) // the same on each call
	for i := range t.Calls {
		c := &t.Calls[i]
		if !c.published() || skip[c.Key] {
			continue
		}
		var digest string
		if checked != nil {
			digest = checked[i]
		}
		held, ok := d.limiter.tryAcquire(c.Team)
		for !ok && len(pending) > 0 {
			settleOldest()
			held, ok = d.limiter.tryAcquire(c.Team)
		}
		if !ok {
			var err error
			if held, err = d.limiter.acquire(ctx, c.Team); err != nil {
				return // shutting down; the sweep re-publishes
			}
		}
		// Built once the slot is held: the server counts the call's TTL
		// from when it stores it, not from before a wait for a slot.
		msg, err := d.callMsg(t, c, deadline, digest)
		if err != nil {
			held.release()
			d.recordFailure(ctx, t, c, &protocol.CallError{Code: protocol.CodeInvalidArguments, Message: err.Error()})
			continue
		}
		p := pendingCall{call: c, msg: msg, slot: held, span: d.tel.send(ctx, c, msg.Header, len(msg.Data))}
		if p.ack, p.err = d.async.Publish(msg); p.err != nil {
			d.settleCall(ctx, t, p) // not sent: retried at once, in order
			continue
		}
		pending = append(pending, p)
	}
}

// pendingCall is a call's publication until its acknowledgement is in.
type pendingCall struct {
	call *TurnCall
	msg  *nats.Msg
	ack  *jspub.Future
	err  error // publishing failed before anything was sent
	slot *slot
	span trace.Span
}

// settleCall waits for p's acknowledgement, publishes p again while its
// failure may pass, fails the call if it cannot be stored, and gives its
// slot back.
func (d *Dispatcher) settleCall(ctx context.Context, t *Turn, p pendingCall) {
	defer p.slot.release()
	defer p.span.End()
	err := p.err
	if err == nil {
		if _, err = awaitAck(ctx, p.ack); err == nil || ctx.Err() != nil {
			return
		}
	}
	if err = d.republish(ctx, t, p.call, p.msg, err); err != nil {
		p.span.RecordError(err)
		p.span.SetStatus(codes.Error, "publish failed")
		d.publishFailed(ctx, t, p.call, err)
	}
}

// callTTL is how long a call is kept in its stream: past its turn's
// deadline by a minute, so a call that no executor took is not kept for
// ever.
func callTTL(t *Turn) time.Duration {
	return max(time.Until(t.Deadline)+time.Minute, time.Second)
}

// republish retries a call whose publication failed, while the failure may
// pass (a stream leader being elected after a server went away, a timeout)
// and until the turn's deadline at the latest. The message ID makes a
// retry of a publish that did land a no-op. It returns nil once the call
// is stored.
func (d *Dispatcher) republish(ctx context.Context, t *Turn, c *TurnCall, msg *nats.Msg, first error) error {
	if !jsretry.MayPass(first) {
		return first // a full queue, a call too large: retrying cannot help
	}
	ctx, cancel := context.WithDeadline(ctx, t.Deadline)
	defer cancel()
	_, err := whileUnavailable(ctx, d.unavailableFor, func(ctx context.Context) (*jetstream.PubAck, error) {
		return d.js.PublishMsg(ctx, msg) // its message ID and TTL are in its headers
	})
	return err
}

// callMsg builds c's message; deadline is t's, formatted for its header.
func (d *Dispatcher) callMsg(t *Turn, c *TurnCall, deadline, checked string) (*nats.Msg, error) {
	call := &protocol.Call{
		Version: protocol.Version, Key: c.Key, Platform: t.Ref.Platform, Scope: t.Scope, CallID: c.ID,
		Team: c.Team, Function: c.Name, Arguments: c.Arguments, Deadline: t.Deadline, CreatedAt: t.CreatedAt,
		Format: callFormat(c), KeepResultUntil: t.keepUntil(),
	}
	data, err := protocol.EncodeCall(call)
	if err != nil {
		return nil, fmt.Errorf("The arguments for %s could not be sent (%v). Call it again with smaller arguments.", c.Name, err)
	}
	// The message ID makes a repeat (resume after a crash, a retry) a
	// no-op on the server. Set as headers, not publish options: these are
	// on every call, and the options cost allocations of their own.
	kv := []string{
		protocol.HeaderCallKey, string(c.Key),
		protocol.HeaderDeadline, deadline,
		protocol.HeaderFunction, c.Name,
		jetstream.MsgIDHeader, protocol.CallMsgID(c.Key),
		jetstream.MsgTTLHeader, callTTL(t).String(),
		protocol.HeaderSchema, checked,
	}
	if checked == "" {
		kv = kv[:len(kv)-2]
	}
	return &nats.Msg{Subject: call.Subject(), Data: data, Header: jspub.SetHeaders(nil, kv...)}, nil
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

// callFormat is the Format of c's envelope: FormatText for a custom tool
// call, whose arguments are its raw input as a JSON string.
func callFormat(c *TurnCall) string {
	if c.Custom {
		return protocol.FormatText
	}
	return ""
}
