package algorithms

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// Property tests: each algorithm against a naive model written from its
// definition (lists of timestamps, a level that drains), over random
// request sequences: the same decisions, exact retry times, and never more
// admitted over any window than the definition allows.

type arrival struct{ at, cost int64 }

type admitted struct{ at, cost int64 }

// arrivals makes n requests with gaps drawn to exercise bursts, window
// boundaries and quiet periods.
func arrivals(rng *rand.Rand, n int, window, maxCost int64) []arrival {
	out := make([]arrival, n)
	now := base + rng.Int64N(window)
	for i := range out {
		switch rng.IntN(4) {
		case 0: // same instant
		case 1:
			now += rng.Int64N(window/50 + 1)
		case 2:
			now += rng.Int64N(window/5 + 1)
		default:
			now += rng.Int64N(2 * window)
		}
		out[i] = arrival{at: now, cost: 1 + rng.Int64N(maxCost)}
	}
	return out
}

func randomPolicy(rng *rand.Rand) Policy {
	return Policy{
		Limit:  1 + rng.Int64N(30),
		Window: (1 + rng.Int64N(120)) * 100 * ms,
		Burst:  rng.Int64N(40), // 0: Limit
	}
}

func sumIn(adm []admitted, from, to int64) int64 { // units admitted in [from, to)
	var n int64
	for _, a := range adm {
		if a.at >= from && a.at < to {
			n += a.cost
		}
	}
	return n
}

func TestPropertySlidingLog(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	for trial := 0; trial < 200; trial++ {
		p := randomPolicy(rng)
		p.Burst = 0
		a := NewSlidingLog(p)
		var st *Log
		var adm []admitted
		for i, q := range arrivals(rng, 300, p.Window, 3) {
			r := a.Decide(st, q.at, q.cost)
			live := sumIn(adm, q.at-p.Window+1, q.at+1) // t + W > now
			want := q.cost <= p.Limit && live+q.cost <= p.Limit
			if r.Allowed != want {
				t.Fatalf("trial %d req %d: allowed=%v, model says %v (live %d, cost %d, limit %d)", trial, i, r.Allowed, want, live, q.cost, p.Limit)
			}
			if r.Allowed {
				st = a.Take(st, q.at, q.cost)
				adm = append(adm, admitted(q))
				continue
			}
			if q.cost > p.Limit {
				if r.RetryAfter != Never {
					t.Fatalf("cost above limit: RetryAfter %d", r.RetryAfter)
				}
				continue
			}
			// The model's wait: the first expiry after which the request fits.
			var wait int64 = -1
			for _, e := range adm {
				if at := e.at + p.Window; at > q.at && sumIn(adm, at-p.Window+1, q.at+1)+q.cost <= p.Limit {
					wait = at - q.at
					break
				}
			}
			if r.RetryAfter != wait {
				t.Fatalf("trial %d req %d: RetryAfter %d, model %d", trial, i, r.RetryAfter, wait)
			}
		}
		for _, e := range adm { // no window (t−W, t] holds more than Limit
			if got := sumIn(adm, e.at-p.Window+1, e.at+1); got > p.Limit {
				t.Fatalf("trial %d: %d units in the window ending at an event, limit %d", trial, got, p.Limit)
			}
		}
	}
}

func TestPropertyFixedWindow(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 22))
	for trial := 0; trial < 200; trial++ {
		p := randomPolicy(rng)
		p.Burst = 0
		a := NewFixedWindow(p)
		var st Window
		var adm []admitted
		for i, q := range arrivals(rng, 300, p.Window, 3) {
			start := q.at - q.at%p.Window
			used := sumIn(adm, start, start+p.Window)
			want := q.cost <= p.Limit && used+q.cost <= p.Limit
			r := a.Decide(st, q.at, q.cost)
			if r.Allowed != want {
				t.Fatalf("trial %d req %d: allowed=%v, model %v", trial, i, r.Allowed, want)
			}
			if r.Allowed {
				st = a.Take(st, q.at, q.cost)
				adm = append(adm, admitted(q))
			} else if want := start + p.Window - q.at; q.cost <= p.Limit && r.RetryAfter != want {
				t.Fatalf("trial %d req %d: RetryAfter %d, want %d", trial, i, r.RetryAfter, want)
			}
		}
	}
}

