package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolrelay/toolrelay/internal/platformsim"
	"github.com/toolrelay/toolrelay/internal/tenancy"
)

// binaries are the programs the fleet runs, built from the modules.
type binaries struct{ natsServer, dispatcher, executor string }

// build builds them in the repository's own module (repo), so they are
// what its go.mod pins, not what the bench module would resolve.
func build(ctx context.Context, repo, dir string) (binaries, error) {
	b := binaries{filepath.Join(dir, "nats-server"), filepath.Join(dir, "dispatcher"), filepath.Join(dir, "executor")}
	for pkg, out := range map[string]string{
		"github.com/nats-io/nats-server/v2":             b.natsServer,
		"github.com/toolrelay/toolrelay/cmd/dispatcher": b.dispatcher,
		"github.com/toolrelay/toolrelay/cmd/executor":   b.executor,
	} {
		cmd := osexec.CommandContext(ctx, "go", "build", "-o", out, pkg)
		cmd.Dir, cmd.Stdout, cmd.Stderr = repo, os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			return b, fmt.Errorf("go build %s: %w", pkg, err)
		}
	}
	return b, nil
}

// proc is one process of the fleet, restartable.
type proc struct {
	name string
	bin  string
	args []string
	env  []string
	log  string
	// ready reports the process serving after a (re)start.
	ready func(context.Context) error

	mu      sync.Mutex
	cmd     *osexec.Cmd
	done    chan struct{}
	stopped bool // SIGSTOPped
}

