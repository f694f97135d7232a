package algorithms

// LeakyBucket is the leaky bucket, in its two forms.
//
// As a meter (MaxDelay 0) the bucket holds Burst units and leaks Limit per
// Window; a request that would overflow it is denied. That is the token
// bucket seen from the other side, and it admits exactly the same requests.
//
// As a queue (MaxDelay > 0) a request is never denied for arriving early: it
// is given the next free slot of a steady Limit-per-Window schedule and
// waits (Result.Delay) until its slot, so what passes is perfectly smooth,
// without bursts: nginx's limit_req without nodelay, or a partner API that
// allows 10 requests per second. Only a request whose slot is more than
// MaxDelay away is denied. The queue holds ⌊MaxDelay/T⌋ + 1 requests.
type LeakyBucket struct {
	bucket
	maxDelay int64
}

// NewLeakyBucket returns the leaky bucket for p: a queue when p.MaxDelay is
// positive, else a meter. p must be valid.
func NewLeakyBucket(p Policy) *LeakyBucket {
	return &LeakyBucket{bucket: newBucket(p), maxDelay: p.MaxDelay}
}

// queueSize is how many unit requests the queue holds: the one whose slot
// is now and those whose slots are at most maxDelay away.
func (l *LeakyBucket) queueSize() int64 { return l.maxDelay/l.interval + 1 }

func (l *LeakyBucket) Decide(s Bucket, now, cost int64) Result {
	if l.maxDelay == 0 {
		return l.bucket.Decide(s, now, cost)
	}
	cost = max(cost, 0)
	d := l.debt(s, now) // how long until the next free slot
	r := Result{Limit: l.queueSize(), ResetAfter: d}
	if cost == 0 { // free: needs no slot, so neither waits nor is refused
		r.Allowed = true
		r.Remaining = l.queued(d)
		return r
	}
	if cost > r.Limit {
		r.RetryAfter = Never
		r.Remaining = l.queued(d)
		return r
	}
	if d <= l.maxDelay {
		r.Allowed = true
		r.Delay = d
		r.ResetAfter = d + cost*l.interval
		r.Remaining = l.queued(r.ResetAfter)
		return r
	}
	r.RetryAfter = d - l.maxDelay
	return r
}

// queued is how many more unit requests fit in the queue when the next
// free slot is d away.
func (l *LeakyBucket) queued(d int64) int64 {
	if d > l.maxDelay {
		return 0
	}
	return floorDiv(l.maxDelay-d, l.interval, l.inverse) + 1
}

// Take and IdleAt are the bucket's: a queued request holds its slot from
// now on.
func (l *LeakyBucket) Take(s Bucket, now, cost int64) Bucket { return l.bucket.Take(s, now, cost) }

// Rebase keeps the slots a queue has given out at the new interval: they
// reach max_delay + the queue's size in intervals, past the bucket's
// capacity, and a debt cut short would hand a newcomer a slot already
// given. The debt stops at the larger of that and the bucket's own bound
// (a settled cost may owe up to MaxDebt).
func (l *LeakyBucket) Rebase(s Bucket, at int64, old Policy) Bucket {
	t := old.Interval()
	if l.maxDelay == 0 || s.TAT <= at || t == l.interval || t <= 0 {
		return l.bucket.Rebase(s, at, old)
	}
	most := max(l.capacity, MaxDebt, l.maxDelay+l.queueSize()*l.interval)
	return Bucket{TAT: at + min(mulDivCeil(s.TAT-at, l.interval, t), most)}
}

// Refund frees the slot of a queued request whose client left, when it
// is the last slot given out. A slot in the middle of the queue stays
// empty: the requests queued behind it keep theirs, and handing it to a
// newcomer would release two requests at once, which a queue must never do.
func (l *LeakyBucket) Refund(s Bucket, now int64, granted Result, cost int64) Bucket {
	if l.maxDelay == 0 {
		return l.bucket.Refund(s, now, granted, cost)
	}
	slot := granted.At + granted.Delay
	if cost <= 0 || s.TAT != slot+cost*l.interval || slot < now {
		return s
	}
	return Bucket{TAT: slot}
}
