package algorithms

// Grant gives a key units back by hand (an operator unblocking a customer):
// unlike Refund, which undoes one known request, it returns units whatever
// took them. Each Grant returns s with up to units given back at now, so
// that Available grows by exactly units, or up to the full quota when fewer
// were in use. What is in use past the limit (a limit lowered by a reload)
// is given back first, so a key that far over gains less room.

// Granter is implemented by every algorithm of this package.
type Granter[S any] interface {
	Grant(s S, now, units int64) S
}

// Grant pays units tokens of the bucket's debt back: units × T.
func (b *bucket) Grant(s Bucket, now, units int64) Bucket {
	if units <= 0 {
		return s
	}
	d := b.debt(s, now)
	if units >= (d+b.interval-1)/b.interval { // units × T ≥ d, without overflow
		return Bucket{}
	}
	return Bucket{TAT: now + d - units*b.interval}
}

// Grant takes units out of the current window's count.
func (a *FixedWindow) Grant(s Window, now, units int64) Window {
	start, count := a.current(s, now)
	if units <= 0 || count == 0 {
		return s
	}
	return Window{Start: start, Count: max(count-units, 0)}
}

// Grant takes units out of the current window's count first, then lowers
// the previous window's count until its weighted share is units smaller:
// the estimate, and so what is available, moves by exactly units.
func (a *SlidingCounter) Grant(s Counter, now, units int64) Counter {
	if units <= 0 {
		return s
	}
	c, e := a.roll(s, now)
	if c.Curr == 0 && c.Prev == 0 {
		return s // nothing in use: the key keeps its window
	}
	take := min(units, c.Curr)
	c.Curr -= take
	units -= take
	if units > 0 && c.Prev > 0 {
		// ⌊p·m/w⌋ ≤ t  ⇔  p ≤ ⌈(t+1)·w/m⌉ − 1, with m = w − e ≥ 1; each
		// unit of p moves the weighted count by at most one, so the largest
		// such p weighs exactly t.
		m := a.p.Window - e
		if t := a.weighted(c.Prev, e) - units; t < 0 {
			c.Prev = 0
		} else {
			c.Prev = min(c.Prev, mulDivCeil(t+1, a.p.Window, m)-1)
		}
	}
	return c
}

// Grant removes units from the newest events, as if the last requests had
// not happened: an event holding more units than are left to give keeps
// the rest.
func (a *SlidingLog) Grant(l *Log, now, units int64) *Log {
	if l == nil || units <= 0 {
		return l
	}
	l.prune(now, a.p.Window)
	for units > 0 && l.n > 0 {
		j := l.index(l.n - 1)
		u := l.unitsAt(j)
		if u > units {
			l.setUnits(j, u-units)
			l.sum -= units
			return l
		}
		l.sum -= u
		l.n--
		units -= u
	}
	if l.n == 0 {
		l.head = 0
		l.units, l.unit = nil, 0
	}
	return l
}

// setUnits sets the units of the event at j, keeping units per event from
// then on if the log had one count for all of them.
func (l *Log) setUnits(j int, u int64) {
	if l.units == nil {
		l.units = make([]uint32, len(l.at))
		for i := range l.units {
			l.units[i] = l.unit
		}
	}
	l.units[j] = uint32(u)
}

// Interface guards.
var (
	_ Granter[Bucket]  = (*TokenBucket)(nil)
	_ Granter[Bucket]  = (*GCRA)(nil)
	_ Granter[Bucket]  = (*LeakyBucket)(nil)
	_ Granter[Window]  = (*FixedWindow)(nil)
	_ Granter[Counter] = (*SlidingCounter)(nil)
	_ Granter[*Log]    = (*SlidingLog)(nil)
)

// Clone returns a copy of l that shares nothing with it, for reading a
// log's usage without pruning it: a read by an operator must leave the
// state exactly as it was (a later, longer window would count events a
// prune dropped).
func (l *Log) Clone() *Log {
	if l == nil {
		return nil
	}
	c := *l
	c.at = append([]int64(nil), l.at...)
	if l.units != nil {
		c.units = append([]uint32(nil), l.units...)
	}
	return &c
}
