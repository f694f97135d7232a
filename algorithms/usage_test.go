package algorithms

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// keyed is one algorithm with one key's state, its state type erased, so
// that tests can move a key between any two algorithms.
type keyed struct {
	name   string
	p      Policy
	decide func(now, cost int64) Result
	take   func(now, cost int64)
	usage  func(now int64) Usage
	adopt  func(u Usage, now int64) // replaces the state by FromUsage(u)
	avail  func(now int64) int64
}

func erase[S any](name string, a Algorithm[S]) *keyed {
	var s S
	return &keyed{
		name:   name,
		p:      a.Policy(),
		decide: func(now, cost int64) Result { return a.Decide(s, now, cost) },
		take:   func(now, cost int64) { s = a.Take(s, now, cost) },
		usage:  func(now int64) Usage { return a.Usage(s, now) },
		adopt:  func(u Usage, now int64) { s = a.FromUsage(u, now) },
		avail:  func(now int64) int64 { return a.Available(s, now) },
	}
}

// kinds makes a fresh key of every kind of state for p; the leaky queue
// takes max_delay so that it holds as many as the others.
func kinds(p Policy) []*keyed {
	q := p
	q.Burst = 0
	q.MaxDelay = (p.Limit - 1) * p.Interval()
	w := p
	w.Burst = 0
	return []*keyed{
		erase(NameSlidingWindow, NewSlidingLog(w)),
		erase(NameSlidingCounter, NewSlidingCounter(w)),
		erase(NameFixedWindow, NewFixedWindow(w)),
		erase(NameTokenBucket, NewTokenBucket(p)),
		erase("leaky_queue", NewLeakyBucket(q)),
	}
}

// caps returns how long the algorithm can keep a translated key denying
// and keep translated units in use; 0 means without bound (the buckets'
// debt holds a denying key as long as needed) or, for the reset, not at all
// (a bucket's reset follows from its remaining tokens).
func caps(k *keyed, now int64) (retry, reset int64) {
	w := k.p.Window
	end := now - now%w + w - now
	switch k.name {
	case NameSlidingWindow:
		return w, w
	case NameFixedWindow:
		return end, end
	case NameSlidingCounter:
		return end + w - 1, end + w
	}
	return 0, 0
}

// checkTranslation moves from's key to to at now and checks that it has no
// more room than before, and holds what is in use as long as to can.
func checkTranslation(t *testing.T, from, to *keyed, now int64) (before, after Usage) {
	t.Helper()
	before = from.usage(now)
	to.adopt(before, now)
	after = to.usage(now)
	if after.Limit != to.decide(now, 0).Limit {
		t.Fatalf("%s → %s: usage limit %d, decide limit %d", from.name, to.name, after.Limit, to.decide(now, 0).Limit)
	}
	share := mulDiv(before.Remaining, after.Limit, before.Limit)
	if after.Remaining > share {
		t.Errorf("%s → %s: %d of %d remaining after, %d of %d before (share %d)", from.name, to.name, after.Remaining, after.Limit, before.Remaining, before.Limit, share)
	}
	if got := to.avail(now); got != after.Remaining {
		t.Errorf("%s → %s: Available %d, Usage.Remaining %d", from.name, to.name, got, after.Remaining)
	}
	if before.Remaining == 0 {
		if r := to.decide(now, 1); r.Allowed {
			t.Errorf("%s → %s: a denying key is allowed after the translation", from.name, to.name)
		}
		want := before.RetryAfter
		if c, _ := caps(to, now); c > 0 {
			want = min(want, c)
		}
		if after.RetryAfter < want {
			t.Errorf("%s → %s: retry after %v, before %v", from.name, to.name, time.Duration(after.RetryAfter), time.Duration(before.RetryAfter))
		}
	}
	if _, c := caps(to, now); c > 0 && after.Remaining < after.Limit && after.ResetAfter < min(before.ResetAfter, c) {
		t.Errorf("%s → %s: resets in %v, before in %v (it can hold %v)", from.name, to.name, time.Duration(after.ResetAfter), time.Duration(before.ResetAfter), time.Duration(c))
	}
	return before, after
}

