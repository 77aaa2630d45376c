package dispatch_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/toolrelay/toolrelay/internal/platformsim"
	"github.com/toolrelay/toolrelay/internal/provision"
	"github.com/toolrelay/toolrelay/internal/testutil"
	"github.com/toolrelay/toolrelay/pkg/dispatch"
	"github.com/toolrelay/toolrelay/pkg/dispatch/httpapi"
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
	t.Parallel()
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
	hs := httptest.NewServer(httpapi.New(d, httpapi.Options{}))
	t.Cleanup(hs.Close)

	ref := e.response("full report")
	status, reply := postWatch(t, hs.URL, `{"platform":"responses","response_id":"`+ref.ResponseID+`"}`)
	if status != http.StatusAccepted || reply["status_url"] == nil {
		t.Fatalf("POST /v1/watch: %d %v; want 202 with a status_url", status, reply)
	}
	var w watchJSON
	testutil.WaitForWhat(t, 20*time.Second, "GET status_url to say the watch ended", func() bool {
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

// A watch of an object the platform does not know is refused with 404
// naming the field, over HTTP and over NATS alike, and records nothing;
// watching a real object twice still gives one watch.
func TestWatchOfAnUnknownObjectIs404(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	d, _ := e.dispatcher(dispatch.Options{})
	hs := httptest.NewServer(httpapi.New(d, httpapi.Options{}))
	t.Cleanup(hs.Close)
	nc, _ := e.srv.Connect(t)
	run := e.assistantsRun("hello", nil)

	cases := []struct {
		name, body, field, id string
	}{
		{"agents session", `{"platform":"agents","session_id":"sess_nope"}`, "session_id", "sess_nope"},
		{"assistants thread", `{"platform":"assistants","thread_id":"thread_nope","run_id":"run_nope"}`, "thread_id", "thread_nope"},
		{"assistants run", `{"platform":"assistants","thread_id":"` + run.ThreadID + `","run_id":"run_nope"}`, "run_id", "run_nope"},
		{"response", `{"platform":"responses","response_id":"resp_nope"}`, "response_id", "resp_nope"},
		{"conversation", `{"platform":"responses","conversation":"conv_nope","model":"gpt-5.5"}`, "conversation", "conv_nope"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			check := func(via string, status int, reply map[string]any) {
				t.Helper()
				errObj, _ := reply["error"].(map[string]any)
				msg, _ := errObj["message"].(string)
				if status != http.StatusNotFound || errObj["field"] != tc.field || !strings.Contains(msg, tc.id) {
					t.Errorf("%s: %d %v; want 404 with field %q and a message naming %s", via, status, reply, tc.field, tc.id)
				}
			}
			status, reply := postWatch(t, hs.URL, tc.body)
			check("HTTP", status, reply)

			m, err := nc.Request(protocol.WatchSubject, []byte(tc.body), 10*time.Second)
			if err != nil {
				t.Fatalf("NATS watch request: %v", err)
			}
			reply = nil
			if err := json.Unmarshal(m.Data, &reply); err != nil {
				t.Fatalf("NATS reply %s: %v", m.Data, err)
			}
			natsStatus, _ := reply["status"].(float64)
			check("NATS", int(natsStatus), reply)
		})
	}
	kv, err := e.js.KeyValue(context.Background(), provision.WatchBucket)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := kv.ListKeys(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for k := range keys.Keys() {
		ids = append(ids, k)
	}
	if len(ids) != 0 {
		t.Errorf("refused watches were recorded: %v", ids)
	}

	// A real object is watched, and watching it again gives the same watch.
	body := `{"platform":"assistants","thread_id":"` + run.ThreadID + `","run_id":"` + run.RunID + `"}`
	status, first := postWatch(t, hs.URL, body)
	if status != http.StatusAccepted || first["id"] == nil {
		t.Fatalf("POST /v1/watch of a real run: %d %v; want 202", status, first)
	}
	status, again := postWatch(t, hs.URL, body)
	if status != http.StatusAccepted || again["id"] != first["id"] {
		t.Errorf("watching the run again: %d %v; want 202 with id %v", status, again, first["id"])
	}
	m, err := nc.Request(protocol.WatchSubject, []byte(body), 10*time.Second)
	if err != nil || !strings.Contains(string(m.Data), `"status":202`) || !strings.Contains(string(m.Data), fmt.Sprint(first["id"])) {
		t.Errorf("watching the run again over NATS: %s %v; want 202 with id %v", m.Data, err, first["id"])
	}
}

// A platform failing for a while (503) is no verdict on the object: the
// watch is accepted, not refused with 404, and completes once the platform
// answers again.
func TestWatchAcceptedWhileThePlatformFails(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var failing atomic.Bool
	var failed atomic.Int32
	failing.Store(true)
	flaky := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if failing.Load() && r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, "/v1/responses/") {
			failed.Add(1)
			w.Header().Set("Retry-After-Ms", "1")
			http.Error(w, `{"error":{"message":"overloaded","type":"server_error"}}`, http.StatusServiceUnavailable)
			return
		}
		e.sim.ServeHTTP(w, r)
	}))
	t.Cleanup(flaky.Close)
	d, _ := e.dispatcherOn(openai.NewClient(option.WithBaseURL(flaky.URL+"/v1"), option.WithAPIKey("sk-test")), dispatch.Options{})
	hs := httptest.NewServer(httpapi.New(d, httpapi.Options{}))
	t.Cleanup(hs.Close)

	ref := e.response("hello")
	status, reply := postWatch(t, hs.URL, `{"platform":"responses","response_id":"`+ref.ResponseID+`"}`)
	if status != http.StatusAccepted {
		t.Fatalf("POST /v1/watch while the platform answers 503: %d %v; want 202", status, reply)
	}
	if failed.Load() == 0 {
		t.Fatal("the platform was never asked while failing; the test proves nothing")
	}
	failing.Store(false)
	var w watchJSON
	testutil.WaitForWhat(t, 20*time.Second, "GET status_url to say the watch ended", func() bool {
		getJSON(t, hs.URL+reply["status_url"].(string), &w)
		return w.State != string(dispatch.WatchActive)
	})
	if w.State != string(dispatch.WatchCompleted) {
		t.Errorf("watch %s (%s); want completed once the platform answers", w.State, w.Error)
	}
}

// A watch request over the size limit is told so (413), not that its
// JSON is truncated.
func TestWatchBodyOverTheLimitIs413(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	d, _ := e.dispatcher(dispatch.Options{})
	hs := httptest.NewServer(httpapi.New(d, httpapi.Options{}))
	t.Cleanup(hs.Close)
	status, reply := postWatch(t, hs.URL, `{"platform":"responses","response_id":"`+strings.Repeat("r", 1<<20)+`"}`)
	errObj, _ := reply["error"].(map[string]any)
	if msg, _ := errObj["message"].(string); status != http.StatusRequestEntityTooLarge || !strings.Contains(msg, "larger than the 64 KiB") {
		t.Errorf("a 1 MiB watch request: %d %v; want 413 naming the limit", status, reply)
	}
}
