package console_test

import (
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/toolrelay/toolrelay/internal/console"
	"github.com/toolrelay/toolrelay/internal/demo"
	"github.com/toolrelay/toolrelay/internal/testutil"
	"github.com/toolrelay/toolrelay/pkg/dispatch/httpapi"
)

// noRedirects is a client that shows redirects instead of following them.
var noRedirects = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

// The console's HTTP contract, without a browser: pages need a login, the
// login keeps the token in an HttpOnly SameSite=Strict cookie that then
// works for pages and /v1 alike, the dead-letter API is scoped by team, and
// a replay needs the console's header.
func TestConsoleHTTP(t *testing.T) {
	s := newStack(t)
	t.Run("pages send a browser without a token to the login form", func(t *testing.T) {
		resp, err := noRedirects.Get(s.url + "/ui/functions")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if loc := resp.Header.Get("Location"); resp.StatusCode != http.StatusSeeOther || loc != "/ui/login?next=%2Fui%2Ffunctions" {
			t.Errorf("GET /ui/functions without a token: %d to %q; want 303 to the login form", resp.StatusCode, loc)
		}
		for _, open := range []string{"/ui/login", "/ui/static/console.css", "/ui/static/console.js"} {
			resp, err := http.Get(s.url + open)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || !strings.Contains(resp.Header.Get("Content-Security-Policy"), "default-src 'self'") {
				t.Errorf("GET %s without a token: %d, CSP %q; want 200 with a self-only policy", open, resp.StatusCode, resp.Header.Get("Content-Security-Policy"))
			}
		}
	})

	var cookie *http.Cookie
	t.Run("login", func(t *testing.T) {
		resp, err := noRedirects.PostForm(s.url+"/ui/login", url.Values{"token": {"not-a-token"}, "next": {"/ui/watches"}})
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized || len(resp.Cookies()) != 0 {
			t.Errorf("login with an unknown token: %d, cookies %v; want 401 and none", resp.StatusCode, resp.Cookies())
		}
		resp, err = noRedirects.PostForm(s.url+"/ui/login", url.Values{"token": {s.tokens[demo.Team]}, "next": {"https://evil.example/"}})
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if len(resp.Cookies()) == 1 {
			cookie = resp.Cookies()[0]
		}
		if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/ui/turns" || cookie == nil ||
			cookie.Name != httpapi.SessionCookie || !cookie.HttpOnly || cookie.SameSite != http.SameSiteStrictMode || cookie.Path != "/" {
			t.Fatalf("login: %d to %q, cookie %+v; want 303 to /ui/turns (not another site) and an HttpOnly SameSite=Strict cookie",
				resp.StatusCode, resp.Header.Get("Location"), cookie)
		}
	})

	get := func(path string) (int, string) {
		req, _ := http.NewRequest(http.MethodGet, s.url+path, nil)
		req.AddCookie(cookie)
		return send(t, req)
	}
	t.Run("the cookie serves pages and the API, scoped to its team", func(t *testing.T) {
		status, body := get("/ui/functions")
		if status != http.StatusOK || !strings.Contains(body, "get_horoscope") || strings.Contains(body, "slow_report") {
			t.Errorf("GET /ui/functions as demo: %d; want 200 with demo's functions only:\n%s", status, body)
		}
		status, body = get("/v1/functions")
		if status != http.StatusOK || strings.Contains(body, "slow_report") {
			t.Errorf("GET /v1/functions with the cookie: %d %s", status, body)
		}
		if status, _ := get("/ui/turns?team=" + reportsTeam); status != http.StatusForbidden {
			t.Errorf("GET /ui/turns?team=reports as demo: %d, want 403", status)
		}
	})

	t.Run("dead letters: listed by team, replayed with the console's header", func(t *testing.T) {
		w := s.session(t, "export the ledger")
		var letters []console.DeadLetter
		testutil.WaitForWhat(t, 20*time.Second, "the ledger export's dead letter to be listed", func() bool {
			_, letters = s.deadLetters(t, s.tokens["admin"])
			return len(letters) == 1
		})
		dl := letters[0]
		if dl.Function != "flaky_export" || dl.Team != reportsTeam || dl.Reason != "permanent_error" || dl.Attempts != 1 ||
			!strings.Contains(dl.Error, "not writable") || dl.LastReplay != nil {
			t.Errorf("dead letter = %+v", dl)
		}
		if status, mine := s.deadLetters(t, s.tokens[demo.Team]); status != http.StatusOK || len(mine) != 0 {
			t.Errorf("the demo team sees dead letters %+v (%d); want none", mine, status)
		}
		replay := func(token, header string) (int, string) {
			req, _ := http.NewRequest(http.MethodPost, s.url+"/v1/deadletters/replay", strings.NewReader(`{"keys":["`+string(dl.Key)+`"]}`))
			req.Header.Set("Authorization", "Bearer "+token)
			if header != "" {
				req.Header.Set(console.ConsoleHeader, header)
			}
			return send(t, req)
		}
		if status, _ := replay(s.tokens["admin"], ""); status != http.StatusForbidden {
			t.Errorf("replay without %s: %d, want 403", console.ConsoleHeader, status)
		}
		if status, body := replay(s.tokens[demo.Team], "1"); status != http.StatusOK || !strings.Contains(body, "no dead letter for this call among your teams'") {
			t.Errorf("replay by the demo team: %d %s; want it refused: none of its teams has it", status, body)
		}
		s.fixed.Store(true)
		status, body := replay(s.tokens[reportsTeam], "1")
		var out struct{ Replays []console.ReplayOutcome }
		if err := json.Unmarshal([]byte(body), &out); status != http.StatusOK || err != nil || len(out.Replays) != 1 || out.Replays[0].Replay != 1 {
			t.Fatalf("replay by the reports team: %d %s; want replay 1", status, body)
		}
		testutil.WaitForWhat(t, 20*time.Second, "the dead letter to show its replay", func() bool {
			_, letters = s.deadLetters(t, s.tokens[reportsTeam])
			return len(letters) == 1 && letters[0].LastReplay != nil
		})
		if r := letters[0].LastReplay; r.N != 1 || r.Outcome != "ok" || !strings.Contains(r.Output, "42 rows") {
			t.Errorf("replay outcome = %+v; want #1 ok with the output", r)
		}
		_ = w
	})
}
