package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	osexec "os/exec"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolrelay/toolrelay/internal/lease"
	"github.com/toolrelay/toolrelay/internal/provision"
	"github.com/toolrelay/toolrelay/pkg/dispatch"
	"github.com/toolrelay/toolrelay/pkg/exec"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// work5ms is a function that waits 5 ms, as an I/O-bound tool does; one
// executor process runs 8 at once, so adding processes adds capacity.
func work5ms() exec.Function {
	f := noop()
	f.Name = "work5ms"
	f.Concurrency = 8
	f.Handler = exec.HandlerFunc(func(ctx context.Context, _ *exec.Invocation) ([]byte, error) {
		select {
		case <-time.After(5 * time.Millisecond):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return []byte("done"), nil
	})
	return f
}

// runExecutorChild serves work5ms until SIGTERM: one executor process.
func runExecutorChild(ctx context.Context, cfg config) error {
	env := &natsEnv{url: cfg.natsURL}
	_, js, err := env.connect("scale-executor")
	if err != nil {
		return err
	}
	ex, err := exec.New(js, benchTeam, exec.Options{})
	if err != nil {
		return err
	}
	if err := ex.Register(work5ms()); err != nil {
		return err
	}
	return ex.Run(ctx)
}

// measureScale runs the same load through 1, 2 and 4 executor processes.
func measureScale(ctx context.Context, cfg config, r *report) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	calls := cfg.calls / 4
	for _, n := range []int{1, 2, 4} {
		env, err := startNATS(ctx, cfg)
		if err != nil {
			return err
		}
		rate, err := scaleOnce(ctx, env, self, n, calls)
		env.close()
		if err != nil {
			return err
		}
		r.scale = append(r.scale, scaleResult{executors: n, calls: rate})
		fmt.Printf("   %d executor process(es): %.0f calls/s\n", n, rate)
	}
	return nil
}

func scaleOnce(ctx context.Context, env *natsEnv, self string, n, calls int) (float64, error) {
	// The dispatcher starts first and stops last, as a deployment's would.
	var procs []*osexec.Cmd
	s := &stack{sink: newSink()}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		for _, p := range procs {
			_ = p.Process.Signal(syscall.SIGTERM)
			_ = p.Wait()
		}
		cancel()
		wg.Wait()
	}()
	_, js, err := env.connect("dispatcher")
	if err != nil {
		return 0, err
	}
	if s.d, err = dispatch.New(js, []dispatch.Platform{s.sink}, dispatch.Options{}); err != nil {
		return 0, err
	}
	wg.Go(func() { _ = s.d.Run(ctx) })
	for !s.d.Ready() {
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
		time.Sleep(10 * time.Millisecond)
	}
	for range n {
		p := osexec.Command(self, "-role", "executor", "-nats", env.url)
		p.Stderr = os.Stderr
		if err := p.Start(); err != nil {
			return 0, err
		}
		procs = append(procs, p)
	}
	if err := waitServed(ctx, js, "work5ms", s.d); err != nil {
		return 0, err
	}
	// Every process is pulling before the clock starts.
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := js.Consumer(ctx, protocol.CallStream(benchTeam), "work5ms")
		if err == nil && c.CachedInfo().NumWaiting >= n {
			break
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("%d executor processes did not all start pulling", n)
		}
		time.Sleep(20 * time.Millisecond)
	}
	elapsed, err := s.drive(ctx, "work5ms", calls, 1, 128)
	if err != nil {
		return 0, err
	}
	return float64(calls) / elapsed.Seconds(), nil
}

// memory is what the memory child reports.
type memory struct {
	Calls      int    `json:"calls"`
	RSSBefore  uint64 `json:"rss_before"`
	RSSAfter   uint64 `json:"rss_after"`
	HeapBefore uint64 `json:"heap_before"`
	HeapAfter  uint64 `json:"heap_after"`
}