func (p *proc) start(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	logf, err := os.OpenFile(p.log, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	cmd := osexec.Command(p.bin, p.args...)
	cmd.Env = append(os.Environ(), p.env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start %s: %w", p.name, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); logf.Close(); close(done) }()
	p.cmd, p.done, p.stopped = cmd, done, false
	return nil
}

func (p *proc) running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// signal sends sig and, for SIGKILL and SIGTERM, waits up to wait for the
// process to exit (then kills it).
func (p *proc) signal(sig syscall.Signal, wait time.Duration) (exited bool, took time.Duration) {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	if sig == syscall.SIGSTOP {
		p.stopped = true
	}
	if sig == syscall.SIGCONT {
		p.stopped = false
	}
	p.mu.Unlock()
	if cmd == nil {
		return true, 0
	}
	at := time.Now()
	_ = cmd.Process.Signal(sig)
	if sig != syscall.SIGKILL && sig != syscall.SIGTERM {
		return false, 0
	}
	select {
	case <-done:
		return true, time.Since(at)
	case <-time.After(wait):
		_ = cmd.Process.Kill()
		<-done
		return false, time.Since(at)
	}
}

// restart starts the process again and waits until it is ready.
func (p *proc) restart(ctx context.Context) (time.Duration, error) {
	at := time.Now()
	if err := p.start(ctx); err != nil {
		return 0, err
	}
	if p.ready == nil {
		return time.Since(at), nil
	}
	// Waiting ends early if the process exits; either way a failure says
	// what the process last logged.
	rctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	p.mu.Lock()
	done := p.done
	p.mu.Unlock()
	go func() {
		select {
		case <-done:
			cancel()
		case <-rctx.Done():
		}
	}()
	err := p.ready(rctx)
	if err != nil {
		select {
		case <-done:
			err = fmt.Errorf("%w (it exited, code %d)", err, p.exitCode())
		default:
		}
		err = fmt.Errorf("%w; its log ends:\n%s", err, tail(p.log, 20))
	}
	return time.Since(at), err
}

// tail is the last n lines of the file at path.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// fleet is everything the soak runs.
type fleet struct {
	dir         string
	nodes       []*proc
	dispatchers []*proc
	executors   []*proc
	httpAddrs   map[*proc]string
	natsURL     string
	sim         *platformsim.Server
	simURL      string
	platform    *faultyPlatform
	effects     *effectLog
	servers     []*http.Server
	hookN       atomic.Int64
}

// Teams and the executors of each.
var teams = map[string]int{"orders": 2, "billing": 2}

const (
	simAPIKey     = "sk-chaos"
	webhookSecret = "whsec_Y2hhb3MtY2hhb3MtY2hhb3MtY2hhb3MtY2hhb3MhIQ=="
	// runTTL is the Assistants runs' expiry unless a conversation sets a
	// tighter one.
	runTTL = 90 * time.Second
	// ackWait is the executors' ack wait: an executor stopped longer than
	// this has its calls redelivered.
	ackWait = 6 * time.Second
)

func startFleet(ctx context.Context, dir string, b binaries) (*fleet, error) {
	f := &fleet{dir: dir, httpAddrs: map[*proc]string{}}
	ports, err := freePorts(6)
	if err != nil {
		return nil, err
	}
	conf := filepath.Join(dir, "conf")
	res, err := tenancy.Write(conf, tenancy.Options{Teams: keys(teams), Cluster: 3, ClientPort: ports[0], ClusterPort: ports[3],
		StoreDir: filepath.Join(dir, "store")})
	if err != nil {
		return nil, err
	}
	f.natsURL = res.URL
	for i, server := range res.Servers {
		n := &proc{name: fmt.Sprintf("nats-%d", i+1), bin: b.natsServer, args: []string{"-c", server},
			log: filepath.Join(dir, fmt.Sprintf("nats-%d.log", i+1))}
		addr := strings.TrimPrefix(strings.Split(res.URL, ",")[i], "nats://")
		n.ready = func(ctx context.Context) error { return waitTCP(ctx, addr) }
		f.nodes = append(f.nodes, n)
	}
	for _, n := range f.nodes {
		if err := n.start(ctx); err != nil {
			return nil, err
		}
	}
	for _, n := range f.nodes {
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err := n.ready(wctx)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("%s not up: %w", n.name, err)
		}
	}

	// The platform, with faults it can be told to inject, and the HTTP
	// functions' endpoints with the effect log.
	// Webhooks go to whichever dispatcher is running, as behind a load
	// balancer.
	hookAddr, err := f.serve(http.HandlerFunc(f.forwardWebhook))
	if err != nil {
		return nil, err
	}
	f.sim = platformsim.New(platformsim.Options{Model: &platformsim.Model{Scenarios: scenarios()}, APIKey: simAPIKey, RunTTL: runTTL,
		Webhook: &platformsim.Webhook{URL: "http://" + hookAddr + "/webhooks/openai", Secret: webhookSecret}})
	f.platform = &faultyPlatform{next: f.sim}
	simAddr, err := f.serve(f.platform)
	if err != nil {
		return nil, err
	}
	f.simURL = "http://" + simAddr + "/v1"
	f.effects = newEffectLog()
	fnAddr, err := f.serve(f.effects.handler())
	if err != nil {
		return nil, err
	}

	denv, err := readEnv(filepath.Join(conf, "dispatcher.env"))
	if err != nil {
		return nil, err
	}
	for i := range 2 {
		addr := fmt.Sprintf("127.0.0.1:%d", ports[5]+100+i)
		d := &proc{name: fmt.Sprintf("dispatcher-%d", i+1), bin: b.dispatcher, log: filepath.Join(dir, fmt.Sprintf("dispatcher-%d.log", i+1)),
			env: append(denv, "OPENAI_BASE_URL="+f.simURL, "OPENAI_API_KEY="+simAPIKey, "TOOLRELAY_HTTP_ADDR="+addr,
				"OPENAI_WEBHOOK_SECRET="+webhookSecret,
				"TOOLRELAY_SHUTDOWN_TIMEOUT=5s", "TOOLRELAY_SWEEP_INTERVAL=2s", "TOOLRELAY_LOG_LEVEL=warn")}
		d.ready = func(ctx context.Context) error { return waitHTTP(ctx, "http://"+addr+"/readyz") }
		f.httpAddrs[d] = addr
		f.dispatchers = append(f.dispatchers, d)
	}
	for _, d := range f.dispatchers {
		if _, err := d.restart(ctx); err != nil {
			return nil, fmt.Errorf("%s: %w", d.name, err)
		}
	}
	for team, n := range teams {
		file, err := writeFunctions(dir, team, "http://"+fnAddr)
		if err != nil {
			return nil, err
		}
		tenv, err := readEnv(filepath.Join(conf, team+".env"))
		if err != nil {
			return nil, err
		}
		for i := range n {
			name := fmt.Sprintf("executor-%s-%d", team, i+1)
			e := &proc{name: name, bin: b.executor, args: []string{"-config", file}, log: filepath.Join(dir, name+".log"),
				env: append(tenv, "TOOLRELAY_EXECUTOR_NAME="+name, "TOOLRELAY_ACK_WAIT="+ackWait.String(),
					"TOOLRELAY_SHUTDOWN_TIMEOUT=5s", "TOOLRELAY_LOG_LEVEL=warn")}
			e.ready = func(ctx context.Context) error { return waitLog(ctx, e.log, "executor serving") }
			f.executors = append(f.executors, e)
		}
	}
	// The Go executor: this program again, serving orders' Go functions.
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	oenv, err := readEnv(filepath.Join(conf, "orders.env"))
	if err != nil {
		return nil, err
	}
	g := &proc{name: "executor-orders-go", bin: self, args: []string{"-child-executor", "-fn-url", "http://" + fnAddr},
		log: filepath.Join(dir, "executor-orders-go.log"), env: append(oenv, "TOOLRELAY_EXECUTOR_NAME=executor-orders-go")}
	g.ready = func(ctx context.Context) error { return waitLog(ctx, g.log, "executor serving") }
	f.executors = append(f.executors, g)
	for _, e := range f.executors {
		if _, err := e.restart(ctx); err != nil {
			return nil, fmt.Errorf("%s: %w", e.name, err)
		}
	}
	fmt.Printf("chaos: cluster at %s, dispatchers %d, executors %d (teams %v), platform at %s\n",
		f.natsURL, len(f.dispatchers), len(f.executors), keys(teams), f.simURL)
	return f, nil
}

// forwardWebhook hands a platform webhook to a running dispatcher; with
// none running it fails, and the platform delivers again.
func (f *fleet) forwardWebhook(w http.ResponseWriter, r *http.Request) {
	live := f.liveDispatchers()
	if len(live) == 0 {
		http.Error(w, "no dispatcher", http.StatusBadGateway)
		return
	}
	body, _ := io.ReadAll(r.Body)
	addr := live[int(f.hookN.Add(1))%len(live)]
	req, _ := http.NewRequestWithContext(r.Context(), http.MethodPost, "http://"+addr+r.URL.Path, bytes.NewReader(body))
	req.Header = r.Header.Clone()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	w.WriteHeader(resp.StatusCode)
	_, _ = io.Copy(w, resp.Body)
}

func (f *fleet) serve(h http.Handler) (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	f.servers = append(f.servers, srv)
	return ln.Addr().String(), nil
}

// all is every process.
func (f *fleet) all() []*proc {
	return append(append(append([]*proc{}, f.nodes...), f.dispatchers...), f.executors...)
}

// restoreAll continues stopped processes and restarts exited ones.
func (f *fleet) restoreAll(ctx context.Context) {
	f.platform.set(platformOK)
	for _, p := range f.all() {
		p.mu.Lock()
		stopped := p.stopped
		p.mu.Unlock()
		if stopped {
			p.signal(syscall.SIGCONT, 0)
		}
		if !p.running() {
			if _, err := p.restart(ctx); err != nil {
				fmt.Fprintf(os.Stderr, "chaos: restoring %s: %v\n", p.name, err)
			}
		}
	}
}

func (f *fleet) stop() {
	for _, p := range append(append(append([]*proc{}, f.executors...), f.dispatchers...), f.nodes...) {
		p.signal(syscall.SIGCONT, 0)
		p.signal(syscall.SIGTERM, 10*time.Second)
	}
	for _, s := range f.servers {
		_ = s.Close()
	}
	f.sim.Close()
}

// liveDispatcher returns the HTTP address of a running dispatcher, chosen
// by pick among the running ones.
func (f *fleet) liveDispatchers() []string {
	var out []string
	for _, d := range f.dispatchers {
		p := d
		p.mu.Lock()
		stopped := p.stopped
		p.mu.Unlock()
		if p.running() && !stopped {
			out = append(out, f.httpAddrs[d])
		}
	}
	return out
}

// freePorts finds n consecutive free ports (the generated configuration
// numbers nodes consecutively), and the two dispatcher ports 100 above the
// last, which the fleet uses too.
func freePorts(n int) ([]int, error) {
	free := func(p int) bool {
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			return false
		}
		ln.Close()
		return true
	}
	for base := 20000 + os.Getpid()%20000; base < 60000; base += 211 {
		ports := make([]int, n)
		ok := true
		for i := range n {
			ports[i] = base + i
			ok = ok && free(base+i)
		}
		if ok && free(ports[n-1]+100) && free(ports[n-1]+101) {
			return ports, nil
		}
	}
	return nil, fmt.Errorf("no block of %d free ports", n)
}

