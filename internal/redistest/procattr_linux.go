package redistest

import (
	"os/exec"
	"syscall"
)

// dieWithParent kills the server when the test process dies, so that a
// killed test (a fuzz worker, a timeout) leaves no redis-server behind.
func dieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
