package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/toolrelay/toolrelay/internal/backoff"
	"github.com/toolrelay/toolrelay/internal/provision"
)

// replicaCalls is how many single-call turns each rate measurement of
// the replicas and cluster curves drives.
func replicaCalls(cfg config) int {
	if cfg.quick {
		return 500
	}
	return 10000
}

// curveReplicas: one against two dispatcher replicas on one server, with
// one executor, beside the floor on the same server: single-call turns,
// and turns of 16 calls.
func curveReplicas(ctx context.Context, cfg config, c *curve) error {
	c.title, c.size = "Dispatcher replicas on one server", "dispatcher replicas"
	c.cols = []column{
		{"floor (calls/s)", false}, {"toolrelay (calls/s)", true}, {"toolrelay ÷ floor", true},
		{"CPU per call, all processes (µs)", true},
		{"turns of 16: toolrelay (calls/s)", true}, {"turns of 16: CPU per call (µs)", true},
		{"turns passed on between replicas (%)", false}, {"turns taken over (%)", false},
	}
	srv, env, done, err := freshServer(ctx, "replicas")
	if err != nil {
		return err
	}
	defer done()
	floorRate, err := floorOn(ctx, env, 1, replicaCalls(cfg), []*child{srv})
	if err != nil {
		return err
	}
	for _, n := range []int{1, 2} {
		rate, cpu, counts, err := toolrelayOn(ctx, env, n, 1, 1, replicaCalls(cfg), []*child{srv})
		if err != nil {
			return fmt.Errorf("%d replicas: %w", n, err)
		}
		rate16, cpu16, counts16, err := toolrelayOn(ctx, env, n, 1, 16, replicaCalls(cfg), []*child{srv})
		if err != nil {
			return fmt.Errorf("%d replicas, turns of 16: %w", n, err)
		}
		turns := float64(replicaCalls(cfg)) + float64(replicaCalls(cfg)/16)
		c.add(float64(n), "", floorRate.rate, rate, rate/floorRate.rate, float64(cpu)/float64(time.Microsecond),
			rate16, float64(cpu16)/float64(time.Microsecond),
			100*(counts["toolrelay.results.passed_on"]+counts16["toolrelay.results.passed_on"])/turns,
			100*(counts["toolrelay.turns.taken_over"]+counts16["toolrelay.turns.taken_over"])/turns)
	}
	c.note("Turns of a no-op function, %d calls in all for each size: single-call turns at most 256 open at once, turns of 16 calls "+
		"at most 16 (256 calls); taken in at each replica in turn; one executor; the server in a process of its own, the dispatchers and the "+
		"executor in the bench's, so the replicas share the machine's two cores with the server. CPU per call is every process's "+
		"CPU time over the run, server included. The floor is measured on the same server first.", replicaCalls(cfg))
	return nil
}

// floorResult is the floor's rate and CPU per call.
type floorResult struct {
	rate float64
	cpu  time.Duration
}

// floorOn measures the floor's throughput on env with streams of
// replicas replicas; servers are the server processes whose CPU counts.
func floorOn(ctx context.Context, env *natsEnv, replicas, calls int, servers []*child) (floorResult, error) {
	f, err := newFloorR(ctx, env, replicas)
	if err != nil {
		return floorResult{}, err
	}
	_, js, err := env.connect("floor-publisher")
	if err != nil {
		f.stop()
		return floorResult{}, err
	}
	defer js.Conn().Close()
	cpu0, err := cpuOf(servers)
	if err != nil {
		f.stop()
		return floorResult{}, err
	}
	elapsed, err := f.saturate(js, calls)
	cpu1, cerr := cpuOf(servers)
	f.stop()
	if err == nil {
		err = cerr
	}
	if err != nil {
		return floorResult{}, err
	}
	// The floor's streams go: toolrelay's executor makes its own.
	_, djs, err := env.connect("floor-cleanup")
	if err != nil {
		return floorResult{}, err
	}
	defer djs.Conn().Close()
	for _, name := range []string{f.calls.CachedInfo().Config.Name, f.results.CachedInfo().Config.Name} {
		if err := djs.DeleteStream(ctx, name); err != nil {
			return floorResult{}, err
		}
	}
	return floorResult{rate: float64(calls) / elapsed.Seconds(), cpu: (cpu1 - cpu0) / time.Duration(calls)}, nil
}

