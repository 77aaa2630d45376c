package kit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// The kit's side of the wire: what a dispatcher publishes, and reading
// back what the executor records, by the forms docs/protocol.md gives.

// callOpts vary a call from the plain one.
type callOpts struct {
	schema      string        // Toolrelay-Schema header
	traceparent string        // traceparent header
	deadline    time.Duration // from now; default 30s (negative: passed)
	keepless    bool          // no keep_result_until, as older dispatchers send
}

// keepAfterDeadline is how long past its deadline the kit's calls ask
// their results kept (keep_result_until), as a dispatcher asks for ten
// minutes past its run's expiry.
const keepAfterDeadline = 10 * time.Minute

// newCall returns a call of fn in a turn of its own.
func (k *kit) newCall(fn, args string, o callOpts) *protocol.Call {
	if o.deadline == 0 {
		o.deadline = 30 * time.Second
	}
	turn := protocol.NewTurnKey(protocol.PlatformMCP, "mcp/conformance-"+uuid.NewString(), []string{"call_1"})
	now := time.Now().UTC()
	c := &protocol.Call{
		Version: protocol.Version, Key: turn.Call("call_1"), Platform: protocol.PlatformMCP,
		Scope: "mcp/conformance", CallID: "call_1", Team: k.team, Function: fn,
		Arguments: json.RawMessage(args), Deadline: now.Add(o.deadline), CreatedAt: now,
	}
	if !o.keepless {
		c.KeepResultUntil = c.Deadline.Add(keepAfterDeadline)
	}
	return c
}

// resultTTL checks the Nats-TTL of c's result, recorded between sent and
// seen: what protocol.Call.ResultTTL gives at some moment between them,
// or none when c names no keep_result_until.
func resultTTL(c *protocol.Call, h nats.Header, sent, seen time.Time) string {
	got := h.Get(jetstream.MsgTTLHeader)
	if c.KeepResultUntil.IsZero() {
		if got != "" {
			return fmt.Sprintf("expected no %s on the result of a call without keep_result_until, saw %q", jetstream.MsgTTLHeader, got)
		}
		return ""
	}
	ttl, err := time.ParseDuration(got)
	if err != nil {
		if n, nerr := strconv.ParseInt(got, 10, 64); nerr == nil {
			ttl, err = time.Duration(n)*time.Second, nil // a bare number counts seconds
		}
	}
	lo, hi := c.ResultTTL(seen), c.ResultTTL(sent)
	if err != nil || ttl < lo || ttl > hi {
		return fmt.Sprintf("expected %s between %s and %s (keep_result_until %s), saw %q", jetstream.MsgTTLHeader, lo, hi,
			c.KeepResultUntil.Format(time.RFC3339), got)
	}
	return ""
}

// publish publishes c as a dispatcher does: on fncall.<team>.<function>
// with Nats-Msg-Id, Nats-TTL and the Toolrelay headers.
func (k *kit) publish(ctx context.Context, c *protocol.Call, o callOpts) error {
	data, err := protocol.EncodeCall(c)
	if err != nil {
		return err
	}
	m := nats.NewMsg(c.Subject())
	m.Data = data
	m.Header.Set(protocol.HeaderCallKey, string(c.Key))
	m.Header.Set(protocol.HeaderDeadline, c.Deadline.Format(time.RFC3339Nano))
	m.Header.Set(protocol.HeaderFunction, c.Function)
	if o.schema != "" {
		m.Header.Set(protocol.HeaderSchema, o.schema)
	}
	if o.traceparent != "" {
		m.Header.Set("traceparent", o.traceparent)
	}
	ttl := max(time.Until(c.Deadline), 0) + time.Minute
	_, err = k.js.PublishMsg(ctx, m, jetstream.WithMsgID(protocol.CallMsgID(c.Key)), jetstream.WithMsgTTL(ttl))
	return err
}

// call publishes a call of fn and waits up to within for its result,
// which must carry the Nats-TTL the call asks for.
func (k *kit) call(ctx context.Context, fn, args string, o callOpts, within time.Duration) (*protocol.Call, *protocol.Result, nats.Header, string) {
	c := k.newCall(fn, args, o)
	sent := time.Now()
	if err := k.publish(ctx, c, o); err != nil {
		return c, nil, nil, fmt.Sprintf("expected to publish the call, saw %v", err)
	}
	res, h, err := k.result(ctx, c.Key, within)
	if err != nil {
		return c, nil, nil, err.Error()
	}
	if p := resultTTL(c, h, sent, time.Now()); p != "" {
		return c, res, h, p
	}
	return c, res, h, ""
}

// result waits up to within for the result of key, read by direct get as
// an executor looks it up.
func (k *kit) result(ctx context.Context, key protocol.CallKey, within time.Duration) (*protocol.Result, nats.Header, error) {
	m, err := k.lastMsg(ctx, protocol.ResultStream(k.team), protocol.ResultSubject(k.team, key), within)
	if err != nil {
		return nil, nil, fmt.Errorf("expected a result on %s within %s, saw %w", protocol.ResultSubject(k.team, key), within, err)
	}
	res, err := protocol.DecodeResult(m.Data)
	if err != nil {
		return nil, nil, fmt.Errorf("expected a valid result envelope, saw %w: %s", err, m.Data)
	}
	return res, m.Header, nil
}

