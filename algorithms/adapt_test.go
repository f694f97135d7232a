package algorithms

import (
	"math/rand/v2"
	"testing"
)

// The burst moves with max_events in proportion, rounded down, at least
// 1; the window and max_delay stay; a window algorithm keeps its burst.
const sec = int64(1_000_000_000)

func TestAdaptedPolicy(t *testing.T) {
	p := Policy{Limit: 100, Window: sec, Burst: 10}
	for _, c := range []struct {
		n, burst int64
	}{{100, 10}, {200, 20}, {150, 15}, {155, 15}, {50, 5}, {19, 1}, {9, 1}, {1, 1}} {
		q := Adapted(NameTokenBucket, p, c.n)
		if q.Limit != c.n || q.Burst != c.burst || q.Window != sec {
			t.Errorf("token bucket at %d: %+v, want burst %d", c.n, q, c.burst)
		}
	}
	// The default burst (max_events) follows max_events exactly.
	if q := Adapted(NameGCRA, Policy{Limit: 100, Window: sec}, 37); q.Burst != 37 {
		t.Errorf("default burst at 37: %+v", q)
	}
	q := Adapted(NameLeakyBucket, Policy{Limit: 10, Window: sec, MaxDelay: sec}, 20)
	if q.MaxDelay != sec || q.Interval() != sec/20 {
		t.Errorf("queue at 20: %+v", q)
	}
	if q := Adapted(NameSlidingCounter, p, 200); q.Burst != 10 || q.Limit != 200 {
		t.Errorf("window kind at 200: %+v", q)
	}
	// A huge max_events does not overflow the product.
	if q := Adapted(NameTokenBucket, Policy{Limit: 3, Window: 1 << 40, Burst: MaxEvents}, MaxEvents); q.Burst != MaxSpan {
		t.Errorf("huge: %+v", q)
	}
}

// At the moment max_events changes, a key's state stays as it is and
// means the same share of the bucket: a key that had used its whole
// bucket has used the smaller one too (no free burst when the rate falls)
// and the larger one too (a rate that grows gives no burst on top); a
// full bucket is full at the new size; half used stays half used.
func TestAdaptedAtTheChange(t *testing.T) {
	base := Policy{Limit: 10, Window: sec} // T 100 ms, burst 10, depth 1 s
	for _, alg := range []string{NameTokenBucket, NameGCRA, NameLeakyBucket} {
		old := NewBucketAlgorithm(alg, base)
		var s Bucket
		now := int64(1_000 * sec)
		for range 10 {
			s = old.Take(s, now, 1)
		}
		if old.Decide(s, now, 1).Allowed {
			t.Fatalf("%s: an 11th unit passed", alg)
		}
		for _, n := range []int64{5, 20, 3, 10} {
			a := NewBucketAlgorithm(alg, Adapted(alg, base, n))
			// Denied for one new interval (less the few ns by which the
			// rounded-up interval makes the depth longer).
			r := a.Decide(s, now, 1)
			if iv := Adapted(alg, base, n).Interval(); r.Allowed || r.RetryAfter > iv || r.RetryAfter < iv-n {
				t.Errorf("%s: an empty bucket at %d/s: %+v, want denied for one new interval %v", alg, n, r, iv)
			}
		}
		// Half a second later, half the depth has come back: at 20/s that
		// is 10 units, at 5/s 2 (burst 5, half of it rounded down).
		for _, c := range []struct{ n, pass int64 }{{20, 10}, {5, 2}, {10, 5}} {
			a := NewBucketAlgorithm(alg, Adapted(alg, base, c.n))
			st, passed := s, int64(0)
			for a.Decide(st, now+sec/2, 1).Allowed {
				st = a.Take(st, now+sec/2, 1)
				passed++
			}
			if passed != c.pass {
				t.Errorf("%s: half refilled, at %d/s: %d passed, want %d", alg, c.n, passed, c.pass)
			}
		}
		// A full bucket is full at the new size.
		a := NewBucketAlgorithm(alg, Adapted(alg, base, 30))
		var st Bucket
		passed := 0
		for a.Decide(st, now, 1).Allowed {
			st = a.Take(st, now, 1)
			passed++
		}
		if passed != 30 {
			t.Errorf("%s: a full bucket at 30/s: %d passed, want 30", alg, passed)
		}
	}
}

// The bound, over random changes and a greedy client: over any span of
// time, a key is admitted at most (span + depth) ÷ the smallest interval
// in force during the span, the depth being the configured bucket's
// (burst × interval, or one interval when the burst is 1); and the state
// never runs more than the depth (or the longest interval in force) ahead.
func TestAdaptedBound(t *testing.T) {
	r := rand.New(rand.NewPCG(8, 3))
	for run := range 300 {
		alg := []string{NameTokenBucket, NameGCRA, NameLeakyBucket}[run%3]
		base := Policy{Limit: int64(1 + r.IntN(50)), Window: int64(1+r.IntN(5)) * sec}
		if r.IntN(2) == 0 {
			base.Burst = int64(1 + r.IntN(40))
		}
		depth := base.burst() * base.Interval()
		type grant struct{ at, interval int64 }
		var grants []grant
		var s Bucket
		now := int64(5_000 * sec)
		n := base.Limit
		a := NewBucketAlgorithm(alg, base)
		longest := base.Interval()
		for range 400 {
			switch r.IntN(5) {
			case 0:
				n = int64(1 + r.IntN(int(3*base.Limit)))
				a = NewBucketAlgorithm(alg, Adapted(alg, base, n))
				longest = max(longest, Adapted(alg, base, n).Interval())
			case 1:
				now += int64(r.IntN(int(base.Window)))
			default:
				cost := int64(1 + r.IntN(2))
				if d := a.Decide(s, now, cost); d.Allowed {
					s = a.Take(s, now, cost)
					iv := Adapted(alg, base, n).Interval()
					for range cost {
						grants = append(grants, grant{now, iv})
					}
				}
				now += int64(r.IntN(int(base.Interval())))
			}
			if s.TAT-now > max(depth, longest)+3*base.Limit {
				t.Fatalf("run %d: the state runs %d ns ahead, past the depth %d and the longest interval %d", run, s.TAT-now, depth, longest)
			}
		}
		for i := range grants {
			tmin := grants[i].interval
			for j := i; j < len(grants); j++ {
				tmin = min(tmin, grants[j].interval)
				span := grants[j].at - grants[i].at
				// One interval's rounding: Interval rounds up, so the
				// depth of a policy may exceed the configured one by
				// burst ns at most.
				most := (span + max(depth, tmin) + Adapted(alg, base, 3*base.Limit).burst()) / tmin
				if got := int64(j - i + 1); got > most {
					t.Fatalf("run %d (%s %+v): %d units in %d ns, smallest interval %d: more than %d", run, alg, base, got, span, tmin, most)
				}
			}
		}
	}
}
