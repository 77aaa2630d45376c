package dispatch

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolrelay/toolrelay/internal/natstest"
	"github.com/toolrelay/toolrelay/internal/testutil"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// Results are consumed again by a start after a stop: Run tries a start
// that failed half-way again (JetStream away while a replica restarts),
// and a stream the first try set up must not be left without a consumer.
func TestResultsAreConsumedAgainAfterAStop(t *testing.T) {
	t.Parallel()
	_, js := natstest.Start(t).Connect(t)
	d, err := New(js, []Platform{idlePlatform{}}, Options{Logger: testutil.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.provision(t.Context()); err != nil {
		t.Fatal(err)
	}
	r := newResultStreams(d)
	var got atomic.Int32
	handle := func(m jetstream.Msg) { got.Add(1); _ = m.Ack() }
	if err := r.start(t.Context(), handle); err != nil {
		t.Fatal(err)
	}
	r.stop()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	if err := r.start(ctx, handle); err != nil {
		t.Fatal(err)
	}
	defer r.stop()
	key := protocol.TurnKey("0123456789abcdef0123456789abcdef").Call("call_1")
	if _, err := js.Publish(t.Context(), protocol.ResultSubject(protocol.SystemTeam, key), []byte("{}")); err != nil {
		t.Fatal(err)
	}
	testutil.WaitForWhat(t, 10*time.Second, "the result to be consumed", func() bool { return got.Load() == 1 })
}
