//go:build unix

package sluice

import "syscall"

// openFileLimit is the process's soft limit on open files, 0 if unknown.
func openFileLimit() int64 {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil || l.Cur > 1<<40 {
		return 0
	}
	return int64(l.Cur)
}
