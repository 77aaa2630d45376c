package main

import (
	"context"
	"fmt"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/toolrelay/toolrelay/internal/platformsim"
	"github.com/toolrelay/toolrelay/internal/testutil"
)

// previousVersion is the last commit of the version before the turn lease
// (holds and claims), which a rolling upgrade runs beside this one.
const previousVersion = "79eb6c0"

// buildPrevious builds the dispatcher of previousVersion from this clone's
// history.
func buildPrevious(t *testing.T) string {
	t.Helper()
	root, err := osexec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Skipf("not in a git clone (%v): the version before cannot be built", err)
	}
	if err := osexec.Command("git", "cat-file", "-e", previousVersion+"^{commit}").Run(); err != nil {
		t.Skipf("commit %s is not in this clone's history (a shallow clone?)", previousVersion)
	}
	dir := t.TempDir()
	archive := osexec.Command("sh", "-c", fmt.Sprintf("git -C %q archive --format=tar %s | tar -x -C %q", strings.TrimSpace(string(root)), previousVersion, dir))
	if out, err := archive.CombinedOutput(); err != nil {
		t.Fatalf("extracting %s: %v\n%s", previousVersion, err, out)
	}
	bin := filepath.Join(binDir, "dispatcher-"+previousVersion)
	build := osexec.Command("go", "build", "-o", bin, "./cmd/dispatcher")
	build.Dir = dir
	build.Env = append(os.Environ(), "GOFLAGS=-mod=mod")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the dispatcher of %s: %v\n%s", previousVersion, err, out)
	}
	return bin
}

// A dispatcher of this version beside one of the version before the lease
// (a rolling upgrade): turns taken in by either, their results reaching
// either, are each submitted once; then the older one stops, and this one
// finishes every turn and watch it left, held ones included. The platform
// sees no continuation asked for twice.
func TestRollingUpgradeFromTheVersionBeforeTheLease(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the version before and runs two of them")
	}
	oldBin := buildPrevious(t)
	w := newWorld(t, platformsim.HoroscopeScenario)
	w.executor("exec-1", "-demo")
	w.executor("exec-2", "-demo")
	old := w.dispatcherOf(oldBin, "dispatcher-old")
	cur := w.dispatcher("dispatcher-new")

	const turns = 60
	ids := make([]string, turns)
	var wg sync.WaitGroup
	for i := range turns {
		wg.Go(func() {
			r, err := w.client.Responses.New(context.Background(), responsesParams("What is my horoscope? I am an Aquarius."))
			if err != nil {
				t.Error(err)
				return
			}
			// Half are driven by each version; a result may reach either.
			by := []*proc{old, cur}[i%2]
			ids[i] = postWatch(t, by, fmt.Sprintf(`{"platform":"responses","response_id":%q}`, r.ID))
		})
		if i == turns/2 {
			wg.Wait() // the first half under way side by side
		}
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	// The older one stops mid-way, as a rolling upgrade stops it: its
	// holds and watches go to this version.
	if err := old.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	for i, id := range ids {
		st := awaitWatch(t, cur, id, 90*time.Second)
		if st.State != "completed" || !strings.Contains(st.Answer, "baby otter") {
			t.Fatalf("watch %d: %s %q %s", i, st.State, st.Answer, st.Error)
		}
	}
	testutil.WaitForWhat(t, 10*time.Second, "the older dispatcher to exit", func() bool {
		select {
		case <-old.done:
			return true
		default:
			return false
		}
	})
	// Both versions took part.
	for _, name := range []string{"dispatcher-old", "dispatcher-new"} {
		b, _ := os.ReadFile(filepath.Join(w.dir, name+".log"))
		if n := strings.Count(string(b), `"msg":"turn submitted"`); n == 0 {
			t.Errorf("%s submitted no turn; the test shows nothing of the two side by side", name)
		} else {
			t.Logf("%s submitted %d turns", name, n)
		}
	}
	stats := w.sim.Stats()
	if stats.FunctionCallOutputs != turns || stats.ResponseReplays != 0 || stats.Rejected != 0 {
		t.Errorf("the platform took %d outputs for %d turns, was asked %d times to continue again, refused %d requests; want exactly one each, none again, none refused",
			stats.FunctionCallOutputs, turns, stats.ResponseReplays, stats.Rejected)
	}
}
