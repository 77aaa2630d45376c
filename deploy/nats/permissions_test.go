// Package natsdeploy checks the NATS configuration in deploy/nats with a
// real server: the files parse, toolrelay runs under the per-team
// permissions, and a team cannot touch another team's calls or results.
package natsdeploy

import (
	"context"
	"encoding/json"
	"errors"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"

	"github.com/toolrelay/toolrelay/internal/natstest"
	"github.com/toolrelay/toolrelay/internal/platformsim"
	"github.com/toolrelay/toolrelay/internal/testutil"
	"github.com/toolrelay/toolrelay/pkg/dispatch"
	"github.com/toolrelay/toolrelay/pkg/dispatch/openaiplatform"
	"github.com/toolrelay/toolrelay/pkg/exec"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

func setPasswords(t *testing.T) {
	t.Setenv("TOOLRELAY_SYS_PASSWORD", "sys-secret")
	t.Setenv("TOOLRELAY_DISPATCHER_PASSWORD", "dispatcher-secret")
	t.Setenv("TOOLRELAY_ORDERS_PASSWORD", "orders-secret")
}

func TestConfigsParse(t *testing.T) {
	setPasswords(t)
	for _, f := range []string{"single.conf", "n1.conf", "n2.conf", "n3.conf"} {
		opts, err := server.ProcessConfigFile(f)
		if err != nil {
			t.Errorf("%s: %v", f, err)
			continue
		}
		if !opts.JetStream || !opts.SyncAlways {
			t.Errorf("%s: jetstream %v, sync always %v", f, opts.JetStream, opts.SyncAlways)
		}
	}
}

// connectAs connects as a user of deploy/nats/accounts.conf, collecting
// the asynchronous errors the server sends (permission violations).
func connectAs(t *testing.T, s *server.Server, user, password string) (*nats.Conn, jetstream.JetStream, *asyncErrors) {
	t.Helper()
	errs := &asyncErrors{}
	nc, js := natstest.Connect(t, s.ClientURL(), nats.UserInfo(user, password), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		errs.add(err)
	}))
	return nc, js, errs
}

type asyncErrors struct {
	mu   sync.Mutex
	errs []error
}

func (a *asyncErrors) add(err error) { a.mu.Lock(); a.errs = append(a.errs, err); a.mu.Unlock() }

func (a *asyncErrors) violation(subject string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, err := range a.errs {
		if errors.Is(err, nats.ErrPermissionViolation) && strings.Contains(err.Error(), subject) {
			return true
		}
	}
	return false
}

func TestTeamPermissions(t *testing.T) {
	setPasswords(t)
	opts, err := server.ProcessConfigFile("single.conf")
	if err != nil {
		t.Fatal(err)
	}
	opts.Port, opts.HTTPPort, opts.StoreDir, opts.NoLog, opts.NoSigs = -1, 0, t.TempDir(), true, true
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("server not ready")
	}
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	quiet := testutil.Logger(t)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })

	// The dispatcher (the control plane) starts first and creates the
	// shared streams.
	sim := platformsim.New(platformsim.Options{Model: &platformsim.Model{Scenarios: []platformsim.Scenario{{
		Name: "order", Prompt: "order", Steps: []platformsim.Step{{{Name: "get_order_status", Arguments: `{"order_id":"A-1"}`}}},
		Answer: `{{out "get_order_status"}}`,
	}}}})
	hs := httptest.NewServer(sim)
	t.Cleanup(func() { hs.CloseClientConnections(); sim.Close(); hs.Close() })
	client := openai.NewClient(option.WithBaseURL(hs.URL+"/v1"), option.WithAPIKey("k"))
	_, djs, _ := connectAs(t, s, "dispatcher", "dispatcher-secret")
	d, err := dispatch.New(djs, openaiplatform.New(client), dispatch.Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	wg.Go(func() { _ = d.Run(ctx) })
	testutil.WaitFor(t, 20*time.Second, d.Ready)

	// Team orders' executor runs with its locked-down user.
	_, ojs, _ := connectAs(t, s, "orders", "orders-secret")
	ex, err := exec.New(ojs, "orders", exec.Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if err := ex.Register(exec.Function{Name: "get_order_status", SideEffects: true,
		Parameters: json.RawMessage(`{"type":"object","properties":{"order_id":{"type":"string"}},"required":["order_id"]}`),
		Handler: exec.HandlerFunc(func(ctx context.Context, inv *exec.Invocation) ([]byte, error) {
			return []byte("shipped"), nil
		})}); err != nil {
		t.Fatal(err)
	}
	runErr := make(chan error, 1)
	wg.Go(func() { runErr <- ex.Run(ctx) })
	testutil.WaitFor(t, 20*time.Second, func() bool {
		select {
		case err := <-runErr:
			t.Fatalf("the executor could not start under its permissions: %v", err)
		default:
		}
		c, err := djs.Consumer(context.Background(), protocol.CallStream("orders"), "get_order_status")
		return err == nil && c.CachedInfo().NumWaiting > 0
	})

	r, err := client.Responses.New(context.Background(), responses.ResponseNewParams{Model: "m",
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("my order")}})
	if err != nil {
		t.Fatal(err)
	}
	w, err := d.Watch(context.Background(), dispatch.Ref{Platform: protocol.PlatformResponses, ResponseID: r.ID})
	if err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 20*time.Second, func() bool {
		w, err = d.WatchStatus(context.Background(), w.ID)
		return err == nil && w.State != dispatch.WatchActive
	})
	if w.State != dispatch.WatchCompleted || w.Answer != "shipped" {
		t.Fatalf("under team permissions: watch %s %q %s", w.State, w.Answer, w.Error)
	}

	// Another team's calls and results are out of reach.
	if _, err := djs.CreateStream(context.Background(), jetstream.StreamConfig{Name: protocol.CallStream("payments"), Subjects: protocol.CallStreamSubjects("payments")}); err != nil {
		t.Fatal(err)
	}
	onc, ojs2, errs := connectAs(t, s, "orders", "orders-secret")
	if err := onc.Publish("fnresult.payments.x.y", []byte("forged")); err != nil {
		t.Fatal(err)
	}
	if _, err := onc.Subscribe("fncall.>", func(*nats.Msg) {}); err != nil {
		t.Fatal(err)
	}
	qctx, qcancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer qcancel()
	if _, err := ojs2.Stream(qctx, protocol.CallStream("payments")); err == nil {
		t.Error("team orders read team payments' call stream")
	}
	testutil.WaitFor(t, 5*time.Second, func() bool {
		return errs.violation("fnresult.payments.x.y") && errs.violation("fncall.>")
	})
}
