package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolrelay/toolrelay/internal/provision"
)

// The floor: the minimal durable pipeline toolrelay is built on, with the
// same stream settings (file storage, work-queue calls, first-result-wins
// results, R1): publish call → pull consumer → ack → publish result →
// consume result. No toolrelay code runs in it.

type floor struct {
	calls, results jetstream.Stream
	got            chan struct{}
	stop           func()
}

func newFloor(ctx context.Context, env *natsEnv) (*floor, error) { return newFloorR(ctx, env, 1) }

// newFloorR is the floor with streams of replicas replicas.
func newFloorR(ctx context.Context, env *natsEnv, replicas int) (*floor, error) {
	_, js, err := env.connect("floor-setup")
	if err != nil {
		return nil, err
	}
	popts := provision.Options{Replicas: replicas}
	cs := provision.CallStreamConfig("bench", popts)
	calls, err := js.CreateStream(ctx, cs)
	if err != nil {
		return nil, err
	}
	results, err := js.CreateStream(ctx, provision.ResultStreamConfig("bench", 0, popts))
	if err != nil {
		return nil, err
	}
	f := &floor{calls: calls, results: results, got: make(chan struct{}, 1<<20)}

	// The worker: its own connection, like an executor process.
	_, wjs, err := env.connect("floor-worker")
	if err != nil {
		return nil, err
	}
	wc, err := calls.CreateConsumer(ctx, jetstream.ConsumerConfig{Durable: "noop", FilterSubject: "fncall.bench.noop", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		return nil, err
	}
	var n atomic.Int64
	wcc, err := wc.Consume(func(m jetstream.Msg) {
		i := n.Add(1)
		if _, err := wjs.PublishAsync("fnresult.bench.r."+strconv.FormatInt(i, 10), m.Data()); err != nil {
			_ = m.Nak()
			return
		}
		_ = m.Ack()
	})
	if err != nil {
		return nil, err
	}
	// The gatherer: its own connection, like a dispatcher.
	rc, err := results.CreateConsumer(ctx, jetstream.ConsumerConfig{Durable: "gather", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		return nil, err
	}
	rcc, err := rc.Consume(func(m jetstream.Msg) {
		_ = m.Ack()
		f.got <- struct{}{}
	})
	if err != nil {
		return nil, err
	}
	f.stop = func() { wcc.Stop(); rcc.Stop(); js.Conn().Close(); wjs.Conn().Close() }
	return f, nil
}

func measureFloor(ctx context.Context, cfg config, r *report) error {
	env, err := startNATS(ctx, cfg)
	if err != nil {
		return err
	}
	defer env.close()
	f, err := newFloor(ctx, env)
	if err != nil {
		return err
	}
	defer f.stop()
	_, js, err := env.connect("floor-publisher")
	if err != nil {
		return err
	}
	defer js.Conn().Close()

	// Throughput at saturation: every call published asynchronously.
	cpu0, alloc0, msgs0 := cpuTime(), allocated(), env.traffic()
	elapsed, err := f.saturate(js, cfg.calls)
	if err != nil {
		return err
	}
	r.floorRate = float64(cfg.calls) / elapsed.Seconds()
	r.floorCPU = (cpuTime() - cpu0) / time.Duration(cfg.calls)
	r.floorAlloc = alloc0.per(cfg.calls)
	r.floorMsgs = msgs0.per(env, cfg.calls)
	fmt.Printf("   throughput %.0f calls/s, %s CPU per call, %s allocated per call, server messages per call %s\n", r.floorRate, usf(r.floorCPU), r.floorAlloc, r.floorMsgs)

	// Round trip, closed loop: one call at a time.
	lat, err := closedLoop(cfg.samples, func() error {
		if _, err := js.PublishAsync("fncall.bench.noop", payload); err != nil {
			return err
		}
		select {
		case <-f.got:
			return nil
		case <-time.After(10 * time.Second):
			return fmt.Errorf("floor: round trip lost")
		}
	})
	if err != nil {
		return err
	}
	r.floorLat = lat
	fmt.Printf("   round trip p50 %.3fms p99 %.3fms\n", msf(lat.pct(50)), msf(lat.pct(99)))
	return nil
}

// saturate publishes calls calls asynchronously through the floor and
// waits for their results.
func (f *floor) saturate(js jetstream.JetStream, calls int) (time.Duration, error) {
	start := time.Now()
	for range calls {
		_, err := js.PublishAsync("fncall.bench.noop", payload)
		if errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
			// A slow server (fsync on every write): wait for what is
			// outstanding, then go on.
			select {
			case <-js.PublishAsyncComplete():
			case <-time.After(30 * time.Second):
				return 0, fmt.Errorf("floor: publications stopped completing")
			}
			_, err = js.PublishAsync("fncall.bench.noop", payload)
		}
		if err != nil {
			return 0, err
		}
	}
	for range calls {
		select {
		case <-f.got:
		case <-time.After(30 * time.Second):
			return 0, fmt.Errorf("floor: results stopped arriving")
		}
	}
	return time.Since(start), nil
}
