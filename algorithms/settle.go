package algorithms

import "math"

// Settling replaces a request's estimated cost by its real cost once the
// response has told it (the tokens an LLM call used): the difference is
// given back when the real cost is lower, never more than was taken, and
// charged when it is higher, even past the limit, so that a key that used
// more than it had owes it and waits it out. Nothing ever goes below an
// empty state.

// MaxSettle is the largest real cost a request can settle at: a number
// above it is not a count of anything a limit holds, and is refused as
// garbage before it reaches an algorithm.
const MaxSettle = MaxEvents

// MaxDebt bounds how long a bucket can owe, in nanoseconds: 2^52 ns,
// about 52 days, the range in which the Redis store's times are exact. A
// key charged past it owes that long, not longer.
const MaxDebt int64 = 1 << 52

// maxOwed bounds the units a window counts once charged past its limit:
// twice the largest limit, exact in the Redis store's doubles.
const maxOwed = 2 * MaxEvents

// Settler is implemented by every algorithm of this package.
type Settler[S any] interface {
	// Settle returns s, at now, with the request that granted took
	// estimate units for settled at actual units (both ≥ 0).
	Settle(s S, now int64, granted Result, estimate, actual int64) S
}

// refundDown settles a real cost at or below the estimate: the
// difference is given back as a refund of that many units.
func refundDown[S any](refund func(S, int64, Result, int64) S, s S, now int64, granted Result, estimate, actual int64) S {
	if actual == estimate {
		return s
	}
	return refund(s, now, granted, estimate-actual)
}

// Settle gives tokens back or adds the extra to the debt: a debt beyond
// the capacity delays the next request by what is owed beyond it, at the
// refill rate.
func (b *bucket) Settle(s Bucket, now int64, granted Result, estimate, actual int64) Bucket {
	if actual <= estimate {
		return refundDown(b.Refund, s, now, granted, estimate, actual)
	}
	d := b.debt(s, now)
	most := max(b.capacity, MaxDebt)
	if d >= most {
		return s
	}
	if extra := actual - estimate; extra > (most-d)/b.interval {
		d = most
	} else {
		d += extra * b.interval
	}
	return Bucket{TAT: now + d}
}

// Settle of the leaky bucket: the meter is a token bucket. A queue's
// request cannot settle (its slot is spent once it left the queue); the
// handler refuses the combination.
func (l *LeakyBucket) Settle(s Bucket, now int64, granted Result, estimate, actual int64) Bucket {
	if l.maxDelay > 0 {
		return s
	}
	return l.bucket.Settle(s, now, granted, estimate, actual)
}

// Settle gives units back out of the window they were counted in, while
// it is current; the extra is counted in the current window, above the
// limit if need be, until it ends.
func (a *FixedWindow) Settle(s Window, now int64, granted Result, estimate, actual int64) Window {
	if actual <= estimate {
		return refundDown(a.Refund, s, now, granted, estimate, actual)
	}
	start, count := a.current(s, now)
	return Window{Start: start, Count: min(count+min(actual-estimate, maxOwed), maxOwed)}
}

// Settle gives units back as Refund does; the extra is counted in the
// current window, and weighs on the next one as it slides.
func (a *SlidingCounter) Settle(s Counter, now int64, granted Result, estimate, actual int64) Counter {
	if actual <= estimate {
		return refundDown(a.Refund, s, now, granted, estimate, actual)
	}
	c, _ := a.roll(s, now)
	c.Curr = min(c.Curr+min(actual-estimate, maxOwed), maxOwed)
	return c
}

// Settle rewrites the request's own event (estimate units at granted.At,
// the newest such) to actual units, removing it at 0, so the extra leaves
// the window with the request. When the event is gone (it left the
// window before the response ended), nothing is given back and the extra
// is logged now. The log holds at most 2^32 − 1 units: more could not
// keep a key out longer than a window of them.
func (a *SlidingLog) Settle(l *Log, now int64, granted Result, estimate, actual int64) *Log {
	if actual == estimate {
		return l
	}
	room := int64(math.MaxUint32)
	if l != nil {
		l.prune(now, a.p.Window)
		room = max(room-l.sum, 0)
	}
	if i := l.find(granted.At, estimate); i >= 0 {
		if actual == 0 {
			l.removeAt(i)
			return l
		}
		if u := min(actual, estimate+room); u != estimate {
			l.setUnits(l.index(i), u)
			l.sum += u - estimate
		}
		return l
	}
	if extra := min(actual-estimate, room); extra > 0 {
		return a.Take(l, now, extra)
	}
	return l
}

// find returns the position (0 oldest) of the newest live event of units
// logged at at, or -1.
func (l *Log) find(at, units int64) int {
	if l == nil || units <= 0 {
		return -1
	}
	for i := l.n - 1; i >= 0; i-- {
		j := l.index(i)
		if l.at[j] < at {
			break
		}
		if l.at[j] == at && l.unitsAt(j) == units {
			return i
		}
	}
	return -1
}

// Interface guards.
var (
	_ Settler[Bucket]  = (*TokenBucket)(nil)
	_ Settler[Bucket]  = (*GCRA)(nil)
	_ Settler[Bucket]  = (*LeakyBucket)(nil)
	_ Settler[Window]  = (*FixedWindow)(nil)
	_ Settler[Counter] = (*SlidingCounter)(nil)
	_ Settler[*Log]    = (*SlidingLog)(nil)
)
