package kit

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolrelay/toolrelay/internal/schema"
	"github.com/toolrelay/toolrelay/pkg/exec"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// cases run in this order: later ones use what earlier ones saw (the
// declarations, the dead-lettered call), and the last ones stop and start
// the executor.
var cases = []testCase{
	{name: "declare: every test function has a live declaration and a consumer", check: (*kit).declare},
	{name: "ownership: another team is refused the names", fn: FnEcho, check: (*kit).ownership},
	{name: "success: output recorded as the result", fn: FnEcho, check: (*kit).success},
	{name: "result TTL: a call without keep_result_until gets a result without Nats-TTL", fn: FnEcho, check: (*kit).keepless},
	{name: "invalid arguments: checked without a Toolrelay-Schema header", fn: FnEcho, check: (*kit).invalidArguments},
	{name: "schema digest: arguments not checked again under the declared schema's digest", fn: FnEcho, check: (*kit).digestTrusted},
	{name: "schema digest: checked again under another digest", fn: FnEcho, check: (*kit).digestOther},
	{name: "trace: the result continues the call's trace", fn: FnEcho, check: (*kit).trace},
	{name: "malformed call: terminated with +TERM and a reason", fn: FnEcho, check: (*kit).malformed},
	{name: "deadline passed: timeout without running", fn: FnEcho, check: (*kit).deadlinePassed},
	{name: "handler error: function_error and a permanent_error dead letter", fn: FnFail, check: (*kit).handlerError},
	{name: "refusal: function_error and no dead letter", fn: FnFail, check: (*kit).refusal},
	{name: "replay: the dead letter's call runs again, its outcome a replayed record", fn: FnFail, check: (*kit).replay},
	{name: "retryable failure: retried, the next attempt's result recorded", fn: FnRetry, check: (*kit).retry},
	{name: "attempts exhausted: function_error and an attempts_exhausted dead letter", fn: FnRetry, check: (*kit).exhausted},
	{name: "timeout: a run over the function's timeout fails as timeout", fn: FnSlow, check: (*kit).timeout},
	{name: "cancellation: a running call of a cancelled turn fails as unavailable", fn: FnSlow, check: (*kit).cancelRunning},
	{name: "cancellation: a queued call of a cancelled turn is not run", fn: FnEcho, check: (*kit).cancelQueued},
	{name: "side effects: an attempt mark before the run", fn: FnEffect, check: (*kit).effectMark},
	{name: "side effects: the attempts bucket's configuration", fn: FnEffect, check: (*kit).attemptsBucket},
	{name: "stop: declarations withdrawn, clean exit, running call finished or handed back", fn: FnSlow, restarts: true, check: (*kit).stop},
	{name: "redelivery after a recorded result: acknowledged without a run", fn: FnEffect, restarts: true, check: (*kit).recordedRedelivery},
	{name: "side effects: a delivery after a running mark is not run (may_have_run)", fn: FnEffect, restarts: true, check: (*kit).mayHaveRun},
	{name: "stop: the handed-back call is answered after the restart", fn: FnSlow, restarts: true, check: (*kit).handedBack},
}

// short bounds the wait for a result that needs no retry or timeout.
const short = 10 * time.Second

func (k *kit) wanted() []string {
	if len(k.opts.Functions) > 0 {
		return k.opts.Functions
	}
	return Functions
}

