package algorithms

// Usage is how much of its quota a key has at one moment, in terms that
// every algorithm shares. A store reads it from a key's state under one
// algorithm (Algorithm.Usage) and writes a state of another algorithm from
// it (Algorithm.FromUsage) when a reload changes the kind of state a limit
// keeps, so that nobody gets a fresh quota from the change.
type Usage struct {
	// Limit is the quota the numbers below are a share of (Result.Limit):
	// the burst (or queue size) of the bucket algorithms, max_events for
	// the window algorithms.
	Limit int64
	// Remaining is how many units a request could take now.
	Remaining int64
	// RetryAfter is how long until a request of one unit can pass, when
	// Remaining is 0; 0 otherwise.
	RetryAfter int64
	// ResetAfter is how long until the key is back to its full quota.
	ResetAfter int64
}

// share is u's remaining share of a quota of limit units, rounded down, so
// that a translated key never has more room than it had.
func (u Usage) share(limit int64) int64 {
	switch {
	case u.Limit <= 0 || u.Remaining <= 0:
		return 0
	case u.Remaining >= u.Limit:
		return limit
	}
	return min(mulDiv(u.Remaining, limit, u.Limit), limit)
}

// holdFor is how long a translated state keeps used units in use: until
// the old state would have been back to its full quota, and never less
// than it would have made a request wait.
func (u Usage) holdFor() int64 {
	return max(u.ResetAfter, u.RetryAfter, 1)
}

// Available, Usage and FromUsage of each algorithm follow. FromUsage
// writes a state that, at now, leaves at most u's share of this algorithm's
// quota (rounded down) and keeps what is in use for as long as u says,
// where the algorithm can hold it that long:
//
//   - the sliding log holds the used units as one event that leaves the
//     window when u would have reset, at most one window from now;
//   - the fixed window counts them in the current window, which ends at
//     its epoch boundary, however long u would have held them;
//   - the sliding window counter counts them in the current window and
//     weighs them out over the next one; a key that was denying stays
//     denied as long as before, up to the end of the next window;
//   - a bucket refills continuously from now, so its reset is tied to its
//     remaining tokens; a key that was denying stays denied for at least
//     u.RetryAfter.

// Available returns how many units a request could take from s at now.
func (b *bucket) Available(s Bucket, now int64) int64 { return b.tokensFloor(b.debt(s, now)) }

func (b *bucket) Usage(s Bucket, now int64) Usage {
	d := b.debt(s, now)
	u := Usage{Limit: b.burst, Remaining: b.tokensFloor(d), ResetAfter: d}
	if u.Remaining == 0 {
		u.RetryAfter = max(d+b.interval-b.capacity, 0)
	}
	return u
}

func (b *bucket) FromUsage(u Usage, now int64) Bucket {
	used := b.burst - u.share(b.burst)
	if used <= 0 {
		return Bucket{}
	}
	debt := used * b.interval
	if used == b.burst {
		// The first token comes back (capacity − interval) before the
		// debt is paid off: no sooner than the old state allowed.
		debt = max(debt, min(u.RetryAfter, MaxSpan-b.capacity)+b.capacity-b.interval)
	}
	return Bucket{TAT: now + debt}
}

// Available is, for the queue, how many unit requests it still takes.
func (l *LeakyBucket) Available(s Bucket, now int64) int64 {
	if l.maxDelay == 0 {
		return l.bucket.Available(s, now)
	}
	return l.queued(l.debt(s, now))
}

func (l *LeakyBucket) Usage(s Bucket, now int64) Usage {
	if l.maxDelay == 0 {
		return l.bucket.Usage(s, now)
	}
	d := l.debt(s, now)
	u := Usage{Limit: l.queueSize(), Remaining: l.queued(d), ResetAfter: d}
	if u.Remaining == 0 {
		u.RetryAfter = d - l.maxDelay
	}
	return u
}

