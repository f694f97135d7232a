package redis

import "syscall"

// cpuNanos is the CPU time this process has used (user and system): on a
// shared machine the wall time of a benchmark measures the other
// processes as much as the code.
func cpuNanos() int64 {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}