func (k *kit) declare(ctx context.Context) string {
	kv, err := k.js.KeyValue(ctx, protocol.DeclarationBucket)
	if err != nil {
		return fmt.Sprintf("expected the bucket %s (a dispatcher must run), saw %v", protocol.DeclarationBucket, err)
	}
	var missing []string
	k.until(ctx, k.opts.DeclareTimeout, func() bool {
		k.declared, missing = map[string]*protocol.Declaration{}, nil
		keys, err := kv.ListKeys(ctx)
		if err != nil {
			return false
		}
		for key := range keys.Keys() {
			if !strings.HasPrefix(key, k.team+".") {
				continue
			}
			e, err := kv.Get(ctx, key)
			if err != nil {
				continue
			}
			var d protocol.Declaration
			if json.Unmarshal(e.Value(), &d) == nil && key == protocol.DeclarationKey(k.team, d.Spec.Name, d.Instance) {
				k.declared[d.Spec.Name] = &d
			}
		}
		for _, fn := range k.wanted() {
			if k.declared[fn] == nil {
				missing = append(missing, fn)
			}
		}
		return len(missing) == 0
	})
	if len(missing) > 0 {
		return fmt.Sprintf("expected declarations under %s.<function>.<instance> of %s within %s, saw none", k.team, strings.Join(missing, ", "), k.opts.DeclareTimeout)
	}
	for _, fn := range k.wanted() {
		d := k.declared[fn]
		if d.Spec.Team != k.team || d.StartedAt.IsZero() {
			return fmt.Sprintf("expected %s's declaration of team %s with started_at, saw team %q started_at %v", fn, k.team, d.Spec.Team, d.StartedAt)
		}
		c, err := k.js.Consumer(ctx, protocol.CallStream(k.team), fn)
		if err != nil {
			return fmt.Sprintf("expected the durable consumer %s on %s, saw %v", fn, protocol.CallStream(k.team), err)
		}
		cfg := c.CachedInfo().Config
		if cfg.FilterSubject != protocol.CallSubject(k.team, fn) || cfg.AckPolicy != jetstream.AckExplicitPolicy || cfg.MaxDeliver != -1 {
			return fmt.Sprintf("expected consumer %s filtering %s, ack explicit, max deliver -1; saw %s, %s, %d", fn, protocol.CallSubject(k.team, fn), cfg.FilterSubject, cfg.AckPolicy, cfg.MaxDeliver)
		}
	}
	if d := k.declared[FnSlow]; d != nil && time.Duration(d.Spec.Timeout) != SlowTimeout {
		return fmt.Sprintf("expected %s declared with timeout %s, saw %s", FnSlow, SlowTimeout, time.Duration(d.Spec.Timeout))
	}
	if d := k.declared[FnEffect]; d != nil && !d.Spec.SideEffects {
		return fmt.Sprintf("expected %s declared with side_effects true, saw false", FnEffect)
	}
	return ""
}

func (k *kit) ownership(ctx context.Context) string {
	other := "conformance-other"
	if other == k.team {
		other = "conformance-other2"
	}
	d := *k.declared[FnEcho]
	d.Spec.Team, d.Instance, d.Executor = other, uuid.NewString(), "conformance-kit"
	body, err := protocol.EncodeDeclareRequest(other, &protocol.DeclareRequest{Version: protocol.Version, Op: protocol.DeclareServe, Declarations: []protocol.Declaration{d}})
	if err != nil {
		return err.Error()
	}
	m, err := k.nc.RequestWithContext(ctx, protocol.DeclareSubject(other), body)
	if err != nil {
		return fmt.Sprintf("expected a dispatcher's answer on %s, saw %v", protocol.DeclareSubject(other), err)
	}
	r, err := protocol.DecodeDeclareReply(m.Data)
	if err != nil {
		return err.Error()
	}
	if len(r.Refused) != 1 || r.Refused[0].Owner != k.team {
		return fmt.Sprintf("expected team %s's declaration of %s refused as owned by %s, saw %s", other, FnEcho, k.team, m.Data)
	}
	return ""
}

func (k *kit) success(ctx context.Context) string {
	c, res, h, problem := k.call(ctx, FnEcho, `{"text":"hi"}`, callOpts{}, short)
	if problem != "" {
		return problem
	}
	if p := output(res, "hi"); p != "" {
		return p
	}
	switch {
	case res.Key != c.Key || res.CallID != c.CallID || res.Team != c.Team || res.Function != c.Function:
		return fmt.Sprintf("expected key, call_id, team and function copied from the call, saw %s %s %s %s", res.Key, res.CallID, res.Team, res.Function)
	case res.Attempt != 1 || res.Executor == "" || res.FinishedAt.IsZero():
		return fmt.Sprintf("expected attempt 1, an executor and finished_at, saw %d %q %v", res.Attempt, res.Executor, res.FinishedAt)
	case h.Get(protocol.HeaderCallKey) != string(c.Key) || h.Get(jetstream.MsgIDHeader) != protocol.ResultMsgID(c.Key):
		return fmt.Sprintf("expected headers Toolrelay-Call-Key and Nats-Msg-Id %s, saw %q and %q", c.Key, h.Get(protocol.HeaderCallKey), h.Get(jetstream.MsgIDHeader))
	}
	return ""
}

