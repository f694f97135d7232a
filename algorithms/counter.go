package algorithms

// Counter is the state of the sliding window counter: the start of the
// current fixed window and the units counted in it and in the one before.
// 24 bytes.
type Counter struct {
	Start int64
	Prev  int64
	Curr  int64
}

// SlidingCounter is the sliding window counter: the count
// of the sliding window is estimated as the previous fixed window's count,
// weighted by how much of it the sliding window still overlaps, plus the
// current window's count, rounded down:
//
//	estimate = ⌊prev × (Window − elapsed) / Window⌋ + curr
//
// and a request passes when estimate + cost ≤ Limit. It assumes the
// previous window's requests were spread evenly; when they were not, it
// admits a little more or less than the exact log (docs/algorithms.md has
// the measured error). Windows are aligned to the Unix epoch.
type SlidingCounter struct{ p Policy }

// NewSlidingCounter returns the sliding window counter for p. p must be
// valid.
func NewSlidingCounter(p Policy) *SlidingCounter { return &SlidingCounter{p: p} }

func (a *SlidingCounter) Policy() Policy { return a.p }

// roll moves s to the window now belongs to. A clock that stepped back
// keeps the later window, with its previous window weighed in full.
func (a *SlidingCounter) roll(s Counter, now int64) (c Counter, elapsed int64) {
	w := a.p.Window
	start := now - now%w
	switch {
	case start <= s.Start:
		return s, max(now-s.Start, 0)
	case start == s.Start+w:
		return Counter{Start: start, Prev: s.Curr}, now - start
	default:
		return Counter{Start: start}, now - start
	}
}

// weighted is ⌊prev × (Window − elapsed) / Window⌋.
func (a *SlidingCounter) weighted(prev, elapsed int64) int64 {
	if prev == 0 {
		return 0
	}
	return mulDiv(prev, a.p.Window-elapsed, a.p.Window)
}

// estimate returns the estimated count of the sliding window at now.
func (a *SlidingCounter) estimate(s Counter, now int64) int64 {
	c, e := a.roll(s, now)
	return a.weighted(c.Prev, e) + c.Curr
}

func (a *SlidingCounter) Decide(s Counter, now, cost int64) Result {
	cost = max(cost, 0)
	c, e := a.roll(s, now)
	est := a.weighted(c.Prev, e) + c.Curr
	r, done := counted(a.p.Limit, est, cost, a.resetAfter(c, now))
	switch {
	case !done:
		r.RetryAfter = a.retryAfter(c, e, now, cost)
	case r.Allowed && cost > 0:
		r.ResetAfter = c.Start + 2*a.p.Window - now
	}
	return r
}

// retryAfter finds the first time the estimate leaves room for cost units:
// later in this window as the previous window's weight falls, or else in the
// next one, where this window's count becomes the previous.
func (a *SlidingCounter) retryAfter(c Counter, elapsed, now, cost int64) int64 {
	w := a.p.Window
	// ⌊prev·m/w⌋ ≤ k  ⇔  prev·m < (k+1)·w  ⇔  m ≤ ⌈(k+1)·w/prev⌉ − 1, where
	// m = w − elapsed is what is left of the window.
	firstFit := func(prev, k int64) int64 {
		if prev == 0 {
			return 0
		}
		m := mulDivCeil(k+1, w, prev) - 1
		return max(w-m, 0)
	}
	if k := a.p.Limit - c.Curr - cost; k >= 0 {
		if e := firstFit(c.Prev, k); e < w {
			return max(e-elapsed, 1)
		}
	}
	e := firstFit(c.Curr, a.p.Limit-cost)
	return c.Start + w + e - now
}

func (a *SlidingCounter) resetAfter(c Counter, now int64) int64 {
	switch {
	case c.Curr > 0:
		return c.Start + 2*a.p.Window - now
	case c.Prev > 0:
		return c.Start + a.p.Window - now
	}
	return 0
}

func (a *SlidingCounter) Take(s Counter, now, cost int64) Counter {
	c, _ := a.roll(s, now)
	c.Curr += max(cost, 0)
	return c
}

// Refund takes the units back out of the window they were counted in: the
// current one, or the previous one if the window has turned since.
func (a *SlidingCounter) Refund(s Counter, now int64, granted Result, cost int64) Counter {
	c, _ := a.roll(s, now)
	cost = max(cost, 0)
	switch {
	case granted.At >= c.Start:
		c.Curr = max(c.Curr-cost, 0)
	case granted.At >= c.Start-a.p.Window:
		c.Prev = max(c.Prev-cost, 0)
	}
	return c
}

func (a *SlidingCounter) IdleAt(s Counter) int64 {
	switch {
	case s.Curr > 0:
		return s.Start + 2*a.p.Window
	case s.Prev > 0:
		return s.Start + a.p.Window
	}
	return 0
}

// Rebase moves the count onto the new window's grid when the window
// length changed: the old estimate at the change becomes the count of the
// new window that contains it (rounded up, as the estimate is), so the
// change frees no quota.
func (a *SlidingCounter) Rebase(s Counter, at int64, old Policy) Counter {
	if old.Window == a.p.Window {
		return s
	}
	oc := SlidingCounter{p: old}
	est := oc.estimate(s, at)
	if est == 0 {
		return Counter{}
	}
	return Counter{Start: at - at%a.p.Window, Curr: est}
}
