//go:build !linux

package redis

import "os/exec"

// dieWithParent has no portable equivalent; TestMain stops the servers.
func dieWithParent(*exec.Cmd) {}
