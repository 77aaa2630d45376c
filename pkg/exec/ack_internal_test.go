package exec

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolrelay/toolrelay/internal/natstest"
	"github.com/toolrelay/toolrelay/internal/testutil"
)

// fetchCalls publishes n messages to a work-queue stream and returns them
// as one consumer delivered them, unacknowledged.
func fetchCalls(t *testing.T, n int) (jetstream.Stream, []jetstream.Msg) {
	t.Helper()
	ctx := t.Context()
	_, js := natstest.Start(t).Connect(t)
	s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "CALLS", Subjects: []string{"calls.>"},
		Retention: jetstream.WorkQueuePolicy, Storage: jetstream.FileStorage})
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if _, err := js.Publish(ctx, "calls."+strconv.Itoa(i), []byte("call")); err != nil {
			t.Fatal(err)
		}
	}
	c, err := s.CreateConsumer(ctx, jetstream.ConsumerConfig{Durable: "fn", AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	batch, err := c.FetchNoWait(n)
	if err != nil {
		t.Fatal(err)
	}
	var msgs []jetstream.Msg
	for m := range batch.Messages() {
		msgs = append(msgs, m)
	}
	if len(msgs) != n {
		t.Fatalf("fetched %d calls, want %d", len(msgs), n)
	}
	return s, msgs
}

// stored is how many calls the work queue still holds: an acknowledged
// call is deleted from it.
func stored(t *testing.T, s jetstream.Stream) uint64 {
	info, err := s.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

// Calls handed to the acker are acknowledged a moment later, with no stop.
func TestAckerAcknowledgesWhatItHolds(t *testing.T) {
	s, msgs := fetchCalls(t, 20)
	a := newAcker(testutil.Logger(t))
	t.Cleanup(a.stop)
	for _, m := range msgs {
		a.ack(m)
	}
	testutil.WaitFor(t, 5*time.Second, func() bool { return stored(t, s) == 0 })
}

// A stop sends what the acker holds before it returns: the executor's Run
// stops it after every worker has returned and before its caller closes
// the connection, so a clean stop leaves no call to be redelivered (and run
// again by a process that cannot see its result for a moment).
func TestAckerStopSendsWhatItHolds(t *testing.T) {
	s, msgs := fetchCalls(t, 20)
	a := newAcker(testutil.Logger(t))
	for _, m := range msgs {
		a.ack(m)
	}
	a.stop() // well within ackDelay of the first: all of them still held
	// Sent before stop returned; the server deletes them as it reads them.
	testutil.WaitFor(t, 5*time.Second, func() bool { return stored(t, s) == 0 })
	for _, m := range msgs {
		if err := m.Ack(); err == nil {
			t.Fatalf("%s could be acknowledged again after stop: stop did not acknowledge it", m.Subject())
		}
	}
}