// cpuOf is the CPU time this process and the children have used.
func cpuOf(children []*child) (time.Duration, error) {
	total := cpuTime()
	for _, c := range children {
		r, err := c.ask(childReq{Op: "mem"})
		if err != nil {
			return 0, err
		}
		total += time.Duration(r.CPU)
	}
	return total, nil
}

// toolrelayOn measures toolrelay's throughput on env with n dispatcher
// replicas and streams of replicas replicas, in turns of size calls:
// calls/s, CPU per call of this process and servers, and the dispatchers'
// counters summed.
func toolrelayOn(ctx context.Context, env *natsEnv, n, replicas, size, calls int, servers []*child) (float64, time.Duration, map[string]float64, error) {
	if err := timersGone(ctx, env); err != nil {
		return 0, 0, nil, err
	}
	readers := make([]*sdkmetric.ManualReader, n)
	meters := make([]metric.MeterProvider, n)
	for i := range readers {
		readers[i] = sdkmetric.NewManualReader()
		meters[i] = sdkmetric.NewMeterProvider(sdkmetric.WithReader(readers[i]))
	}
	s, err := newStack(ctx, env, 1, noop, stackOptions{replicas: n, meters: meters, streamReplicas: replicas})
	if err != nil {
		return 0, 0, nil, err
	}
	defer s.stop()
	// Warm up: connections, the registry, the first turns.
	if _, err := s.drive(ctx, "noop", 200, 1, 64); err != nil {
		return 0, 0, nil, err
	}
	counts0 := sumCounters(ctx, readers)
	cpu0, err := cpuOf(servers)
	if err != nil {
		return 0, 0, nil, err
	}
	elapsed, err := s.drive(ctx, "noop", calls/size, size, 256/size)
	if err != nil {
		return 0, 0, nil, err
	}
	cpu1, err := cpuOf(servers)
	if err != nil {
		return 0, 0, nil, err
	}
	if f := s.sink.failed.Load(); f > 0 {
		return 0, 0, nil, fmt.Errorf("%d calls failed: %s", f, *s.sink.why.Load())
	}
	counts := sumCounters(ctx, readers)
	for k, v := range counts0 {
		counts[k] -= v
	}
	calls = calls / size * size
	return float64(calls) / elapsed.Seconds(), (cpu1 - cpu0) / time.Duration(calls), counts, nil
}

// sumCounters adds up the integer counters the readers have, by name.
func sumCounters(ctx context.Context, readers []*sdkmetric.ManualReader) map[string]float64 {
	out := map[string]float64{}
	for _, r := range readers {
		var rm metricdata.ResourceMetrics
		if r.Collect(ctx, &rm) != nil {
			continue
		}
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				if sum, ok := m.Data.(metricdata.Sum[int64]); ok {
					for _, p := range sum.DataPoints {
						out[m.Name] += float64(p.Value)
					}
				}
			}
		}
	}
	return out
}

// curveCluster: the three-node cluster with every stream on three
// replicas (R3), against one node (R1): toolrelay's throughput beside
// the floor measured on the same servers in the same run.
func curveCluster(ctx context.Context, cfg config, c *curve) error {
	c.title, c.size = "One server (R1) against a three-node cluster (R3)", "stream replicas"
	c.cols = []column{
		{"floor (calls/s)", true}, {"toolrelay (calls/s)", true}, {"toolrelay ÷ floor", false},
		{"floor CPU per call (µs)", false}, {"toolrelay CPU per call (µs)", true},
	}
	for _, nodes := range []int{1, 3} {
		if err := clusterPoint(ctx, cfg, c, nodes); err != nil {
			return fmt.Errorf("%d nodes: %w", nodes, err)
		}
	}
	c.note("Each node is a nats-server process (the embedded server's code, from a configuration file like the one `dispatcher " +
		"nats-config -cluster 3` writes, without the accounts: `sync_interval: always`, file storage), all three on this one " +
		"two-core machine, so the cluster's ceiling here is the machine's CPU, not the network. One dispatcher and one executor in " +
		"the bench's process; single-call turns of a no-op function, at most 256 open. CPU per call is every process's, the " +
		"nodes' included. The floor is measured on the same servers first.")
	return nil
}

