package kit_test

import (
	"bytes"
	"context"
	"os"
	"testing"
	"time"

	"github.com/toolrelay/toolrelay/internal/conformance/kit"
	"github.com/toolrelay/toolrelay/internal/natstest"
	"github.com/toolrelay/toolrelay/internal/testutil"
	"github.com/toolrelay/toolrelay/pkg/dispatch"
)

// TestGoExecutorPassesTheKit runs every case of the kit against pkg/exec:
// the kit's checks are docs/protocol.md's statements, so this is also the
// test that the Go executor does what the document says.
func TestGoExecutorPassesTheKit(t *testing.T) {
	srv := natstest.Start(t)
	_, djs := srv.Connect(t)
	d, err := dispatch.New(djs, nil, dispatch.Options{Logger: testutil.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	runErr := make(chan error, 1)
	go func() { runErr <- d.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-runErr; err != nil {
			t.Errorf("dispatcher Run: %v", err)
		}
	})
	testutil.WaitForWhat(t, 10*time.Second, "the dispatcher to be ready", d.Ready)

	nc, js := srv.Connect(t)
	var out bytes.Buffer
	start := time.Now()
	rep, err := kit.Run(t.Context(), nc, &kit.GoTarget{JS: js, Team: "kit", Logger: testutil.Logger(t)}, kit.Options{Team: "kit"}, &out)
	t.Logf("kit report (%s):\n%s", time.Since(start).Round(time.Millisecond), out.String())
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK() || rep.Skipped > 0 {
		t.Errorf("the Go executor failed %d and skipped %d of the kit's cases", rep.Failed, rep.Skipped)
	}
}

// TestOperationsDocShowsTheEchoSchema keeps the schema teams copy from
// docs/operations.md the one the kit's Go functions declare.
func TestOperationsDocShowsTheEchoSchema(t *testing.T) {
	doc, err := os.ReadFile("../../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(doc, []byte("```json\n"+kit.EchoSchema+"\n```")) {
		t.Errorf("docs/operations.md (Conformance kit) does not show kit.EchoSchema:\n%s", kit.EchoSchema)
	}
}
