package jspub

import (
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolrelay/toolrelay/internal/natstest"
)

// A publication whose answer never comes, with the connection up all the
// while, is failed once it is forgetAfter old, so it does not hold a slot
// for ever; a younger one stays.
func TestAsyncForgetsWhatIsNeverAnswered(t *testing.T) {
	nc, _ := natstest.Start(t).Connect(t)
	sub, err := nc.SubscribeSync("silent.>") // takes each publication, never answers
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	a := NewAsync(nc, 8)
	defer a.Close()
	old, err := a.Publish(nats.NewMsg("silent.a"))
	if err != nil {
		t.Fatal(err)
	}
	young, err := a.Publish(nats.NewMsg("silent.b"))
	if err != nil {
		t.Fatal(err)
	}
	young.sent = young.sent.Add(forgetAfter) // as if sent forgetAfter later
	a.mu.Lock()
	a.forgetOld(old.sent.Add(forgetAfter + time.Second))
	a.mu.Unlock()
	select {
	case <-old.Done():
	default:
		t.Fatal("a publication unanswered past forgetAfter is still pending")
	}
	if _, err := old.Result(); !errors.Is(err, jetstream.ErrAsyncPublishTimeout) {
		t.Fatalf("forgotten: %v; want ErrAsyncPublishTimeout", err)
	}
	if n := a.Pending(); n != 1 {
		t.Fatalf("%d pending; want the younger one", n)
	}
}