func waitTCP(ctx context.Context, addr string) error {
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %w", addr, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func waitHTTP(ctx context.Context, url string) error {
	for {
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not ready", url)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// waitLog waits until a line containing text is appended to the log file
// after the call.
func waitLog(ctx context.Context, path, text string) error {
	var from int64
	if st, err := os.Stat(path); err == nil {
		from = st.Size()
	}
	for {
		if fh, err := os.Open(path); err == nil {
			_, _ = fh.Seek(from, 0)
			sc := bufio.NewScanner(fh)
			sc.Buffer(make([]byte, 1<<20), 1<<20)
			for sc.Scan() {
				if strings.Contains(sc.Text(), text) {
					fh.Close()
					return nil
				}
			}
			fh.Close()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %q not logged", path, text)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// auth is the NATS credential of a user of the generated configuration
// (dispatcher, or a team), from its env file.
func (f *fleet) auth(user string) (nats.Option, error) {
	env, err := readEnv(filepath.Join(f.dir, "conf", user+".env"))
	if err != nil {
		return nil, err
	}
	for _, kv := range env {
		if seed, ok := strings.CutPrefix(kv, "NATS_NKEY="); ok {
			return nats.NkeyOptionFromSeed(seed)
		}
	}
	return nil, fmt.Errorf("%s.env has no NATS_NKEY", user)
}

// readEnv reads the settings of an env file the generator wrote.
func readEnv(path string) ([]string, error) { return tenancy.ReadEnvFile(path) }

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}
