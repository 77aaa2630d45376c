package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/nats-io/nats.go/micro"
	"github.com/redis/go-redis/v9"
)

// measureMicro: NATS micro request-reply, core NATS with no persistence:
// the at-most-once lower bound.
func measureMicro(ctx context.Context, cfg config, r *report) error {
	env, err := startNATS(ctx, cfg)
	if err != nil {
		return err
	}
	defer env.close()
	snc, _, err := env.connect("micro-service")
	if err != nil {
		return err
	}
	defer snc.Close()
	svc, err := micro.AddService(snc, micro.Config{Name: "bench", Version: "1.0.0",
		Endpoint: &micro.EndpointConfig{Subject: "bench.noop", Handler: micro.HandlerFunc(func(req micro.Request) {
			_ = req.Respond([]byte(`{"status":"shipped"}`))
		})}})
	if err != nil {
		return err
	}
	defer svc.Stop()
	cnc, _, err := env.connect("micro-client")
	if err != nil {
		return err
	}
	defer cnc.Close()

	workers := 64
	per := cfg.calls / workers
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	start := time.Now()
	for range workers {
		wg.Go(func() {
			for range per {
				if _, err := cnc.Request("bench.noop", payload, 10*time.Second); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	select {
	case err := <-errs:
		return err
	default:
	}
	r.microRate = float64(per*workers) / time.Since(start).Seconds()
	lat, err := closedLoop(cfg.samples, func() error {
		_, err := cnc.Request("bench.noop", payload, 10*time.Second)
		return err
	})
	if err != nil {
		return err
	}
	r.microLat = lat
	fmt.Printf("   %.0f calls/s; round trip p50 %.3fms\n", r.microRate, msf(lat.pct(50)))
	return nil
}

// measureAsynq: the same work on asynq and Redis, result retrieval
// included. asynq has no way to wait for a result: clients poll the task's
// info, and idle servers poll Redis for tasks.
func measureAsynq(ctx context.Context, cfg config, r *report) error {
	rc := redis.NewClient(&redis.Options{Addr: cfg.redisAddr})
	defer rc.Close()
	if err := rc.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("redis at %s: %w (bench/run.sh starts one)", cfg.redisAddr, err)
	}
	if err := rc.FlushDB(ctx).Err(); err != nil {
		return err
	}
	opt := asynq.RedisClientOpt{Addr: cfg.redisAddr}
	srv := asynq.NewServer(opt, asynq.Config{Concurrency: 64, Queues: map[string]int{"bench": 1},
		Logger: quietAsynq{}, LogLevel: asynq.FatalLevel})
	mux := asynq.NewServeMux()
	mux.HandleFunc("noop", func(ctx context.Context, t *asynq.Task) error {
		_, err := t.ResultWriter().Write([]byte(`{"status":"shipped"}`))
		return err
	})
	if err := srv.Start(mux); err != nil {
		return err
	}
	defer srv.Shutdown()
	client := asynq.NewClient(opt)
	defer client.Close()
	insp := asynq.NewInspector(opt)
	defer insp.Close()

	n := cfg.calls / 4 // asynq is slower; a quarter of the calls keeps the run short
	ids := make([]string, n)
	start := time.Now()
	var wg sync.WaitGroup
	sem := make(chan struct{}, 64)
	var enqErr error
	var mu sync.Mutex
	for i := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			info, err := client.Enqueue(asynq.NewTask("noop", payload), asynq.Queue("bench"), asynq.Retention(time.Hour))
			if err != nil {
				mu.Lock()
				enqErr = err
				mu.Unlock()
				return
			}
			ids[i] = info.ID
		})
	}
	wg.Wait()
	if enqErr != nil {
		return enqErr
	}
	for {
		q, err := insp.GetQueueInfo("bench")
		if err == nil && q.Completed >= n {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, id := range ids { // retrieve every result
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if _, err := insp.GetTaskInfo("bench", id); err != nil {
				mu.Lock()
				enqErr = err
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if enqErr != nil {
		return enqErr
	}
	r.asynqRate = float64(n) / time.Since(start).Seconds()

	samples := min(cfg.samples, 30)
	lat := make(latencies, 0, samples)
	for range samples {
		t0 := time.Now()
		info, err := client.Enqueue(asynq.NewTask("noop", payload), asynq.Queue("bench"), asynq.Retention(time.Hour))
		if err != nil {
			return err
		}
		for {
			ti, err := insp.GetTaskInfo("bench", info.ID)
			if err == nil && ti.State == asynq.TaskStateCompleted {
				break
			}
			time.Sleep(time.Millisecond)
		}
		lat = append(lat, time.Since(t0))
	}
	r.asynqLat = lat
	fmt.Printf("   %.0f calls/s; closed loop p50 %.1fms\n", r.asynqRate, msf(lat.pct(50)))
	return nil
}

type quietAsynq struct{}

func (quietAsynq) Debug(...any) {}
func (quietAsynq) Info(...any)  {}
func (quietAsynq) Warn(...any)  {}
func (quietAsynq) Error(...any) {}
func (quietAsynq) Fatal(...any) {}