// runMemoryChild is a dispatcher process alone: it takes in memCalls
// single-call turns whose calls stay in flight (nobody answers them) and
// reports its memory before and after.
func runMemoryChild(ctx context.Context, cfg config) error {
	env := &natsEnv{url: cfg.natsURL}
	_, js, err := env.connect("memory-dispatcher")
	if err != nil {
		return err
	}
	s := &stack{sink: newSink()}
	if s.d, err = dispatch.New(js, []dispatch.Platform{s.sink}, dispatch.Options{}); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { _ = s.d.Run(ctx) }()
	for !s.d.Ready() {
		time.Sleep(10 * time.Millisecond)
	}
	// The declaration of "hold" was sent before this dispatcher ran, and
	// is sent again within a renewal: until it is in, every call would
	// fail at once as unknown, and its turn close.
	if err := waitDeclared(ctx, js, "hold"); err != nil {
		return err
	}
	rss0, heap0 := memNow()
	sem := make(chan struct{}, 256)
	var wg sync.WaitGroup
	var failed error
	var mu sync.Mutex
	for range cfg.memCalls {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if _, err := s.d.Intake(ctx, turn("hold", 1)); err != nil {
				mu.Lock()
				failed = err
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if failed != nil {
		return failed
	}
	rss1, heap1 := memNow()
	if cfg.heapProfile != "" {
		f, err := os.Create(cfg.heapProfile)
		if err != nil {
			return err
		}
		err = pprof.Lookup("heap").WriteTo(f, 0)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	}
	return json.NewEncoder(os.Stdout).Encode(memory{Calls: cfg.memCalls, RSSBefore: rss0, RSSAfter: rss1, HeapBefore: heap0, HeapAfter: heap1})
}

// memNow returns the process's resident set and live heap, after a GC.
func memNow() (rss, heap uint64) {
	runtime.GC()
	debug.FreeOSMemory()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	b, err := os.ReadFile("/proc/self/status")
	if err == nil {
		sc := bufio.NewScanner(strings.NewReader(string(b)))
		for sc.Scan() {
			if f := strings.Fields(sc.Text()); len(f) >= 2 && f[0] == "VmRSS:" {
				kb, _ := strconv.ParseUint(f[1], 10, 64)
				rss = kb * 1024
			}
		}
	}
	return rss, ms.HeapAlloc
}

// measureMemory: dispatcher memory per in-flight call at 10k and 100k.
func measureMemory(ctx context.Context, cfg config, r *report) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	sizes := []int{10000, 100000}
	if cfg.quick {
		sizes = []int{1000, 5000}
	}
	for _, n := range sizes {
		env, err := startNATS(ctx, cfg)
		if err != nil {
			return err
		}
		m, err := memoryOnce(ctx, cfg, env, self, n, sizes[len(sizes)-1])
		env.close()
		if err != nil {
			return err
		}
		r.memory = append(r.memory, m)
		fmt.Printf("   %d in-flight calls: RSS +%.1f MiB (%.0f B/call), heap +%.1f MiB (%.0f B/call)\n", n,
			float64(m.RSSAfter-m.RSSBefore)/(1<<20), float64(m.RSSAfter-m.RSSBefore)/float64(n),
			float64(m.HeapAfter-m.HeapBefore)/(1<<20), float64(m.HeapAfter-m.HeapBefore)/float64(n))
	}
	return nil
}

func memoryOnce(ctx context.Context, cfg config, env *natsEnv, self string, n, largest int) (memory, error) {
	stopHold, err := serveHold(ctx, env)
	if err != nil {
		return memory{}, err
	}
	defer stopHold()

	args := []string{"-role", "memory", "-nats", env.url, "-mem-calls", strconv.Itoa(n)}
	if cfg.heapProfile != "" && n == largest {
		args = append(args, "-heapprofile", cfg.heapProfile)
	}
	p := osexec.CommandContext(ctx, self, args...)
	p.Stderr = os.Stderr
	out, err := p.Output()
	if err != nil {
		return memory{}, fmt.Errorf("memory child: %w", err)
	}
	var m memory
	if err := json.Unmarshal(out, &m); err != nil {
		return memory{}, fmt.Errorf("memory child said %q: %w", out, err)
	}
	return m, nil
}

// serveHold announces the function "hold" and gives it an executor that
// takes one call and never answers: it counts as served, and the rest of
// its calls wait in line, their turns open until their deadline.
func serveHold(ctx context.Context, env *natsEnv) (stop func(), err error) {
	_, js, err := env.connect("hold-setup")
	if err != nil {
		return nil, err
	}
	var undo []func()
	stop = func() {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
	}
	undo = append(undo, js.Conn().Close)
	defer func() {
		if err != nil {
			stop()
		}
	}()
	st, err := provision.Stream(ctx, js, provision.CallStreamConfig(benchTeam, provision.Options{}))
	if err != nil {
		return nil, err
	}
	hold := protocol.FunctionSpec{Version: protocol.Version, Name: "hold", Team: benchTeam,
		Parameters: json.RawMessage(`{"type":"object"}`), UpdatedAt: time.Now()}
	keeper, err := lease.Declare(ctx, js.Conn(), benchTeam, []*protocol.Declaration{{Version: protocol.Version, Spec: hold,
		Instance: "bench-hold", Executor: "bench", StartedAt: time.Now()}},
		// Declared before the dispatcher (a child) runs: its "no
		// dispatcher answered" until then is expected.
		slog.New(slog.DiscardHandler))
	if err != nil {
		return nil, err
	}
	kctx, stopLease := context.WithCancel(ctx)
	leased := make(chan struct{})
	go func() { keeper.Run(kctx); close(leased) }()
	undo = append(undo, func() { stopLease(); <-leased; _ = keeper.Withdraw(context.WithoutCancel(ctx)) })
	cons, err := st.CreateConsumer(ctx, jetstream.ConsumerConfig{Durable: "hold", FilterSubject: protocol.CallSubject(benchTeam, "hold"), AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		return nil, err
	}
	cc, err := cons.Consume(func(jetstream.Msg) {}, jetstream.PullMaxMessages(1))
	if err != nil {
		return nil, err
	}
	undo = append(undo, cc.Stop)
	return stop, nil
}

// waitDeclared waits until the registry has fn.
func waitDeclared(ctx context.Context, js jetstream.JetStream, fn string) error {
	deadline := time.Now().Add(2 * protocol.LeaseTTL)
	for time.Now().Before(deadline) {
		if specs, err := dispatch.Functions(ctx, js); err == nil {
			for _, s := range specs {
				if s.Name == fn {
					return nil
				}
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("%s was not declared within %s", fn, 2*protocol.LeaseTTL)
}

// runExecutor runs ex until ctx ends, and says so when it stops before:
// a measurement that waits for what the executor never does (its
// declarations, say) must not wait without a word. A full disk refusing
// its streams was such a stop.
func runExecutor(ctx context.Context, ex *exec.Executor, team string) {
	if err := ex.Run(ctx); err != nil && ctx.Err() == nil {
		fmt.Fprintf(os.Stderr, "bench: the executor of team %s stopped: %v\n", team, err)
	}
}
