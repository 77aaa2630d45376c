package demo

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolrelay/toolrelay/internal/platformsim"
	"github.com/toolrelay/toolrelay/internal/testutil"
	"github.com/toolrelay/toolrelay/pkg/exec"
)

// copyTestdata copies testdata files into a directory the test may edit.
func copyTestdata(t *testing.T, names ...string) []string {
	t.Helper()
	dir := t.TempDir()
	var paths []string
	for _, n := range names {
		b, err := os.ReadFile(filepath.Join("../../testdata", n))
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, n)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		paths = append(paths, p)
	}
	return paths
}

// devLoop runs RunDev until the test ends and returns its output and its
// HTTP address once the scenarios were played the first time.
func devLoop(t *testing.T, opts DevOptions) (*testutil.Buffer, string, <-chan error) {
	t.Helper()
	out := &testutil.Buffer{}
	ready := make(chan string, 1)
	opts.Out, opts.HTTPAddr, opts.NATSListen = out, "127.0.0.1:0", "127.0.0.1:0"
	opts.PollInterval, opts.Timeout = 20*time.Millisecond, 30*time.Second
	opts.Ready = func(addr string) { ready <- addr }
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- RunDev(ctx, opts) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Error("RunDev did not return within 30s of its context ending")
		}
	})
	select {
	case addr := <-ready:
		return out, addr, done
	case err := <-done:
		t.Fatalf("RunDev returned before it was ready: %v\n%s", err, out.String())
	case <-time.After(60 * time.Second):
		t.Fatalf("not ready within 60s:\n%s", out.String())
	}
	return nil, "", nil
}