func (k *kit) keepless(ctx context.Context) string {
	_, res, _, problem := k.call(ctx, FnEcho, `{"text":"keepless"}`, callOpts{keepless: true}, short)
	if problem != "" {
		return problem
	}
	return output(res, "keepless")
}

func (k *kit) invalidArguments(ctx context.Context) string {
	_, res, _, problem := k.call(ctx, FnEcho, `{"text":5}`, callOpts{}, short)
	if problem != "" {
		return problem
	}
	return failure(res, protocol.CodeInvalidArguments)
}

// longText breaks EchoSchema's maxLength.
const longText = "longer than eight"

func (k *kit) digestTrusted(ctx context.Context) string {
	digest := schema.Digest(k.declared[FnEcho].Spec.Parameters)
	_, res, _, problem := k.call(ctx, FnEcho, `{"text":"`+longText+`"}`, callOpts{schema: digest}, short)
	if problem != "" {
		return problem
	}
	if p := output(res, longText); p != "" {
		return fmt.Sprintf("with Toolrelay-Schema: %s (the digest of the declared parameters, docs/protocol.md \"The schema digest\"): %s", digest, p)
	}
	return ""
}

func (k *kit) digestOther(ctx context.Context) string {
	_, res, _, problem := k.call(ctx, FnEcho, `{"text":"`+longText+`"}`, callOpts{schema: "0000000000000000"}, short)
	if problem != "" {
		return problem
	}
	return failure(res, protocol.CodeInvalidArguments)
}

func (k *kit) trace(ctx context.Context) string {
	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	tp := "00-" + traceID + "-00f067aa0ba902b7-01"
	_, res, h, problem := k.call(ctx, FnEcho, `{"text":"trace"}`, callOpts{traceparent: tp}, short)
	if problem != "" {
		return problem
	}
	if p := output(res, "trace"); p != "" {
		return p
	}
	got := h.Get("traceparent")
	parts := strings.Split(got, "-")
	if len(parts) != 4 || parts[1] != traceID || len(parts[2]) != 16 {
		return fmt.Sprintf("expected the result's traceparent in trace %s, saw %q", traceID, got)
	}
	return ""
}

