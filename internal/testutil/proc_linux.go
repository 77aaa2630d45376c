package testutil

import (
	"os/exec"
	"syscall"
)

// DieWithTest has the kernel kill cmd when the test process dies, however
// it dies: an interrupted go test leaves no servers behind on a shared
// machine.
func DieWithTest(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
