package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// floor is the raw JetStream pipeline on the same cluster and replication:
// a call published to an R3 work queue, a worker that takes it and
// publishes a result to an R3 stream, and the caller consuming the result.
// Four server operations per call, against toolrelay's own. It runs as the
// dispatcher's user, in the control account.
type floorResult struct {
	calls   int
	elapsed time.Duration
	rtts    []time.Duration
}

// floorPullExpiry keeps the floor's pulls short, as the dispatcher's are: a
// pull sent to a consumer of a stream just created can be lost while its
// leader is elected, and the client notices only when two heartbeats are
// missed. With nats.go's default 30 s expiry that is 30 s, as long as the
// warm-up below waits: CI once failed with "no round trip in 30s" so.
const floorPullExpiry = 5 * time.Second

func (f *fleet) measureFloor(ctx context.Context, d time.Duration, inFlight int) (*floorResult, error) {
	auth, err := f.auth("dispatcher")
	if err != nil {
		return nil, err
	}
	conn := func() (*nats.Conn, jetstream.JetStream, error) {
		nc, err := nats.Connect(f.natsURL, auth)
		if err != nil {
			return nil, nil, err
		}
		js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(inFlight*2))
		return nc, js, err
	}
	nc, js, err := conn()
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	calls, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: "FLOOR_CALLS", Subjects: []string{"floor.call.>"},
		Retention: jetstream.WorkQueuePolicy, Replicas: 3, Storage: jetstream.FileStorage})
	if err != nil {
		return nil, fmt.Errorf("floor: %w", err)
	}
	results, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: "FLOOR_RESULTS", Subjects: []string{"floor.result.>"},
		Replicas: 3, Storage: jetstream.FileStorage})
	if err != nil {
		return nil, fmt.Errorf("floor: %w", err)
	}
	defer func() {
		_ = js.DeleteStream(context.WithoutCancel(ctx), "FLOOR_CALLS")
		_ = js.DeleteStream(context.WithoutCancel(ctx), "FLOOR_RESULTS")
	}()

	// The worker, on its own connection as an executor is.
	wnc, wjs, err := conn()
	if err != nil {
		return nil, err
	}
	defer wnc.Close()
	wc, err := calls.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "worker", AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: inFlight * 2})
	if err != nil {
		return nil, err
	}
	// Each call is answered on its own goroutine (at most inFlight), as
	// an executor runs calls side by side.
	var working sync.WaitGroup
	defer working.Wait()
	wcc, err := wc.Consume(func(m jetstream.Msg) {
		working.Go(func() {
			id := strings.TrimPrefix(m.Subject(), "floor.call.")
			if _, err := wjs.Publish(ctx, "floor.result."+id, m.Data()); err != nil {
				// Again soon, not after the ack wait (30 s): the warm-up's
				// repeats are one call to JetStream (one message ID), so a
				// result lost to a leader election would stall it that long.
				_ = m.NakWithDelay(100 * time.Millisecond)
				return
			}
			_ = m.Ack()
		})
	}, jetstream.PullMaxMessages(inFlight), jetstream.PullExpiry(floorPullExpiry))
	if err != nil {
		return nil, err
	}
	defer wcc.Stop()

	var mu sync.Mutex
	sent := map[string]time.Time{}
	res := &floorResult{}
	slots := make(chan struct{}, inFlight)
	rc, err := results.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "caller", AckPolicy: jetstream.AckNonePolicy})
	if err != nil {
		return nil, err
	}
	rcc, err := rc.Consume(func(m jetstream.Msg) {
		id := strings.TrimPrefix(m.Subject(), "floor.result.")
		mu.Lock()
		if at, ok := sent[id]; ok {
			res.rtts = append(res.rtts, time.Since(at))
			delete(sent, id)
			res.calls++
		}
		mu.Unlock()
		<-slots
	}, jetstream.PullMaxMessages(inFlight), jetstream.PullExpiry(floorPullExpiry))
	if err != nil {
		return nil, err
	}
	defer rcc.Stop()

	payload := []byte(`{"v":1,"arguments":{"order":"A-1"}}`)
	// One round trip before the clock starts: streams just created may
	// still be electing their leaders, which is not the floor's speed.
	// (Once, right after a quiet phase, the floor measured 2 calls/s.)
	slots <- struct{}{}
	mu.Lock()
	sent["warm"] = time.Now()
	mu.Unlock()
	warmed := func() bool { mu.Lock(); defer mu.Unlock(); return res.calls > 0 }
	for giveUp := time.Now().Add(30 * time.Second); !warmed(); time.Sleep(10 * time.Millisecond) {
		if _, err := js.PublishAsync("floor.call.warm", payload, jetstream.WithMsgID("warm")); err != nil {
			return nil, err
		}
		if time.Now().After(giveUp) || ctx.Err() != nil {
			return nil, fmt.Errorf("floor: no round trip in 30s")
		}
	}
	mu.Lock()
	res.calls, res.rtts = 0, nil
	mu.Unlock()

	start := time.Now()
	for i := 0; time.Since(start) < d && ctx.Err() == nil; i++ {
		slots <- struct{}{}
		id := fmt.Sprint(i)
		mu.Lock()
		sent[id] = time.Now()
		mu.Unlock()
		if _, err := js.PublishAsync("floor.call."+id, payload); err != nil {
			return nil, err
		}
	}
	mu.Lock()
	res.elapsed = time.Since(start)
	slices.Sort(res.rtts)
	mu.Unlock()
	return res, nil
}
