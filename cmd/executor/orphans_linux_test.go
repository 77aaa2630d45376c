//go:build linux

package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/toolrelay/toolrelay/internal/testutil"
)

// A command function's processes must not outlive an executor killed with
// SIGKILL: nobody would kill them at the deadline any more, and a side
// effect would happen after the model was told it did not.
func TestKilledExecutorsCommandProcessesDieWithIt(t *testing.T) {
	c := newCluster(t)
	childFile, grandchildFile := filepath.Join(c.dir, "child.pid"), filepath.Join(c.dir, "grandchild.pid")
	// The shell is the executor's child; the background sleep, in the same
	// process group, is its grandchild.
	cfg := writeFile(t, fmt.Sprintf(`functions:
  - name: long_effect
    owner: ops
    side_effects: true
    timeout: 3s
    command: ["sh", "-c", "sleep 600 & echo $! > %s.tmp; mv %[1]s.tmp %[1]s; echo $$ > %s.tmp; mv %[2]s.tmp %[2]s; wait"]
`, grandchildFile, childFile))
	a := c.executor("exec-a", cfg)
	c.waitServing("ops", "long_effect")
	c.call("ops", "long_effect")

	var child, grandchild int
	testutil.WaitForWhat(t, 10*time.Second, "the command and its child to write their pids", func() bool {
		child, grandchild = readPID(childFile), readPID(grandchildFile)
		return child > 0 && grandchild > 0
	})
	t.Cleanup(func() { // if the test fails, do not leave them behind
		for _, pid := range []int{child, grandchild} {
			if alive(pid) {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})
	if !alive(child) || !alive(grandchild) {
		t.Fatalf("the command is not running: child %d alive %v, grandchild %d alive %v",
			child, alive(child), grandchild, alive(grandchild))
	}
	if err := a.Process.Kill(); err != nil { // SIGKILL mid-call
		t.Fatal(err)
	}
	_ = a.Wait()
	// Well before the 3s timeout could matter, and far before the sleep
	// would end by itself.
	testutil.WaitForWhat(t, 10*time.Second, "the command and its child to be gone", func() bool { return !alive(child) && !alive(grandchild) })
}

// readPID returns the pid written to path, or 0 if there is none yet.
func readPID(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0
	}
	return pid
}

// alive reports whether pid is a running process: it exists and is not a
// zombie waiting to be reaped (an orphan's new parent may never reap it).
func alive(pid int) bool {
	if pid <= 0 || syscall.Kill(pid, 0) != nil {
		return false
	}
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(stat)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	return len(fields) > 0 && fields[0] != "Z" && fields[0] != "X"
}
