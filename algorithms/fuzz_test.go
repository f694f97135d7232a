package algorithms

import (
	"math"
	"testing"
)

// FuzzAlgorithms drives every algorithm with arbitrary policies, costs and
// clock steps, backwards included. Nothing may panic or overflow, results
// must be coherent, and the units admitted must stay within what the policy
// allows over the time the clock actually covered: a clock that steps back
// and forth must not mint quota.
//
//	go test -fuzz FuzzAlgorithms ./algorithms
func FuzzAlgorithms(f *testing.F) {
	f.Add(uint8(0), uint16(10), uint32(1000), uint16(0), uint32(0), []byte{0, 1, 0, 5, 1, 0, 250, 1, 0, 6, 255, 0})
	f.Add(uint8(3), uint16(5), uint32(1000), uint16(10), uint32(0), []byte{0, 1, 0, 0, 1, 0, 200, 3, 0, 100, 3, 0})
	f.Add(uint8(5), uint16(10), uint32(1000), uint16(0), uint32(500), []byte{0, 1, 0, 0, 1, 0, 0, 2, 0, 128, 1, 0})
	f.Add(uint8(2), uint16(1), uint32(1), uint16(1), uint32(1), []byte{255, 255, 255, 128, 0, 128})
	f.Fuzz(func(t *testing.T, which uint8, limit uint16, windowMs uint32, burst uint16, delayMs uint32, ops []byte) {
		p := Policy{
			Limit:  int64(limit),
			Window: int64(windowMs) * ms,
			Burst:  int64(burst),
		}
		name := Names()[int(which)%len(Names())]
		if name == NameLeakyBucket && which%2 == 1 {
			p.MaxDelay = int64(delayMs) * ms
		}
		if !UsesBurst(name) {
			p.Burst = 0
		}
		if _, err := Check(name, p); err != nil {
			return
		}
		switch name {
		case NameSlidingWindow:
			drive(t, NewSlidingLog(p), name, p, ops)
		case NameSlidingCounter:
			drive(t, NewSlidingCounter(p), name, p, ops)
		case NameFixedWindow:
			drive(t, NewFixedWindow(p), name, p, ops)
		case NameTokenBucket:
			drive(t, NewTokenBucket(p), name, p, ops)
		case NameGCRA:
			drive(t, NewGCRA(p), name, p, ops)
		case NameLeakyBucket:
			drive(t, NewLeakyBucket(p), name, p, ops)
		}
	})
}

// drive replays ops, three bytes each: a signed clock step in sixteenths of
// the window, a cost (255 means the largest int64), and whether to refund
// the previous admitted request.
func drive[S any](t *testing.T, a Algorithm[S], name string, p Policy, ops []byte) {
	var st S
	now := base
	lo, hi := now, now
	var units, lastCost int64
	var lastGranted Result
	maxCost := MaxCost(name, p)
	for i := 0; i+2 < len(ops); i += 3 {
		step := int64(int8(ops[i])) * (p.Window / 16)
		now = max(now+step, 0)
		lo, hi = min(lo, now), max(hi, now)
		cost := int64(ops[i+1])
		if cost == 255 {
			cost = math.MaxInt64
		}
		if ops[i+2]&1 == 1 && lastCost > 0 {
			st = a.Refund(st, now, lastGranted, lastCost)
			units -= lastCost
			lastCost = 0
		}
		r := a.Decide(st, now, cost)
		switch {
		case r.Remaining < 0, r.ResetAfter < 0, r.Delay < 0, r.Limit <= 0:
			t.Fatalf("%s op %d: incoherent result %+v", name, i/3, r)
		case r.Allowed && r.RetryAfter != 0:
			t.Fatalf("%s op %d: allowed with a RetryAfter: %+v", name, i/3, r)
		case !r.Allowed && r.RetryAfter <= 0 && r.RetryAfter != Never:
			t.Fatalf("%s op %d: denied without a wait: %+v", name, i/3, r)
		case r.Allowed && cost > maxCost:
			t.Fatalf("%s op %d: cost %d above the most the zone holds (%d) allowed", name, i/3, cost, maxCost)
		case r.Delay > 0 && p.MaxDelay == 0:
			t.Fatalf("%s op %d: a delay without a queue: %+v", name, i/3, r)
		case r.Delay > p.MaxDelay:
			t.Fatalf("%s op %d: delay %d beyond max_delay %d", name, i/3, r.Delay, p.MaxDelay)
		}
		if r.RetryAfter == Never && cost <= maxCost {
			t.Fatalf("%s op %d: cost %d ≤ %d can never pass?", name, i/3, cost, maxCost)
		}
		if r.Allowed {
			st = a.Take(st, now, cost)
			units += cost
			lastCost = cost
			r.At = now
			lastGranted = r
			// The most any algorithm admits over a span: two windows'
			// worth per window covered (the fixed window's boundary burst,
			// the counter's worst case), plus a full bucket or queue.
			span := hi - lo
			bound := 2*(p.Limit*(span/p.Window+2)) + maxCost
			if p.MaxDelay > 0 {
				bound += (p.MaxDelay/p.Interval() + 1) * 2
			}
			if units > bound {
				t.Fatalf("%s: %d units admitted over %dns of clock (bound %d)", name, units, span, bound)
			}
		}
		if idle := a.IdleAt(st); idle < 0 {
			t.Fatalf("%s: IdleAt %d", name, idle)
		}
		checkUsage(t, a, name, st, now)
	}
}

// checkUsage requires Available and Usage to agree with Decide, and a
// state rebuilt from its own usage to leave no more room.
func checkUsage[S any](t *testing.T, a Algorithm[S], name string, st S, now int64) {
	u := a.Usage(st, now)
	avail := a.Available(st, now)
	switch {
	case u.Remaining != avail || avail < 0 || avail > u.Limit:
		t.Fatalf("%s: Available %d, usage %+v", name, avail, u)
	case (avail > 0) != a.Decide(st, now, 1).Allowed:
		t.Fatalf("%s: Available %d but a unit request allowed=%v", name, avail, !(avail > 0))
	case u.ResetAfter < 0 || u.RetryAfter < 0 || (avail == 0) != (u.RetryAfter > 0):
		t.Fatalf("%s: incoherent usage %+v", name, u)
	}
	if again := a.Available(a.FromUsage(u, now), now); again > avail {
		t.Fatalf("%s: rebuilt from its usage %+v, %d available instead of %d", name, u, again, avail)
	}
}