func clusterPoint(ctx context.Context, cfg config, c *curve, nodes int) error {
	dir, err := os.MkdirTemp("", "toolrelay-curves-cluster-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	files, err := clusterConfig(dir, nodes)
	if err != nil {
		return err
	}
	var servers []*child
	defer func() {
		for _, s := range servers {
			s.stop()
		}
	}()
	for _, f := range files {
		s, err := serverChild(ctx, dir, f)
		if err != nil {
			return err
		}
		servers = append(servers, s)
	}
	env := &natsEnv{url: servers[0].first.URL}
	if err := jetStreamReady(ctx, env); err != nil {
		return err
	}
	fl, err := floorOn(ctx, env, nodes, replicaCalls(cfg), servers)
	if err != nil {
		return err
	}
	rate, cpu, _, err := toolrelayOn(ctx, env, 1, nodes, 1, replicaCalls(cfg), servers)
	if err != nil {
		return err
	}
	c.add(float64(nodes), fmt.Sprintf("R%d (%d node%s)", nodes, nodes, map[bool]string{true: "s"}[nodes > 1]),
		fl.rate, rate, rate/fl.rate, float64(fl.cpu)/float64(time.Microsecond), float64(cpu)/float64(time.Microsecond))
	return nil
}

// clusterConfig writes the configuration files of a cluster of nodes (one:
// a single server with the same settings) and returns their paths.
func clusterConfig(dir string, nodes int) ([]string, error) {
	var ports, routes []int
	for range 2 * nodes {
		p, err := freePort()
		if err != nil {
			return nil, err
		}
		if len(ports) < nodes {
			ports = append(ports, p)
		} else {
			routes = append(routes, p)
		}
	}
	var files []string
	for i := range nodes {
		conf := fmt.Sprintf("server_name: n%d\nlisten: 127.0.0.1:%d\njetstream {\n  store_dir: %q\n  sync_interval: always\n}\n",
			i+1, ports[i], filepath.Join(dir, fmt.Sprintf("n%d", i+1)))
		if nodes > 1 {
			conf += fmt.Sprintf("cluster {\n  name: toolrelay\n  listen: 127.0.0.1:%d\n  routes: [\n", routes[i])
			for _, r := range routes {
				conf += fmt.Sprintf("    nats-route://127.0.0.1:%d\n", r)
			}
			conf += "  ]\n}\n"
		}
		f := filepath.Join(dir, fmt.Sprintf("n%d.conf", i+1))
		if err := os.WriteFile(f, []byte(conf), 0o644); err != nil {
			return nil, err
		}
		files = append(files, f)
	}
	return files, nil
}

// jetStreamReady waits until the servers at env answer JetStream requests
// (a cluster has elected its meta leader).
func jetStreamReady(ctx context.Context, env *natsEnv) error {
	_, js, err := env.connect("curves-ready")
	if err != nil {
		return err
	}
	defer js.Conn().Close()
	for {
		if _, err = js.AccountInfo(ctx); err == nil {
			return nil
		}
		if err := sleepCtx(ctx, 100*time.Millisecond); err != nil {
			return fmt.Errorf("JetStream not ready: %w", err)
		}
	}
}

// timersGone waits until the deadline timers of an earlier measurement on
// env are gone (a closed turn's markers stay a second): the replicas'
// startup sweep would otherwise read every one of those turns while the
// next measurement runs.
func timersGone(ctx context.Context, env *natsEnv) error {
	nc, js, err := env.connect("timers-gone")
	if err != nil {
		return err
	}
	defer nc.Close()
	deadline := time.Now().Add(30 * time.Second)
	for {
		info, err := js.Stream(ctx, provision.TimerStream)
		if errors.Is(err, jetstream.ErrStreamNotFound) || err == nil && info.CachedInfo().State.Msgs == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the deadline timers of the measurement before are still there after 30 s (%v)", err)
		}
		if !backoff.Sleep(ctx, 100*time.Millisecond) {
			return ctx.Err()
		}
	}
}