func playAgain(t *testing.T, addr, scenario string) (int, []PlayResult) {
	t.Helper()
	resp, err := http.Post("http://"+addr+"/dev/play?scenario="+scenario, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var res []PlayResult
	if err := json.NewDecoder(resp.Body).Decode(&res); err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, res
}

// The example files, played at start through the simulator, the
// dispatcher and executors running the file's commands: every scenario's
// answer, calls and traces are printed; /dev/play plays one again.
func TestDevPlaysTheScenariosAndAgainOnRequest(t *testing.T) {
	paths := copyTestdata(t, "dev-functions.yaml", "scenarios.yaml")
	out, addr, _ := devLoop(t, DevOptions{FunctionsFile: paths[0], ScenariosFile: paths[1]})
	got := out.String()
	for _, want := range []string{
		"[responses] order-status", "[agents] two-orders", "[assistants] refund",
		"Calling get_order_status...", "Calling get_shipping_eta...", "Calling issue_refund...",
		"answer: Order A-1001 is shipped with ups, arriving 2026-12-03.",
		"answer: A-1001 is shipped; A-1002 is packing.",
		"answer: refund of 500 cents issued",
		"turn submitted: 2 call(s)", "execute_tool get_shipping_eta", "submit assistants",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	status, res := playAgain(t, addr, "two-orders")
	if status != http.StatusOK || len(res) != 1 {
		t.Fatalf("/dev/play?scenario=two-orders: %d %+v", status, res)
	}
	r := res[0]
	if r.Answer != "A-1001 is shipped; A-1002 is packing." || r.Platform != "agents" || len(r.Calls) != 2 || len(r.Traces) != 1 || r.Error != "" {
		t.Errorf("played again: %+v", r)
	}
	for _, c := range r.Calls {
		if c.Function != "get_order_status" || c.Result != "ok" || !strings.Contains(c.Output, `"status"`) {
			t.Errorf("call %+v", c)
		}
	}
	if status, _ := playAgain(t, addr, "no-such-scenario"); status != http.StatusNotFound {
		t.Errorf("/dev/play of an unknown scenario: %d, want 404", status)
	}
	if t.Failed() {
		t.Log(out.String())
	}
}

// Saving the functions file with a mistake prints the error and keeps the
// running executors; saving a valid change restarts them and plays the
// scenarios again with the new functions.
func TestDevReloadsTheFunctionsFile(t *testing.T) {
	paths := copyTestdata(t, "dev-functions.yaml", "scenarios.yaml")
	out, addr, _ := devLoop(t, DevOptions{FunctionsFile: paths[0], ScenariosFile: paths[1]})
	orig, err := os.ReadFile(paths[0])
	if err != nil {
		t.Fatal(err)
	}

	bad := strings.Replace(string(orig), "    timeout: 10s\n", "    timeout: 10s\n    colour: blue\n", 1)
	if err := os.WriteFile(paths[0], []byte(bad), 0o644); err != nil {
		t.Fatal(err)
	}
	testutil.WaitForWhat(t, 10*time.Second, "the dev loop to refuse the invalid change", func() bool { return strings.Contains(out.String(), "not valid") })
	if got := out.String(); !strings.Contains(got, paths[0]) || !strings.Contains(got, "colour") {
		t.Errorf("the refused change's error does not name the file and the field:\n%s", got)
	}
	if _, res := playAgain(t, addr, "order-status"); len(res) != 1 || !strings.Contains(res[0].Answer, "is shipped") {
		t.Errorf("after a bad change the old functions should serve: %+v", res)
	}

	good := strings.Replace(string(orig), `\"status\":\"shipped\"`, `\"status\":\"delivered\"`, 1)
	if good == string(orig) {
		t.Fatal("the example's get_order_status changed; update this test")
	}
	mark := len(out.String())
	if err := os.WriteFile(paths[0], []byte(good), 0o644); err != nil {
		t.Fatal(err)
	}
	// Every scenario plays again, the first with the new output.
	testutil.WaitForWhat(t, 30*time.Second, "every scenario to play again, the first with the new output", func() bool {
		got := out.String()[mark:]
		return strings.Contains(got, "answer: Order A-1001 is delivered with ups") && strings.Contains(got, "answer: refund of 500 cents issued")
	})
	if got := out.String()[mark:]; !strings.Contains(got, "changed: reloading") {
		t.Errorf("after the change:\n%s", got)
	}
}

// Without a scenarios file each function is called once with arguments
// made up from its schema; one the made-up arguments do not satisfy shows
// the message the model gets.
func TestDevDefaultScenarios(t *testing.T) {
	paths := copyTestdata(t, "dev-functions.yaml")
	out, _, _ := devLoop(t, DevOptions{FunctionsFile: paths[0]})
	got := out.String()
	for _, want := range []string{
		"[responses] get_order_status", "[responses] get_shipping_eta", "[responses] issue_refund",
		`answer: get_shipping_eta returned: {"eta":"2026-12-03"}`,
		"answer: issue_refund returned: refund of 500 cents issued",
		"invalid_arguments", "does not match pattern",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	if t.Failed() {
		t.Log(got)
	}
}

func TestDevRefusesABadFileAtStart(t *testing.T) {
	p := testutil.WriteFile(t, "functions.yaml", "functions:\n  - name: f\n    owner: t\n")
	err := RunDev(t.Context(), DevOptions{FunctionsFile: p, Out: &bytes.Buffer{}, HTTPAddr: "127.0.0.1:0", NATSListen: "127.0.0.1:0"})
	if err == nil || !strings.Contains(err.Error(), p) || !strings.Contains(err.Error(), "command") {
		t.Errorf("RunDev with a function without implementation: %v", err)
	}
}

// A scenario's call of a function nobody serves is warned of once; one an
// executor in another process serves (a Go executor) is not.
func TestUnservedFunctionsAreWarnedOf(t *testing.T) {
	teams := map[string][]exec.Function{"orders": {{Name: "get_order_status"}}}
	scenarios := []platformsim.Scenario{{Name: "s", Steps: []platformsim.Step{
		{{Name: "get_order_status"}, {Name: "get_invoice"}, {Name: "reverse_text"}}, {{Name: "get_invoice"}}}}}
	got := unserved(teams, []string{"reverse_text"}, scenarios)
	if len(got) != 1 || !strings.Contains(got[0], "scenario s calls get_invoice") {
		t.Errorf("unserved = %q, want one warning about get_invoice", got)
	}
}

// The console is at /ui, and a direct call (dispatcher call, any MCP
// client) prints how it ended: a call refused for its arguments says so
// rather than "answered".
func TestDevServesTheConsoleAndReportsDirectCalls(t *testing.T) {
	paths := copyTestdata(t, "dev-functions.yaml", "scenarios.yaml")
	out, addr, _ := devLoop(t, DevOptions{FunctionsFile: paths[0], ScenariosFile: paths[1]})
	if !strings.Contains(out.String(), "console:    http://"+addr+"/ui") {
		t.Errorf("the banner does not give the console's address:\n%s", out.String())
	}
	page, err := httpGet("http://" + addr + "/ui/turns")
	if err != nil || !strings.Contains(page, "Recently closed") || !strings.Contains(page, "order-status") && !strings.Contains(page, "get_order_status") {
		t.Errorf("GET /ui/turns: %v\n%.400s", err, page)
	}

	client := mcp.NewClient(&mcp.Implementation{Name: "dev-test", Version: "1"}, nil)
	s, err := client.Connect(t.Context(), &mcp.StreamableClientTransport{Endpoint: "http://" + addr + "/mcp", DisableStandaloneSSE: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, args := range []string{`{"order_id":"nope"}`, `{"order_id":"A-1001"}`} {
		if _, err := s.CallTool(t.Context(), &mcp.CallToolParams{Name: "get_order_status", Arguments: json.RawMessage(args)}); err != nil {
			t.Fatal(err)
		}
	}
	testutil.WaitForWhat(t, 10*time.Second, "both direct calls to be reported", func() bool {
		got := out.String()
		return strings.Contains(got, "[mcp] get_order_status failed (invalid_arguments: ") && strings.Contains(got, "[mcp] get_order_status answered in ")
	})
}

func TestExampleArguments(t *testing.T) {
	tests := []struct{ schema, want string }{
		{`{"type":"object","properties":{"a":{"type":"string"},"b":{"type":"integer","minimum":3}},"required":["a","b"]}`, `{"a":"example","b":3}`},
		{`{"type":"object","properties":{"c":{"enum":["ups","dhl"]},"d":{"type":"string","examples":["A-1"]}}}`, `{"c":"ups","d":"A-1"}`},
		{`{"type":"object","properties":{"o":{"type":"object","properties":{"x":{"type":"boolean"}}},"l":{"type":"array","items":{"type":"number"}}},"required":["o","l"]}`, `{"l":[1],"o":{"x":true}}`},
		{`{"type":"object","properties":{"when":{"type":"string","format":"date"},"opt":{"type":"string"}},"required":["when"]}`, `{"when":"2026-01-01"}`},
		{`{"type":"object","properties":{"t":{"type":"string","default":"{{x}}"}},"required":["t"]}`, `{"t":"{{"{{"}}x}}"}`},
	}
	for _, tc := range tests {
		if got := exampleArguments([]byte(tc.schema)); got != tc.want {
			t.Errorf("exampleArguments(%s) = %s, want %s", tc.schema, got, tc.want)
		}
	}
}

// TestDefaultScenariosCallACustomToolAsOne: a function with a Format is
// played as a custom tool call with text, not as a function call with
// JSON arguments the dispatcher would refuse.
func TestDefaultScenariosCallACustomToolAsOne(t *testing.T) {
	var signDates exec.Function
	for _, f := range Functions() {
		if f.Name == "get_sign_dates" {
			signDates = f
		}
	}
	got := defaultScenarios(map[string][]exec.Function{Team: {signDates}})
	if len(got) != 1 || len(got[0].Steps) != 1 || len(got[0].Steps[0]) != 1 {
		t.Fatalf("scenarios = %+v", got)
	}
	if call := got[0].Steps[0][0]; call.Kind != platformsim.KindCustom || call.Arguments != "example" || got[0].Platform != "" {
		t.Errorf("the custom tool is played as %+v on %q; want a custom call with text, on the Responses API", call, got[0].Platform)
	}
}

// dev prints the spans of its own process; with OTEL_EXPORTER_OTLP_ENDPOINT
// set it also exports them, so they meet there the spans of executors in
// other processes.
func TestDevExportsItsSpansOverOTLP(t *testing.T) {
	var posts atomic.Int64
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && r.URL.Path == "/v1/traces" {
			posts.Add(1)
		}
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	t.Cleanup(collector.Close)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.URL)
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "50") // milliseconds
	paths := copyTestdata(t, "dev-functions.yaml", "scenarios.yaml")
	devLoop(t, DevOptions{FunctionsFile: paths[0], ScenariosFile: paths[1]})
	testutil.WaitForWhat(t, 10*time.Second, "dev to export spans to OTEL_EXPORTER_OTLP_ENDPOINT", func() bool { return posts.Load() > 0 })
}
