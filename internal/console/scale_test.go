package console_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/toolrelay/toolrelay/internal/console"
	"github.com/toolrelay/toolrelay/internal/testutil"
	"github.com/toolrelay/toolrelay/internal/turnfixture"
	"github.com/toolrelay/toolrelay/pkg/dispatch"
	"github.com/toolrelay/toolrelay/pkg/dispatch/httpapi"
)

// With 10,000 open turns the turns page shows the 200 nearest their
// deadline and says how many more there are. How long it takes to render
// is logged, not asserted (BenchmarkTurnsPage measures it).
func TestTurnsPageAt10k(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 10,000 turn records")
	}
	url := consoleOver(t, 10000)
	start := time.Now()
	status, body := getPage(t, url+"/ui/turns")
	took := time.Since(start)
	if status != http.StatusOK || strings.Count(body, `<tr data-key=`) != 200 || !strings.Contains(body, `<span id="hidden">9800</span>`) {
		t.Errorf("GET /ui/turns: %d with %d rows; want 200 rows and 9800 more", status, strings.Count(body, `<tr data-key=`))
	}
	t.Logf("GET /ui/turns with 10000 open turns: %s, %d KB", took.Round(time.Microsecond), len(body)>>10)
}

// BenchmarkTurnsPage renders the turns page with 10,000 open turns:
//
//	go test -run '^$' -bench TurnsPage ./internal/console/
func BenchmarkTurnsPage(b *testing.B) {
	url := consoleOver(b, 10000)
	for b.Loop() {
		getPage(b, url+"/ui/turns")
	}
}

// consoleOver serves the console of a dispatcher (no platforms, no tokens:
// loopback clients only) over n open turns, once its index holds them.
func consoleOver(tb testing.TB, n int) string {
	tb.Helper()
	d, _ := turnfixture.Dispatcher(tb, n)
	api := httpapi.New(d, httpapi.Options{Logger: testutil.Logger(tb)})
	ui, err := console.New(d, api, console.Options{Logger: testutil.Logger(tb)})
	if err != nil {
		tb.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/", api)
	ui.Mount(mux)
	hs := httptest.NewServer(mux)
	tb.Cleanup(hs.Close)
	testutil.WaitForWhat(tb, 30*time.Second, "the dispatcher to count every open turn", func() bool {
		list, err := d.InspectTurns(context.Background(), dispatch.Caller{Admin: true}, dispatch.TurnQuery{OpenOnly: true, Limit: 1})
		return err == nil && list.OpenTotal == n
	})
	return hs.URL
}

func getPage(tb testing.TB, url string) (int, string) {
	tb.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		tb.Fatal(err)
	}
	return send(tb, req)
}

// send sends req and returns the status and body of the answer.
func send(tb testing.TB, req *http.Request) (int, string) {
	tb.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		tb.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		tb.Fatal(err)
	}
	return resp.StatusCode, string(b)
}
