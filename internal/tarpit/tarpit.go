// Package tarpit holds the answers to denied requests for a while, so that
// a scraper's threads wait instead of retrying at once. It counts the held
// requests, of one handler and of the whole process, and tells how long to
// hold one; the caller does the waiting.
package tarpit

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/algorithms"
)

// Every tarpit of the process shares one ceiling: half the open-file
// limit. Each held denial keeps a connection open, and held ones must
// never take the descriptors that other clients' connections, upstream
// connections and files need: with tarpit_max above the limit, one client
// opening connections and getting denied would make Caddy refuse everyone.
var (
	heldAll atomic.Int64 // denials every tarpit holds now
	ceiling atomic.Int64 // 0: no ceiling known
)

// SetCeiling sets how many denials all tarpits together hold at most; 0
// for no ceiling.
func SetCeiling(c int64) { ceiling.Store(c) }

// Ceiling is the ceiling of all tarpits together; 0 when none is known.
func Ceiling() int64 { return ceiling.Load() }

// HeldAll is how many denials all tarpits hold now.
func HeldAll() int64 { return heldAll.Load() }

// Tarpit is a handler's tarpit: how many denials it holds, and a channel
// closed when the config stops serving, which lets them all go.
type Tarpit struct {
	delay, max int64
	held       atomic.Int64
	done       chan struct{}
	once       sync.Once
}

// New is a tarpit that holds a denial for between half and all of delay
// (ns), and at most max of them at once.
func New(delay, max int64) *Tarpit {
	return &Tarpit{delay: delay, max: max, done: make(chan struct{})}
}

// Max is how many denials t holds at most.
func (t *Tarpit) Max() int64 { return t.max }

// Held is how many denials t holds now.
func (t *Tarpit) Held() int64 { return t.held.Load() }

// Done is closed once t has stopped: held denials go at once.
func (t *Tarpit) Done() <-chan struct{} { return t.done }

// Stop lets every held denial go, at once; further ones are not held.
func (t *Tarpit) Stop() {
	if t != nil {
		t.once.Do(func() { close(t.done) })
	}
}

// Take counts one more held request, unless max are held by this
// tarpit or the ceiling by all of them. A true Take is followed by one
// Release.
func (t *Tarpit) Take() bool {
	for {
		n := t.held.Load()
		if n >= t.max {
			return false
		}
		if t.held.CompareAndSwap(n, n+1) {
			break
		}
	}
	if c := ceiling.Load(); heldAll.Add(1) > c && c > 0 {
		heldAll.Add(-1)
		t.held.Add(-1)
		return false
	}
	return true
}

// Release counts a held request out.
func (t *Tarpit) Release() {
	t.held.Add(-1)
	heldAll.Add(-1)
}

// Delay is how long to hold a denial, given random, a number in [0, 1):
// between half and all of the tarpit. Jittered, so held scrapers are not
// let go, and do not come back, in one wave, and the delay does not tell a
// tarpit from a slow server.
func (t *Tarpit) Delay(random float64) time.Duration {
	return time.Duration(t.delay/2 + int64(random*float64(t.delay-t.delay/2)))
}

// Elapse takes d (ns) off the waits of out, decided d ago: a client told
// to retry in 30 s after a 10 s hold would otherwise wait 10 s too long.
func Elapse(out []algorithms.Result, d int64) {
	for i := range out {
		if out[i].RetryAfter != algorithms.Never {
			out[i].RetryAfter = max(out[i].RetryAfter-d, 0)
		}
		out[i].ResetAfter = max(out[i].ResetAfter-d, 0)
	}
}
