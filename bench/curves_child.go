package main

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	osexec "os/exec"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/toolrelay/toolrelay/internal/natsembed"
	"github.com/toolrelay/toolrelay/pkg/dispatch"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// The curves run the JetStream server, and the dispatcher whose memory
// they measure, each in a process of its own (this program with -role
// server or -role dispatcher), so that a process's memory is its own. A
// child prints one JSON line when it is ready, then answers each request
// line on stdin with one JSON line on stdout; it stops when stdin closes.

// childReq is a request to a child.
type childReq struct {
	Op string `json:"op"`
	// N is a count: turns to take in, samples to take, functions to wait for.
	N int `json:"n,omitempty"`
	// Functions are the functions the latency samples call, in turn.
	Functions []string `json:"functions,omitempty"`
	Timeout   string   `json:"timeout,omitempty"`
	// Path is where "profile" writes the child's CPU profile; "profile"
	// without a path stops it.
	Path string `json:"path,omitempty"`
}

// childResp is a child's answer; which fields are set depends on the request.
type childResp struct {
	Err   string `json:"err,omitempty"`
	URL   string `json:"url,omitempty"`
	RSS   uint64 `json:"rss,omitempty"`
	Heap  uint64 `json:"heap,omitempty"`
	CPU   int64  `json:"cpu_ns,omitempty"`
	Took  int64  `json:"took_ns,omitempty"`
	Count int    `json:"count,omitempty"`
	// Lat are latency samples (ns) and Failed the samples whose call failed.
	Lat    []int64 `json:"lat,omitempty"`
	Failed int     `json:"failed,omitempty"`
	// Why is the first failed call's message.
	Why string `json:"why,omitempty"`
	// Server traffic (varz).
	InMsgs, InBytes, OutMsgs, OutBytes int64 `json:",omitempty"`
	// Sweeps is how many sweeps the dispatcher finished, and SweepNs the
	// seconds (ns) they took in all, from its toolrelay.sweep.duration.
	Sweeps  int   `json:"sweeps,omitempty"`
	SweepNs int64 `json:"sweep_ns,omitempty"`
	// StartupSweepNs is the startup sweep's duration, once done.
	StartupSweepNs int64 `json:"startup_sweep_ns,omitempty"`
}

// serve answers requests on stdin with handle until stdin closes.
func serveRequests(handle func(childReq) childResp) {
	sc := bufio.NewScanner(os.Stdin)
	out := json.NewEncoder(os.Stdout)
	for sc.Scan() {
		var req childReq
		if err := json.Unmarshal(sc.Bytes(), &req); err != nil {
			_ = out.Encode(childResp{Err: err.Error()})
			continue
		}
		var resp childResp
		switch req.Op {
		case "mem":
			resp.RSS, resp.Heap = memNow()
			resp.CPU = int64(cpuTime())
		case "profile":
			resp.Err = errText(profile(req.Path))
		default:
			resp = handle(req)
		}
		_ = out.Encode(resp)
	}
}

// runServerChild is a JetStream server alone: the embedded server
// toolrelay ships (natsembed) on -store, or a server of the -server-config
// file (a nats-config deployment, a cluster node).
func runServerChild(cfg config) error {
	var s *server.Server
	if cfg.serverConfig != "" {
		opts, err := server.ProcessConfigFile(cfg.serverConfig)
		if err != nil {
			return err
		}
		opts.NoSigs, opts.NoLog = true, true
		if s, err = server.NewServer(opts); err != nil {
			return err
		}
		go s.Start()
		if !s.ReadyForConnections(60 * time.Second) {
			return fmt.Errorf("server of %s not ready", cfg.serverConfig)
		}
	} else {
		var err error
		if s, err = natsembed.Start(natsembed.Options{StoreDir: cfg.store, Listen: "127.0.0.1:0"}); err != nil {
			return err
		}
	}
	defer func() { s.Shutdown(); s.WaitForShutdown() }()
	_ = json.NewEncoder(os.Stdout).Encode(childResp{URL: s.ClientURL()})
	serveRequests(func(req childReq) childResp {
		if req.Op != "varz" {
			return childResp{Err: "unknown op " + req.Op}
		}
		v, err := s.Varz(nil)
		if err != nil {
			return childResp{Err: err.Error()}
		}
		return childResp{InMsgs: v.InMsgs, InBytes: v.InBytes, OutMsgs: v.OutMsgs, OutBytes: v.OutBytes}
	})
	return nil
}