// Token bucket, GCRA and the leaky meter against a bucket written as a level
// of debt that drains one nanosecond per nanosecond.
func TestPropertyBuckets(t *testing.T) {
	rng := rand.New(rand.NewPCG(31, 32))
	for trial := 0; trial < 300; trial++ {
		p := randomPolicy(rng)
		algs := map[string]Algorithm[Bucket]{
			NameTokenBucket: NewTokenBucket(p),
			NameGCRA:        NewGCRA(p),
			NameLeakyBucket: NewLeakyBucket(p),
		}
		T, burst := p.Interval(), p.burst()
		seq := arrivals(rng, 300, p.Window, 4)
		for name, a := range algs {
			var st Bucket
			var level, last int64 // model: debt in ns, time of last update
			var adm []admitted
			for i, q := range seq {
				level = max(level-(q.at-last), 0)
				last = q.at
				want := q.cost <= burst && level+q.cost*T <= burst*T
				r := a.Decide(st, q.at, q.cost)
				if r.Allowed != want {
					t.Fatalf("%s trial %d req %d: allowed=%v, model %v", name, trial, i, r.Allowed, want)
				}
				if r.Allowed {
					st = a.Take(st, q.at, q.cost)
					level += q.cost * T
					adm = append(adm, admitted(q))
					if r.Remaining != (burst*T-level)/T {
						t.Fatalf("%s: remaining %d, model %d", name, r.Remaining, (burst*T-level)/T)
					}
				} else if q.cost <= burst && r.RetryAfter != level+q.cost*T-burst*T {
					t.Fatalf("%s: RetryAfter %d, model %d", name, r.RetryAfter, level+q.cost*T-burst*T)
				}
			}
			// Over any span [t_i, t_j], at most burst + span/T units.
			for i := range adm {
				var units int64
				for j := i; j < len(adm); j++ {
					units += adm[j].cost
					if units*T > burst*T+(adm[j].at-adm[i].at) {
						t.Fatalf("%s trial %d: %d units in %dns, burst %d, T %d", name, trial, units, adm[j].at-adm[i].at, burst, T)
					}
				}
			}
		}
	}
}

func TestPropertySlidingCounter(t *testing.T) {
	rng := rand.New(rand.NewPCG(41, 42))
	for trial := 0; trial < 200; trial++ {
		p := randomPolicy(rng)
		p.Burst = 0
		a := NewSlidingCounter(p)
		var st Counter
		var adm []admitted
		for i, q := range arrivals(rng, 300, p.Window, 3) {
			start := q.at - q.at%p.Window
			prev, curr := sumIn(adm, start-p.Window, start), sumIn(adm, start, start+p.Window)
			est := prev*(p.Window-(q.at-start))/p.Window + curr
			want := q.cost <= p.Limit && est+q.cost <= p.Limit
			r := a.Decide(st, q.at, q.cost)
			if r.Allowed != want {
				t.Fatalf("trial %d req %d: allowed=%v, model %v (est %d)", trial, i, r.Allowed, want, est)
			}
			if r.Allowed {
				st = a.Take(st, q.at, q.cost)
				adm = append(adm, admitted(q))
				continue
			}
			if q.cost > p.Limit {
				continue
			}
			// RetryAfter is the first instant the request fits, if nothing
			// else arrives.
			at := q.at + r.RetryAfter
			if !a.Decide(st, at, q.cost).Allowed || a.Decide(st, at-1, q.cost).Allowed {
				t.Fatalf("trial %d req %d: RetryAfter %d is not the first instant that fits", trial, i, r.RetryAfter)
			}
		}
		for k := adm[0].at - adm[0].at%p.Window; k <= adm[len(adm)-1].at; k += p.Window {
			if got := sumIn(adm, k, k+p.Window); got > p.Limit {
				t.Fatalf("trial %d: fixed window at %d holds %d > %d", trial, k, got, p.Limit)
			}
		}
	}
}