// lastMsg polls the last message on subject of stream until there is one.
func (k *kit) lastMsg(ctx context.Context, stream, subject string, within time.Duration) (*jetstream.RawStreamMsg, error) {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	var s jetstream.Stream
	for {
		var err error
		if s == nil {
			s, err = k.js.Stream(ctx, stream)
		}
		if s != nil {
			var m *jetstream.RawStreamMsg
			if m, err = s.GetLastMsgForSubject(ctx, subject); err == nil {
				return m, nil
			}
		}
		if !errors.Is(err, jetstream.ErrMsgNotFound) && !errors.Is(err, jetstream.ErrStreamNotFound) && ctx.Err() == nil {
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, errors.New("none")
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// deadLetter waits up to within for the last record on the dead-letter
// subject of c (protocol.DeadLetterCallSubject).
func (k *kit) deadLetter(ctx context.Context, c *protocol.Call, within time.Duration) (*protocol.DeadLetter, nats.Header, error) {
	subject := protocol.DeadLetterCallSubject(c.Team, c.Function, c.Key)
	m, err := k.lastMsg(ctx, protocol.DeadLetterStream, subject, within)
	if err != nil {
		return nil, nil, fmt.Errorf("expected a dead letter on %s, saw %w", subject, err)
	}
	d, err := protocol.DecodeDeadLetter(m.Data)
	if err != nil {
		return nil, nil, fmt.Errorf("expected a valid dead letter on %s, saw %w", subject, err)
	}
	return d, m.Header, nil
}

// noDeadLetter reports a dead letter of c, if there is one.
func (k *kit) noDeadLetter(ctx context.Context, c *protocol.Call) string {
	if d, _, err := k.deadLetter(ctx, c, 300*time.Millisecond); err == nil {
		return fmt.Sprintf("expected no dead letter, saw one of reason %s", d.Reason)
	}
	return ""
}

// mark returns the attempt mark of key, or nil.
func (k *kit) mark(ctx context.Context, key protocol.CallKey) (*protocol.AttemptMark, error) {
	kv, err := k.js.KeyValue(ctx, protocol.AttemptBucket)
	if err != nil {
		return nil, err
	}
	e, err := kv.Get(ctx, protocol.AttemptKey(key))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return protocol.DecodeAttemptMark(e.Value())
}

// cancel publishes the cancellation of c's turn as a dispatcher does.
func (k *kit) cancel(ctx context.Context, c *protocol.Call, reason string) error {
	_, err := k.cancelAt(ctx, c, reason)
	return err
}

// cancelAt cancels c's turn and returns the cancellation's sequence in
// its stream.
func (k *kit) cancelAt(ctx context.Context, c *protocol.Call, reason string) (uint64, error) {
	m := nats.NewMsg(protocol.CancelSubject(k.team, c.Key.Turn()))
	m.Data = []byte(reason)
	ack, err := k.js.PublishMsg(ctx, m, jetstream.WithMsgID(protocol.CancelMsgID(c.Key.Turn(), k.team)))
	if err != nil {
		return 0, err
	}
	return ack.Sequence, nil
}

// cancelsDelivered reports whether every consumer of the cancellations
// stream (an executor following them) was delivered the one at seq.
func (k *kit) cancelsDelivered(ctx context.Context, seq uint64) bool {
	s, err := k.js.Stream(ctx, protocol.CancelStream)
	if err != nil {
		return false
	}
	infos := s.ListConsumers(ctx)
	for info := range infos.Info() {
		if info.Delivered.Stream < seq {
			return false
		}
	}
	return infos.Err() == nil
}

// taken waits until fn's consumer has a call unacknowledged (taken and
// not answered), and reports whether it did within within.
func (k *kit) taken(ctx context.Context, fn string, within time.Duration) bool {
	return k.until(ctx, within, func() bool {
		c, err := k.js.Consumer(ctx, protocol.CallStream(k.team), fn)
		if err != nil {
			return false
		}
		info, err := c.Info(ctx)
		return err == nil && info.NumAckPending > 0
	})
}

// until polls cond every 50ms up to within.
func (k *kit) until(ctx context.Context, within time.Duration, cond func() bool) bool {
	end := time.Now().Add(within)
	for {
		if cond() {
			return true
		}
		if time.Now().After(end) || ctx.Err() != nil {
			return false
		}
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// failure checks res failed with code, and returns what differs.
func failure(res *protocol.Result, code protocol.ErrorCode) string {
	if res.Error == nil {
		return fmt.Sprintf("expected a failed result %s, saw output %q", code, res.Output)
	}
	if res.Error.Code != code || res.Error.Message == "" {
		return fmt.Sprintf("expected a failed result %s with a message, saw %s %q", code, res.Error.Code, res.Error.Message)
	}
	return ""
}

// output checks res succeeded with want.
func output(res *protocol.Result, want string) string {
	if res.Error != nil {
		return fmt.Sprintf("expected output %q, saw %s %q", want, res.Error.Code, res.Error.Message)
	}
	if res.Output != want {
		return fmt.Sprintf("expected output %q, saw %q", want, res.Output)
	}
	return ""
}
