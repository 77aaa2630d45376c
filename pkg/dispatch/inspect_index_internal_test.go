package dispatch

import (
	"fmt"
	"testing"
	"time"

	"github.com/toolrelay/toolrelay/internal/provision"
	"github.com/toolrelay/toolrelay/internal/testutil"
)

// The inspection index's first load reads the open turns' records a
// thousand a request, not one request a turn: at 100,000 open turns the
// first list after a start took 11 s that way, past indexLoadWait. A turn
// whose record is gone (its timer outlived it) is left out.
func TestTheIndexLoadsTheOpenTurnsAThousandARequest(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	d, srv, _ := provisioned(t, Options{Name: "one", Logger: testutil.Logger(t)})
	now := time.Now()
	const n = 1500
	for i := range n + 1 {
		tn, _ := openRecord(t, d, fmt.Sprintf("resp_%d", i), now, now.Add(5*time.Minute), "get_weather")
		if i == n { // its timer outlived its record
			if err := d.turns.kv.Purge(ctx, string(tn.Key)); err != nil {
				t.Fatal(err)
			}
		}
	}
	testutil.WaitForWhat(t, 10*time.Second, "the timers", func() bool { return len(d.mustOpenTurns(t)) == n+1 })
	counter, _ := srv.Connect(t)
	batched, err := counter.SubscribeSync("$JS.API.DIRECT.GET.KV_" + provision.TurnBucket)
	if err != nil {
		t.Fatal(err)
	}
	single, err := counter.SubscribeSync("$JS.API.STREAM.MSG.GET.KV_" + provision.TurnBucket) // a get from the leader
	if err != nil {
		t.Fatal(err)
	}
	direct, err := counter.SubscribeSync("$JS.API.DIRECT.GET.KV_" + provision.TurnBucket + ".>") // a direct get of one
	if err != nil {
		t.Fatal(err)
	}
	if err := counter.Flush(); err != nil {
		t.Fatal(err)
	}

	if err := d.inspect.loadOpen(ctx); err != nil {
		t.Fatal(err)
	}

	if err := d.js.Conn().Flush(); err != nil {
		t.Fatal(err)
	}
	if err := counter.Flush(); err != nil { // what the dispatcher sent before its flush has arrived
		t.Fatal(err)
	}
	b, _, _ := batched.Pending()
	s, _, _ := single.Pending()
	one, _, _ := direct.Pending()
	s += one
	if b != 2 || s != 0 {
		t.Errorf("the index read %d open turns with %d requests of many and %d of one, want 2 of many", n, b, s)
	}
	d.inspect.mu.RLock()
	loaded := len(d.inspect.open)
	d.inspect.mu.RUnlock()
	if loaded != n {
		t.Errorf("the index holds %d open turns, want %d", loaded, n)
	}
}
