package algorithms

// Bucket is the state of the token bucket and GCRA: one theoretical arrival
// time, 8 bytes. TAT is when the bucket is full again; before it the bucket
// holds burst − (TAT−now)/T tokens. When a reload changes T, the store
// rebases each TAT to the new T as of the reload (Rebase).
type Bucket struct {
	TAT int64
}

// bucket is the shared math of the token bucket and GCRA. Lazy refill in
// tokens and GCRA's TAT comparison are the same inequality:
//
//	tokens(now) ≥ cost  ⇔  max(TAT, now) + cost·T − now ≤ burst·T
//
// so both are kept as a TAT in integer nanoseconds, which makes the worked
// examples of docs/algorithms.md exact (no float drift in 0.4 × 5 = 2).
type bucket struct {
	p        Policy
	interval int64   // T
	inverse  float64 // 1/T, to count whole tokens without dividing
	burst    int64
	capacity int64 // burst · T: the largest debt the bucket can hold
}

func newBucket(p Policy) bucket {
	t := p.Interval()
	b := p.burst()
	return bucket{p: p, interval: t, inverse: 1 / float64(t), burst: b, capacity: b * t}
}

// TokenBucket is the token bucket: capacity Burst (default
// Limit), refilled continuously at Limit per Window, cost tokens per request.
type TokenBucket struct{ bucket }

// NewTokenBucket returns the token bucket for p. p must be valid.
func NewTokenBucket(p Policy) *TokenBucket { return &TokenBucket{newBucket(p)} }

// GCRA is the generic cell rate algorithm: emission interval
// T = Window/Limit, tolerance τ = (Burst−1)·T, allow when now ≥ TAT − τ.
// It admits exactly what a token bucket of capacity Burst admits.
type GCRA struct{ bucket }

// NewGCRA returns GCRA for p. p must be valid.
func NewGCRA(p Policy) *GCRA { return &GCRA{newBucket(p)} }

func (b *bucket) Policy() Policy { return b.p }

// debt is TAT − now in the current interval: how long until the bucket is
// full. A clock that went backwards only makes the debt larger, so it can
// never mint tokens.
func (b *bucket) debt(s Bucket, now int64) int64 {
	if s.TAT <= now {
		return 0
	}
	return s.TAT - now
}

// Rebase converts the debt left at the moment of the change from the old
// interval to this one: the tokens in use stay in use (rounded up, so a
// change of rate never mints a token) and refill at the new rate from then.
func (b *bucket) Rebase(s Bucket, at int64, old Policy) Bucket {
	t := old.Interval()
	if s.TAT <= at || t == b.interval || t <= 0 {
		return s
	}
	// A debt owed past the capacity (a settled cost) stays within what
	// settling may owe.
	return Bucket{TAT: at + min(mulDivCeil(s.TAT-at, b.interval, t), max(b.capacity, MaxDebt))}
}

func (b *bucket) tokensFloor(debt int64) int64 {
	if debt >= b.capacity {
		return 0
	}
	return floorDiv(b.capacity-debt, b.interval, b.inverse)
}

func (b *bucket) Decide(s Bucket, now, cost int64) Result {
	cost = max(cost, 0)
	d := b.debt(s, now)
	r := Result{Limit: b.burst}
	if cost > b.burst {
		r.RetryAfter = Never
		r.Remaining = b.tokensFloor(d)
		r.ResetAfter = d
		return r
	}
	nd := d + cost*b.interval
	if nd <= b.capacity || cost == 0 {
		r.Allowed = true
		r.Remaining = b.tokensFloor(nd)
		r.ResetAfter = nd
		return r
	}
	r.RetryAfter = nd - b.capacity
	r.Remaining = b.tokensFloor(d)
	r.ResetAfter = d
	return r
}

func (b *bucket) Take(s Bucket, now, cost int64) Bucket {
	return Bucket{TAT: now + b.debt(s, now) + max(cost, 0)*b.interval}
}

// Refund gives cost tokens back (a request that took them did not happen),
// never filling the bucket above its capacity, and never more than the
// request's charge still holds: the refill has paid it off by the time
// its decision said the bucket would be full again (granted.At +
// granted.ResetAfter), whatever came after it. Tokens given back past
// that would be refill the key had already had: a client that held
// reservations open while its bucket refilled could cash them all at
// once, a burst many times the bucket's size. A result that does not say
// when (no ResetAfter: units a lease gives back) is refunded whole.
func (b *bucket) Refund(s Bucket, now int64, granted Result, cost int64) Bucket {
	back := max(cost, 0) * b.interval
	if granted.At != 0 && granted.ResetAfter > 0 {
		back = min(back, granted.At+granted.ResetAfter-now)
	}
	if back <= 0 {
		return s
	}
	d := b.debt(s, now) - back
	if d <= 0 {
		return Bucket{}
	}
	return Bucket{TAT: now + d}
}

// IdleAt is the TAT itself: from then on the bucket is full.
func (b *bucket) IdleAt(s Bucket) int64 { return s.TAT }
