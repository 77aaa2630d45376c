package dispatch_test

import (
	"bufio"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/toolrelay/toolrelay/internal/apiauth"
	"github.com/toolrelay/toolrelay/internal/platformsim"
	"github.com/toolrelay/toolrelay/internal/testutil"
	"github.com/toolrelay/toolrelay/pkg/dispatch"
	"github.com/toolrelay/toolrelay/pkg/dispatch/httpapi"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// getAs GETs url with token and decodes a 200 body into v; it returns
// the status.
func getAs(t testing.TB, url, token string, v any) int {
	t.Helper()
	got := do(t, http.MethodGet, url, token, "")
	if got.status == http.StatusOK {
		if err := json.Unmarshal(got.body, v); err != nil {
			t.Fatalf("GET %s: %v in %s", url, err, got.body)
		}
	}
	return got.status
}

// The inspection API shows a turn while it is open (teams, functions,
// time left), then as recently submitted with each call's result; a team
// token sees only turns, functions and watches of its team, with other
// teams' calls redacted. A replica started later finds the closed turn in
// the bucket; event streams end when their dispatcher stops.
func TestInspectionAPI(t *testing.T) {
	t.Parallel()
	e := newEnv(t, platformsim.Scenario{Name: "two teams", Prompt: "order and invoice",
		Steps:  []platformsim.Step{{{Name: "get_order"}, {Name: "get_invoice"}}},
		Answer: "order {{out \"get_order\"}}, invoice {{out \"get_invoice\"}}"})
	e.register("orders", "get_order", `{"type":"object"}`)
	e.register("billing", "get_invoice", `{"type":"object"}`)
	release := make(chan struct{})
	answer := func(c *protocol.Call) (string, bool) { return `"` + c.Function + ` of ` + c.Team + `"`, false }
	e.serve("orders", []string{"get_order"}, answer)
	e.serve("billing", []string{"get_invoice"}, func(c *protocol.Call) (string, bool) {
		<-release // holds the turn open until the test has looked at it
		return answer(c)
	})
	path := filepath.Join(t.TempDir(), "tokens.txt")
	tokens := tokensFile(t, path, "admin", "orders", "billing", "shipping")
	file, err := apiauth.Open(path, apiauth.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	d, stop := e.dispatcher(dispatch.Options{})
	hs := httptest.NewServer(httpapi.New(d, httpapi.Options{Authenticator: file}))
	t.Cleanup(hs.Close)

	// A stream of turn changes, opened before the turn exists.
	events := streamEvents(t, hs.URL+"/v1/turns/stream?team=orders", tokens["orders"])
	if ev := <-events; ev.name != "snapshot" {
		t.Fatalf("first event %q, want snapshot", ev.name)
	}

	w, err := d.Watch(context.Background(), e.session("order and invoice"))
	if err != nil {
		t.Fatal(err)
	}
	var open dispatch.TurnList
	testutil.WaitForWhat(t, 10*time.Second, "GET /v1/turns?open=1 to list one open turn", func() bool {
		return getAs(t, hs.URL+"/v1/turns?open=1", tokens["admin"], &open) == http.StatusOK && len(open.Open) == 1
	})
	turn := open.Open[0]
	if turn.Platform != protocol.PlatformAgents || turn.ObjectID != w.Ref.SessionID || turn.Outcome != "open" ||
		!slices.Equal(turn.Teams, []string{"orders", "billing"}) || turn.TimeLeftMS <= 0 || turn.TimeLeftMS > turn.BudgetMS {
		t.Errorf("open turn = %+v; want the agents session's, open, of orders and billing, with time left", turn)
	}
	if open.Recent != nil {
		t.Errorf("open=1 listed recent turns: %+v", open.Recent)
	}
	// The straggler is named once the other call's result is in: to an
	// admin with its call id, to orders (billing's call) by function only.
	testutil.WaitForWhat(t, 10*time.Second, "the open turn to be waiting on get_invoice alone", func() bool {
		return getAs(t, hs.URL+"/v1/turns?open=1", tokens["admin"], &open) == http.StatusOK && len(open.Open) == 1 &&
			len(open.Open[0].Waiting) == 1 && strings.HasPrefix(open.Open[0].Waiting[0], "get_invoice/")
	})
	if getAs(t, hs.URL+"/v1/turns?open=1", tokens["orders"], &open); len(open.Open) != 1 || !slices.Equal(open.Open[0].Waiting, []string{"get_invoice"}) {
		t.Errorf("orders' view of the open turn waits on %+v; want billing's call by its function only", open.Open)
	}
	select {
	case ev := <-events:
		if ev.name != "turn" || !strings.Contains(ev.data, string(turn.Key)) {
			t.Errorf("stream event %q %s; want the new turn", ev.name, ev.data)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the stream did not report the new turn")
	}

	t.Run("filters and scopes", func(t *testing.T) {
		for _, tc := range []struct {
			name, query, token string
			status, want       int
		}{
			{"admin, no filter", "", "admin", 200, 1},
			{"by function", "function=get_order", "admin", 200, 1},
			{"by another function", "function=get_weather", "admin", 200, 0},
			{"by platform", "platform=agents", "admin", 200, 1},
			{"by another platform", "platform=responses", "admin", 200, 0},
			{"by the MCP front door", "platform=mcp", "admin", 200, 0},
			{"by an unknown platform", "platform=gemini", "admin", 400, 0},
			{"by outcome", "outcome=open", "admin", 200, 1},
			{"team token", "", "billing", 200, 1},
			{"other team's token", "", "shipping", 200, 0},
			{"team outside the token", "team=orders", "shipping", 403, 0},
			{"bad outcome", "outcome=maybe", "admin", 400, 0},
		} {
			var l dispatch.TurnList
			status := getAs(t, hs.URL+"/v1/turns?open=1&"+tc.query, tokens[tc.token], &l)
			if status != tc.status || len(l.Open) != tc.want {
				t.Errorf("%s: %d with %d open turns; want %d with %d", tc.name, status, len(l.Open), tc.status, tc.want)
			}
		}
		if got := do(t, http.MethodGet, hs.URL+"/v1/turns", "", ""); got.status != http.StatusUnauthorized {
			t.Errorf("without a token: %d, want 401", got.status)
		}
		var v dispatch.TurnView
		if status := getAs(t, hs.URL+"/v1/turns/"+string(turn.Key), tokens["shipping"], &v); status != http.StatusForbidden {
			t.Errorf("GET /v1/turns/{key} with another team's token: %d, want 403", status)
		}
		if status := getAs(t, hs.URL+"/v1/turns/0123456789abcdef0123456789abcdef", tokens["admin"], &v); status != http.StatusNotFound {
			t.Errorf("GET /v1/turns/{unknown}: %d, want 404", status)
		}
	})

	close(release)
	var list dispatch.TurnList
	testutil.WaitForWhat(t, 10*time.Second, "GET /v1/turns to list the turn as recent, none open", func() bool {
		return getAs(t, hs.URL+"/v1/turns", tokens["admin"], &list) == http.StatusOK && len(list.Open) == 0 && len(list.Recent) == 1
	})
	done := list.Recent[0]
	if done.Key != turn.Key || done.Outcome != "submitted" || done.Duration == "" || done.TimeLeftAtSubmit == "" || len(done.Calls) != 2 {
		t.Fatalf("recent turn = %+v; want it submitted with a duration and two calls", done)
	}
	for _, c := range done.Calls {
		if c.Result != "ok" || c.Output == nil || c.FinishedAt == "" {
			t.Errorf("call %+v; want ok with its output", c)
		}
	}
	closedSeen := time.After(10 * time.Second)
	for seen := false; !seen; {
		select {
		case ev := <-events:
			seen = ev.name == "turn" && strings.Contains(ev.data, `"outcome":"submitted"`)
		case <-closedSeen:
			t.Fatal("the stream did not report the turn submitted")
		}
	}

	t.Run("a team token sees its calls, others redacted", func(t *testing.T) {
		var v dispatch.TurnView
		if status := getAs(t, hs.URL+"/v1/turns/"+string(turn.Key), tokens["orders"], &v); status != http.StatusOK {
			t.Fatalf("GET /v1/turns/{key} with the orders token: %d", status)
		}
		for _, c := range v.Calls {
			if mine := c.Team == "orders"; mine == c.Redacted || mine != (c.Output != nil) {
				t.Errorf("orders token sees call %+v", c)
			}
		}
		if v.OtherCalls != 1 || !slices.Equal(v.Functions, []string{"get_order"}) {
			t.Errorf("orders token: other calls %d, functions %v; want 1 and [get_order]", v.OtherCalls, v.Functions)
		}
	})

	t.Run("functions", func(t *testing.T) {
		var fns struct{ Functions []dispatch.FunctionView }
		if status := getAs(t, hs.URL+"/v1/functions", tokens["admin"], &fns); status != http.StatusOK || len(fns.Functions) != 2 {
			t.Fatalf("GET /v1/functions: %d, %d functions; want 2", status, len(fns.Functions))
		}
		f := fns.Functions[1]
		if f.Name != "get_order" || f.Team != "orders" || len(f.Executors) != 1 || f.Executors[0].Name != "test-executor" || f.SchemaDigest == "" {
			t.Errorf("get_order = %+v", f)
		}
		if f.Stats.Results != 1 || f.Stats.ErrorShare != 0 || f.Stats.P50 == "" {
			t.Errorf("get_order's figures = %+v; want 1 result, none failed, a p50", f.Stats)
		}
		if status := getAs(t, hs.URL+"/v1/functions", tokens["billing"], &fns); status != http.StatusOK || len(fns.Functions) != 1 || fns.Functions[0].Name != "get_invoice" {
			t.Errorf("billing token sees functions %+v", fns.Functions)
		}
	})

	t.Run("watches", func(t *testing.T) {
		var ws struct{ Watches []dispatch.WatchView }
		testutil.WaitForWhat(t, 10*time.Second, "GET /v1/watches to list the watch completed", func() bool {
			return getAs(t, hs.URL+"/v1/watches", tokens["admin"], &ws) == http.StatusOK && len(ws.Watches) == 1 &&
				ws.Watches[0].State == dispatch.WatchCompleted
		})
		if got := ws.Watches[0]; got.ID != w.ID || got.Steps != 1 || !strings.Contains(got.Answer, "invoice") {
			t.Errorf("watch = %+v", got)
		}
		ws.Watches = nil
		if getAs(t, hs.URL+"/v1/watches", tokens["orders"], &ws); len(ws.Watches) != 1 || ws.Watches[0].Answer != "" || !ws.Watches[0].AnswerRedacted {
			t.Errorf("orders token sees watches %+v; want the watch without its answer", ws.Watches)
		}
		ws.Watches = nil
		if getAs(t, hs.URL+"/v1/watches", tokens["shipping"], &ws); len(ws.Watches) != 0 {
			t.Errorf("shipping token sees watches %+v; want none", ws.Watches)
		}
	})

	t.Run("a replica started later knows the recently closed turn", func(t *testing.T) {
		later, _ := e.dispatcher(dispatch.Options{})
		ls := httptest.NewServer(httpapi.New(later, httpapi.Options{Authenticator: file}))
		defer ls.Close()
		var l dispatch.TurnList
		if status := getAs(t, ls.URL+"/v1/turns", tokens["admin"], &l); status != http.StatusOK || len(l.Recent) != 1 || l.Recent[0].Key != turn.Key {
			t.Errorf("the later replica lists %d: %+v; want the submitted turn", status, l.Recent)
		}
	})

	t.Run("event streams end when the dispatcher stops", func(t *testing.T) {
		stop()
		ended := time.After(10 * time.Second)
		for {
			select {
			case _, ok := <-events:
				if !ok {
					return
				}
			case <-ended:
				t.Fatal("the event stream outlived its dispatcher by 10s")
			}
		}
	})
}

type sseEvent struct{ name, data string }

// streamEvents reads the server-sent events of url until the test ends.
func streamEvents(t *testing.T, url, token string) <-chan sseEvent {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("GET %s: %d %s", url, resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	out := make(chan sseEvent, 64)
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); resp.Body.Close(); <-done })
	go func() {
		defer close(done)
		defer close(out)
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(nil, 1<<20)
		var ev sseEvent
		for sc.Scan() {
			line := sc.Text()
			switch {
			case strings.HasPrefix(line, "event: "):
				ev.name = strings.TrimPrefix(line, "event: ")
			case strings.HasPrefix(line, "data: "):
				ev.data = strings.TrimPrefix(line, "data: ")
			case line == "" && ev.name != "":
				select {
				case out <- ev:
				case <-ctx.Done():
					return
				}
				ev = sseEvent{}
			}
		}
	}()
	return out
}
