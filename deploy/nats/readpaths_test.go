package natsdeploy

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolrelay/toolrelay/internal/console"
	"github.com/toolrelay/toolrelay/internal/tenancy"
	"github.com/toolrelay/toolrelay/internal/testutil"
	"github.com/toolrelay/toolrelay/pkg/dispatch"
	"github.com/toolrelay/toolrelay/pkg/dispatch/httpapi"
	"github.com/toolrelay/toolrelay/pkg/exec"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// The read-only paths from each team's account to the control plane
// (docs/security.md): what the console reads through them, and that
// nothing else goes through them.

// A team cannot import another team's read paths (nor the control
// account's view of them): each export names the control account alone,
// and the server refuses to load a configuration that imports one anyway.
func TestNoTeamCanImportAnothersReadPaths(t *testing.T) {
	dir := t.TempDir()
	res, err := tenancy.Write(dir, tenancy.Options{Teams: []string{"orders", "billing"}})
	if err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(dir, "accounts.conf")
	generated, err := os.ReadFile(conf)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := server.ProcessConfigFile(res.Servers[0]); err != nil {
		t.Fatalf("the generated configuration: %v", err)
	}
	dlq, calls := protocol.DeadLetterStream, protocol.CallStream("billing")
	for _, imp := range []struct{ account, subject string }{
		{tenancy.TeamAccount("billing"), "$JS.API.STREAM.INFO." + calls},
		{tenancy.TeamAccount("billing"), "$JS.API.CONSUMER.LIST." + calls},
		{tenancy.TeamAccount("billing"), "$JS.API.STREAM.INFO." + dlq},
		{tenancy.TeamAccount("billing"), "$JS.API.DIRECT.GET." + dlq},
		{tenancy.TeamAccount("billing"), "$JS.API.DIRECT.GET." + dlq + ".>"},
		{tenancy.ControlAccount, "$JS.team.billing.API.>"},
	} {
		// Orders' account imports it, as an operator hand-editing the
		// file (or a team asking for it) might.
		orders := "  " + tenancy.TeamAccount("orders") + ": {"
		i := strings.Index(string(generated), orders)
		j := i + strings.Index(string(generated[i:]), "    imports: [\n") + len("    imports: [\n")
		edited := string(generated[:j]) + fmt.Sprintf("      { service: { account: %s, subject: %q }, to: \"steal.>\" }\n", imp.account, imp.subject) + string(generated[j:])
		if err := os.WriteFile(conf, []byte(edited), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := server.ProcessConfigFile(res.Servers[0]); err == nil || !strings.Contains(err.Error(), "not authorized") {
			t.Errorf("orders importing %s of %s: %v; want the server to refuse it as not authorized", imp.subject, imp.account, err)
		}
	}
}

// console serves the console and the HTTP API of the deployment's
// dispatcher, to loopback clients (no tokens: they see every team).
func (x *deployment) console() string {
	x.t.Helper()
	api := httpapi.New(x.d, httpapi.Options{Logger: testutil.Logger(x.t)})
	ui, err := console.New(x.d, api, console.Options{Logger: testutil.Logger(x.t)})
	if err != nil {
		x.t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/", api)
	ui.Mount(mux)
	hs := httptest.NewServer(mux)
	x.t.Cleanup(hs.Close)
	return hs.URL
}

// api sends an HTTP request to url with body (GET when empty) and decodes
// the answer into v.
func api(t *testing.T, url, body string, v any) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	if body != "" {
		req, _ = http.NewRequest(http.MethodPost, url, strings.NewReader(body))
		req.Header.Set(console.ConsoleHeader, "1")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s %s: %s", req.Method, url, resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatal(err)
	}
}

// The control plane reads what lives in a team's account through the
// read-only paths the generator exports and nothing else: the console
// lists billing's dead letters and replays one (billing's executor runs it
// and its outcome is recorded), and /v1/functions has billing's queue
// figures. Through those paths the dispatcher's user can change nothing.
func TestControlPlaneReadsATeamsDeadLettersAndQueue(t *testing.T) {
	x := deploy(t)
	url := x.console()
	deadLetters := func() []console.DeadLetter {
		var body struct {
			DeadLetters []console.DeadLetter `json:"dead_letters"`
		}
		api(t, url+"/v1/deadletters", "", &body)
		return body.DeadLetters
	}

	call := x.callTarot(`{"card":"the fool"}`)
	t.Run("dead letters are listed and replayed", func(t *testing.T) {
		var letters []console.DeadLetter
		testutil.WaitForWhat(t, 20*time.Second, "billing's failed call to be listed as a dead letter", func() bool { letters = deadLetters(); return len(letters) == 1 })
		if dl := letters[0]; dl.Key != call.Key || dl.Team != "billing" || dl.Function != "get_tarot" ||
			dl.Reason != protocol.ReasonPermanent || !strings.Contains(dl.Error, "missing its cards") {
			t.Fatalf("dead letter = %+v; want billing's failed get_tarot call", dl)
		}
		x.tarotFixed.Store(true)
		var replayed struct{ Replays []console.ReplayOutcome }
		api(t, url+"/v1/deadletters/replay", `{"keys":["`+string(call.Key)+`"]}`, &replayed)
		if len(replayed.Replays) != 1 || replayed.Replays[0].Replay != 1 {
			t.Fatalf("replay = %+v; want replay 1 queued (its publish acknowledged across the import)", replayed.Replays)
		}
		testutil.WaitForWhat(t, 20*time.Second, "the dead letter to show its replay's outcome", func() bool { letters = deadLetters(); return len(letters) == 1 && letters[0].LastReplay != nil })
		if r := letters[0].LastReplay; r.N != 1 || r.Outcome != "ok" || r.Output != secretOutput {
			t.Errorf("replay outcome = %+v; want #1 ok with billing's output", r)
		}
	})

	t.Run("queue figures", func(t *testing.T) {
		// One held call runs (get_tarot runs one at a time), one waits.
		x.callTarot(`{"card":"hold"}`)
		x.callTarot(`{"card":"hold"}`)
		defer x.release()
		var q *dispatch.FunctionQueue
		testutil.WaitForWhat(t, 20*time.Second, "get_tarot's queue figures to show 1 in flight, 1 queued, 1 dead letter", func() bool { // the figures are read every few seconds
			var body struct{ Functions []dispatch.FunctionView }
			api(t, url+"/v1/functions", "", &body)
			for _, f := range body.Functions {
				if f.Name == "get_tarot" {
					q = f.Queue
				}
			}
			return q != nil && q.InFlight == 1 && q.Queued == 1 && q.DeadLetters == 1
		})
	})

	t.Run("nothing is written through the read paths", func(t *testing.T) {
		tjs, err := x.d.TeamJetStream("billing")
		if err != nil {
			t.Fatal(err)
		}
		calls := protocol.CallStream("billing")
		if err := tjs.DeleteStream(short(t), protocol.DeadLetterStream); !refused(err) {
			t.Errorf("deleting billing's dead letters as the dispatcher: %v, want it refused", err)
		}
		if _, err := tjs.CreateConsumer(short(t), calls, jetstream.ConsumerConfig{Name: "peek"}); !refused(err) {
			t.Errorf("making a consumer of billing's calls as the dispatcher: %v, want it refused", err)
		}
		if err := tjs.DeleteConsumer(short(t), calls, "get_tarot"); !refused(err) {
			t.Errorf("deleting billing's consumer as the dispatcher: %v, want it refused", err)
		}
		if s, err := tjs.Stream(short(t), protocol.DeadLetterStream); err != nil {
			t.Error(err)
		} else if err := s.Purge(short(t)); !refused(err) {
			t.Errorf("purging billing's dead letters as the dispatcher: %v, want it refused", err)
		}
		// Nor is anything but the exported reads answered, a call's
		// arguments least of all.
		nc := x.djs.Conn()
		prefix := protocol.TeamAPIPrefix(protocol.TeamAPIPrefixTemplate, "billing")
		for _, req := range []string{"STREAM.MSG.GET." + calls, "DIRECT.GET." + calls, "DIRECT.GET." + calls + "." + call.Subject(),
			"STREAM.MSG.DELETE." + protocol.DeadLetterStream, "STREAM.UPDATE." + protocol.DeadLetterStream,
			"STREAM.CREATE.STEAL", "STREAM.NAMES", "CONSUMER.INFO." + calls + ".get_tarot",
			"CONSUMER.MSG.NEXT." + calls + ".get_tarot", "CONSUMER.CREATE." + calls + ".peek", "INFO"} {
			if _, err := nc.Request(prefix+"."+req, []byte(`{"seq":1}`), time.Second); !refused(err) {
				t.Errorf("%s.%s as the dispatcher: %v, want no responders", prefix, req, err)
			}
		}
		// Billing's account is as it was: its dead letter, its consumers.
		_, bjs := x.connect("billing")
		if dls, err := exec.NewDeadLetters(bjs).List(short(t), "billing"); err != nil || len(dls) != 2 {
			t.Errorf("billing's dead letters: %d records, %v; want its dead letter and the replay's outcome", len(dls), err)
		}
		if _, err := bjs.Consumer(short(t), calls, "get_tarot"); err != nil {
			t.Errorf("billing's consumer: %v", err)
		}
	})
}
