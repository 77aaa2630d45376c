package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/toolrelay/toolrelay/internal/natstest"
	"github.com/toolrelay/toolrelay/internal/platformsim"
	"github.com/toolrelay/toolrelay/internal/testutil"
	"github.com/toolrelay/toolrelay/pkg/dispatch"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// These tests run the built dispatcher and executor binaries as separate
// processes against a JetStream server and the platform simulator, and
// kill them with SIGKILL.

var (
	bins   = map[string]string{}
	binDir string
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "toolrelay-bin-")
	if err != nil {
		panic(err)
	}
	binDir = dir
	for _, name := range []string{"dispatcher", "executor"} {
		bins[name] = filepath.Join(dir, name)
		if out, err := osexec.Command("go", "build", "-o", bins[name], "../"+name).CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "building %s: %v\n%s", name, err, out)
			os.Exit(1)
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

type world struct {
	t *testing.T
	// natsURL is what every process is given as NATS_URL.
	natsURL string
	// env is added to every process's environment.
	env    []string
	sim    *platformsim.Server
	simURL string
	client openai.Client
	dir    string
	// dispatchers counts the dispatcher replicas started.
	dispatchers int
}

func newWorld(t *testing.T, scenarios ...platformsim.Scenario) *world {
	t.Helper()
	return newWorldOn(t, natstest.Start(t).ClientURL(), scenarios...)
}

// newWorldOn is a world whose processes use the JetStream servers at natsURL.
func newWorldOn(t *testing.T, natsURL string, scenarios ...platformsim.Scenario) *world {
	t.Helper()
	sim := platformsim.New(platformsim.Options{Model: &platformsim.Model{Scenarios: scenarios}, APIKey: "sk-mp"})
	hs := httptest.NewServer(sim)
	t.Cleanup(func() { hs.CloseClientConnections(); sim.Close(); hs.Close() })
	return &world{t: t, natsURL: natsURL, sim: sim, simURL: hs.URL + "/v1", dir: t.TempDir(),
		client: openai.NewClient(option.WithBaseURL(hs.URL+"/v1"), option.WithAPIKey("sk-mp"))}
}

type proc struct {
	name string
	cmd  *osexec.Cmd
	addr string
	done chan struct{}
}

func (w *world) start(name, bin string, args []string, env ...string) *proc {
	w.t.Helper()
	return startProc(w.t, w.dir, name, bin, args, append(append([]string{"NATS_URL=" + w.natsURL, "TOOLRELAY_LOG_LEVEL=info"}, w.env...), env...)...)
}

