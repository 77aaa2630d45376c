package lease

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolrelay/toolrelay/internal/natstest"
	"github.com/toolrelay/toolrelay/internal/testutil"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

func declaration(instance string) *protocol.Declaration {
	return &protocol.Declaration{Version: protocol.Version, Instance: instance, Executor: instance, StartedAt: time.Now(),
		Spec: protocol.FunctionSpec{Version: protocol.Version, Name: "get_order", Team: "orders",
			Parameters: json.RawMessage(`{"type":"object"}`), UpdatedAt: time.Now()}}
}

// A renewed lease outlives the bucket's age limit; one whose keeper stopped
// (its process died) is removed by the server, and a watcher sees it go; a
// withdrawn one goes at once. The bucket here has a 2s age limit, so the
// test takes seconds instead of protocol.LeaseTTL.
func TestLeasesLiveWhileRenewedAndLapseWhenNot(t *testing.T) {
	_, js := natstest.Start(t).Connect(t)
	ctx := t.Context()
	const ttl = 2 * time.Second
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "leases", History: 1, TTL: ttl, LimitMarkerTTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	w, err := kv.WatchAll(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	gone := make(chan string, 4)
	go func() {
		for e := range w.Updates() {
			if e != nil && e.Operation() != jetstream.KeyValuePut {
				gone <- e.Key()
			}
		}
	}()

	renewed, err := Declare(ctx, kv, []*protocol.Declaration{declaration("renewed")}, testutil.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	renewed.every = ttl / 4
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	go renewed.Run(rctx)
	dead, err := Declare(ctx, kv, []*protocol.Declaration{declaration("dead")}, testutil.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	_ = dead // never renewed, as if its process was killed

	select {
	case key := <-gone:
		if key != protocol.DeclarationKey("get_order", "dead") {
			t.Fatalf("%s went first; want the unrenewed lease", key)
		}
	case <-time.After(ttl + 10*time.Second):
		t.Fatal("the unrenewed lease was not removed")
	}
	// Both were declared at once, more than the age limit ago: the renewed
	// one is still there.
	if _, err := kv.Get(ctx, protocol.DeclarationKey("get_order", "renewed")); err != nil {
		t.Fatalf("the renewed lease: %v", err)
	}

	stop()
	if err := renewed.Withdraw(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case key := <-gone:
		if key != protocol.DeclarationKey("get_order", "renewed") {
			t.Fatalf("%s went; want the withdrawn lease", key)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the withdrawn lease did not go")
	}
}
