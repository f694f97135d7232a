//go:build !linux

package redistest

import "os/exec"

// dieWithParent has no portable equivalent; the caller stops the servers.
func dieWithParent(*exec.Cmd) {}