// Every pair of kinds of state, over histories from fresh to denying: the
// table of remaining and reset before and after is the test's log.
func TestTranslateEveryPair(t *testing.T) {
	p := Policy{Limit: 10, Window: 60 * s}
	now := base + 25*s // the fixed windows end 35 s from now
	type req struct{ ago, cost int64 }
	histories := []struct {
		name string
		reqs []req
	}{
		{"fresh", nil},
		{"1 unit 10 s ago", []req{{10 * s, 1}}},
		{"5 units over 50 s", []req{{50 * s, 1}, {40 * s, 1}, {30 * s, 1}, {20 * s, 1}, {10 * s, 1}}},
		{"7 units in one request 30 s ago", []req{{30 * s, 7}}},
		{"10 units 1 s ago (denying)", []req{{1 * s, 10}}},
		{"10 units 50 s ago (denying for some)", []req{{50 * s, 10}}},
		{"10 units over 54 s (denying)", []req{{54 * s, 1}, {48 * s, 1}, {42 * s, 1}, {36 * s, 1}, {30 * s, 1}, {24 * s, 1}, {18 * s, 1}, {12 * s, 1}, {6 * s, 1}, {0, 1}}},
	}
	d := func(ns int64) string { return time.Duration(ns).Round(time.Millisecond).String() }
	for _, h := range histories {
		for i := range kinds(p) {
			for j := range kinds(p) {
				if i == j || (i >= 3 && j >= 3) { // the buckets share one kind of state
					continue
				}
				from, to := kinds(p)[i], kinds(p)[j]
				for _, r := range h.reqs {
					if from.decide(now-r.ago, r.cost).Allowed {
						from.take(now-r.ago, r.cost)
					}
				}
				b, a := checkTranslation(t, from, to, now)
				t.Logf("%-36s %-22s → %-22s remaining %2d → %2d  reset %7s → %7s  retry %6s → %6s",
					h.name, from.name, to.name, b.Remaining, a.Remaining, d(b.ResetAfter), d(a.ResetAfter), d(b.RetryAfter), d(a.RetryAfter))
			}
		}
	}
}

// Random policies, histories and pairs: a translated key never has more
// room than its share, and a denying key stays denied at least as long as
// the new kind can hold it.
func TestTranslateRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for trial := 0; trial < 3000; trial++ {
		p := randomPolicy(rng)
		p.Burst = 0
		q := p
		q.Limit = 1 + rng.Int64N(40)
		q.Window = (1 + rng.Int64N(120)) * 100 * ms
		src, dst := kinds(p), kinds(q)
		i, j := rng.IntN(len(src)), rng.IntN(len(dst))
		if i == j || (i >= 3 && j >= 3) { // one kind of state: rebased, not translated
			continue
		}
		from, to := src[i], dst[j]
		var now int64
		for _, a := range arrivals(rng, rng.IntN(40), p.Window, 3) {
			if from.decide(a.at, a.cost).Allowed {
				from.take(a.at, a.cost)
			}
			now = a.at
		}
		now += rng.Int64N(p.Window)
		t.Run(fmt.Sprint(trial), func(t *testing.T) { checkTranslation(t, from, to, now) })
		if t.Failed() {
			t.Fatalf("trial %d: %v → %v", trial, p, q)
		}
	}
}

// Events of one cost need no units per event; mixed costs do, and the
// units go again once the mixed events have left the window.
func TestLogKeepsUnitsOnlyForMixedCosts(t *testing.T) {
	a := NewSlidingLog(Policy{Limit: 100, Window: 10 * s})
	var l *Log
	for i := int64(0); i < 10; i++ {
		l = a.Take(l, base+i, 7)
	}
	if l.units != nil || l.sum != 70 {
		t.Fatalf("ten events of 7: units %v, sum %d", l.units, l.sum)
	}
	l = a.Take(l, base+20, 3)
	if l.units == nil || a.Available(l, base+20) != 27 {
		t.Fatalf("a 3 after the 7s: units %v, %d available", l.units, a.Available(l, base+20))
	}
	// Once those events have left the window, the log starts afresh.
	for i := int64(0); i < 5; i++ {
		l = a.Take(l, base+11*s+i, 2)
	}
	if got := a.Available(l, base+11*s+30); got != 90 || l.units != nil {
		t.Fatalf("after the window: %d available, units %v", got, l.units)
	}
}
