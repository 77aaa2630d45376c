package exec

import (
	"context"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// deadLetter records a call that failed for good. Its message ID makes the
// record unique per call even if the executor repeats it.
func deadLetter(ctx context.Context, js jetstream.JetStream, call *protocol.Call, res *protocol.Result, reason string, attempts, replay int, executor string) error {
	d := &protocol.DeadLetter{
		Version: protocol.Version, Call: call, Result: res, Reason: reason,
		Attempts: attempts, Executor: executor, At: time.Now().UTC(), Replay: replay,
	}
	data, err := protocol.EncodeDeadLetter(d)
	if err != nil {
		return err
	}
	m := nats.NewMsg(deadLetterCallSubject(call.Team, call.Function, call.Key))
	m.Data = data
	m.Header.Set(protocol.HeaderCallKey, string(call.Key))
	_, err = js.PublishMsg(ctx, m, jetstream.WithMsgID(d.MsgID()))
	return err
}

// deadLetterCallSubject is protocol.DeadLetterCallSubject; team and
// function may be "*" to find a key alone. Records written before per-call
// subjects sit on fndlq.<team>.<function>; the stream's fndlq.> and a
// team's fndlq.<team>.> permission cover both.
func deadLetterCallSubject(team, function string, key protocol.CallKey) string {
	return protocol.DeadLetterCallSubject(team, function, key)
}