// FromUsage, for the queue, puts the next free slot as far away as leaves
// u's share of the queue's places.
func (l *LeakyBucket) FromUsage(u Usage, now int64) Bucket {
	if l.maxDelay == 0 {
		return l.bucket.FromUsage(u, now)
	}
	size := l.queueSize()
	free := u.share(size)
	switch {
	case free >= size:
		return Bucket{}
	case free > 0:
		return Bucket{TAT: now + l.maxDelay - (free-1)*l.interval}
	}
	return Bucket{TAT: now + l.maxDelay + min(max(u.RetryAfter, 1), MaxSpan-l.maxDelay)}
}

func (a *SlidingLog) Available(l *Log, now int64) int64 {
	if l == nil {
		return a.p.Limit
	}
	l.prune(now, a.p.Window)
	return max(a.p.Limit-l.sum, 0)
}

func (a *SlidingLog) Usage(l *Log, now int64) Usage {
	u := Usage{Limit: a.p.Limit, Remaining: a.Available(l, now)}
	if l == nil || l.n == 0 {
		return u
	}
	u.ResetAfter = a.resetAfter(l, now)
	if u.Remaining == 0 {
		u.RetryAfter = a.Decide(l, now, 1).RetryAfter
	}
	return u
}

// FromUsage logs the units in use as one event, dated so that it leaves
// the window when u would have reset (or a window from now, if later).
func (a *SlidingLog) FromUsage(u Usage, now int64) *Log {
	used := a.p.Limit - u.share(a.p.Limit)
	if used <= 0 {
		return nil
	}
	l := new(Log)
	l.push(now-a.p.Window+min(u.holdFor(), a.p.Window), used)
	return l
}

func (a *FixedWindow) Available(s Window, now int64) int64 {
	_, count := a.current(s, now)
	return max(a.p.Limit-count, 0)
}

func (a *FixedWindow) Usage(s Window, now int64) Usage {
	start, count := a.current(s, now)
	u := Usage{Limit: a.p.Limit, Remaining: max(a.p.Limit-count, 0)}
	if count > 0 {
		u.ResetAfter = a.end(start) - now
	}
	if u.Remaining == 0 {
		u.RetryAfter = u.ResetAfter
	}
	return u
}

// FromUsage counts the units in use in the current window: they come back
// at its end, however long u would have held them.
func (a *FixedWindow) FromUsage(u Usage, now int64) Window {
	used := a.p.Limit - u.share(a.p.Limit)
	if used <= 0 {
		return Window{}
	}
	return Window{Start: a.start(now), Count: used}
}

func (a *SlidingCounter) Available(s Counter, now int64) int64 {
	return max(a.p.Limit-a.estimate(s, now), 0)
}

func (a *SlidingCounter) Usage(s Counter, now int64) Usage {
	c, e := a.roll(s, now)
	est := a.weighted(c.Prev, e) + c.Curr
	u := Usage{Limit: a.p.Limit, Remaining: max(a.p.Limit-est, 0), ResetAfter: a.resetAfter(c, now)}
	if u.Remaining == 0 {
		u.RetryAfter = a.retryAfter(c, e, now, 1)
	}
	return u
}

// FromUsage counts the units in use in the current window: the estimate
// holds them until its end and weighs them out over the next one. A key
// that was denying for longer than the current window lasts is counted
// over the limit by as much as keeps the weighted estimate full until then.
func (a *SlidingCounter) FromUsage(u Usage, now int64) Counter {
	used := a.p.Limit - u.share(a.p.Limit)
	if used <= 0 {
		return Counter{}
	}
	w := a.p.Window
	c := Counter{Start: now - now%w, Curr: used}
	if used == a.p.Limit {
		// Into the next window by e, ⌊curr·(w−e)/w⌋ stays ≥ limit while
		// curr ≥ limit·w/(w−e): add limit·e/(w−e), rounded up.
		if e := min(now+min(u.RetryAfter, MaxSpan)-(c.Start+w), w-1); e > 0 {
			c.Curr += mulDivCeil(a.p.Limit, e, w-e)
		}
	}
	return c
}
