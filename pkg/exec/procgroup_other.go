//go:build !linux

package exec

import "syscall"

// setPdeathsig does nothing where there is no parent-death signal; the
// process group guard still kills the command when the executor dies.
func setPdeathsig(*syscall.SysProcAttr) {}
