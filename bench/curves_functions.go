package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolrelay/toolrelay/pkg/dispatch"
	"github.com/toolrelay/toolrelay/pkg/exec"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// functionsPerTeam is how many functions one team serves here: each
// function has one durable consumer on its team's call stream, and
// nats-server allows 1,000 consumers per stream by default, so 10,000
// functions are ten teams of 1,000.
const functionsPerTeam = 1000

// curveFunctions: N declared functions, served by one executor process
// per team (1,000 functions a team at most), with one dispatcher.
func curveFunctions(ctx context.Context, cfg config, c *curve) error {
	c.title, c.size, c.logX = "Functions", "functions", true
	c.cols = []column{
		{"teams", false}, {"executor start-up to all declared (ms)", true}, {"registry and declarations (KiB)", true},
		{"renewal messages/s", true}, {"renewal KiB/s", true}, {"idle CPU, dispatcher and executors (%)", true},
		{"server RSS (MiB)", true}, {"Functions() (ms)", true}, {"GET /v1/functions (ms)", true},
		{"MCP tools/list, all pages (ms)", true}, {"GET /v1/tools (ms)", true}, {"served, as tools/list lists them (%)", false},
	}
	window := 3 * protocol.LeaseRenewal
	if cfg.quick {
		window = protocol.LeaseRenewal / 2 // a check that it runs: half a renewal period is no measure
	}
	for _, n := range sizes(cfg, []int{10, 100}, []int{10, 1000, 10000}) {
		pctx, cancel := context.WithTimeout(ctx, pointTimeout)
		err := functionsPoint(pctx, c, n, window)
		cancel()
		if err != nil {
			return fmt.Errorf("%d functions: %w", n, err)
		}
	}
	c.note("A team serves at most %d functions: each function has one durable consumer on the team's call stream and nats-server "+
		"allows 1,000 consumers per stream by default (docs/security.md, \"Limits per team\"). The 10,000 functions are ten teams "+
		"of 1,000, each one executor process; all teams share one account here (the traffic and registry do not depend on accounts).", functionsPerTeam)
	c.note("Renewals: every executor process sends all its declarations every %s (protocol.LeaseRenewal), and a dispatcher stores "+
		"each as a key-value write. The messages and bytes are what the server received in %s of idleness, all clients together.",
		protocol.LeaseRenewal, window)
	return nil
}

func functionsPoint(ctx context.Context, c *curve, n int, window time.Duration) error {
	srv, env, done, err := freshServer(ctx, "functions")
	if err != nil {
		return err
	}
	defer done()
	s, err := newStack(ctx, env, 0, nil)
	if err != nil {
		return err
	}
	defer s.stop()
	_, js, err := env.connect("curves-check")
	if err != nil {
		return err
	}
	defer js.Conn().Close()

	teams := (n + functionsPerTeam - 1) / functionsPerTeam
	ectx, stopExecutors := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { stopExecutors(); wg.Wait() }()
	t0 := time.Now()
	for t := range teams {
		team := "f" + strconv.Itoa(t)
		_, ejs, err := env.connect("executor-" + team)
		if err != nil {
			return err
		}
		ex, err := exec.New(ejs, team, exec.Options{Name: "exec-" + team})
		if err != nil {
			return err
		}
		for i := t * functionsPerTeam; i < min(n, (t+1)*functionsPerTeam); i++ {
			f := noop()
			f.Name = fmt.Sprintf("fn_%s_%05d", team, i)
			f.Description = "Looks up order " + strconv.Itoa(i) + " and says where it is."
			if err := ex.Register(f); err != nil {
				return err
			}
		}
		wg.Go(func() { runExecutor(ectx, ex, team); ejs.Conn().Close() })
	}
	for {
		specs, err := dispatch.Functions(ctx, js)
		if err == nil && len(specs) >= n {
			break
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%d of %d functions declared: %w", len(specs), n, ctx.Err())
		}
		time.Sleep(50 * time.Millisecond)
	}
	started := time.Since(t0)
	var registryBytes uint64
	for _, b := range []string{protocol.RegistryBucketSpec().Name, protocol.DeclarationBucketSpec().Name} {
		st, err := js.Stream(ctx, "KV_"+b)
		if err != nil {
			return err
		}
		registryBytes += st.CachedInfo().State.Bytes
	}

	// Idle: what keeping the declarations alive costs.
	v0, err := srv.ask(childReq{Op: "varz"})
	if err != nil {
		return err
	}
	cpu0 := cpuTime()
	time.Sleep(window) // a measurement window, not a wait for a condition
	cpu := cpuTime() - cpu0
	v1, err := srv.ask(childReq{Op: "varz"})
	if err != nil {
		return err
	}
	secs := window.Seconds()
	rss, _, err := srv.mem()
	if err != nil {
		return err
	}

	listTook, err := best(3, func() error { _, err := dispatch.Functions(ctx, js); return err })
	if err != nil {
		return err
	}
	hs := httptest.NewServer(frontDoor(s.d))
	defer hs.Close()
	get := func(path string) func() error {
		return func() error {
			resp, err := http.Get(hs.URL + path)
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			if _, err := io.Copy(io.Discard, resp.Body); err != nil {
				return err
			}
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("GET %s: %s", path, resp.Status)
			}
			return nil
		}
	}
	fnsTook, err := best(3, get("/v1/functions"))
	if err != nil {
		return err
	}
	toolsTook, err := best(3, get("/v1/tools"))
	if err != nil {
		return err
	}
	session, err := mcp.NewClient(&mcp.Implementation{Name: "bench", Version: "1"}, nil).
		Connect(ctx, &mcp.StreamableClientTransport{Endpoint: hs.URL + "/mcp"}, nil)
	if err != nil {
		return err
	}
	defer session.Close()
	listed := 0
	mcpTook, err := best(3, func() error {
		listed = 0
		for _, err := range session.Tools(ctx, nil) {
			if err != nil {
				return err
			}
			listed++
		}
		return nil
	})
	if err != nil {
		return err
	}
	c.add(float64(n), "", float64(teams), msf(started), float64(registryBytes)/1024,
		float64(v1.InMsgs-v0.InMsgs)/secs, float64(v1.InBytes-v0.InBytes)/1024/secs, 100*cpu.Seconds()/secs,
		float64(rss)/(1<<20), msf(listTook), msf(fnsTook), msf(mcpTook), msf(toolsTook), 100*float64(listed)/float64(n))
	if listed < n {
		// Declarations whose renewals fell behind lapsed: what the curve
		// is there to find, so it is a figure, not a failure.
		c.note("At %d functions, tools/list listed %d: the others' declarations had lapsed, their renewals not taken in within "+
			"the lease (%s).", n, listed, protocol.LeaseTTL)
	}
	return nil
}

// best runs f n times and returns its shortest time.
func best(n int, f func() error) (time.Duration, error) {
	var b time.Duration
	for i := range n {
		t0 := time.Now()
		if err := f(); err != nil {
			return 0, err
		}
		if d := time.Since(t0); i == 0 || d < b {
			b = d
		}
	}
	return b, nil
}
