package algorithms

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

type settling[S any] interface {
	Algorithm[S]
	Settler[S]
}

// anySettling is an algorithm whose state type is erased.
const oneMinute = int64(time.Minute)

type anySettling interface {
	settling[any]
	zero() any
}

// settleTokens runs the LLM example on one algorithm: 5000 tokens
// reserved (1000 in + max_tokens 4000), 1800 used, 3200 given back.
func settleTokens[S any](t *testing.T, name string, a settling[S]) {
	t.Helper()
	now := 1_700_000_000*int64(time.Second) + 7
	var s S
	r := a.Decide(s, now, 5000)
	if !r.Allowed {
		t.Fatalf("%s: 5000 of 200000 denied", name)
	}
	r.At = now
	s = a.Take(s, now, 5000)
	if got := a.Available(s, now); got != 195000 {
		t.Fatalf("%s: after the reservation %d available, want 195000", name, got)
	}
	s = a.Settle(s, now, r, 5000, 1800)
	if got := a.Available(s, now); got != 198200 {
		t.Fatalf("%s: after settling at 1800, %d available, want 198200 (3200 back)", name, got)
	}
	// Settling again at the same cost changes nothing.
	if got := a.Available(a.Settle(s, now, r, 1800, 1800), now); got != 198200 {
		t.Fatalf("%s: a settle at the estimate changed available to %d", name, got)
	}
}

func TestSettleWorkedExample(t *testing.T) {
	p := Policy{Limit: 200000, Window: oneMinute}
	settleTokens[*Log](t, NameSlidingWindow, NewSlidingLog(p))
	settleTokens[Counter](t, NameSlidingCounter, NewSlidingCounter(p))
	settleTokens[Window](t, NameFixedWindow, NewFixedWindow(p))
	settleTokens[Bucket](t, NameTokenBucket, NewTokenBucket(p))
	settleTokens[Bucket](t, NameGCRA, NewGCRA(p))
	settleTokens[Bucket](t, NameLeakyBucket, NewLeakyBucket(p))
}

// A key that used more than it had owes the extra and waits it out.
func TestSettleDebt(t *testing.T) {
	p := Policy{Limit: 10, Window: oneMinute} // one token per 6 s
	t0 := 1_700_000_040 * int64(time.Second)  // on the minute
	tests := []struct {
		name string
		a    anySettling
		// wait is how long after the settle a request of one unit
		// waits; free is when it passes.
		wait int64
	}{
		// 4 reserved, 25 used: 25 × 6 s = 150 s of debt over a 60 s
		// bucket; the first token comes back after 150 − 60 + 6 s.
		{NameTokenBucket, wrap[Bucket](NewTokenBucket(p)), 96 * int64(time.Second)},
		{NameGCRA, wrap[Bucket](NewGCRA(p)), 96 * int64(time.Second)},
		{NameLeakyBucket, wrap[Bucket](NewLeakyBucket(p)), 96 * int64(time.Second)},
		// 25 counted in the window until it ends, 60 s after t0.
		{NameFixedWindow, wrap[Window](NewFixedWindow(p)), oneMinute},
		// The request's event holds 25 units until it leaves the window.
		{NameSlidingWindow, wrap[*Log](NewSlidingLog(p)), oneMinute},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var s any
			s = tt.a.zero()
			r := tt.a.Decide(s, t0, 4)
			r.At = t0
			s = tt.a.Take(s, t0, 4)
			s = tt.a.Settle(s, t0, r, 4, 25)
			if got := tt.a.Available(s, t0); got != 0 {
				t.Fatalf("available %d after the debt, want 0", got)
			}
			d := tt.a.Decide(s, t0, 1)
			if d.Allowed || d.RetryAfter != tt.wait {
				t.Fatalf("next request: allowed %v retry %s, want denied for %s", d.Allowed, FormatSpan(d.RetryAfter), FormatSpan(tt.wait))
			}
			if tt.a.Decide(s, t0+tt.wait-1, 1).Allowed {
				t.Fatal("allowed before the debt was paid")
			}
			if !tt.a.Decide(s, t0+tt.wait, 1).Allowed {
				t.Fatal("still denied once the debt was paid")
			}
		})
	}
}

// The sliding window counter carries the extra in its current window and
// weighs it out over the next.
func TestSettleCounterDebt(t *testing.T) {
	a := NewSlidingCounter(Policy{Limit: 10, Window: 100})
	r := a.Decide(Counter{}, 1000, 4)
	r.At = 1000
	s := a.Settle(a.Take(Counter{}, 1000, 4), 1000, r, 4, 25)
	if s != (Counter{Start: 1000, Curr: 25}) {
		t.Fatalf("state %+v, want 25 in the current window", s)
	}
	// At 1160 the previous window (25) weighs ⌊25 × 40/100⌋ = 10.
	if a.Decide(s, 1160, 1).Allowed {
		t.Fatal("allowed while the extra still weighs 10")
	}
	if !a.Decide(s, 1161, 1).Allowed { // ⌊25 × 39/100⌋ = 9
		t.Fatal("denied once the extra weighs 9")
	}
}

