package exec

import (
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// ackDelay is how long after its result is stored a call is acknowledged
// at most. The result's storage sets off, at the same instant, the
// dispatcher's compare-and-set that closes the turn; the acknowledgement is
// a work-queue delete the server stores too, and sent at once it is served
// first, on the same cores, on the turn's critical path. Sent a moment
// later, with the others of that moment, it is not. Nobody waits for it:
// until it is sent the call is only redelivered if this process dies, and
// the redelivery finds the result recorded and skips the call.
const ackDelay = time.Millisecond

// acker acknowledges the calls whose outcome is recorded, ackDelay after
// the first of a batch. Stop sends whatever it holds: an executor that
// stops leaves no call to be redelivered for want of an acknowledgement.
type acker struct {
	in   chan jetstream.Msg
	done chan struct{}
	log  *slog.Logger
}

func newAcker(log *slog.Logger) *acker {
	a := &acker{in: make(chan jetstream.Msg, 1024), done: make(chan struct{}), log: log}
	go a.run()
	return a
}

// ack acknowledges msg soon. It must not be called after stop.
func (a *acker) ack(msg jetstream.Msg) { a.in <- msg }

// stop acknowledges what is held and returns once it is sent.
func (a *acker) stop() {
	close(a.in)
	<-a.done
}

func (a *acker) run() {
	defer close(a.done)
	var held []jetstream.Msg
	wait := time.NewTimer(ackDelay)
	wait.Stop()
	defer wait.Stop()
	send := func() {
		for i, msg := range held {
			if err := msg.Ack(); err != nil {
				// The result is recorded: a redelivery finds it and skips
				// the call.
				a.log.Warn("ack failed after recording the result", "subject", msg.Subject(), "err", err)
			}
			held[i] = nil
		}
		held = held[:0]
	}
	for {
		select {
		case msg, ok := <-a.in:
			if !ok {
				send()
				return
			}
			if len(held) == 0 {
				wait.Reset(ackDelay)
			}
			held = append(held, msg)
		case <-wait.C:
			send()
		}
	}
}