// The sliding counter approximates the exact log. Both see the same
// arrivals; the test reports how many more (or fewer) requests the counter
// admits, and the most units it ever lets into one sliding window. The
// figures are quoted in docs/algorithms.md.
func TestSlidingCounterErrorAgainstLog(t *testing.T) {
	scenarios := []struct {
		name string
		gap  func(rng *rand.Rand, w int64) int64
	}{
		{"steady at 1.5x the limit", func(rng *rand.Rand, w int64) int64 { return rng.Int64N(2*w/150 + 1) }},
		{"bursts then quiet", func(rng *rand.Rand, w int64) int64 {
			if rng.IntN(50) == 0 {
				return rng.Int64N(2 * w)
			}
			return rng.Int64N(w/1000 + 1)
		}},
		{"one burst per window end", func(rng *rand.Rand, w int64) int64 {
			if rng.IntN(100) == 0 {
				return w - w/20
			}
			return rng.Int64N(w/2000 + 1)
		}},
	}
	const limit, window = 100, 60 * s
	p := Policy{Limit: limit, Window: window}
	for _, sc := range scenarios {
		rng := rand.New(rand.NewPCG(51, 52))
		counter, log := NewSlidingCounter(p), NewSlidingLog(p)
		var cs Counter
		var ls *Log
		var cAdm, lAdm []int64
		now := base
		for i := 0; i < 20000; i++ {
			now += sc.gap(rng, window)
			if counter.Decide(cs, now, 1).Allowed {
				cs = counter.Take(cs, now, 1)
				cAdm = append(cAdm, now)
			}
			if log.Decide(ls, now, 1).Allowed {
				ls = log.Take(ls, now, 1)
				lAdm = append(lAdm, now)
			}
		}
		worst := 0
		for i, at := range cAdm { // most admitted in any window (at−W, at]
			j, _ := slices.BinarySearch(cAdm, at-window+1)
			worst = max(worst, i-j+1)
		}
		t.Logf("%s: counter admitted %d, exact log %d (%+.2f%%); most in one sliding window %d (limit %d)",
			sc.name, len(cAdm), len(lAdm), 100*float64(len(cAdm)-len(lAdm))/float64(len(lAdm)), worst, limit)
		if worst > 2*limit {
			t.Fatalf("%s: %d in one sliding window, above the 2× bound", sc.name, worst)
		}
	}
}

// The queue releases requests at least T·cost apart and never makes one
// wait longer than MaxDelay; it denies only what would wait longer.
func TestPropertyLeakyQueue(t *testing.T) {
	rng := rand.New(rand.NewPCG(61, 62))
	for trial := 0; trial < 200; trial++ {
		p := randomPolicy(rng)
		p.Burst = 0
		p.MaxDelay = rng.Int64N(3 * p.Window)
		if p.MaxDelay == 0 {
			p.MaxDelay = 1
		}
		q := NewLeakyBucket(p)
		T := p.Interval()
		var st Bucket
		var next int64 // model: the next free slot
		lastRelease, lastCost := int64(-1), int64(0)
		for i, a := range arrivals(rng, 300, p.Window, 3) {
			slot := max(next, a.at)
			want := a.cost <= q.queueSize() && slot-a.at <= p.MaxDelay
			r := q.Decide(st, a.at, a.cost)
			if r.Allowed != want {
				t.Fatalf("trial %d req %d: allowed=%v, model %v", trial, i, r.Allowed, want)
			}
			if !r.Allowed {
				continue
			}
			release := a.at + r.Delay
			if release != slot || r.Delay > p.MaxDelay {
				t.Fatalf("trial %d req %d: released at +%d, model slot +%d", trial, i, release-a.at, slot-a.at)
			}
			if lastRelease >= 0 && release-lastRelease < lastCost*T {
				t.Fatalf("trial %d: releases %dns apart after a cost-%d request, T %d", trial, release-lastRelease, lastCost, T)
			}
			st = q.Take(st, a.at, a.cost)
			next = slot + a.cost*T
			lastRelease, lastCost = release, a.cost
		}
	}
}
