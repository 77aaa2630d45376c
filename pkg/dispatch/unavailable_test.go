package dispatch

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolrelay/toolrelay/pkg/protocol"
)

func TestWhileUnavailableRetriesUntilTheStoreIsBack(t *testing.T) {
	// The backoff waits on a fake clock: the test takes no time.
	synctest.Test(t, func(t *testing.T) {
		attempts := 0
		got, err := whileUnavailable(context.Background(), 10*time.Second, func(context.Context) (string, error) {
			if attempts++; attempts < 3 {
				return "", nats.ErrNoResponders
			}
			return "stored", nil
		})
		if err != nil || got != "stored" || attempts != 3 {
			t.Fatalf("got %q, %v after %d attempts; want stored after 3", got, err, attempts)
		}

		attempts = 0
		_, err = whileUnavailable(context.Background(), 10*time.Second, func(context.Context) (int, error) {
			attempts++
			return 0, jetstream.ErrKeyNotFound
		})
		if !errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, ErrUnavailable) || attempts != 1 {
			t.Fatalf("a failure that will not pass: %v after %d attempts; want it at once", err, attempts)
		}

		_, err = whileUnavailable(context.Background(), 300*time.Millisecond, func(context.Context) (int, error) {
			return 0, nats.ErrTimeout
		})
		if !errors.Is(err, ErrUnavailable) || !errors.Is(err, nats.ErrTimeout) {
			t.Fatalf("after the window: %v; want ErrUnavailable wrapping the last failure", err)
		}
	})
}

// idlePlatform is a Responses platform whose responses are always still
// running.
type idlePlatform struct{}

func (idlePlatform) Name() protocol.Platform { return protocol.PlatformResponses }
func (idlePlatform) Poll(context.Context, Ref) (*Observation, error) {
	return &Observation{State: ObjectRunning}, nil
}
func (idlePlatform) Submit(context.Context, *Turn, []Output) (*Submission, error) {
	return &Submission{}, nil
}

// A caller's deadline ends the wait, and the answer is still "unavailable"
// (503), not an internal error; a cancelled caller gets the failure as is.
func TestWhileUnavailableStopsAtTheCallersDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		_, err := whileUnavailable(ctx, time.Minute, func(ctx context.Context) (int, error) {
			<-ctx.Done()
			return 0, ctx.Err()
		})
		if !errors.Is(err, ErrUnavailable) {
			t.Fatalf("at the caller's deadline: %v; want ErrUnavailable", err)
		}
		ctx, cancel = context.WithCancel(context.Background())
		cancel()
		_, err = whileUnavailable(ctx, time.Minute, func(context.Context) (int, error) { return 0, nats.ErrTimeout })
		if errors.Is(err, ErrUnavailable) || !errors.Is(err, nats.ErrTimeout) {
			t.Fatalf("cancelled: %v; want the failure itself", err)
		}
	})
}

// answeredAck is a publication whose acknowledgement is in.
type answeredAck struct{ done chan struct{} }

func (a answeredAck) Done() <-chan struct{} { return a.done }
func (answeredAck) Result() (uint64, error) { return 7, nil }

// An acknowledgement that came in while the caller did other work is
// taken, even once the caller's context is done: taking ctx's error
// instead would publish a stored call again. (A lost acknowledgement is
// the publisher's to time out: jspub's TestAsyncTimesOutWhatIsNeverAnswered.)
func TestAwaitAckTakesAnAnswerAlreadyIn(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for range 50 { // a select between the two would pick ctx about half the time
		f := answeredAck{done: make(chan struct{})}
		close(f.done)
		seq, err := awaitAck(ctx, f)
		if err != nil || seq != 7 {
			t.Fatalf("answered before the wait: %v, %v; want the acknowledgement", seq, err)
		}
	}
}
