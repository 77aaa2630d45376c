package main

import (
	"context"
	"fmt"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolrelay/toolrelay/internal/natstest"
	"github.com/toolrelay/toolrelay/internal/platformsim"
	"github.com/toolrelay/toolrelay/internal/testutil"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// natsServerBin builds nats-server from the module toolrelay embeds, once
// per test binary: cluster tests run it as separate processes.
var natsServerBin = sync.OnceValues(func() (string, error) {
	path := filepath.Join(binDir, "nats-server")
	if out, err := osexec.Command("go", "build", "-o", path, "github.com/nats-io/nats-server/v2").CombinedOutput(); err != nil {
		return "", fmt.Errorf("building nats-server: %w\n%s", err, out)
	}
	return path, nil
})

// natsNode is one nats-server process of a cluster.
type natsNode struct {
	name, conf, url string
	proc            *proc
}

type natsCluster struct {
	t     *testing.T
	bin   string
	dir   string
	nodes []*natsNode
}

// URL lists every node, as NATS_URL does for a cluster.
func (c *natsCluster) URL() string {
	var urls []string
	for _, n := range c.nodes {
		urls = append(urls, n.url)
	}
	return strings.Join(urls, ",")
}

// startNATSCluster starts three nats-server processes routed together on
// loopback, configured like deploy/nats/n1.conf (fsync on every write), and
// waits until JetStream answers. The ports are found free by listening on
// them and closing, so another process (a test of another package, run at
// the same time) may take one before its node binds it: then the cluster
// is started again on other ports.
func startNATSCluster(t *testing.T) *natsCluster {
	t.Helper()
	bin, err := natsServerBin()
	if err != nil {
		t.Fatal(err)
	}
	for attempt := 1; ; attempt++ {
		c := &natsCluster{t: t, bin: bin, dir: t.TempDir()}
		c.configure()
		for _, n := range c.nodes {
			c.run(n)
		}
		if c.answers(60 * time.Second) {
			return c
		}
		if attempt == 3 || !c.lostAPort() {
			t.Fatalf("the NATS cluster did not start (attempt %d)", attempt)
		}
		t.Logf("a node of the NATS cluster found its port taken; starting the cluster again on other ports")
		c.kill()
	}
}

// configure writes each node's configuration, on ports free a moment ago.
func (c *natsCluster) configure() {
	t := c.t
	var clients, routes []string
	for range 3 {
		clients = append(clients, freeAddr(t))
		routes = append(routes, "nats-route://"+freeAddr(t))
	}
	for i := range 3 {
		name := fmt.Sprintf("nats-%d", i+1)
		conf := filepath.Join(c.dir, name+".conf")
		cfg := fmt.Sprintf(`server_name: %s
listen: %s
jetstream {
  store_dir: %q
  sync_interval: always
}
cluster {
  name: toolrelay-test
  listen: %s
  routes: [%s]
}
`, name, clients[i], filepath.Join(c.dir, name), strings.TrimPrefix(routes[i], "nats-route://"), strings.Join(routes, ", "))
		if err := os.WriteFile(conf, []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
		c.nodes = append(c.nodes, &natsNode{name: name, conf: conf, url: "nats://" + clients[i]})
	}
}

// answers reports whether JetStream answers within d, giving up at once
// if a node has exited.
func (c *natsCluster) answers(d time.Duration) bool {
	_, js := natstest.Connect(c.t, c.URL(), nats.RetryOnFailedConnect(true))
	for deadline := time.Now().Add(d); time.Now().Before(deadline); {
		for _, n := range c.nodes {
			select {
			case <-n.proc.done:
				return false
			default:
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := js.AccountInfo(ctx)
		cancel()
		if err == nil {
			return true
		}
		time.Sleep(50 * time.Millisecond) // between polls
	}
	return false
}

// lostAPort reports whether a node exited because its port was taken.
func (c *natsCluster) lostAPort() bool {
	for _, n := range c.nodes {
		b, _ := os.ReadFile(filepath.Join(c.dir, n.proc.name+".log"))
		if strings.Contains(string(b), "address already in use") {
			return true
		}
	}
	return false
}

// kill stops every node of a cluster that did not start.
func (c *natsCluster) kill() {
	for _, n := range c.nodes {
		_ = n.proc.cmd.Process.Kill()
		<-n.proc.done
	}
}

// run starts (or restarts, with the same store) node n.
func (c *natsCluster) run(n *natsNode) {
	c.t.Helper()
	n.proc = startProc(c.t, c.dir, n.name+"-"+time.Now().Format("150405.000"), c.bin, []string{"-c", n.conf})
}

func (c *natsCluster) node(name string) *natsNode {
	for _, n := range c.nodes {
		if n.name == name {
			return n
		}
	}
	c.t.Fatalf("no node %q", name)
	return nil
}

// On three nats-server processes with every stream and bucket replicated
// three times, SIGKILL of the server leading the results stream mid-run
// loses nothing: every turn is submitted exactly once, and the server,
// restarted on its data, catches up.
func TestBuiltBinariesOnAClusterSurviveAServerKill(t *testing.T) {
	if testing.Short() {
		t.Skip("three nats-server processes")
	}
	c := startNATSCluster(t)
	w := newWorldOn(t, c.URL(), platformsim.FavoriteCityScenario)
	w.env = []string{"TOOLRELAY_REPLICAS=3"}
	w.executor("exec-1", "-demo")
	w.executor("exec-2", "-demo")
	ds := []*proc{w.dispatcher("dispatcher-a"), w.dispatcher("dispatcher-b")}

	_, js := natstest.Connect(t, c.URL())
	ctx := context.Background()
	for _, name := range []string{protocol.ResultStream("demo"), protocol.CallStream("demo")} {
		s, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if r := s.CachedInfo().Config.Replicas; r != 3 {
			t.Fatalf("stream %s has %d replicas, want 3", name, r)
		}
	}
	results, err := js.Stream(ctx, protocol.ResultStream("demo"))
	if err != nil {
		t.Fatal(err)
	}
	leader := c.node(results.CachedInfo().Cluster.Leader)

	const runs = 10
	ids := make([]string, runs)
	for i := range runs {
		thread, run := w.assistantsRun("my favorite city", nil)
		ids[i] = postWatch(t, ds[i%2], fmt.Sprintf(`{"platform":"assistants","thread_id":%q,"run_id":%q}`, thread, run))
		if i == runs/2 {
			if err := leader.proc.cmd.Process.Kill(); err != nil {
				t.Fatal(err)
			}
			<-leader.proc.done
		}
	}
	want := "Your favorite city, Seattle, WA, is also known as The Emerald City. The current weather there is 70f."
	for i, id := range ids {
		st := awaitWatch(t, ds[i%2], id, 120*time.Second)
		if st.State != "completed" || st.Answer != want {
			t.Fatalf("watch %s after %s was killed: %s %q %s", id, leader.name, st.State, st.Answer, st.Error)
		}
	}
	if n := w.sim.Stats().SubmitToolOutputs; n != 2*runs {
		t.Errorf("accepted submissions = %d, want exactly %d (one per turn)", n, 2*runs)
	}

	// The killed server comes back on its own data and catches up.
	c.run(leader)
	testutil.WaitForWhat(t, 60*time.Second, "the restarted server's result-stream replica to catch up", func() bool {
		info, err := results.Info(ctx)
		if err != nil || info.Cluster == nil || len(info.Cluster.Replicas) != 2 {
			return false
		}
		for _, r := range info.Cluster.Replicas {
			if !r.Current || r.Offline {
				return false
			}
		}
		return true
	})
}
