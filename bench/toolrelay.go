package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/toolrelay/toolrelay/pkg/dispatch"
	"github.com/toolrelay/toolrelay/pkg/exec"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// sink is an in-process platform: it takes submissions and tells the
// bench, so nothing but toolrelay is measured between intake and
// submission.
type sink struct {
	mu      sync.Mutex
	waiting map[protocol.TurnKey]chan struct{}
	count   atomic.Int64
	// failed counts submitted results that are failures (a curve's calls
	// must all succeed to count).
	failed atomic.Int64
	// why is the first failure's message.
	why atomic.Pointer[string]
	// reached, when not nil, takes the turn and time of each traced
	// submission that reached the platform, by its trace.
	reached map[trace.TraceID]reach
}

type reach struct {
	key protocol.TurnKey
	at  time.Time
}

func newSink() *sink { return &sink{waiting: map[protocol.TurnKey]chan struct{}{}} }

func (*sink) Name() protocol.Platform { return protocol.PlatformResponses }

func (*sink) Poll(context.Context, dispatch.Ref) (*dispatch.Observation, error) {
	return &dispatch.Observation{State: dispatch.ObjectDone}, nil
}

func (s *sink) Submit(ctx context.Context, t *dispatch.Turn, outs []dispatch.Output) (*dispatch.Submission, error) {
	now := time.Now()
	s.count.Add(1)
	for _, o := range outs {
		if o.Result == nil || !o.Result.OK() {
			s.failed.Add(1)
			why := "no result"
			if o.Result != nil {
				why = o.Result.Error.Message
			}
			s.why.CompareAndSwap(nil, &why)
		}
	}
	s.mu.Lock()
	if s.reached != nil {
		s.reached[trace.SpanContextFromContext(ctx).TraceID()] = reach{t.Key, now}
	}
	ch := s.waiting[t.Key]
	delete(s.waiting, t.Key)
	s.mu.Unlock()
	if ch != nil {
		close(ch)
	}
	return &dispatch.Submission{}, nil
}

// expect registers interest in a turn's submission before its intake.
func (s *sink) expect(key protocol.TurnKey) chan struct{} {
	ch := make(chan struct{})
	s.mu.Lock()
	s.waiting[key] = ch
	s.mu.Unlock()
	return ch
}

// stack is toolrelay on one JetStream server: a dispatcher with the sink,
// and executors serving fn, each on its own connection.
type stack struct {
	d *dispatch.Dispatcher
	// more are the other dispatcher replicas; drive takes turns in at
	// each in turn.
	more []*dispatch.Dispatcher
	sink *sink
	stop func()
}

// stackOptions are what a phase may change in its stack: the tracer
// provider of the dispatcher and executors (none: the global one, which
// the bench sets as the commands do when they export no traces).
type stackOptions struct {
	tracer trace.TracerProvider
	// resultBytes is the dispatcher's ResultStreamBytes (0: its default).
	resultBytes int64
	// replicas is how many dispatchers run (0: one), each with the meter
	// provider of its index in meters, if any; streamReplicas is the
	// Replicas of the streams the dispatchers and executors create.
	replicas       int
	meters         []metric.MeterProvider
	streamReplicas int
	// execShutdown is the executors' ShutdownTimeout (0: their default).
	execShutdown time.Duration
}

const benchTeam = "bench"

