package exec

import (
	"fmt"
	"os"
	osexec "os/exec"
	"runtime"
	"syscall"
)

// A command's processes must not outlive its call: not past the deadline,
// not after the command exits, and not after the executor dies, whatever
// kills it. If they did, a side-effect function could really perform its
// effect after the model was told it had not run. runInGroup gives each
// command a process group that dies with the call, in three layers:
//
//  1. The executor kills the whole group (SIGKILL to -pgid) at the deadline
//     (cmd.Cancel) and again when the command exits, so nothing it left in
//     the background outlives the call.
//
//  2. The group's leader is a guard: a /bin/sh that ignores the usual
//     termination signals and blocks reading a pipe whose only write end
//     the executor holds (close-on-exec, so no command inherits it). When
//     the executor dies — SIGKILL, OOM kill, a crash — the kernel closes
//     that end, the guard reads EOF and kills its own process group, which
//     takes the command and every descendant that stayed in the group
//     (the "sleep 600 &" of a shell script) with it. A kernel signal
//     alone cannot do this: PR_SET_PDEATHSIG reaches only the direct child
//     and is cleared by fork. Because the guard leads the group and stays
//     the executor's unreaped child until the call ends, the group id
//     cannot be reused while the executor may still signal it.
//
//  3. The command itself (Linux) also has Pdeathsig = SIGKILL, so it dies
//     at once with the executor even if it moved out of the group or the
//     guard was killed. Go delivers Pdeathsig when the OS thread that
//     forked the child exits, not the process, so the child is started and
//     waited for on a goroutine locked to its thread for the child's whole
//     life; the goroutine never unlocks, so the thread is discarded after
//     Wait rather than reused.
//
// Not chosen: making the executor a child subreaper
// (PR_SET_CHILD_SUBREAPER). It is process-wide state a library should not
// impose on the program embedding it, the subreaper must then reap
// adopted orphans (a wait on any child races os/exec's own waits), and it
// does nothing once the executor itself is dead. What the guard cannot
// catch is a process that deliberately leaves the group (setsid, a
// daemonizing fork): containing that needs a cgroup or PID namespace,
// which is the deployment's business.
func runInGroup(cmd *osexec.Cmd) error {
	r, w, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("exec: process group guard: %w", err)
	}
	defer w.Close()
	guard := osexec.Command("/bin/sh", "-c", guardScript)
	guard.Stdin = r
	guard.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	err = guard.Start()
	r.Close()
	if err != nil {
		return fmt.Errorf("exec: start the process group guard: %w", err)
	}
	pgid := guard.Process.Pid
	defer func() {
		// Whatever the command left running, and the guard, end with the
		// call. The guard is reaped only now, so pgid stayed ours.
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		_ = guard.Wait()
	}()

	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pgid: pgid}
	setPdeathsig(cmd.SysProcAttr)
	cmd.Cancel = func() error { return syscall.Kill(-pgid, syscall.SIGKILL) }
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: see layer 3 above
		done <- cmd.Run()
	}()
	return <-done
}

// guardScript ignores the signals a terminal or a stray "kill 0" from the
// command would send, waits for the executor's end of the pipe to close,
// and then kills its process group (itself included).
const guardScript = `trap '' HUP INT QUIT TERM; read -r _; kill -s KILL 0`
