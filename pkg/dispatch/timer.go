package dispatch

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolrelay/toolrelay/internal/jspub"
	"github.com/toolrelay/toolrelay/internal/provision"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// Deadline timers are JetStream scheduled messages: one per turn, armed at
// intake, firing at the turn's deadline into a consumer all replicas share.
// They live in the server, so they survive any dispatcher crash.

const timersConsumer = "toolrelay_timers"

// scheduleDeadline arms t's timer, waiting for it: a request of its own,
// not through the asynchronous publisher, so that arming again after a
// failure does not depend on what failed. Arming twice is deduplicated.
func (d *Dispatcher) scheduleDeadline(ctx context.Context, t *Turn) error {
	_, err := jspub.Publish(ctx, d.js.Conn(), timerMsg(t))
	return err
}

// scheduleDeadlineAsync arms t's timer beside its record.
func (d *Dispatcher) scheduleDeadlineAsync(t *Turn) (*jspub.Future, error) {
	return d.async.Publish(timerMsg(t))
}

func timerMsg(t *Turn) *nats.Msg {
	// Fired at the second before the deadline, the rest is waited out
	// in-process (closeTurn).
	return scheduledMsg(timerScheduleSubject(t.Key), timerFireSubject(t.Key), "timer."+string(t.Key), string(t.Key), t.Deadline)
}

// scheduledMsg schedules data to be published on fire at the second
// before at (@at has second resolution; rounding up would eat up to a
// second of a margin), deduplicated by msgID.
func scheduledMsg(sched, fire, msgID, data string, at time.Time) *nats.Msg {
	return &nats.Msg{Subject: sched, Data: []byte(data), Header: jspub.SetHeaders(nil,
		jetstream.MsgIDHeader, msgID,
		jetstream.ScheduleHeader, "@at "+at.Truncate(time.Second).UTC().Format(time.RFC3339),
		jetstream.ScheduleTargetHeader, fire)}
}

func (d *Dispatcher) startTimers(ctx context.Context) (stop func(), err error) {
	return d.consume(ctx, d.timers, jetstream.ConsumerConfig{
		Durable:       timersConsumer,
		Description:   "toolrelay dispatchers firing turn deadlines",
		FilterSubject: provision.TimerSubjectPrefix + ".fire.>",
		MaxAckPending: 10000,
	}, 256, func(msg jetstream.Msg) {
		if len(msg.Data()) == 0 {
			// The roll-up marker unindex leaves on a fired timer's subject
			// (a timer that fired carries its turn's key): nothing fired.
			_ = msg.Ack()
			return
		}
		key, err := parseTimerFireSubject(msg.Subject())
		if err != nil {
			d.log.Error("ignoring malformed timer", "subject", msg.Subject(), "err", err)
			_ = msg.Term()
			return
		}
		_ = msg.Ack()
		d.engine.Due(string(key))
	})
}

// unindex removes a closed turn's timer: it will not fire, and the turn
// leaves the index of open turns. Each timer subject gets a roll-up marker
// (which replaces the message on its subject, and so cancels a schedule)
// that itself expires a second later. The markers are published without
// asking for an acknowledgement, which nothing would wait for: whatever
// they miss the sweep removes.
func (d *Dispatcher) unindex(key protocol.TurnKey, fired bool) {
	subjects := []string{timerScheduleSubject(key)}
	if fired {
		subjects = append(subjects, timerFireSubject(key))
	}
	for _, subj := range subjects {
		m := nats.NewMsg(subj)
		m.Header.Set(jetstream.MsgRollup, jetstream.MsgRollupSubject)
		m.Header.Set(jetstream.MsgTTLHeader, markerTTL)
		if err := d.js.Conn().PublishMsg(m); err != nil {
			d.log.Debug("removing a closed turn's timer failed; the sweep will", "turn", key, "err", err)
		}
	}
}

// markerTTL is how long a roll-up marker outlives the timer it removed.
const markerTTL = "1s"

// kvSubject is where a KV bucket stores key (ADR-8): writing there is a KV
// put that can go out asynchronously, beside other writes.
func kvSubject(bucket, key string) string { return "$KV." + bucket + "." + key }

// margin is how long before expiry to submit, given the time left.
func (d *Dispatcher) margin(left time.Duration) time.Duration {
	return min(d.opts.SubmitMargin, max(left/4, 0))
}

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
	rest, ok := strings.CutPrefix(subject, provision.TimerSubjectPrefix+".")
	kind, key, _ := strings.Cut(rest, ".")
	if !ok || (kind != "sched" && kind != "fire") || strings.Contains(key, ".") {
		return "", fmt.Errorf("dispatch: malformed timer subject %q", subject)
	}
	return protocol.ParseTurnKey(key)
}

// parseTimerFireSubject returns the turn of a fired deadline timer.
func parseTimerFireSubject(subject string) (protocol.TurnKey, error) {
	rest, ok := strings.CutPrefix(subject, provision.TimerSubjectPrefix+".fire.")
	if !ok {
		return "", fmt.Errorf("dispatch: malformed timer subject %q", subject)
	}
	return protocol.ParseTurnKey(rest)
}