// runDispatcherChild is a dispatcher alone, with the bench's platform
// sink, connected to -nats (as -nkey, reaching teams' accounts through
// protocol.TeamAPIPrefixTemplate when -nkey is given).
func runDispatcherChild(ctx context.Context, cfg config) error {
	nc, err := connectAs(cfg.natsURL, "curves-dispatcher", cfg.nkey)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096))
	if err != nil {
		return err
	}
	reader := sdkmetric.NewManualReader()
	o := dispatch.Options{MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)),
		ResultStreamBytes: cfg.resultBytes, SweepInterval: cfg.sweepInterval, RunTTL: cfg.runTTL, Name: cfg.replicaName,
		// The curves' control accounts allow 512 MiB beyond the result
		// streams (curves_teams.go), the default audit trail 1 GiB.
		AuditBytes: 64 << 20}
	if cfg.nkey != "" {
		o.TeamAPIPrefix = protocol.TeamAPIPrefixTemplate
	}
	sk := newSink()
	d, err := dispatch.New(js, []dispatch.Platform{sk}, o)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	ran := make(chan error, 1)
	wg.Go(func() { ran <- d.Run(ctx) })
	for !d.Ready() {
		select {
		case err := <-ran: // it will never be ready
			return fmt.Errorf("dispatcher: %w", cmp.Or(err, errors.New("Run returned before it was ready")))
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
	_ = json.NewEncoder(os.Stdout).Encode(childResp{})
	serveRequests(func(req childReq) childResp {
		timeout := 10 * time.Minute
		if req.Timeout != "" {
			timeout, _ = time.ParseDuration(req.Timeout)
		}
		rctx, stop := context.WithTimeout(ctx, timeout)
		defer stop()
		switch req.Op {
		case "hold": // take in N single-call turns of "hold", left open
			if err := waitDeclared(rctx, js, "hold"); err != nil {
				return childResp{Err: err.Error()}
			}
			t0 := time.Now()
			err := intakeMany(rctx, d, req.N, func(int) *dispatch.TurnRequest { return turn("hold", 1) })
			return childResp{Took: int64(time.Since(t0)), Err: errText(err)}
		case "lat": // closed loop: one single-call turn at a time
			var r childResp
			for i := range req.N {
				req := turn(req.Functions[i%len(req.Functions)], 1)
				done := sk.expect(req.Key())
				t0 := time.Now()
				if _, err := d.Intake(rctx, req); err != nil {
					return childResp{Err: err.Error()}
				}
				select {
				case <-done:
				case <-rctx.Done():
					return childResp{Err: "turn not submitted: " + rctx.Err().Error()}
				}
				r.Lat = append(r.Lat, int64(time.Since(t0)))
			}
			r.Failed = int(sk.failed.Load())
			if why := sk.why.Load(); why != nil {
				r.Why = *why
			}
			return r
		case "served": // wait until N functions are declared
			t0 := time.Now()
			for {
				specs, err := dispatch.Functions(rctx, js)
				if err == nil && len(specs) >= req.N {
					return childResp{Took: int64(time.Since(t0)), Count: len(specs)}
				}
				if rctx.Err() != nil {
					return childResp{Err: fmt.Sprintf("%d functions declared, want %d", len(specs), req.N)}
				}
				time.Sleep(50 * time.Millisecond)
			}
		case "inspect": // the console's list: the open turns nearest their deadline
			t0 := time.Now()
			for {
				l, err := d.InspectTurns(rctx, dispatch.Caller{Name: "bench", Admin: true}, dispatch.TurnQuery{OpenOnly: true})
				if err == nil {
					return childResp{Took: int64(time.Since(t0)), Count: l.OpenTotal}
				}
				if rctx.Err() != nil {
					return childResp{Err: err.Error()}
				}
				time.Sleep(100 * time.Millisecond)
			}
		case "sweeps":
			return sweeps(ctx, reader)
		case "submitted": // turns submitted so far, and failed calls among them
			r := childResp{Count: int(sk.count.Load()), Failed: int(sk.failed.Load())}
			if why := sk.why.Load(); why != nil {
				r.Why = *why
			}
			return r
		}
		return childResp{Err: "unknown op " + req.Op}
	})
	return nil
}

// intakeMany takes in n turns, 256 at a time.
func intakeMany(ctx context.Context, d *dispatch.Dispatcher, n int, mk func(int) *dispatch.TurnRequest) error {
	sem := make(chan struct{}, 256)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failed error
	for i := range n {
		if ctx.Err() != nil {
			break
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if _, err := d.Intake(ctx, mk(i)); err != nil {
				mu.Lock()
				failed = err
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if failed == nil {
		failed = ctx.Err()
	}
	return failed
}

// sweeps reads the dispatcher's toolrelay.sweep.duration.
func sweeps(ctx context.Context, reader *sdkmetric.ManualReader) childResp {
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		return childResp{Err: err.Error()}
	}
	var r childResp
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != "toolrelay.sweep.duration" {
				continue
			}
			h, ok := m.Data.(metricdata.Histogram[float64])
			if !ok {
				continue
			}
			for _, p := range h.DataPoints {
				r.Sweeps += int(p.Count)
				r.SweepNs += int64(p.Sum * 1e9)
				if v, ok := p.Attributes.Value("toolrelay.sweep.startup"); ok && v.AsBool() {
					r.StartupSweepNs = int64(p.Sum * 1e9)
				}
			}
		}
	}
	return r
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// child is a child process of the curves, as the parent sees it.
type child struct {
	cmd     *osexec.Cmd
	in      io.WriteCloser
	out     *bufio.Reader
	mu      sync.Mutex
	started time.Time
	// first is the line the child printed when ready.
	first childResp
	// ready is how long after its start the child said it was ready.
	ready time.Duration
}

// startChild starts this program with args and waits for its first line.
func startChild(ctx context.Context, args ...string) (*child, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	c := &child{cmd: osexec.Command(self, args...)}
	c.cmd.Stderr = os.Stderr
	if c.in, err = c.cmd.StdinPipe(); err != nil {
		return nil, err
	}
	out, err := c.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	c.out = bufio.NewReaderSize(out, 1<<20)
	c.started = time.Now()
	if err := c.cmd.Start(); err != nil {
		return nil, err
	}
	first := make(chan error, 1)
	go func() { first <- c.read(&c.first) }()
	select {
	case err = <-first:
	case <-ctx.Done():
		err = ctx.Err()
	case <-time.After(10 * time.Minute):
		err = fmt.Errorf("child %s not ready within 10m", strings.Join(args, " "))
	}
	if err != nil {
		c.kill()
		return nil, err
	}
	c.ready = time.Since(c.started)
	return c, nil
}

func (c *child) read(v *childResp) error {
	line, err := c.out.ReadBytes('\n')
	if err != nil {
		return fmt.Errorf("child %d: %w", c.cmd.Process.Pid, err)
	}
	if err := json.Unmarshal(line, v); err != nil {
		return fmt.Errorf("child said %q: %w", line, err)
	}
	if v.Err != "" {
		return fmt.Errorf("child: %s", v.Err)
	}
	return nil
}

// ask sends req and returns the answer.
func (c *child) ask(req childReq) (childResp, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	b, _ := json.Marshal(req)
	if _, err := c.in.Write(append(b, '\n')); err != nil {
		return childResp{}, err
	}
	var r childResp
	err := c.read(&r)
	return r, err
}

// mem is the child's resident set and live heap, after a GC.
func (c *child) mem() (rss, heap uint64, err error) {
	r, err := c.ask(childReq{Op: "mem"})
	return r.RSS, r.Heap, err
}

// stop closes the child's stdin and waits for it to exit (SIGKILL after 60s).
func (c *child) stop() {
	_ = c.in.Close()
	done := make(chan struct{})
	go func() { _ = c.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		_ = c.cmd.Process.Kill()
		<-done
	}
}

// kill ends the child at once, as a crash would.
func (c *child) kill() {
	_ = c.cmd.Process.Signal(syscall.SIGKILL)
	_ = c.cmd.Wait()
}

// serverChild starts a JetStream server process: the embedded default on
// a fresh store, or the server of a configuration file.
func serverChild(ctx context.Context, store, configFile string) (*child, error) {
	args := []string{"-role", "server", "-store", store}
	if configFile != "" {
		args = append(args, "-server-config", configFile)
	}
	return startChild(ctx, args...)
}

// dispatcherChild starts a dispatcher process on url; extra are more flags.
func dispatcherChild(ctx context.Context, url string, extra ...string) (*child, error) {
	return startChild(ctx, append([]string{"-role", "dispatcher", "-nats", url}, extra...)...)
}

func itoa(n int) string { return strconv.Itoa(n) }

// connectAs connects to url as the user of the NKEY seed in nkeyFile (none:
// without credentials).
func connectAs(url, name, nkeyFile string) (*nats.Conn, error) {
	opts := []nats.Option{nats.Name(name), nats.MaxReconnects(-1)}
	if nkeyFile != "" {
		o, err := nats.NkeyOptionFromSeed(nkeyFile)
		if err != nil {
			return nil, err
		}
		opts = append(opts, o)
	}
	return nats.Connect(url, opts...)
}

var profileFile *os.File

// profile starts a CPU profile into path, or with no path stops it.
func profile(path string) error {
	if path == "" {
		pprof.StopCPUProfile()
		if profileFile == nil {
			return nil
		}
		err := profileFile.Close()
		profileFile = nil
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	profileFile = f
	return pprof.StartCPUProfile(f)
}

// freshServer starts the embedded server in a process of its own on a new
// store; done stops it and removes the store.
func freshServer(ctx context.Context, name string) (srv *child, env *natsEnv, done func(), err error) {
	dir, err := os.MkdirTemp("", "toolrelay-curves-"+name+"-")
	if err != nil {
		return nil, nil, nil, err
	}
	if srv, err = serverChild(ctx, dir, ""); err != nil {
		os.RemoveAll(dir)
		return nil, nil, nil, err
	}
	return srv, &natsEnv{url: srv.first.URL}, func() { srv.stop(); os.RemoveAll(dir) }, nil
}
