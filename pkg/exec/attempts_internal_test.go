package exec

import (
	"context"
	"errors"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolrelay/toolrelay/internal/natstest"
	"github.com/toolrelay/toolrelay/internal/provision"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// Two deliveries of one side-effect call can both find no attempt running:
// an executor stalled (SIGSTOP, a long GC pause) between its check and its
// mark, its ack wait ran out and another executor got the redelivery. Only
// one of them may start the handler, on a single server and on a
// replicated bucket alike (where a lost compare-and-set has another error
// code).
func TestOnlyOneOfTwoRacingAttemptsStarts(t *testing.T) {
	for _, tc := range []struct {
		name     string
		replicas int
		connect  func(t *testing.T) jetstream.JetStream
	}{
		{"single server", 1, func(t *testing.T) jetstream.JetStream { _, js := natstest.Start(t).Connect(t); return js }},
		{"R3 cluster", 3, func(t *testing.T) jetstream.JetStream { _, js := natstest.StartCluster(t).Connect(t); return js }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			kv, err := provision.KeyValue(ctx, tc.connect(t), provision.AttemptBucketConfig(provision.Options{Replicas: tc.replicas}))
			if err != nil {
				t.Fatal(err)
			}
			marks := attempts{kv: kv}
			key := protocol.NewTurnKey(protocol.PlatformResponses, "resp_1", []string{"call_1"}).Call("call_1")

			// Both check before either marks.
			mayA, revA, errA := marks.mayHaveRun(ctx, key)
			mayB, revB, errB := marks.mayHaveRun(ctx, key)
			if mayA || mayB || errA != nil || errB != nil {
				t.Fatalf("fresh call: may have run %v/%v, %v/%v", mayA, mayB, errA, errB)
			}
			if err := marks.start(ctx, key, revB, 2, "exec-b"); err != nil {
				t.Fatalf("the first attempt to mark itself: %v", err)
			}
			if err := marks.start(ctx, key, revA, 1, "exec-a"); !errors.Is(err, errAttemptRaced) {
				t.Fatalf("the stalled attempt marking itself after the other: %v, want errAttemptRaced", err)
			}

			// After a retryable failure the mark says so; of two attempts
			// that then race again, one starts.
			if err := marks.mark(ctx, key, attemptRetryable, 2, "exec-b"); err != nil {
				t.Fatal(err)
			}
			_, revA, _ = marks.mayHaveRun(ctx, key)
			may, revB, _ := marks.mayHaveRun(ctx, key)
			if may {
				t.Fatal("a mark of a retryable failure reads as may have run")
			}
			if err := marks.start(ctx, key, revA, 3, "exec-a"); err != nil {
				t.Fatalf("retry: %v", err)
			}
			if err := marks.start(ctx, key, revB, 3, "exec-b"); !errors.Is(err, errAttemptRaced) {
				t.Fatalf("the second retry of the same mark: %v, want errAttemptRaced", err)
			}
			if may, _, _ := marks.mayHaveRun(ctx, key); !may {
				t.Fatal("the attempt that started is not marked running")
			}
		})
	}
}
