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

	"github.com/toolrelay/toolrelay/internal/jsretry"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// publishCalls publishes every call of t not rejected at intake and not in
// skip. Message IDs make a repeat (resume after a crash) a no-op on the
// server. checked, when not nil, holds in the order of t.Calls the digest
// of the schema each call's arguments were checked against at intake; a
// call published again without it is checked by its executor.
func (d *Dispatcher) publishCalls(ctx context.Context, t *Turn, skip map[protocol.CallKey]bool, checked []string) {
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
		var digest string
		if checked != nil {
			digest = checked[i]
		}
		msg, err := d.callMsg(t, c, digest)
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
	if !jsretry.MayPass(first) {
		return first // a full queue, a call too large: retrying cannot help
	}
	ctx, cancel := context.WithDeadline(ctx, t.Deadline)
	defer cancel()
	_, err := whileUnavailable(ctx, d.unavailableFor, func(ctx context.Context) (*jetstream.PubAck, error) {
		return d.js.PublishMsg(ctx, msg, callPubOpts(t, c)...)
	})
	return err
}

func (d *Dispatcher) callMsg(t *Turn, c *TurnCall, checked string) (*nats.Msg, error) {
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
	if checked != "" {
		m.Header.Set(protocol.HeaderSchema, checked)
	}
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
