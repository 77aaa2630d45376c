package kit

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolrelay/toolrelay/internal/firstwins"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// The cases that stop and start the executor. stop leaves it stopped;
// recordedRedelivery prepares two deliveries while nothing serves, as an
// executor that died would leave them, and starts it again.

// restartState is what the restart cases hand on.
type restartState struct {
	handedBack *protocol.Call // running when the executor was stopped
	mayHaveRun *protocol.Call // delivered, marked running, nacked
}

func (k *kit) stop(ctx context.Context) string {
	c := k.newCall(FnSlow, `{"ms":1500}`, callOpts{deadline: time.Minute})
	if err := k.publish(ctx, c, callOpts{}); err != nil {
		return err.Error()
	}
	if !k.taken(ctx, FnSlow, short) {
		return "expected the call to be taken, saw it queued"
	}
	// Stopped only once the executor has held the call a moment: a call
	// the server delivers in the instant a pull consumer stops may reach
	// no one and come back only after its ack wait (a residual of pull
	// consumers, docs/protocol.md), which is not what this case is about.
	takenAt := time.Now()
	if !k.until(ctx, short, func() bool { return time.Since(takenAt) > 300*time.Millisecond && k.taken(ctx, FnSlow, 0) }) {
		return "expected the call to stay taken while it runs, saw it handed back before the stop"
	}
	k.restart.handedBack = c
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	err := k.target.Stop(sctx)
	k.running = false
	if err != nil {
		return fmt.Sprintf("expected a clean stop within a minute, saw %v", err)
	}
	kv, err := k.js.KeyValue(ctx, protocol.DeclarationBucket)
	if err != nil {
		return err.Error()
	}
	keys, err := kv.ListKeys(ctx)
	if err != nil {
		return err.Error()
	}
	var left []string
	for key := range keys.Keys() {
		if strings.HasPrefix(key, k.team+".") {
			left = append(left, key)
		}
	}
	if len(left) > 0 {
		return fmt.Sprintf("expected every declaration withdrawn on stop, saw %s", strings.Join(left, ", "))
	}
	// Finished within the shutdown timeout, or handed back unacknowledged.
	// The executor's last words reach the server on its own connection,
	// which may come after this one's question: asked again for a moment.
	if _, _, err := k.result(ctx, c.Key, 100*time.Millisecond); err == nil {
		return ""
	}
	cons, err := k.js.Consumer(ctx, protocol.CallStream(k.team), FnSlow)
	if err != nil {
		return err.Error()
	}
	var held int
	for giveUp := time.Now().Add(short); ; {
		info, err := cons.Info(ctx)
		if err != nil {
			return err.Error()
		}
		if info.NumAckPending == 0 || info.NumRedelivered > 0 || info.NumPending > 0 {
			return ""
		}
		held = info.NumAckPending
		if time.Now().After(giveUp) {
			break
		}
		if _, _, err := k.result(ctx, c.Key, 50*time.Millisecond); err == nil { // and the pause before asking again
			return ""
		}
	}
	return fmt.Sprintf("expected the running call finished or handed back (nak), saw %d unacknowledged", held)
}

// kitExecutor names the kit in what it records as a dead executor would.
const kitExecutor = "conformance-kit"

