package dispatch_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/toolrelay/toolrelay/internal/platformsim"
	"github.com/toolrelay/toolrelay/internal/testutil"
	"github.com/toolrelay/toolrelay/pkg/dispatch"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// callJSON is one call of GET /v1/watch/{id}; pointers tell a field that
// is absent from one that is empty.
type callJSON struct {
	ID            string              `json:"id"`
	Function      string              `json:"function"`
	Team          string              `json:"team"`
	Result        string              `json:"result"`
	Error         *protocol.CallError `json:"error"`
	Output        *string             `json:"output"`
	OutputPreview string              `json:"output_preview"`
	OutputBytes   *int                `json:"output_bytes"`
	Executor      string              `json:"executor"`
	Attempts      int                 `json:"attempts"`
	StartedAt     string              `json:"started_at"`
	FinishedAt    string              `json:"finished_at"`
	Duration      string              `json:"duration"`
}

type watchJSON struct {
	ID          string `json:"id"`
	State       string `json:"state"`
	Answer      string `json:"answer"`
	Error       string `json:"error"`
	TurnDetails []struct {
		State string     `json:"state"`
		Calls []callJSON `json:"calls"`
	} `json:"turn_details"`
}

// getJSON GETs url and decodes its JSON body into v, returning the status.
func getJSON(t *testing.T, url string, v any) int {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	if err := json.Unmarshal(body, v); err != nil {
		t.Fatalf("GET %s: %d %s: %v", url, resp.StatusCode, body, err)
	}
	return resp.StatusCode
}

// postWatch POSTs body to /v1/watch and returns the status and the reply.
func postWatch(t *testing.T, base, body string) (int, map[string]any) {
	t.Helper()
	resp, err := http.Post(base+"/v1/watch", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatalf("POST /v1/watch %s: %v", body, err)
	}
	defer resp.Body.Close()
	var reply map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&reply); err != nil {
		t.Fatalf("POST /v1/watch %s: %d, body not JSON: %v", body, resp.StatusCode, err)
	}
	return resp.StatusCode, reply
}

// GET /v1/watch/{id} reports each call's result: a small output whole, a
// large one by its size and first KiB, an error, which executor recorded
// it, on which attempt, and how long that attempt ran.
func TestWatchReportShowsEachResult(t *testing.T) {
	e := newEnv(t, platformsim.Scenario{Name: "report", Prompt: "full report",
		Steps:  []platformsim.Step{{{Name: "small"}, {Name: "big"}, {Name: "broken"}, {Name: "empty"}}},
		Answer: "reported"})
	functions := []string{"small", "big", "broken", "empty"}
	for _, fn := range functions {
		e.register("lab", fn, `{"type":"object"}`)
	}
	// Two-byte characters after one ASCII byte: the first KiB ends inside
	// one, so the preview must stop a byte short.
	big := "x" + strings.Repeat("é", 1500)
	finished := time.Now().UTC().Truncate(time.Millisecond)
	started := finished.Add(-1500 * time.Millisecond)
	e.serveWith("lab", functions, func(c *protocol.Call, attempt int) (*protocol.Result, bool) {
		res := &protocol.Result{Version: protocol.Version, Key: c.Key, CallID: c.CallID, Team: c.Team, Function: c.Function,
			Executor: "lab-1", Attempt: attempt, StartedAt: started, FinishedAt: finished}
		switch c.Function {
		case "small":
			if attempt == 1 {
				return nil, true // the first attempt fails; the second answers
			}
			res.Output = `{"ok":true}`
		case "big":
			res.Output = big
		case "broken":
			res.Executor = "lab-2"
			res.Error = &protocol.CallError{Code: protocol.CodeFunctionError, Message: "the lab is on fire"}
		}
		return res, false
	})
	d, _ := e.dispatcher(dispatch.Options{})
	hs := httptest.NewServer(d.Handler())
	t.Cleanup(hs.Close)

	ref := e.response("full report")
	status, reply := postWatch(t, hs.URL, `{"platform":"responses","response_id":"`+ref.ResponseID+`"}`)
	if status != http.StatusAccepted || reply["status_url"] == nil {
		t.Fatalf("POST /v1/watch: %d %v; want 202 with a status_url", status, reply)
	}
	var w watchJSON
	testutil.WaitFor(t, 20*time.Second, func() bool {
		if code := getJSON(t, hs.URL+reply["status_url"].(string), &w); code != http.StatusOK {
			t.Fatalf("GET %s: %d", reply["status_url"], code)
		}
		return w.State != string(dispatch.WatchActive)
	})
	if w.State != string(dispatch.WatchCompleted) || w.Answer != "reported" || len(w.TurnDetails) != 1 {
		t.Fatalf("watch %s, answer %q (%s), %d turns; want completed, \"reported\", one turn", w.State, w.Answer, w.Error, len(w.TurnDetails))
	}

	at := func(tm time.Time) string { return tm.Format("2006-01-02T15:04:05.000Z07:00") }
	size := func(n int) *int { return &n }
	text := func(s string) *string { return &s }
	want := map[string]callJSON{
		"small": {Function: "small", Team: "lab", Result: "ok", Output: text(`{"ok":true}`), OutputBytes: size(11),
			Executor: "lab-1", Attempts: 2, StartedAt: at(started), FinishedAt: at(finished), Duration: "1.5s"},
		"big": {Function: "big", Team: "lab", Result: "ok", OutputPreview: big[:1023], OutputBytes: size(len(big)),
			Executor: "lab-1", Attempts: 1, StartedAt: at(started), FinishedAt: at(finished), Duration: "1.5s"},
		"broken": {Function: "broken", Team: "lab", Result: "error",
			Error:    &protocol.CallError{Code: protocol.CodeFunctionError, Message: "the lab is on fire"},
			Executor: "lab-2", Attempts: 1, StartedAt: at(started), FinishedAt: at(finished), Duration: "1.5s"},
		"empty": {Function: "empty", Team: "lab", Result: "ok", Output: text(""), OutputBytes: size(0),
			Executor: "lab-1", Attempts: 1, StartedAt: at(started), FinishedAt: at(finished), Duration: "1.5s"},
	}
	got := map[string]callJSON{}
	for _, c := range w.TurnDetails[0].Calls {
		if c.ID == "" {
			t.Errorf("call %s has no id", c.Function)
		}
		c.ID = ""
		got[c.Function] = c
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("calls in the report (-want +got):\n%s", diff)
	}
	if p := got["big"].OutputPreview; len(p) > 1024 || !strings.HasPrefix(big, p) {
		t.Errorf("preview of %d bytes, want at most 1024 bytes from the start of the output", len(p))
	}
}
