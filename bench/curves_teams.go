package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolrelay/toolrelay/internal/tenancy"
	"github.com/toolrelay/toolrelay/pkg/exec"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// curveTeams: N teams, each its own NATS account (dispatcher nats-config,
// internal/tenancy), each with one executor process's worth of one no-op
// function, against one dispatcher on one server.
func curveTeams(ctx context.Context, cfg config, c *curve) error {
	c.title, c.size, c.logX = "Teams (one NATS account each)", "teams", true
	c.cols = []column{
		{"nats-config (ms)", true}, {"nats-config output (KiB)", true}, {"storage reserved at the defaults (GiB)", false},
		{"server start-up (ms)", true}, {"server RSS (MiB)", true},
		{"dispatcher start-up (ms)", true}, {"all teams served (ms)", true}, {"dispatcher RSS (MiB)", true}, {"dispatcher restart (ms)", true},
		{"call p50 (ms)", true}, {"call p99 (ms)", false},
	}

	samples := 400
	if cfg.quick {
		samples = 100
	}
	for _, n := range sizes(cfg, []int{1, 10}, []int{1, 10, 100, 300}) {
		pctx, cancel := context.WithTimeout(ctx, pointTimeout)
		err := teamsPoint(pctx, c, n, samples)
		cancel()
		if err != nil {
			return fmt.Errorf("%d teams: %w", n, err)
		}
	}
	c.note("Each team's account is given 16 MiB of file storage and an 8 MiB result stream here, and the control account 512 MiB " +
		"besides the result streams, not the defaults (1 GiB, 256 MiB and 4 GiB): the server reserves every account's limits when " +
		"it enables JetStream, and refuses JetStream to all of them when they add up to more than its max_file_store (75%% of the " +
		"free disk by default) or max_memory_store (75%% of the memory). The column \"storage reserved at the defaults\" is what " +
		"`nats-config` reports for the defaults: teams × (1 GiB + 256 MiB) + 4.25 GiB of file storage. The per-call latency is " +
		"higher than the toolrelay phase's because `nats-config` writes `sync_interval: always` (every write is fsynced).")
	return nil
}

func teamsPoint(ctx context.Context, c *curve, n, samples int) error {
	dir, err := os.MkdirTemp("", "toolrelay-curves-teams-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("t%03d", i)
	}
	port, err := freePort()
	if err != nil {
		return err
	}
	const resultBytes = 8 << 20
	t0 := time.Now()
	res, err := tenancy.Write(filepath.Join(dir, "conf"), tenancy.Options{Teams: names, ClientPort: port, StoreDir: filepath.Join(dir, "store"),
		Limits: tenancy.Limits{MaxFile: 16 << 20}, Control: tenancy.ControlLimits{MaxFile: int64(n+1)*resultBytes + 512<<20},
		ResultBytes: resultBytes})
	if err != nil {
		return err
	}
	configTook := time.Since(t0)
	size, err := dirSize(filepath.Join(dir, "conf"))
	if err != nil {
		return err
	}
	defaults, err := tenancy.Write(filepath.Join(dir, "defaults"), tenancy.Options{Teams: names})
	if err != nil {
		return err
	}

	srv, err := serverChild(ctx, filepath.Join(dir, "store"), res.Servers[0])
	if err != nil {
		return err
	}
	defer srv.stop()
	nk := filepath.Join(dir, "conf", "dispatcher.nk")
	d, err := dispatcherChild(ctx, srv.first.URL, "-nkey", nk, "-result-bytes", itoa(resultBytes))
	if err != nil {
		return err
	}
	defer func() { d.stop() }()

	// One executor per team, each on its own connection as its team's user.
	ectx, stopExecutors := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { stopExecutors(); wg.Wait() }()
	fns := make([]string, n)
	t0 = time.Now()
	for i, team := range names {
		nc, err := connectAs(srv.first.URL, "executor-"+team, filepath.Join(dir, "conf", team+".nk"))
		if err != nil {
			return err
		}
		js, err := jetstream.New(nc)
		if err != nil {
			return err
		}
		ex, err := exec.New(js, team, exec.Options{Name: "exec-" + team, ControlAPIPrefix: protocol.ControlAPIPrefix})
		if err != nil {
			return err
		}
		f := noop()
		f.Name = "noop_" + team
		fns[i] = f.Name
		if err := ex.Register(f); err != nil {
			return err
		}
		wg.Go(func() { runExecutor(ectx, ex, team); nc.Close() })
	}
	if _, err := d.ask(childReq{Op: "served", N: n, Timeout: "5m"}); err != nil {
		return err
	}
	served := time.Since(t0)
	if err := waitPulling(ctx, srv.first.URL, dir, names, fns); err != nil {
		return err
	}
	lat, err := d.ask(childReq{Op: "lat", N: samples, Functions: fns})
	if err != nil {
		return err
	}
	if lat.Failed > 0 {
		return fmt.Errorf("%d of %d calls failed", lat.Failed, samples)
	}
	l := make(latencies, len(lat.Lat))
	for i, v := range lat.Lat {
		l[i] = time.Duration(v)
	}
	drss, _, err := d.mem()
	if err != nil {
		return err
	}
	srss, _, err := srv.mem()
	if err != nil {
		return err
	}
	// A restart of the dispatcher with every team's state in place.
	first := d.ready
	d.stop()
	if d, err = dispatcherChild(ctx, srv.first.URL, "-nkey", nk, "-result-bytes", itoa(resultBytes)); err != nil {
		return err
	}
	c.add(float64(n), "", msf(configTook), float64(size)/1024, float64(defaults.ReservedFile)/(1<<30),
		msf(srv.ready), float64(srss)/(1<<20), msf(first), msf(served), float64(drss)/(1<<20), msf(d.ready),
		msf(l.pct(50)), msf(l.pct(99)))
	return nil
}

// waitPulling waits until each team's function has an executor pulling.
func waitPulling(ctx context.Context, url, dir string, teams, fns []string) error {
	nc, err := connectAs(url, "curves-check", filepath.Join(dir, "conf", "dispatcher.nk"))
	if err != nil {
		return err
	}
	defer nc.Close()
	for i, team := range teams {
		js, err := jetstream.NewWithAPIPrefix(nc, protocol.TeamAPIPrefix(protocol.TeamAPIPrefixTemplate, team))
		if err != nil {
			return err
		}
		for {
			if ctx.Err() != nil {
				return fmt.Errorf("team %s: nobody pulls %s: %w", team, fns[i], ctx.Err())
			}
			if ok, _ := pulling(ctx, js, team, fns[i]); ok {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return nil
}

// pulling reports whether fn of team has a consumer with a pull waiting,
// listing the team's consumers (the read the control account may make).
func pulling(ctx context.Context, js jetstream.JetStream, team, fn string) (bool, error) {
	s, err := js.Stream(ctx, protocol.CallStream(team))
	if err != nil {
		return false, err
	}
	l := s.ListConsumers(ctx)
	for ci := range l.Info() {
		if ci.Name == fn && ci.NumWaiting > 0 {
			return true, nil
		}
	}
	return false, l.Err()
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// dirSize is the bytes of the files in dir.
func dirSize(dir string) (int64, error) {
	var n int64
	err := filepath.WalkDir(dir, func(_ string, e os.DirEntry, err error) error {
		if err != nil || e.IsDir() {
			return err
		}
		fi, err := e.Info()
		if err == nil {
			n += fi.Size()
		}
		return err
	})
	return n, err
}
