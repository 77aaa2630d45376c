package exec

import "syscall"

// setPdeathsig has the kernel SIGKILL the child when the thread that
// started it exits (see runInGroup).
func setPdeathsig(attr *syscall.SysProcAttr) { attr.Pdeathsig = syscall.SIGKILL }