func newStack(ctx context.Context, env *natsEnv, executors int, fn func() exec.Function, opt ...stackOptions) (*stack, error) {
	var o stackOptions
	if len(opt) > 0 {
		o = opt[0]
	}
	// The dispatcher starts first and stops last, as a deployment's
	// would: executors then declare to a dispatcher that answers, and
	// withdraw before it goes.
	dctx, stopDispatcher := context.WithCancel(ctx)
	ectx, stopExecutors := context.WithCancel(ctx)
	var dwg, ewg sync.WaitGroup
	s := &stack{sink: newSink()}
	s.stop = func() { stopExecutors(); ewg.Wait(); stopDispatcher(); dwg.Wait() }
	var djs jetstream.JetStream
	for i := range max(o.replicas, 1) {
		_, js, err := env.connect("dispatcher")
		if err != nil {
			s.stop()
			return nil, err
		}
		dopts := dispatch.Options{TracerProvider: o.tracer, ResultStreamBytes: o.resultBytes, Replicas: o.streamReplicas}
		if i < len(o.meters) {
			dopts.MeterProvider = o.meters[i]
		}
		d, err := dispatch.New(js, []dispatch.Platform{s.sink}, dopts)
		if err != nil {
			s.stop()
			return nil, err
		}
		dwg.Go(func() { _ = d.Run(dctx); js.Conn().Close() })
		for !d.Ready() {
			select {
			case <-ctx.Done():
				s.stop()
				return nil, ctx.Err()
			case <-time.After(10 * time.Millisecond):
			}
		}
		if i == 0 {
			s.d, djs = d, js
		} else {
			s.more = append(s.more, d)
		}
	}
	for i := range executors {
		_, js, err := env.connect("executor-" + strconv.Itoa(i))
		if err != nil {
			s.stop()
			return nil, err
		}
		ex, err := exec.New(js, benchTeam, exec.Options{Name: "exec-" + strconv.Itoa(i), TracerProvider: o.tracer, Replicas: o.streamReplicas,
			ShutdownTimeout: o.execShutdown})
		if err != nil {
			s.stop()
			return nil, err
		}
		if err := ex.Register(fn()); err != nil {
			s.stop()
			return nil, err
		}
		ewg.Go(func() { runExecutor(ectx, ex, benchTeam); js.Conn().Close() })
	}
	if fn == nil { // no executors: the caller starts its own
		return s, nil
	}
	if err := waitServed(ctx, djs, fn().Name, s.d); err != nil {
		s.stop()
		return nil, err
	}
	return s, nil
}

