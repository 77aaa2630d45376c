package jspub

import (
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolrelay/toolrelay/internal/natstest"
)

// listeners counts the publishers' listeners running in this process.
func listeners() int {
	buf := make([]byte, 1<<22)
	n := runtime.Stack(buf, true)
	return strings.Count(string(buf[:n]), "jspub.(*Async).listen(")
}

// A connection that closes while the first publication sets the publisher
// up leaves no listener (and its ticker) running: the listener is
// registered before the connection is looked at, so it either hears the
// close or is never started.
func TestNoListenerOutlivesItsConnection(t *testing.T) {
	srv := natstest.Start(t)
	for range 300 {
		nc, err := nats.Connect(srv.ClientURL())
		if err != nil {
			t.Fatal(err)
		}
		a := NewAsync(nc, 8, time.Second)
		var wg sync.WaitGroup
		wg.Go(func() { _, _ = a.Publish(nats.NewMsg("x.y")) })
		wg.Go(nc.Close)
		wg.Wait()
	}
	deadline := time.Now().Add(10 * time.Second)
	for listeners() > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d listeners still running 10 s after their connections closed", listeners())
		}
		time.Sleep(10 * time.Millisecond)
	}
}
