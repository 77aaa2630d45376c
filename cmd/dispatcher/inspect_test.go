package main

import (
	"bytes"
	"encoding/json"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/toolrelay/toolrelay/internal/demo"
	"github.com/toolrelay/toolrelay/internal/platformsim"
	"github.com/toolrelay/toolrelay/internal/testutil"
	"github.com/toolrelay/toolrelay/pkg/dispatch"
)

// inspect runs an inspection command in-process and returns its stdout;
// a failing command fails the test.
func inspect(t *testing.T, args ...string) string {
	t.Helper()
	out, err := inspectErr(t, args...)
	if err != nil {
		t.Fatalf("dispatcher %s: %v", strings.Join(args, " "), err)
	}
	return out
}

func inspectErr(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	err := run(t.Context(), args, &out, &errOut)
	return out.String(), err
}

// The inspection commands, run as an operator would against the built
// dispatcher and executor: turns, turn, functions and watches, as tables
// and as JSON; with API tokens, the token comes from TOOLRELAY_API_TOKEN
// and a team token sees only its team.
func TestInspectionCommands(t *testing.T) {
	w := newWorld(t, platformsim.FavoriteCityScenario)
	tokens := filepath.Join(w.dir, "tokens.txt")
	token := func(args ...string) string { t.Helper(); return newToken(t, tokens, args...) }
	admin, shipping := token("-name", "ops", "-admin"), token("-name", "shipping", "-teams", "shipping")
	// The dispatcher first: executors declare their functions through it.
	d := w.dispatcher("dispatcher", "TOOLRELAY_API_TOKENS_FILE="+tokens)
	w.executor("exec-1", "-demo")
	addr := "http://" + d.addr

	t.Setenv(APITokenEnv, "")
	if _, err := inspectErr(t, "turns", "-addr", addr); err == nil || !strings.Contains(err.Error(), "401") || !strings.Contains(err.Error(), APITokenEnv) {
		t.Errorf("turns without a token: %v; want a 401 naming %s", err, APITokenEnv)
	}
	t.Setenv(APITokenEnv, admin)

	thread, runID := w.assistantsRun("favorite city", nil)
	id := watchWith(t, d, admin, `{"platform":"assistants","thread_id":"`+thread+`","run_id":"`+runID+`"}`)
	var list dispatch.TurnList
	testutil.WaitForWhat(t, 30*time.Second, "the run's two turns to be listed as recent, none open", func() bool {
		if err := json.Unmarshal([]byte(inspect(t, "turns", "-addr", addr, "-json")), &list); err != nil {
			t.Fatal(err)
		}
		return len(list.Open) == 0 && len(list.Recent) == 2 // the run's two steps
	})
	first := list.Recent[1] // newest first
	if first.Outcome != "submitted" || first.ObjectID != runID || len(first.Calls) != 1 || first.Calls[0].Executor != "exec-1" {
		t.Errorf("first turn = %+v; want the run's, submitted, its call run by exec-1", first)
	}

	table := inspect(t, "turns", "-addr", addr)
	for _, want := range []string{"OPEN (0)", "RECENTLY CLOSED (2", string(first.Key), "submitted", "1 ok", "2 ok"} {
		if !strings.Contains(table, want) {
			t.Errorf("turns table lacks %q:\n%s", want, table)
		}
	}
	if open := inspect(t, "turns", "-addr", addr, "-open"); strings.Contains(open, "RECENTLY") {
		t.Errorf("turns -open lists closed turns:\n%s", open)
	}
	one := inspect(t, "turn", "-addr", addr, string(first.Key))
	for _, want := range []string{"getUserFavoriteCity", "exec-1", "ok", "Seattle", "submitted"} {
		if !strings.Contains(one, want) {
			t.Errorf("turn table lacks %q:\n%s", want, one)
		}
	}
	// The console shows 12 characters of a key: they are enough here.
	if short := inspect(t, "turn", "-addr", addr, string(first.Key)[:12]); !strings.Contains(short, string(first.Key)) {
		t.Errorf("turn by the key's first 12 characters:\n%s", short)
	}
	if _, err := inspectErr(t, "turn", "-addr", addr, "ffffffffffff"); err == nil || !strings.Contains(err.Error(), "whole key") {
		t.Errorf("turn by a prefix no turn has: %v; want an error asking for the whole key", err)
	}
	// -addr as dev's own flag takes it (host:port), or from the environment.
	if plain := inspect(t, "functions", "-addr", d.addr); !strings.Contains(plain, "getCityNickname") {
		t.Errorf("functions -addr host:port:\n%s", plain)
	}
	t.Setenv(APIURLEnv, addr)
	if env := inspect(t, "functions"); !strings.Contains(env, "getCityNickname") {
		t.Errorf("functions with %s and no -addr:\n%s", APIURLEnv, env)
	}
	fns := inspect(t, "functions", "-addr", addr)
	for _, want := range []string{"FUNCTION", "getCityNickname", "demo", "get_horoscope"} {
		if !strings.Contains(fns, want) {
			t.Errorf("functions table lacks %q:\n%s", want, fns)
		}
	}
	var fj struct{ Functions []dispatch.FunctionView }
	if err := json.Unmarshal([]byte(inspect(t, "functions", "-addr", addr, "-json")), &fj); err != nil || len(fj.Functions) != len(demo.Functions()) {
		t.Errorf("functions -json: %v, %d functions; want executor -demo's %d", err, len(fj.Functions), len(demo.Functions()))
	}
	testutil.WaitForWhat(t, 10*time.Second, "inspect watches to list the watch completed", func() bool {
		return strings.Contains(inspect(t, "watches", "-addr", addr), "completed")
	})
	if ws := inspect(t, "watches", "-addr", addr); !strings.Contains(ws, id) || !strings.Contains(ws, "Emerald City") || !strings.Contains(ws, "2/16") {
		t.Errorf("watches table lacks the watch, its answer or its steps:\n%s", ws)
	}

	t.Setenv(APITokenEnv, shipping)
	if fns := inspect(t, "functions", "-addr", addr); strings.Contains(fns, "demo") {
		t.Errorf("the shipping token sees the demo team's functions:\n%s", fns)
	}
	if _, err := inspectErr(t, "turn", "-addr", addr, string(first.Key)); err == nil || !strings.Contains(err.Error(), "403") {
		t.Errorf("turn with the shipping token: %v; want 403", err)
	}
	if _, err := inspectErr(t, "turns", "-addr", addr, "-team", "demo"); err == nil || !strings.Contains(err.Error(), "403") {
		t.Errorf("turns -team demo with the shipping token: %v; want 403", err)
	}
	if _, err := inspectErr(t, "turn", "-addr", addr); err == nil {
		t.Error("turn without a key succeeded")
	}
}

// watchWith asks dispatcher p to drive a platform object, with a bearer
// token, and returns the watch's id.
func watchWith(t *testing.T, p *proc, token, body string) string {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, "http://"+p.addr+"/v1/watch", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct{ ID string }
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != http.StatusAccepted {
		t.Fatalf("POST /v1/watch: %d, %v", resp.StatusCode, err)
	}
	return out.ID
}
