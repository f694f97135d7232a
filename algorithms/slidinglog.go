package algorithms

import "math"

// Log is the state of the exact sliding window: the times of the admitted
// events still inside the window, oldest first, in a ring that grows as it is
// used. An event costs 8 bytes, not the 24 of a time.Time, and nothing is
// allocated before the first event. Events of one cost (every request of the
// key costs the same) share one count of units; only a key whose requests
// cost different amounts keeps the units of each event, 4 bytes more.
type Log struct {
	at    []int64  // event times; len is a power of two
	units []uint32 // units per event, parallel to at; nil while all are unit
	unit  uint32   // the units of every event while units is nil
	head  int      // index of the oldest event
	n     int      // events held
	sum   int64    // units held
}

func (l *Log) index(i int) int { return (l.head + i) & (len(l.at) - 1) }

func (l *Log) unitsAt(j int) int64 {
	if l.units == nil {
		return int64(l.unit)
	}
	return int64(l.units[j])
}

// prune drops the events that have left the window (at + window ≤ now).
func (l *Log) prune(now, window int64) {
	for l.n > 0 && l.at[l.head]+window <= now {
		l.sum -= l.unitsAt(l.head)
		l.head = (l.head + 1) & (len(l.at) - 1)
		l.n--
	}
	if l.n == 0 {
		l.head = 0
		l.units, l.unit = nil, 0 // the next event may set another unit
	}
	// Give memory back after a burst, but keep room for the usual load.
	if len(l.at) > 64 && l.n < len(l.at)/4 {
		l.resize(len(l.at) / 2)
	}
}

// resize moves the events to a ring of size slots, dropping the units per
// event once the events left all have the same.
func (l *Log) resize(size int) {
	at := make([]int64, size)
	var units []uint32
	if l.units != nil && !l.uniform() {
		units = make([]uint32, size)
	}
	for i := 0; i < l.n; i++ {
		j := l.index(i)
		at[i] = l.at[j]
		if units != nil {
			units[i] = l.units[j]
		}
	}
	if l.units != nil && units == nil && l.n > 0 {
		l.unit = l.units[l.head]
	}
	l.at, l.units, l.head = at, units, 0
}

// uniform reports whether every event held has the same units.
func (l *Log) uniform() bool {
	for i := 1; i < l.n; i++ {
		if l.units[l.index(i)] != l.units[l.head] {
			return false
		}
	}
	return true
}

func (l *Log) newest() int64 { return l.at[l.index(l.n-1)] }

func (l *Log) push(t, units int64) {
	units = min(units, math.MaxUint32) // a limit of the log never exceeds it
	if l.n == len(l.at) {
		l.resize(max(2*len(l.at), 2))
	}
	if l.n == 0 && l.units == nil {
		l.unit = uint32(units)
	}
	if l.units == nil && units != int64(l.unit) {
		l.units = make([]uint32, len(l.at))
		for i := range l.units {
			l.units[i] = l.unit
		}
	}
	j := l.index(l.n)
	l.at[j] = t
	if l.units != nil {
		l.units[j] = uint32(units)
	}
	l.n++
	l.sum += units
}

// SlidingLog is the exact sliding window (a log of events), as in
// mholt/caddy-ratelimit: at most Limit units in any window of length Window.
// An event at time e counts while now < e + Window. Denied requests are never
// logged, so hammering a full window does not extend it.
type SlidingLog struct {
	p Policy
}

// NewSlidingLog returns the sliding window log for p. p must be valid.
func NewSlidingLog(p Policy) *SlidingLog { return &SlidingLog{p: p} }

func (a *SlidingLog) Policy() Policy { return a.p }

func (a *SlidingLog) Decide(l *Log, now, cost int64) Result {
	cost = max(cost, 0)
	var count int64
	if l != nil {
		l.prune(now, a.p.Window)
		count = l.sum
	}
	r, done := counted(a.p.Limit, count, cost, a.resetAfter(l, now))
	if done {
		if r.Allowed && cost > 0 {
			r.ResetAfter = max(r.ResetAfter, a.p.Window)
		}
		return r
	}
	// Wait until enough of the oldest units leave the window.
	need := count + cost - a.p.Limit
	var freed int64
	for i := 0; i < l.n; i++ {
		j := l.index(i)
		freed += l.unitsAt(j)
		if freed >= need {
			r.RetryAfter = l.at[j] + a.p.Window - now
			break
		}
	}
	return r
}

func (a *SlidingLog) resetAfter(l *Log, now int64) int64 {
	if l == nil || l.n == 0 {
		return 0
	}
	return max(l.newest()+a.p.Window-now, 0)
}

func (a *SlidingLog) Take(l *Log, now, cost int64) *Log {
	if cost <= 0 {
		return l
	}
	if l == nil {
		l = new(Log)
	}
	l.prune(now, a.p.Window)
	// Keep the log in time order even if the clock stepped back: such an
	// event is recorded at the newest time, so it leaves the window later,
	// never earlier.
	if l.n > 0 {
		now = max(now, l.newest())
	}
	l.push(now, cost)
	return l
}

// Refund removes the event the granted request logged: cost units at
// granted.At, searched from the newest. Events of other requests are never
// taken out, so the log stays exact; an event that cannot be found (the
// clock stepped back and it was logged at a later time) stays. Like a
// decision, it first drops the events that have left the window: a later,
// longer window must not count them again (the Redis store lets the key
// expire once its newest event has left).
func (a *SlidingLog) Refund(l *Log, now int64, granted Result, cost int64) *Log {
	if l == nil || cost <= 0 {
		return l
	}
	l.prune(now, a.p.Window)
	for i := l.n - 1; i >= 0; i-- {
		j := l.index(i)
		if l.at[j] < granted.At {
			break
		}
		if l.at[j] == granted.At && l.unitsAt(j) == cost {
			l.removeAt(i)
			break
		}
	}
	return l
}

// removeAt deletes the i-th oldest event, keeping the others in order.
func (l *Log) removeAt(i int) {
	l.sum -= l.unitsAt(l.index(i))
	for k := i; k < l.n-1; k++ {
		j, next := l.index(k), l.index(k+1)
		l.at[j] = l.at[next]
		if l.units != nil {
			l.units[j] = l.units[next]
		}
	}
	l.n--
}

func (a *SlidingLog) IdleAt(l *Log) int64 {
	if l == nil || l.n == 0 {
		return 0
	}
	return l.newest() + a.p.Window
}

// Rebase keeps the state: it records events, not a rate, so a new policy
// reads it as it is.
func (a *SlidingLog) Rebase(s *Log, _ int64, _ Policy) *Log { return s }
