// Package natstest runs a real JetStream server in-process for tests.
package natstest

import (
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
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	return &Server{Server: s, storeDir: dir}
}

// Connect opens a connection closed when the test ends.
func (s *Server) Connect(t testing.TB) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(s.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
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
