package backend

import "time"

var (
	clockBase = time.Now()
	clockWall = clockBase.UnixNano()
)

// SystemNow returns the Unix time in nanoseconds from the monotonic clock:
// cheaper than time.Now (one clock read, not two) and immune to wall-clock
// steps while the process runs. It is the clock of stores that keep their
// own time; a store that decides with a shared server's clock ignores it.
func SystemNow() int64 { return clockWall + int64(time.Since(clockBase)) }
