// Package natstest runs a real JetStream server in-process for tests.
//
// It may import nats-server, nats.go and internal/natsembed; only tests
// import it.
package natstest

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolrelay/toolrelay/internal/natsembed"
)

// Server is a JetStream server for one test, shut down when the test ends.
type Server struct {
	*server.Server
	storeDir string
}

// Start starts a server on a random loopback port with file storage in a
// temporary directory.
func Start(t testing.TB) *Server {
	t.Helper()
	dir := t.TempDir()
	s, err := natsembed.Start(natsembed.Options{StoreDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	srv := &Server{Server: s, storeDir: dir}
	// The server running when the test ends (Restart replaces it), shut
	// down after the test's own cleanups, as it was started before them.
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	return srv
}

// Restart shuts the server down and starts it again on the same address
// with the same store, as an operator's restart does: clients reconnect,
// and the server knows only what it rebuilds from its files.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	addr := s.Addr().String()
	s.Shutdown()
	s.WaitForShutdown()
	ns, err := natsembed.Start(natsembed.Options{StoreDir: s.storeDir, Listen: addr})
	if err != nil {
		t.Fatal(err)
	}
	s.Server = ns
}

// RestartEmpty shuts the server down and starts one on the same address
// with an empty store, as a development server restarted without its data
// is: clients reconnect to a server that has none of their streams.
func (s *Server) RestartEmpty(t testing.TB) {
	t.Helper()
	s.storeDir = t.TempDir()
	s.Restart(t)
}

// Connect opens a connection closed when the test ends.
func (s *Server) Connect(t testing.TB) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	return Connect(t, s.ClientURL())
}

// Connect opens a connection to the servers at url, closed when the test
// ends. It reconnects forever, quickly; opts add to or override that.
func Connect(t testing.TB, url string, opts ...nats.Option) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(url, append([]nats.Option{nats.MaxReconnects(-1), nats.ReconnectWait(50 * time.Millisecond)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

// Cluster is three JetStream servers routed together, for tests of
// replicated streams and of a server going away.
type Cluster struct {
	Servers []*server.Server
}

// StartCluster starts a three-node cluster on loopback and waits until it
// has a JetStream meta leader.
func StartCluster(t testing.TB) *Cluster {
	t.Helper()
	routes := make([]int, 3)
	for i := range routes {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		routes[i] = ln.Addr().(*net.TCPAddr).Port
		ln.Close()
	}
	var routeURLs []string
	for _, p := range routes {
		routeURLs = append(routeURLs, fmt.Sprintf("nats://127.0.0.1:%d", p))
	}
	c := &Cluster{}
	for i := range 3 {
		opts := &server.Options{
			ServerName: fmt.Sprintf("n%d", i+1), Host: "127.0.0.1", Port: -1,
			JetStream: true, StoreDir: t.TempDir(), NoLog: true, NoSigs: true,
			Cluster: server.ClusterOpts{Name: "toolrelay-test", Host: "127.0.0.1", Port: routes[i]},
			Routes:  server.RoutesFromStr(strings.Join(routeURLs, ",")),
		}
		s, err := server.NewServer(opts)
		if err != nil {
			t.Fatal(err)
		}
		go s.Start()
		if !s.ReadyForConnections(10 * time.Second) {
			t.Fatalf("cluster node %d not ready", i+1)
		}
		c.Servers = append(c.Servers, s)
		t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	}
	// JetStream is usable once a meta leader is elected.
	nc, js := c.Connect(t)
	defer nc.Close()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := js.AccountInfo(ctx)
		cancel()
		if err == nil {
			return c
		}
		if time.Now().After(deadline) {
			t.Fatalf("cluster has no JetStream leader: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// URL lists every node, so clients fail over.
func (c *Cluster) URL() string {
	var urls []string
	for _, s := range c.Servers {
		if s.Running() {
			urls = append(urls, s.ClientURL())
		}
	}
	return strings.Join(urls, ",")
}

// Connect opens a connection to the cluster, closed when the test ends.
func (c *Cluster) Connect(t testing.TB) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	return Connect(t, c.URL())
}