func (k *kit) malformed(ctx context.Context) string {
	acks := make(chan *nats.Msg, 64)
	sub, err := k.nc.ChanSubscribe("$JS.ACK."+protocol.CallStream(k.team)+"."+FnEcho+".>", acks)
	if err != nil {
		return fmt.Sprintf("expected to watch the acks, saw %v", err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	m := nats.NewMsg(protocol.CallSubject(k.team, FnEcho))
	m.Data = []byte(`{"v":1,"key":"not a call"}`)
	pub, err := k.js.PublishMsg(ctx, m, jetstream.WithMsgID("conformance-malformed-"+uuid.NewString()))
	if err != nil {
		return err.Error()
	}
	// The acks of earlier cases' calls may still come: only this
	// message's counts ($JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>...).
	seq := strconv.FormatUint(pub.Sequence, 10)
	timeout := time.After(short)
	for {
		select {
		case a := <-acks:
			if tok := strings.Split(a.Subject, "."); len(tok) < 6 || tok[5] != seq {
				continue
			}
			body := string(a.Data)
			if reason, ok := strings.CutPrefix(body, "+TERM "); !ok || strings.TrimSpace(reason) == "" {
				return fmt.Sprintf("expected \"+TERM <reason>\", saw %q", body)
			}
			return ""
		case <-timeout:
			return "expected \"+TERM <reason>\" on the delivery's reply subject, saw nothing"
		}
	}
}

func (k *kit) deadlinePassed(ctx context.Context) string {
	_, res, _, problem := k.call(ctx, FnEcho, `{"text":"late"}`, callOpts{deadline: -time.Second}, short)
	if problem != "" {
		return problem
	}
	return failure(res, protocol.CodeTimeout)
}

func (k *kit) handlerError(ctx context.Context) string {
	c, res, _, problem := k.call(ctx, FnFail, `{"mode":"error"}`, callOpts{}, short)
	if problem != "" {
		return problem
	}
	if p := failure(res, protocol.CodeFunctionError); p != "" {
		return p
	}
	if !strings.Contains(res.Error.Message, FailMessage) {
		return fmt.Sprintf("expected the message %q, saw %q", FailMessage, res.Error.Message)
	}
	d, h, err := k.deadLetter(ctx, c, short)
	if err != nil {
		return err.Error()
	}
	if p := deadLetterIs(c, d, h, protocol.ReasonPermanent, protocol.CodeFunctionError, 0); p != "" {
		return p
	}
	if d.Attempts != 1 {
		return fmt.Sprintf("expected attempts 1, saw %d", d.Attempts)
	}
	k.failedKey = c.Key
	return ""
}

// deadLetterIs checks a dead letter of c.
func deadLetterIs(c *protocol.Call, d *protocol.DeadLetter, h nats.Header, reason string, code protocol.ErrorCode, replay int) string {
	wantID := "dlq." + string(c.Key)
	if replay > 0 {
		wantID += fmt.Sprintf(".r%d", replay)
	}
	switch {
	case d.Reason != reason || d.Replay != replay:
		return fmt.Sprintf("expected a dead letter of reason %s replay %d, saw %s replay %d", reason, replay, d.Reason, d.Replay)
	case d.Call.Key != c.Key || d.Result.Key != c.Key:
		return fmt.Sprintf("expected the dead letter's call and result of %s, saw %s and %s", c.Key, d.Call.Key, d.Result.Key)
	case d.Result.Error == nil || d.Result.Error.Code != code:
		return fmt.Sprintf("expected the dead letter's result a failed %s, saw %+v", code, d.Result.Error)
	case h.Get(jetstream.MsgIDHeader) != wantID || h.Get(protocol.HeaderCallKey) != string(c.Key):
		return fmt.Sprintf("expected Nats-Msg-Id %s and Toolrelay-Call-Key %s, saw %q and %q", wantID, c.Key, h.Get(jetstream.MsgIDHeader), h.Get(protocol.HeaderCallKey))
	case d.Attempts < 1:
		return fmt.Sprintf("expected attempts >= 1, saw %d", d.Attempts)
	}
	return ""
}

func (k *kit) refusal(ctx context.Context) string {
	c, res, _, problem := k.call(ctx, FnFail, `{"mode":"refuse"}`, callOpts{}, short)
	if problem != "" {
		return problem
	}
	if p := failure(res, protocol.CodeFunctionError); p != "" {
		return p
	}
	if !strings.Contains(res.Error.Message, RefuseMessage) {
		return fmt.Sprintf("expected the message %q, saw %q", RefuseMessage, res.Error.Message)
	}
	return k.noDeadLetter(ctx, c)
}

func (k *kit) replay(ctx context.Context) string {
	if k.failedKey == "" {
		return "expected the handler-error case to leave a dead letter to replay, saw none"
	}
	dl := exec.NewDeadLetters(k.js)
	orig, err := dl.Get(ctx, k.failedKey)
	if err != nil {
		return err.Error()
	}
	n, err := dl.Replay(ctx, k.failedKey, 30*time.Second)
	if err != nil {
		return fmt.Sprintf("expected to replay %s, saw %v", k.failedKey, err)
	}
	var d *protocol.DeadLetter
	var h nats.Header
	k.until(ctx, short, func() bool {
		d, h, err = k.deadLetter(ctx, orig.Call, 100*time.Millisecond)
		return err == nil && d.Replay == n
	})
	if err != nil {
		return err.Error()
	}
	return deadLetterIs(orig.Call, d, h, protocol.ReasonReplayed, protocol.CodeFunctionError, n)
}

func (k *kit) retry(ctx context.Context) string {
	_, res, _, problem := k.call(ctx, FnRetry, `{"fail_times":1}`, callOpts{}, 20*time.Second)
	if problem != "" {
		return problem
	}
	if p := output(res, "attempt 2"); p != "" {
		return p
	}
	if res.Attempt != 2 {
		return fmt.Sprintf("expected the result's attempt 2, saw %d", res.Attempt)
	}
	return ""
}

func (k *kit) exhausted(ctx context.Context) string {
	c, res, _, problem := k.call(ctx, FnRetry, `{"fail_times":1000}`, callOpts{}, 30*time.Second)
	if problem != "" {
		return problem
	}
	if p := failure(res, protocol.CodeFunctionError); p != "" {
		return p
	}
	d, h, err := k.deadLetter(ctx, c, short)
	if err != nil {
		return err.Error()
	}
	if p := deadLetterIs(c, d, h, protocol.ReasonExhausted, protocol.CodeFunctionError, 0); p != "" {
		return p
	}
	if d.Attempts < 2 || d.Attempts != res.Attempt {
		return fmt.Sprintf("expected at least 2 attempts, the dead letter's attempts the result's attempt; saw %d and %d", d.Attempts, res.Attempt)
	}
	return ""
}

func (k *kit) timeout(ctx context.Context) string {
	c, res, _, problem := k.call(ctx, FnSlow, `{"ms":60000}`, callOpts{}, SlowTimeout+short)
	if problem != "" {
		return problem
	}
	if p := failure(res, protocol.CodeTimeout); p != "" {
		return p
	}
	return k.noDeadLetter(ctx, c)
}

// cancelReason is the body of the kit's cancellations.
const cancelReason = "the conformance kit cancelled the turn"

func (k *kit) cancelRunning(ctx context.Context) string {
	c := k.newCall(FnSlow, `{"ms":60000}`, callOpts{})
	if err := k.publish(ctx, c, callOpts{}); err != nil {
		return err.Error()
	}
	if !k.taken(ctx, FnSlow, short) {
		return "expected the call to be taken, saw it queued"
	}
	if err := k.cancel(ctx, c, cancelReason); err != nil {
		return err.Error()
	}
	res, _, err := k.result(ctx, c.Key, SlowTimeout)
	if err != nil {
		return err.Error() + " (before the function's timeout)"
	}
	if p := failure(res, protocol.CodeUnavailable); p != "" {
		return p
	}
	if !strings.Contains(res.Error.Message, cancelReason) {
		return fmt.Sprintf("expected the message to give the reason %q, saw %q", cancelReason, res.Error.Message)
	}
	return ""
}

func (k *kit) cancelQueued(ctx context.Context) string {
	c := k.newCall(FnEcho, `{"text":"cxl"}`, callOpts{})
	seq, err := k.cancelAt(ctx, c, cancelReason)
	if err != nil {
		return err.Error()
	}
	// An executor learns of cancellations as they are delivered to it: a
	// call that overtakes its turn's cancellation is run, as it would be
	// in a dispatcher's hands. The call goes out once the cancellation
	// reached every executor following them.
	if !k.until(ctx, short, func() bool { return k.cancelsDelivered(ctx, seq) }) {
		return fmt.Sprintf("expected the executors following %s to be delivered the cancellation, saw it undelivered", protocol.CancelStream)
	}
	if err := k.publish(ctx, c, callOpts{}); err != nil {
		return err.Error()
	}
	res, _, err := k.result(ctx, c.Key, short)
	if err != nil {
		return err.Error()
	}
	return failure(res, protocol.CodeUnavailable)
}

func (k *kit) effectMark(ctx context.Context) string {
	c, res, _, problem := k.call(ctx, FnEffect, `{"text":"fx"}`, callOpts{}, short)
	if problem != "" {
		return problem
	}
	if p := output(res, "fx"); p != "" {
		return p
	}
	m, err := k.mark(ctx, c.Key)
	if err != nil || m == nil {
		return fmt.Sprintf("expected an attempt mark under %s in %s, saw %v", c.Key, protocol.AttemptBucket, err)
	}
	if m.Attempt != 1 || m.Executor == "" || m.At.IsZero() || (m.State != protocol.AttemptRunning) {
		return fmt.Sprintf("expected the mark running, attempt 1, with executor and at; saw %+v", *m)
	}
	return ""
}

func (k *kit) attemptsBucket(ctx context.Context) string {
	s, err := k.js.Stream(ctx, "KV_"+protocol.AttemptBucket)
	if err != nil {
		return err.Error()
	}
	cfg := s.CachedInfo().Config
	want := fmt.Sprintf("subjects [$KV.%s.>] max_msgs_per_subject 1 discard new true allow_rollup_hdrs true deny_delete true allow_direct true allow_msg_ttl false max_age>0 true", protocol.AttemptBucket)
	got := fmt.Sprintf("subjects %v max_msgs_per_subject %d discard new %t allow_rollup_hdrs %t deny_delete %t allow_direct %t allow_msg_ttl %t max_age>0 %t",
		cfg.Subjects, cfg.MaxMsgsPerSubject, cfg.Discard == jetstream.DiscardNew, cfg.AllowRollup, cfg.DenyDelete, cfg.AllowDirect, cfg.AllowMsgTTL, cfg.MaxAge > 0)
	if got != want {
		return fmt.Sprintf("expected %s, saw %s", want, got)
	}
	return ""
}
