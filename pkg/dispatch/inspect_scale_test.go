package dispatch_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolrelay/toolrelay/internal/provision"
	"github.com/toolrelay/toolrelay/internal/testutil"
	"github.com/toolrelay/toolrelay/internal/turnfixture"
	"github.com/toolrelay/toolrelay/pkg/dispatch"
	"github.com/toolrelay/toolrelay/pkg/dispatch/httpapi"
)

// kvScan reads every turn record the way a request without the index
// would: list the keys, get each.
func kvScan(tb testing.TB, kv jetstream.KeyValue) int {
	tb.Helper()
	ctx := context.Background()
	keys, err := kv.ListKeys(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	n := 0
	for k := range keys.Keys() {
		if _, err := kv.Get(ctx, k); err == nil {
			n++
		}
	}
	return n
}

// scaleDispatcher starts a dispatcher (no platforms: none is needed to
// read turns), writes n open turn records, and returns its API's URL and
// the turn bucket once the index holds all n.
func scaleDispatcher(tb testing.TB, n int) (string, jetstream.KeyValue) {
	tb.Helper()
	d, js := turnfixture.Dispatcher(tb, n)
	hs := httptest.NewServer(httpapi.New(d, httpapi.Options{}))
	tb.Cleanup(hs.Close)
	var list dispatch.TurnList
	// Seconds as a rule; a minute and more under -race on a busy machine.
	testutil.WaitForWhat(tb, 2*time.Minute, "the index to count "+strconv.Itoa(n)+" open turns", func() bool {
		return getAs(tb, hs.URL+"/v1/turns?open=1&limit=1", "", &list) == http.StatusOK && list.OpenTotal == n
	})
	kv, err := js.KeyValue(context.Background(), provision.TurnBucket)
	if err != nil {
		tb.Fatal(err)
	}
	return hs.URL, kv
}

// With 10,000 open turns, GET /v1/turns answers from the index: this
// measures it beside the KV scan it saves (once, logged; timings are not
// asserted: BenchmarkInspectTurns measures properly), and checks the
// answer is whole and in deadline order.
//
// It runs alone, not in parallel: writing and indexing 10,000 records
// takes the machine's cores for seconds, which would starve the tests
// whose deadlines are a second or two.
func TestInspectTurnsAt10k(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 10,000 turn records")
	}
	const n = 10000
	url, kv := scaleDispatcher(t, n)
	var list dispatch.TurnList
	measure := func(f func()) time.Duration {
		start := time.Now()
		f()
		return time.Since(start)
	}
	page := measure(func() { getAs(t, url+"/v1/turns?open=1", "", &list) })
	if len(list.Open) != dispatch.DefaultTurnLimit || list.OpenTotal != n || list.Open[0].TimeLeftMS > list.Open[len(list.Open)-1].TimeLeftMS {
		t.Errorf("listed %d of %d open turns, first with %dms left, last %dms; want %d of %d, nearest deadline first",
			len(list.Open), list.OpenTotal, list.Open[0].TimeLeftMS, list.Open[len(list.Open)-1].TimeLeftMS, dispatch.DefaultTurnLimit, n)
	}
	all := measure(func() { getAs(t, url+"/v1/turns?open=1&limit=0", "", &list) })
	if len(list.Open) != n {
		t.Errorf("limit=0 listed %d open turns, want %d", len(list.Open), n)
	}
	var scanned int
	scan := measure(func() { scanned = kvScan(t, kv) })
	if scanned != n {
		t.Errorf("scanned %d records, want %d", scanned, n)
	}
	t.Logf("%d open turns: GET /v1/turns?open=1 (first %d) %s, all %d %s; reading the records by a KV scan alone %s (%.0fx the first page)",
		n, dispatch.DefaultTurnLimit, page.Round(time.Microsecond), n, all.Round(time.Microsecond), scan.Round(time.Millisecond), float64(scan)/float64(page))
}

// BenchmarkInspectTurns measures GET /v1/turns?open=1 with 10,000 open
// turns, and beside it the KV scan the index saves:
//
//	go test -run '^$' -bench InspectTurns ./pkg/dispatch/
func BenchmarkInspectTurns(b *testing.B) {
	const n = 10000
	url, kv := scaleDispatcher(b, n)
	b.Run("index/first-page", func(b *testing.B) {
		for b.Loop() {
			var list dispatch.TurnList
			getAs(b, url+"/v1/turns?open=1", "", &list)
		}
	})
	b.Run("index/all", func(b *testing.B) {
		for b.Loop() {
			var list dispatch.TurnList
			getAs(b, url+"/v1/turns?open=1&limit=0", "", &list)
		}
	})
	b.Run("kv-scan", func(b *testing.B) {
		for b.Loop() {
			kvScan(b, kv)
		}
	})
}