// Huge real costs cap the debt instead of overflowing it.
func TestSettleBounds(t *testing.T) {
	t0 := 1_700_000_040 * int64(time.Second) // on the minute
	tb := NewTokenBucket(Policy{Limit: 1, Window: int64(time.Hour)})
	b := tb.Settle(Bucket{}, t0, Result{At: t0}, 1, MaxSettle)
	if b.TAT != t0+MaxDebt {
		t.Fatalf("debt %s, want the cap %s", FormatSpan(b.TAT-t0), FormatSpan(MaxDebt))
	}
	if again := tb.Settle(b, t0, Result{At: t0}, 1, MaxSettle); again != b {
		t.Fatalf("a second huge settle moved the debt to %s", FormatSpan(again.TAT-t0))
	}
	fw := NewFixedWindow(Policy{Limit: 10, Window: oneMinute})
	w := Window{Start: t0 - t0%oneMinute, Count: maxOwed - 1}
	if got := fw.Settle(w, t0, Result{At: t0}, 1, MaxSettle); got.Count != maxOwed {
		t.Fatalf("count %d, want the cap %d", got.Count, maxOwed)
	}
	sl := NewSlidingLog(Policy{Limit: 10, Window: oneMinute})
	l := sl.Take(nil, t0, 3)
	l = sl.Settle(l, t0, Result{At: t0}, 3, MaxSettle)
	if l.sum != math.MaxUint32 || l.n != 1 {
		t.Fatalf("log holds %d units in %d events, want %d in 1", l.sum, l.n, uint32(math.MaxUint32))
	}
}

// Settling never gives back more than the request took, never leaves a
// state below empty, and moves what is available by exactly the
// difference when the state holds it.
func TestSettleNeverNegative(t *testing.T) {
	p := Policy{Limit: 20, Window: oneMinute}
	for _, a := range []anySettling{
		wrap[*Log](NewSlidingLog(p)), wrap[Counter](NewSlidingCounter(p)), wrap[Window](NewFixedWindow(p)),
		wrap[Bucket](NewTokenBucket(p)), wrap[Bucket](NewGCRA(p)),
	} {
		rng := rand.New(rand.NewPCG(3, 4))
		for trial := range 300 {
			s := a.zero()
			now := 1_700_000_000*int64(time.Second) + rng.Int64N(oneMinute)
			var granted []Result
			var costs []int64
			for range rng.IntN(30) {
				now += rng.Int64N(oneMinute / 10)
				c := rng.Int64N(6)
				if r := a.Decide(s, now, c); r.Allowed {
					r.At = now
					s = a.Take(s, now, c)
					granted, costs = append(granted, r), append(costs, c)
				}
			}
			if len(granted) == 0 {
				continue
			}
			k := rng.IntN(len(granted))
			actual := rng.Int64N(costs[k] + 1) // a refund
			before := a.Available(s, now)
			s = a.Settle(s, now, granted[k], costs[k], actual)
			after := a.Available(s, now)
			if after < before || after-before > costs[k]-actual || after > a.Usage(s, now).Limit {
				t.Fatalf("%T trial %d: settling %d at %d moved available %d → %d", a, trial, costs[k], actual, before, after)
			}
			// Settle every request at 0: the state is back to empty at most.
			for i := range granted {
				s = a.Settle(s, now, granted[i], costs[i], 0)
			}
			if u := a.Usage(s, now); u.Remaining > u.Limit || u.Remaining < 0 {
				t.Fatalf("%T trial %d: usage %+v after settling everything at 0", a, trial, u)
			}
		}
	}
}

// wrap erases an algorithm's state type, for tables of algorithms.
func wrap[S any](a settling[S]) anySettling { return erased[S]{a} }

type erased[S any] struct{ a settling[S] }

func (e erased[S]) zero() any                            { var s S; return s }
func (e erased[S]) Decide(s any, now, cost int64) Result { return e.a.Decide(s.(S), now, cost) }
func (e erased[S]) Take(s any, now, cost int64) any      { return e.a.Take(s.(S), now, cost) }
func (e erased[S]) IdleAt(s any) int64                   { return e.a.IdleAt(s.(S)) }
func (e erased[S]) Refund(s any, now int64, g Result, c int64) any {
	return e.a.Refund(s.(S), now, g, c)
}
func (e erased[S]) Rebase(s any, at int64, old Policy) any { return e.a.Rebase(s.(S), at, old) }
func (e erased[S]) Policy() Policy                         { return e.a.Policy() }
func (e erased[S]) Available(s any, now int64) int64       { return e.a.Available(s.(S), now) }
func (e erased[S]) Usage(s any, now int64) Usage           { return e.a.Usage(s.(S), now) }
func (e erased[S]) FromUsage(u Usage, now int64) any       { return e.a.FromUsage(u, now) }
func (e erased[S]) Settle(s any, now int64, g Result, est, act int64) any {
	return e.a.Settle(s.(S), now, g, est, act)
}