// waitServed waits until the dispatcher runs and fn is announced with its
// consumer in place.
func waitServed(ctx context.Context, js jetstream.JetStream, name string, d *dispatch.Dispatcher) error {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if d == nil || d.Ready() {
			if specs, err := dispatch.Functions(ctx, js); err == nil {
				for _, s := range specs {
					if s.Name == name {
						if c, err := js.Consumer(ctx, protocol.CallStream(benchTeam), name); err == nil && c.CachedInfo().NumWaiting > 0 {
							return nil
						}
					}
				}
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("%s was not served within 30s", name)
}

var turnSeq atomic.Int64

// turn builds a turn of n calls to fn with unique IDs.
func turn(fn string, n int) *dispatch.TurnRequest {
	id := "resp_bench_" + strconv.FormatInt(turnSeq.Add(1), 10)
	req := &dispatch.TurnRequest{Ref: dispatch.Ref{Platform: protocol.PlatformResponses, ResponseID: id}, Scope: id}
	for i := range n {
		req.Calls = append(req.Calls, dispatch.CallRequest{ID: "call_" + strconv.Itoa(i), Name: fn, Arguments: json.RawMessage(`{"order_id":"A-1001"}`)})
	}
	return req
}

// drive runs turns through s with at most inflight open at once and
// returns the elapsed time.
func (s *stack) drive(ctx context.Context, fn string, turns, calls, inflight int) (time.Duration, error) {
	sem := make(chan struct{}, inflight)
	errs := make(chan error, 1)
	var wg sync.WaitGroup
	var slowest atomic.Int64 // nanoseconds
	start := time.Now()
	defer func() {
		if d := time.Duration(slowest.Load()); d > time.Second {
			fmt.Printf("   (the slowest turn took %s)\n", d.Round(time.Millisecond))
		}
	}()
	ds := append([]*dispatch.Dispatcher{s.d}, s.more...)
	for i := range turns {
		d := ds[i%len(ds)]
		sem <- struct{}{}
		req := turn(fn, calls)
		done := s.sink.expect(req.Key())
		wg.Go(func() {
			defer func() { <-sem }()
			t0 := time.Now()
			defer func() {
				for d := int64(time.Since(t0)); ; {
					if have := slowest.Load(); d <= have || slowest.CompareAndSwap(have, d) {
						return
					}
				}
			}()
			if _, err := d.Intake(ctx, req); err != nil {
				select {
				case errs <- err:
				default:
				}
				return
			}
			select {
			case <-done:
			case <-time.After(60 * time.Second):
				select {
				case errs <- fmt.Errorf("turn %s not submitted within 60s", req.Key()):
				default:
				}
			}
		})
	}
	wg.Wait()
	select {
	case err := <-errs:
		return 0, err
	default:
	}
	return time.Since(start), nil
}

func noop() exec.Function {
	return exec.Function{
		Name:        "noop",
		Parameters:  json.RawMessage(`{"type":"object","properties":{"order_id":{"type":"string"}}}`),
		Concurrency: 64,
		Handler: exec.HandlerFunc(func(context.Context, *exec.Invocation) ([]byte, error) {
			return []byte(`{"status":"shipped"}`), nil
		}),
	}
}

func measureToolrelay(ctx context.Context, cfg config, r *report) error {
	for _, size := range turnSizes {
		env, err := startNATS(ctx, cfg)
		if err != nil {
			return err
		}
		s, err := newStack(ctx, env, 1, noop)
		if err != nil {
			env.close()
			return err
		}
		turns := cfg.calls / size
		inflight := max(inflightCalls/size, 16)
		cpu0, alloc0, msgs0 := cpuTime(), allocated(), env.traffic()
		elapsed, err := s.drive(ctx, "noop", turns, size, inflight)
		cpu := (cpuTime() - cpu0) / time.Duration(turns*size)
		alloc, msgs := alloc0.per(turns*size), msgs0.per(env, turns*size)
		if err != nil {
			s.stop()
			env.close()
			return err
		}
		rate := float64(turns*size) / elapsed.Seconds()
		r.e2e = append(r.e2e, e2eResult{size: size, calls: rate, turns: float64(turns) / elapsed.Seconds(), cpu: cpu, alloc: alloc, msgs: msgs})
		fmt.Printf("   turns of %2d: %.0f calls/s, %.0f turns/s, %s CPU per call, %s allocated per call, server messages per call %s\n", size, rate, float64(turns)/elapsed.Seconds(), usf(cpu), alloc, msgs)

		if size == 1 {
			// Closed loop: one single-call turn at a time, intake to
			// submission.
			lat := make(latencies, 0, cfg.samples)
			for range cfg.samples {
				req := turn("noop", 1)
				done := s.sink.expect(req.Key())
				t0 := time.Now()
				if _, err := s.d.Intake(ctx, req); err != nil {
					s.stop()
					env.close()
					return err
				}
				<-done
				lat = append(lat, time.Since(t0))
			}
			r.e2eLat = lat
			fmt.Printf("   intake to submission p50 %.3fms p99 %.3fms p999 %.3fms\n", msf(lat.pct(50)), msf(lat.pct(99)), msf(lat.pct(99.9)))
		}
		s.stop()
		env.close()
	}
	return nil
}

// measureParallelTurn: a turn of 8 calls of 100 ms each, against running
// them one after another in process (what the SDK's session helper does).
func measureParallelTurn(ctx context.Context, cfg config, r *report) error {
	env, err := startNATS(ctx, cfg)
	if err != nil {
		return err
	}
	defer env.close()
	slow := func() exec.Function {
		f := noop()
		f.Name = "slow100"
		f.Handler = exec.HandlerFunc(func(ctx context.Context, _ *exec.Invocation) ([]byte, error) {
			select {
			case <-time.After(100 * time.Millisecond):
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			return []byte("done"), nil
		})
		return f
	}
	s, err := newStack(ctx, env, 1, slow)
	if err != nil {
		return err
	}
	defer s.stop()
	reps := 20
	if cfg.quick {
		reps = 5
	}
	var lat latencies
	for range reps {
		req := turn("slow100", 8)
		done := s.sink.expect(req.Key())
		t0 := time.Now()
		if _, err := s.d.Intake(ctx, req); err != nil {
			return err
		}
		<-done
		lat = append(lat, time.Since(t0))
	}
	r.parallel = lat
	// Sequential, in process: the handler eight times in a row.
	h := slow().Handler
	t0 := time.Now()
	for range 8 {
		if _, err := h.Handle(ctx, &exec.Invocation{}); err != nil {
			return err
		}
	}
	r.sequential = time.Since(t0)
	fmt.Printf("   8 x 100ms: toolrelay p50 %.1fms (max %.1fms), sequential %.1fms\n", msf(lat.pct(50)), msf(lat.pct(100)), msf(r.sequential))
	return nil
}

// turnSizes are the turn sizes measured; -sizes overrides them.
var turnSizes = []int{1, 4, 16}

// inflightCalls is how many calls the saturation runs keep in flight;
// -inflight overrides it.
var inflightCalls = 256
