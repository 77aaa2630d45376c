package exec_test

import (
	"testing"
	"time"

	"github.com/toolrelay/toolrelay/internal/provision"
	"github.com/toolrelay/toolrelay/internal/testutil"
	"github.com/toolrelay/toolrelay/pkg/exec"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// healWithin bounds how long an executor may take to serve again after
// its consumer or stream is gone: missing heartbeats show within 5s (two
// 2.5s heartbeats), and recreating takes a few round trips.
const healWithin = 15 * time.Second

// servedWithin publishes a call and fails the test unless it succeeds
// within the time given.
func (h *harness) servedWithin(team, fn string, within time.Duration) {
	h.t.Helper()
	c := h.call(team, fn, `{"n":1}`, time.Now().Add(time.Minute))
	if res := h.result(c, within); !res.OK() {
		h.t.Fatalf("result %+v, want success", res)
	}
}

func TestHealRecreatesADeletedConsumer(t *testing.T) {
	h := start(t, "team-a", exec.Options{}, echo())
	h.servedWithin("team-a", "echo", 10*time.Second)
	if err := h.js.DeleteConsumer(t.Context(), protocol.CallStream("team-a"), "echo"); err != nil {
		t.Fatal(err)
	}
	testutil.WaitForWhat(t, healWithin, "the executor to recreate its consumer", func() bool {
		_, err := h.js.Consumer(t.Context(), protocol.CallStream("team-a"), "echo")
		return err == nil
	})
	h.servedWithin("team-a", "echo", healWithin)
	if !(len(h.declared("team-a", "echo")) > 0) {
		t.Error("the declaration of echo is gone, though the executor serves it")
	}
}

// An operator deletes the team's stream and creates it again (a restore,
// a move): the executor recreates its consumer on the new stream.
func TestHealAfterTheStreamIsRecreated(t *testing.T) {
	h := start(t, "team-a", exec.Options{}, echo())
	h.servedWithin("team-a", "echo", 10*time.Second)
	name := protocol.CallStream("team-a")
	if err := h.js.DeleteStream(t.Context(), name); err != nil {
		t.Fatal(err)
	}
	if _, err := provision.Stream(t.Context(), h.js, provision.CallStreamConfig("team-a", provision.Options{})); err != nil {
		t.Fatal(err)
	}
	h.servedWithin("team-a", "echo", healWithin)
}

// The stream goes and nobody recreates it (a server started on a fresh
// store): the executor, which provisions its team's stream, does.
func TestHealRecreatesAMissingStream(t *testing.T) {
	h := start(t, "team-a", exec.Options{}, echo())
	h.servedWithin("team-a", "echo", 10*time.Second)
	if err := h.js.DeleteStream(t.Context(), protocol.CallStream("team-a")); err != nil {
		t.Fatal(err)
	}
	testutil.WaitForWhat(t, healWithin, "the executor to recreate its stream and consumer", func() bool {
		_, err := h.js.Consumer(t.Context(), protocol.CallStream("team-a"), "echo")
		return err == nil
	})
	h.servedWithin("team-a", "echo", healWithin)
}

// The server starts again on an empty store (a development server
// restarted without its data): the executor reconnects, finds its stream
// and consumer gone by their missing heartbeats, and recreates them.
func TestHealAfterTheServerLosesItsStore(t *testing.T) {
	h := start(t, "team-a", exec.Options{}, echo())
	h.servedWithin("team-a", "echo", 10*time.Second)
	h.srv.RestartEmpty(t)
	testutil.WaitForWhat(t, 10*time.Second, "the test's connection to reach JetStream again", func() bool {
		_, err := h.js.AccountInfo(t.Context())
		return err == nil
	})
	registrar(t, h.js) // the dispatchers' side, as it would be provisioned again
	testutil.WaitForWhat(t, healWithin, "the executor to recreate its stream and consumer", func() bool {
		_, err := h.js.Consumer(t.Context(), protocol.CallStream("team-a"), "echo")
		return err == nil
	})
	var err error
	testutil.WaitForWhat(t, healWithin, "the results stream to exist again", func() bool {
		h.results, err = h.js.Stream(t.Context(), protocol.ResultStream("team-a"))
		return err == nil
	})
	h.servedWithin("team-a", "echo", healWithin)
}

// Where the consumer cannot be recreated (here: the team's stream was
// changed into one toolrelay will not use; in a deployment, the process
// may lack the rights), the executor stops declaring the function, says
// why at ERROR, and serves and declares it again once it can.
func TestHealWithdrawsTheDeclarationWhileItCannot(t *testing.T) {
	logs := &testutil.Buffer{}
	h := start(t, "team-a", exec.Options{Logger: testutil.LoggerTo(t, logs)}, echo())
	h.servedWithin("team-a", "echo", 10*time.Second)
	testutil.WaitForWhat(t, 10*time.Second, "echo to be declared", func() bool { return len(h.declared("team-a", "echo")) > 0 })
	name := protocol.CallStream("team-a")
	good := provision.CallStreamConfig("team-a", provision.Options{})
	bad := good
	bad.Subjects = append([]string{"elsewhere.team-a"}, good.Subjects...)
	if _, err := h.js.UpdateStream(t.Context(), bad); err != nil {
		t.Fatal(err)
	}
	if err := h.js.DeleteConsumer(t.Context(), name, "echo"); err != nil {
		t.Fatal(err)
	}
	testutil.WaitForWhat(t, healWithin, "the declaration of echo to be withdrawn", func() bool { return len(h.declared("team-a", "echo")) == 0 })
	if !logs.Logged("ERROR", "cannot recreate the function's consumer") {
		t.Errorf("no ERROR saying why echo is not served; log:\n%s", logs.String())
	}

	// The operator puts the stream right: the executor serves and
	// declares echo again.
	if _, err := h.js.UpdateStream(t.Context(), good); err != nil {
		t.Fatal(err)
	}
	testutil.WaitForWhat(t, healWithin, "echo to be declared again", func() bool { return len(h.declared("team-a", "echo")) > 0 })
	h.servedWithin("team-a", "echo", healWithin)
}
