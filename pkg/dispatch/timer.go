package dispatch

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolrelay/toolrelay/internal/provision"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// Deadline timers are JetStream scheduled messages: one per turn, armed at
// intake, firing at the turn's deadline into a consumer all replicas share.
// They live in the server, so they survive any dispatcher crash.

const timersConsumer = "toolrelay_timers"

// A turn's timer is scheduled on fntimer.sched.<turn> and fires on
// fntimer.fire.<turn>, both in provision.TimerStream. Together the timer
// subjects index the open turns: a turn's are removed when it closes.

// timerScheduleSubject is where a turn's deadline timer is scheduled.
func timerScheduleSubject(turn protocol.TurnKey) string {
	return provision.TimerSubjectPrefix + ".sched." + string(turn)
}

// timerFireSubject is the subject a turn's deadline timer fires on.
func timerFireSubject(turn protocol.TurnKey) string {
	return provision.TimerSubjectPrefix + ".fire." + string(turn)
}

// parseTimerSubject returns the turn of a scheduled or fired timer.
func parseTimerSubject(subject string) (protocol.TurnKey, error) {
	parts := strings.Split(subject, ".")
	if len(parts) != 3 || parts[0] != provision.TimerSubjectPrefix || (parts[1] != "sched" && parts[1] != "fire") {
		return "", fmt.Errorf("dispatch: malformed timer subject %q", subject)
	}
	return protocol.ParseTurnKey(parts[2])
}

// parseTimerFireSubject returns the turn of a fired deadline timer.
func parseTimerFireSubject(subject string) (protocol.TurnKey, error) {
	rest, ok := strings.CutPrefix(subject, provision.TimerSubjectPrefix+".fire.")
	if !ok {
		return "", fmt.Errorf("dispatch: malformed timer subject %q", subject)
	}
	return protocol.ParseTurnKey(rest)
}

// scheduleDeadline arms t's timer. Arming twice is deduplicated.
func (d *Dispatcher) scheduleDeadline(ctx context.Context, t *Turn) error {
	sent := time.Now()
	f, err := d.scheduleDeadlineAsync(t)
	if err != nil {
		return err
	}
	_, err = awaitAck(ctx, f, sent)
	return err
}

func (d *Dispatcher) scheduleDeadlineAsync(t *Turn) (jetstream.PubAckFuture, error) {
	// @at has second resolution. Fire at the second before the deadline
	// and wait out the rest in-process (closeTurn): rounding up would eat
	// up to a second of the margin.
	at := t.Deadline.Truncate(time.Second)
	return d.js.PublishAsync(timerScheduleSubject(t.Key), []byte(t.Key),
		jetstream.WithMsgID("timer."+string(t.Key)),
		jetstream.WithScheduleAt(at),
		jetstream.WithScheduleTarget(timerFireSubject(t.Key)))
}

func (d *Dispatcher) startTimers(ctx context.Context) (stop func(), err error) {
	cons, err := provision.Consumer(ctx, d.timers, jetstream.ConsumerConfig{
		Durable:       timersConsumer,
		Description:   "toolrelay dispatchers firing turn deadlines",
		FilterSubject: provision.TimerSubjectPrefix + ".fire.>",
		AckPolicy:     jetstream.AckExplicitPolicy,
		DeliverPolicy: jetstream.DeliverAllPolicy,
		AckWait:       30 * time.Second,
		MaxDeliver:    -1,
		MaxAckPending: 10000,
	})
	if err != nil {
		return nil, err
	}
	cc, err := cons.Consume(func(msg jetstream.Msg) {
		key, err := parseTimerFireSubject(msg.Subject())
		if err != nil {
			d.log.Error("ignoring malformed timer", "subject", msg.Subject(), "err", err)
			_ = msg.Term()
			return
		}
		_ = msg.Ack()
		// Closing may submit to the platform: do it off the consumer.
		if !d.background(func(ctx context.Context) { d.closeTurn(ctx, key, true) }) {
			_ = msg.Nak()
		}
	}, jetstream.PullMaxMessages(256), jetstream.PullExpiry(5*time.Second), jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
		if !errors.Is(err, jetstream.ErrNoHeartbeat) {
			d.log.Warn("consuming timers", "err", err)
		}
	}))
	if err != nil {
		return nil, err
	}
	return func() { cc.Stop(); <-cc.Closed() }, nil
}
