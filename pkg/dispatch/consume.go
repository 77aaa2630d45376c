package dispatch

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolrelay/toolrelay/internal/provision"
)

// Settings of the consumers every replica shares (the deadline and approval
// timers); the pull expiry is every replica's results consumers' too.
const (
	// sharedAckWait is how long a message handed to a replica that died
	// waits before another replica gets it.
	sharedAckWait = 30 * time.Second
	// sharedPullExpiry keeps pulls short, so a pull lost with a server
	// (failover) is noticed and re-issued within seconds.
	sharedPullExpiry = 5 * time.Second
)

// consume provisions a durable consumer of s that the replicas share
// (explicit acks, from the start of the stream, redelivered without end
// after sharedAckWait) and hands its messages to handle until stop is
// called; stop returns once handle is no longer called. batch bounds the
// messages buffered in this replica. Pull errors are logged, except missed
// heartbeats, which a failover causes and the client recovers from.
func (d *Dispatcher) consume(ctx context.Context, s jetstream.Stream, cfg jetstream.ConsumerConfig, batch int,
	handle jetstream.MessageHandler) (stop func(), err error) {
	cfg.AckPolicy = jetstream.AckExplicitPolicy
	cfg.DeliverPolicy = jetstream.DeliverAllPolicy
	cfg.AckWait = sharedAckWait
	cfg.MaxDeliver = -1
	cons, err := provision.Consumer(ctx, s, cfg)
	if err != nil {
		return nil, err
	}
	cc, err := cons.Consume(handle, jetstream.PullMaxMessages(batch), jetstream.PullExpiry(sharedPullExpiry),
		jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
			if !errors.Is(err, jetstream.ErrNoHeartbeat) {
				d.log.Warn("consuming "+cfg.Durable, "err", err)
			}
		}))
	if err != nil {
		return nil, err
	}
	return func() { cc.Stop(); <-cc.Closed() }, nil
}
