package natsembed_test

import (
	"net"
	"strings"
	"testing"
	"time"

	"github.com/toolrelay/toolrelay/internal/natsembed"
)

// A port another process holds (an old dispatcher still stopping, say)
// fails Start at once with the reason, not after the ready timeout.
func TestStartFailsAtOnceOnAPortInUse(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	start := time.Now()
	s, err := natsembed.Start(natsembed.Options{Listen: ln.Addr().String(), StoreDir: t.TempDir()})
	if err == nil {
		s.Shutdown()
		t.Fatal("Start succeeded on a port in use")
	}
	if !strings.Contains(err.Error(), ln.Addr().String()) || !strings.Contains(err.Error(), "in use") {
		t.Errorf("Start = %v; want the address and that it is in use", err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("Start took %s to fail; want at once", took.Round(time.Millisecond))
	}
}

func TestStartServesOnAFreePort(t *testing.T) {
	s, err := natsembed.Start(natsembed.Options{StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown()
	if !s.JetStreamEnabled() {
		t.Error("JetStream is not enabled")
	}
}
