package main

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/toolrelay/toolrelay/internal/testutil"
)

// runExecutor runs the command with args until ctx ends and returns its
// output and error.
func runExecutor(ctx context.Context, args ...string) (*testutil.Buffer, <-chan error) {
	out := &testutil.Buffer{}
	done := make(chan error, 1)
	go func() { done <- run(ctx, args, out, io.Discard) }()
	return out, done
}

// The command says 'serving' only once the dispatchers accepted its
// declarations, so an executor refused a name another team owns never
// says it; and a clean stop says why it stopped.
func TestExecutorSaysServingOnlyWhenServedAndWhyItStopped(t *testing.T) {
	p := newPipeline(t, "functions:\n  - name: get_invoice\n    owner: billing\n    command: [\"cat\"]\n")
	p.waitServing(t, 1)

	out, done := runExecutor(t.Context(), "-config", writeFile(t, "functions:\n  - name: get_invoice\n    owner: orders\n    command: [\"cat\"]\n"))
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "billing") {
			t.Errorf("an executor claiming billing's function: %v; want a refusal naming billing", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the refused executor did not stop within 20s")
	}
	if got := out.String(); !strings.Contains(got, "executor starting") || strings.Contains(got, "executor serving") {
		t.Errorf("the refused executor said:\n%s\nwant 'starting' and never 'serving'", got)
	}

	ctx, stop := context.WithCancelCause(t.Context())
	out, done = runExecutor(ctx, "-config", writeFile(t, "functions:\n  - name: get_order\n    owner: orders\n    command: [\"cat\"]\n"))
	testutil.WaitForWhat(t, 20*time.Second, "the second executor to say it serves", func() bool { return strings.Contains(out.String(), "executor serving 1 function(s)") })
	stop(errors.New("received terminated"))
	if err := <-done; err != nil {
		t.Fatalf("a stopped executor: %v", err)
	}
	if got := out.String(); !strings.Contains(got, "executor stopped (received terminated): declarations withdrawn") {
		t.Errorf("the stopped executor said:\n%s\nwant why it stopped", got)
	}
}