// startProc starts bin with its output in dir/name.log, killed when the
// test ends; the log's tail is shown when the test failed.
func startProc(t *testing.T, dir, name, bin string, args []string, env ...string) *proc {
	t.Helper()
	cmd := osexec.Command(bin, args...)
	testutil.DieWithTest(cmd)
	log, err := os.Create(filepath.Join(dir, name+".log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = log, log
	cmd.Env = append(os.Environ(), env...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{name: name, cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); log.Close(); close(p.done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.done
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(dir, name+".log"))
			t.Logf("--- %s log ---\n%s", name, tail(string(b), 4000))
		}
	})
	return p
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// dispatcher starts a dispatcher replica and waits until it is ready.
func (w *world) dispatcher(name string, env ...string) *proc {
	w.t.Helper()
	return w.dispatcherOf(bins["dispatcher"], name, env...)
}

// dispatcherOf starts a dispatcher replica built as bin.
func (w *world) dispatcherOf(bin, name string, env ...string) *proc {
	w.t.Helper()
	addr := freeAddr(w.t)
	p := w.start(name, bin, nil, append([]string{
		"OPENAI_BASE_URL=" + w.simURL, "OPENAI_API_KEY=sk-mp", "TOOLRELAY_HTTP_ADDR=" + addr,
	}, env...)...)
	p.addr = addr
	testutil.WaitForWhat(w.t, 30*time.Second, "dispatcher "+name+" to answer /readyz with 200", func() bool {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	w.dispatchers++
	w.waitServed()
	return p
}

// executor starts an executor process and waits until it serves: its
// functions are declared (with a dispatcher running: the registry counts
// them served, so none looks unknown or unserved).
func (w *world) executor(name string, args ...string) *proc {
	w.t.Helper()
	p := w.start(name, bins["executor"], args, "TOOLRELAY_EXECUTOR_NAME="+name)
	testutil.WaitForWhat(w.t, 30*time.Second, "executor "+name+" to log that it is serving", func() bool {
		b, _ := os.ReadFile(filepath.Join(w.dir, name+".log"))
		return strings.Contains(string(b), `"msg":"executor serving"`)
	})
	if w.dispatchers > 0 {
		w.waitServed()
	}
	return p
}

// waitServed waits until every function some executor pulls calls of is
// served in the registry: executors started before any dispatcher declare
// again within a second of one answering.
func (w *world) waitServed() {
	w.t.Helper()
	nc, err := nats.Connect(w.natsURL)
	if err != nil {
		w.t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx := context.Background()
	testutil.WaitForWhat(w.t, 30*time.Second, "every function with waiting consumers to be served in the registry", func() bool {
		fns, err := dispatch.Registry(ctx, js)
		if err != nil {
			return false
		}
		served := map[string]bool{}
		for _, f := range fns {
			if f.Served() {
				served[f.Spec.Team+"/"+f.Spec.Name] = true
			}
		}
		streams := js.StreamNames(ctx, jetstream.WithStreamListSubject(protocol.CallSubjectPrefix+".>"))
		for name := range streams.Name() {
			team := strings.TrimPrefix(name, protocol.CallStream(""))
			s, err := js.Stream(ctx, name)
			if err != nil {
				return false
			}
			for c := range s.ListConsumers(ctx).Info() {
				if c.NumWaiting > 0 && !served[team+"/"+c.Name] {
					return false
				}
			}
		}
		return true
	})
}

func freeAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// postWatch asks a dispatcher over HTTP to drive a platform object.
func postWatch(t *testing.T, p *proc, body string) string {
	t.Helper()
	resp, err := http.Post("http://"+p.addr+"/v1/watch", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct{ ID, StatusURL string }
	_ = json.NewDecoder(resp.Body).Decode(&out)
	if resp.StatusCode != http.StatusAccepted || out.ID == "" {
		t.Fatalf("POST /v1/watch %s: %d", body, resp.StatusCode)
	}
	return out.ID
}

type watchStatus struct {
	State       string `json:"state"`
	Answer      string `json:"answer"`
	Error       string `json:"error"`
	TurnDetails []struct {
		State       string    `json:"state"`
		ExpiresAt   time.Time `json:"expires_at"`
		SubmittedAt time.Time `json:"submitted_at"`
		CutOff      bool      `json:"cut_off"`
	} `json:"turn_details"`
}

func status(p *proc, id string) (*watchStatus, error) {
	resp, err := http.Get("http://" + p.addr + "/v1/watch/" + id)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /v1/watch/%s: %d", id, resp.StatusCode)
	}
	var st watchStatus
	return &st, json.NewDecoder(resp.Body).Decode(&st)
}

func awaitWatch(t *testing.T, p *proc, id string, within time.Duration) *watchStatus {
	t.Helper()
	var st *watchStatus
	testutil.WaitForWhat(t, within, "watch "+id+" to end", func() bool {
		var err error
		st, err = status(p, id)
		return err == nil && st.State != "watching"
	})
	return st
}

func (w *world) assistantsRun(prompt string, metadata map[string]string) (thread, run string) {
	w.t.Helper()
	r, err := platformsim.StartAssistantsRun(context.Background(), w.client, prompt, metadata)
	if err != nil {
		w.t.Fatal(err)
	}
	return r.ThreadID, r.ID
}

func (w *world) runStatus(thread, run string) string {
	r, err := w.client.Beta.Threads.Runs.Get(context.Background(), thread, run)
	if err != nil {
		w.t.Fatal(err)
	}
	return string(r.Status)
}

func TestDispatcherKilledAtEachStageSubmitsOnce(t *testing.T) {
	for _, stage := range []string{"intake", "fanout", "gather", "submitted"} {
		t.Run(stage, func(t *testing.T) {
			w := newWorld(t, platformsim.FavoriteCityScenario)
			w.executor("exec-1", "-demo")
			a := w.dispatcher("dispatcher-a", "TOOLRELAY_TEST_CRASH_AT="+stage)
			thread, run := w.assistantsRun("my favorite city", nil)
			id := postWatch(t, a, fmt.Sprintf(`{"platform":"assistants","thread_id":%q,"run_id":%q}`, thread, run))
			select {
			case <-a.done:
			case <-time.After(30 * time.Second):
				t.Fatalf("dispatcher-a did not reach stage %s", stage)
			}
			if ws, ok := a.cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || ws.Signal() != syscall.SIGKILL {
				t.Fatalf("dispatcher-a ended with %v, want SIGKILL at %s", a.cmd.ProcessState, stage)
			}
			b := w.dispatcher("dispatcher-b")
			st := awaitWatch(t, b, id, 60*time.Second)
			want := "Your favorite city, Seattle, WA, is also known as The Emerald City. The current weather there is 70f."
			if st.State != "completed" || st.Answer != want {
				t.Fatalf("after the crash: watch %s %q %s", st.State, st.Answer, st.Error)
			}
			// Every turn ends submitted, including one the crashed replica
			// submitted without marking: another replica takes it over, and
			// the platform's "no longer waiting" counts as success.
			testutil.WaitForWhat(t, 60*time.Second, "both turns of the watch to be submitted", func() bool {
				st, err := status(b, id)
				if err != nil || len(st.TurnDetails) != 2 {
					return false
				}
				for _, td := range st.TurnDetails {
					if td.State != "submitted" {
						return false
					}
				}
				return true
			})
			if n := w.sim.Stats().SubmitToolOutputs; n != 2 {
				t.Errorf("accepted submissions = %d, want exactly 2 (one per turn)", n)
			}
			if s := w.runStatus(thread, run); s != "completed" {
				t.Errorf("run %s, want completed", s)
			}
		})
	}
}

func TestThreeReplicasFiveHundredTurns(t *testing.T) {
	if testing.Short() {
		t.Skip("500 turns through five processes")
	}
	w := newWorld(t, platformsim.HoroscopeScenario)
	w.executor("exec-1", "-demo")
	w.executor("exec-2", "-demo")
	var ds []*proc
	for i := range 3 {
		ds = append(ds, w.dispatcher(fmt.Sprintf("dispatcher-%d", i)))
	}
	const turns = 500
	ids := make([]string, turns)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 32)
	for i := range turns {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			r, err := w.client.Responses.New(context.Background(), responsesParams("What is my horoscope? I am an Aquarius."))
			if err != nil {
				t.Error(err)
				return
			}
			// Every replica is asked; the watch is one, and so is the turn.
			for _, d := range ds {
				ids[i] = postWatch(t, d, fmt.Sprintf(`{"platform":"responses","response_id":%q}`, r.ID))
			}
		})
	}
	wg.Wait()
	for i, id := range ids {
		st := awaitWatch(t, ds[i%3], id, 120*time.Second)
		if st.State != "completed" || !strings.Contains(st.Answer, "baby otter") {
			t.Fatalf("watch %d: %s %q %s", i, st.State, st.Answer, st.Error)
		}
	}
	stats := w.sim.Stats()
	if stats.FunctionCallOutputs != turns {
		t.Errorf("outputs accepted = %d, want exactly %d", stats.FunctionCallOutputs, turns)
	}
	if stats.Rejected != 0 {
		t.Errorf("the platform rejected %d requests", stats.Rejected)
	}
}

func TestShortRunWithSlowFunctionIsSubmittedBeforeExpiry(t *testing.T) {
	w := newWorld(t, platformsim.Scenario{Name: "slow", Prompt: "slow report",
		Steps: []platformsim.Step{{{Name: "slow_report"}}}, Answer: `report: {{out "slow_report"}}`})
	cfg := filepath.Join(w.dir, "functions.yaml")
	if err := os.WriteFile(cfg, []byte("functions:\n  - name: slow_report\n    owner: reports\n    command: [\"sleep\", \"120\"]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	w.executor("exec-1", "-config", cfg)
	d := w.dispatcher("dispatcher") // default margin 30s: a 20s run gets a quarter of it
	thread, run := w.assistantsRun("the slow report", map[string]string{platformsim.SimTTLMetadataKey: "20s"})
	id := postWatch(t, d, fmt.Sprintf(`{"platform":"assistants","thread_id":%q,"run_id":%q}`, thread, run))
	st := awaitWatch(t, d, id, 60*time.Second)
	if st.State != "completed" || !strings.Contains(st.Answer, `"type":"timeout"`) || !strings.Contains(st.Answer, "slow_report timed out") {
		t.Fatalf("watch %s %q %s; want an answer built on a timeout result", st.State, st.Answer, st.Error)
	}
	// The timeout comes from the dispatcher's cut-off or from the executor
	// stopping the command at the same deadline, whichever is recorded
	// first; either way the turn goes in before the run expires.
	turn := st.TurnDetails[0]
	if turn.State != "submitted" || !turn.SubmittedAt.Before(turn.ExpiresAt) {
		t.Errorf("turn %s, submitted %s, expires %s", turn.State, turn.SubmittedAt, turn.ExpiresAt)
	}
	if s := w.runStatus(thread, run); s != "completed" {
		t.Errorf("run %s, want completed (not expired)", s)
	}
}

func TestSchemaViolationNeverRuns(t *testing.T) {
	marker := filepath.Join(t.TempDir(), "ran")
	w := newWorld(t, platformsim.Scenario{Name: "bad", Prompt: "bad args",
		Steps: []platformsim.Step{{{Name: "record", Arguments: `{"n":"not a number"}`}}}, Answer: `{{out "record"}}`})
	cfg := filepath.Join(w.dir, "functions.yaml")
	body := fmt.Sprintf("functions:\n  - name: record\n    owner: ops\n    parameters: {type: object, properties: {n: {type: integer}}, required: [n]}\n    command: [\"sh\", \"-c\", \"touch %s\"]\n", marker)
	if err := os.WriteFile(cfg, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	w.executor("exec-1", "-config", cfg)
	d := w.dispatcher("dispatcher")
	r, err := w.client.Responses.New(context.Background(), responsesParams("bad args"))
	if err != nil {
		t.Fatal(err)
	}
	id := postWatch(t, d, fmt.Sprintf(`{"platform":"responses","response_id":%q}`, r.ID))
	st := awaitWatch(t, d, id, 30*time.Second)
	if !strings.Contains(st.Answer, `"type":"invalid_arguments"`) {
		t.Fatalf("answer %q, want invalid_arguments", st.Answer)
	}
	if _, err := os.Stat(marker); !os.IsNotExist(err) {
		t.Error("the function ran on arguments that break its schema")
	}
}

func TestWatchRejectsBadBodies(t *testing.T) {
	w := newWorld(t)
	d := w.dispatcher("dispatcher")
	for body, field := range map[string]string{
		`{"platform":"assistants","thread_id":"t"}`:                      "run_id",
		`{"platform":"slack","session_id":"s"}`:                          "platform",
		`{"platform":"agents","session_id":"s","extra":1}`:               "extra",
		`{"platform":"agents","session_id":5}`:                           "session_id",
		`{"platform":"responses","response_id":"r","agent":{"nom":"x"}}`: "agent",
		`not json`: "",
	} {
		resp, err := http.Post("http://"+d.addr+"/v1/watch", "application/json", bytes.NewBufferString(body))
		if err != nil {
			t.Fatal(err)
		}
		var out struct {
			Error struct{ Message, Field string }
		}
		_ = json.NewDecoder(resp.Body).Decode(&out)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || out.Error.Field != field || out.Error.Message == "" {
			t.Errorf("%s: %d %+v, want 400 naming %q", body, resp.StatusCode, out.Error, field)
		}
	}
}

func TestBuiltDispatcherTakesSignedWebhooksAndRefusesForgedOnes(t *testing.T) {
	const secret = "whsec_AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="
	w := newWorld(t, platformsim.CustomerScenario)
	w.executor("exec-1", "-demo")
	d := w.dispatcher("dispatcher", "OPENAI_WEBHOOK_SECRET="+secret)
	s, err := w.client.Beta.Agents.Sessions.New(context.Background(), openai.BetaAgentSessionNewParams{
		Environment: openai.EnvironmentParamUnion{OfParamNone: &openai.EnvironmentParamNone{}},
		Input:       openai.BetaAgentSessionNewParamsInputUnion{OfString: openai.String("customer 123")},
	})
	if err != nil {
		t.Fatal(err)
	}
	testutil.WaitForWhat(t, 10*time.Second, "the session to require action", func() bool {
		got, err := w.client.Beta.Agents.Sessions.Get(context.Background(), s.ID)
		return err == nil && got.Status == "requires_action"
	})
	body := platformsim.WebhookBody("evt_1", "agent.session.action_required", map[string]any{"id": s.ID, "required_action": map[string]string{"type": "function_call"}})
	send := func(h http.Header) int {
		req, _ := http.NewRequest(http.MethodPost, "http://"+d.addr+"/webhooks/openai", bytes.NewReader(body))
		req.Header = h
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	forged, _ := platformsim.Sign("whsec_AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE=", "wh_1", time.Now(), body)
	stale, _ := platformsim.Sign(secret, "wh_2", time.Now().Add(-10*time.Minute), body)
	for name, h := range map[string]http.Header{"forged": forged, "stale": stale, "unsigned": {"Content-Type": {"application/json"}}} {
		if code := send(h); code != http.StatusUnauthorized {
			t.Errorf("%s webhook: %d, want 401", name, code)
		}
	}
	if n := w.sim.Stats().ToolResults; n != 0 {
		t.Fatalf("refused webhooks led to %d tool results", n)
	}
	good, _ := platformsim.Sign(secret, "wh_3", time.Now(), body)
	if code := send(good); code != http.StatusOK {
		t.Fatalf("signed webhook: %d", code)
	}
	testutil.WaitForWhat(t, 20*time.Second, "the platform to take both tool results", func() bool { return w.sim.Stats().ToolResults == 2 })
	if code := send(good); code != http.StatusOK {
		t.Errorf("replayed webhook: %d, want 200", code)
	}
	if n := w.sim.Stats().ToolResults; n != 2 {
		t.Errorf("tool results after a replay = %d, want 2", n)
	}
}