func (k *kit) recordedRedelivery(ctx context.Context) string {
	if k.running {
		sctx, cancel := context.WithTimeout(ctx, time.Minute)
		err := k.target.Stop(sctx)
		cancel()
		k.running = false
		if err != nil {
			return fmt.Sprintf("expected a clean stop, saw %v", err)
		}
	}
	cons, err := k.js.Consumer(ctx, protocol.CallStream(k.team), FnEffect)
	if err != nil {
		return err.Error()
	}
	// Call 1: delivered, its result recorded, then nacked: a process that
	// recorded the result and died before its ack. Call 2: delivered,
	// marked running, then nacked: a process that died while running a side
	// effect.
	recorded := k.newCall(FnEffect, `{"text":"recorded"}`, callOpts{})
	k.restart.mayHaveRun = k.newCall(FnEffect, `{"text":"may have run"}`, callOpts{})
	if p := k.deliverOnce(ctx, cons, map[protocol.CallKey]func() error{
		recorded.Key: func() error {
			res := &protocol.Result{Version: protocol.Version, Key: recorded.Key, CallID: recorded.CallID, Team: k.team,
				Function: FnEffect, Output: "recorded by the kit", Executor: kitExecutor, Attempt: 1, FinishedAt: time.Now().UTC()}
			return firstwins.Record(ctx, k.nc, res, nil, recorded.ResultTTL(time.Now()))
		},
		k.restart.mayHaveRun.Key: func() error {
			kv, err := k.js.KeyValue(ctx, protocol.AttemptBucket)
			if err != nil {
				return err
			}
			b, err := protocol.EncodeAttemptMark(&protocol.AttemptMark{State: protocol.AttemptRunning, Attempt: 1, Executor: kitExecutor, At: time.Now().UTC()})
			if err != nil {
				return err
			}
			_, err = kv.Create(ctx, protocol.AttemptKey(k.restart.mayHaveRun.Key), b)
			return err
		},
	}, recorded, k.restart.mayHaveRun); p != "" {
		return p
	}
	if err := k.target.Start(ctx); err != nil {
		return fmt.Sprintf("expected the executor to start again, saw %v", err)
	}
	k.running = true
	res, _, err := k.result(ctx, recorded.Key, short)
	if err != nil {
		return err.Error()
	}
	if res.Executor != kitExecutor {
		return fmt.Sprintf("expected the recorded result to stay, saw one of %s", res.Executor)
	}
	if !k.until(ctx, k.opts.DeclareTimeout, func() bool { return k.pending(ctx, recorded) == 0 }) {
		return "expected the redelivery acknowledged, saw it still in the queue"
	}
	if m, err := k.mark(ctx, recorded.Key); err != nil || m != nil {
		return fmt.Sprintf("expected no attempt mark (the call must not run again), saw %+v (%v)", m, err)
	}
	return ""
}

// deliverOnce publishes calls while no executor serves, takes each one's
// delivery from the function's consumer, does what a dying executor did
// (did, by call key), and naks them for redelivery.
func (k *kit) deliverOnce(ctx context.Context, cons jetstream.Consumer, did map[protocol.CallKey]func() error, calls ...*protocol.Call) string {
	for _, c := range calls {
		if err := k.publish(ctx, c, callOpts{}); err != nil {
			return err.Error()
		}
	}
	batch, err := cons.Fetch(len(calls), jetstream.FetchMaxWait(short))
	if err != nil {
		return err.Error()
	}
	n := 0
	for msg := range batch.Messages() {
		got, err := protocol.DecodeCall(msg.Data())
		if err != nil || did[got.Key] == nil {
			_ = msg.Nak()
			return fmt.Sprintf("expected the queue of %s empty while the executor is stopped, saw another call", calls[0].Function)
		}
		if err := did[got.Key](); err != nil {
			_ = msg.Nak()
			return err.Error()
		}
		if err := msg.Nak(); err != nil {
			return err.Error()
		}
		n++
	}
	if n != len(calls) {
		return fmt.Sprintf("expected to take %d calls from %s's consumer, saw %d (%v)", len(calls), calls[0].Function, n, batch.Error())
	}
	return ""
}

// pending is how many messages of c's call subject the call stream holds.
func (k *kit) pending(ctx context.Context, c *protocol.Call) uint64 {
	s, err := k.js.Stream(ctx, protocol.CallStream(k.team))
	if err != nil {
		return 1
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(c.Subject()))
	if err != nil {
		return 1
	}
	return info.State.Subjects[c.Subject()]
}

func (k *kit) mayHaveRun(ctx context.Context) string {
	c := k.restart.mayHaveRun
	if c == nil {
		return "expected the redelivery case to prepare the call, saw none"
	}
	res, _, err := k.result(ctx, c.Key, short)
	if err != nil {
		return err.Error()
	}
	if p := failure(res, protocol.CodeUnavailable); p != "" {
		return p
	}
	d, h, err := k.deadLetter(ctx, c, short)
	if err != nil {
		return err.Error()
	}
	return deadLetterIs(c, d, h, protocol.ReasonMayHaveRun, protocol.CodeUnavailable, 0)
}

func (k *kit) handedBack(ctx context.Context) string {
	c := k.restart.handedBack
	if c == nil {
		return "expected the stop case to leave a call, saw none"
	}
	if _, _, err := k.result(ctx, c.Key, short); err != nil {
		return err.Error()
	}
	return ""
}
