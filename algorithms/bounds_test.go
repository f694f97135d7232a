package algorithms

import (
	"fmt"
	"math"
	"strings"
	"testing"
)

// y2100 is 2100-01-01 UTC: the bounds must keep every sum of a time and
// the spans an algorithm adds to it within int64 until then.
const y2100 = int64(4_102_444_800) * s

// horizon is 2^62 ns after the epoch, early in 2116: MaxSpan promises
// nothing about times after it.
const horizon = int64(1) << 62

// Values at and just past every bound, and the values that broke the
// arithmetic before there were bounds: 2^63 − 1024 is the largest int64 a
// JSON number carries through Caddy's admin API (which decodes it as a
// float64).
var (
	edgeLimits  = []int64{1, 2, 3, 1000, math.MaxUint32, MaxEvents - 1, MaxEvents, MaxEvents + 1, 1 << 53, 1 << 62, math.MaxInt64 - 1023, math.MaxInt64}
	edgeWindows = []int64{1, 2, s, 3600 * s, MaxSpan - 1, MaxSpan, MaxSpan + 1, math.MaxInt64 - 1023, math.MaxInt64}
	edgeBursts  = []int64{0, 1, 7, MaxEvents, MaxEvents + 1, 1 << 62, math.MaxInt64}
	edgeDelays  = []int64{0, 1, s, MaxSpan / 2, MaxSpan, MaxSpan + 1, math.MaxInt64}
	edgeCosts   = []int64{0, 1, 2, MaxEvents, MaxEvents + 1, math.MaxInt64 / 2, math.MaxInt64 - 1023, math.MaxInt64}
)

// edgePolicies are the accepted policies among every combination of the
// edge values, for the named algorithm.
func edgePolicies(name string) []Policy {
	var ps []Policy
	for _, l := range edgeLimits {
		for _, w := range edgeWindows {
			for _, b := range edgeBursts {
				for _, d := range edgeDelays {
					p := Policy{Limit: l, Window: w, Burst: b, MaxDelay: d}
					if _, err := Check(name, p); err == nil {
						ps = append(ps, p)
					}
				}
			}
		}
	}
	return ps
}

// TestEveryBoundKeepsArithmeticInRange drives every algorithm, under every
// policy the bounds accept (at their edges), with costs up to the largest
// int64 that a placeholder can produce, at times up to 2100, across
// reloads to other edge policies: no result may be negative or wrap, a
// single instant never admits more than the policy holds, and a denied
// request retried after its RetryAfter passes.
func TestEveryBoundKeepsArithmeticInRange(t *testing.T) {
	for _, name := range Names() {
		ps := edgePolicies(name)
		if len(ps) == 0 {
			t.Fatalf("%s: no edge policy accepted", name)
		}
		for i, p := range ps {
			next := ps[(i*7+3)%len(ps)] // a reload to another edge policy
			for _, now := range []int64{base, y2100} {
				where := fmt.Sprintf("%s %+v at %d, reloaded to %+v", name, p, now, next)
				driveAny(t, where, name, p, next, now, edgeCosts)
			}
		}
	}
}

// driveAny runs driveEdges for the named algorithm.
func driveAny(t *testing.T, where, name string, p, next Policy, now int64, costs []int64) {
	t.Helper()
	switch name {
	case NameSlidingWindow:
		driveEdges(t, where, func(p Policy) Algorithm[*Log] { return NewSlidingLog(p) }, name, p, next, now, costs)
	case NameSlidingCounter:
		driveEdges(t, where, func(p Policy) Algorithm[Counter] { return NewSlidingCounter(p) }, name, p, next, now, costs)
	case NameFixedWindow:
		driveEdges(t, where, func(p Policy) Algorithm[Window] { return NewFixedWindow(p) }, name, p, next, now, costs)
	case NameTokenBucket:
		driveEdges(t, where, func(p Policy) Algorithm[Bucket] { return NewTokenBucket(p) }, name, p, next, now, costs)
	case NameGCRA:
		driveEdges(t, where, func(p Policy) Algorithm[Bucket] { return NewGCRA(p) }, name, p, next, now, costs)
	case NameLeakyBucket:
		driveEdges(t, where, func(p Policy) Algorithm[Bucket] { return NewLeakyBucket(p) }, name, p, next, now, costs)
	}
}

func driveEdges[S any](t *testing.T, where string, build func(Policy) Algorithm[S], name string, p, next Policy, now int64, edgeCosts []int64) {
	t.Helper()
	a := build(p)
	most := MaxCost(name, p)
	var st S
	// At one instant, from a fresh key: never more than the policy holds,
	// whatever the costs asked.
	var admitted int64
	costs := append([]int64{most, most, most / 2, most/2 + 1}, edgeCosts...)
	for _, c := range costs {
		r := checkResult(t, where, a.Decide(st, now, c), now, c, most)
		if r.Allowed {
			st = a.Take(st, now, c)
			admitted += max(c, 0) // a negative cost is free
			if admitted < 0 || admitted > most {
				t.Fatalf("%s: %d units admitted at one instant, the policy holds %d", where, admitted, most)
			}
			checkIdle(t, where, a.IdleAt(st), now, c)
		}
	}
	// Retried after its RetryAfter, a denied request of a cost the policy
	// can hold passes.
	for _, c := range []int64{1, most} {
		r := checkResult(t, where, a.Decide(st, now, c), now, c, most)
		if r.Allowed {
			continue
		}
		if r.RetryAfter == Never {
			t.Fatalf("%s: cost %d ≤ %d can never pass: %+v", where, c, most, r)
		}
		later := now + r.RetryAfter
		if later >= horizon {
			continue
		}
		if r2 := checkResult(t, where, a.Decide(st, later, c), later, c, most); !r2.Allowed {
			t.Fatalf("%s: cost %d denied again at its Retry-After (%d ns later): %+v", where, c, r.RetryAfter, r2)
		}
	}
	// A reload to another policy, then the same edge costs.
	b := build(next)
	st = b.Rebase(st, now, p)
	nextMost := MaxCost(name, next)
	for _, c := range edgeCosts {
		r := checkResult(t, where+" after the reload", b.Decide(st, now, c), now, c, nextMost)
		if r.Allowed {
			st = b.Take(st, now, c)
			checkIdle(t, where+" after the reload", b.IdleAt(st), now, c)
		}
	}
}

func checkResult(t *testing.T, where string, r Result, now, cost, most int64) Result {
	t.Helper()
	switch {
	case r.Remaining < 0, r.ResetAfter < 0, r.Delay < 0, r.Limit <= 0:
		t.Fatalf("%s: cost %d: a negative field: %+v", where, cost, r)
	case r.Allowed && r.RetryAfter != 0:
		t.Fatalf("%s: cost %d: allowed with a RetryAfter: %+v", where, cost, r)
	case !r.Allowed && r.RetryAfter <= 0 && r.RetryAfter != Never:
		t.Fatalf("%s: cost %d: denied without a wait: %+v", where, cost, r)
	case r.Allowed && cost > most:
		t.Fatalf("%s: cost %d above the most the policy holds (%d) allowed: %+v", where, cost, most, r)
	case r.RetryAfter > math.MaxInt64-now, r.ResetAfter > math.MaxInt64-now:
		t.Fatalf("%s: cost %d: now + the wait overflows: %+v", where, cost, r)
	}
	return r
}

// checkIdle requires the state after taking cost > 0 units at now to stay
// busy until after now: a time that wrapped would make the key idle (and
// forgotten) at once.
func checkIdle(t *testing.T, where string, idle, now, cost int64) {
	t.Helper()
	if cost > 0 && idle <= now {
		t.Fatalf("%s: after taking %d units at %d the key is idle at %d", where, cost, now, idle)
	}
}

func TestPolicyBounds(t *testing.T) {
	tests := []struct {
		name string
		p    Policy
		want string
	}{
		{"max_events at the bound", Policy{Limit: MaxEvents, Window: 3600 * s}, ""},
		{"max_events past the bound", Policy{Limit: MaxEvents + 1, Window: 3600 * s}, "max_events must be at most 1000000000000000, got 1000000000000001"},
		{"max_events near 2^63", Policy{Limit: math.MaxInt64 - 1023, Window: 60 * s}, "max_events must be at most 1000000000000000, got 9223372036854774784"},
		{"max_events 2^63-1", Policy{Limit: math.MaxInt64, Window: 60 * s}, "max_events must be at most"},
		{"burst past the bound", Policy{Limit: 1, Window: 3600 * s, Burst: MaxEvents + 1}, "burst must be at most 1000000000000000, got 1000000000000001"},
		{"window past the bound", Policy{Limit: 1, Window: MaxSpan + 1}, "window must be at most 73 years"},
		{"max_delay past the bound", Policy{Limit: 1, Window: s, MaxDelay: MaxSpan + 1}, "max_delay must be between 0 and 73 years"},
		{"queue span past the bound", Policy{Limit: 1, Window: MaxSpan / 2, MaxDelay: MaxSpan}, "max_delay"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.p.Validate()
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("unexpected error %v", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("error = %v, want it to contain %q", err, tt.want)
			}
		})
	}
}

// Interval cannot overflow, even for a policy Validate refuses.
func TestIntervalNeverOverflows(t *testing.T) {
	for _, l := range edgeLimits {
		for _, w := range edgeWindows {
			p := Policy{Limit: l, Window: w}
			got := p.Interval()
			want := w / l
			if w%l != 0 {
				want++
			}
			if got != want {
				t.Fatalf("Interval of %d per %d = %d, want %d", l, w, got, want)
			}
		}
	}
}

// FuzzBounds is the edge test over any int64 policy, cost and time before
// the horizon: whatever Check accepts keeps its arithmetic in range.
//
//	go test -fuzz FuzzBounds ./algorithms
func FuzzBounds(f *testing.F) {
	f.Add(uint8(1), int64(math.MaxInt64-1023), int64(60*s), int64(0), int64(0), int64(math.MaxInt64), int64(0))
	f.Add(uint8(5), int64(1), MaxSpan/2, int64(0), MaxSpan/2, int64(2), int64(y2100-base))
	f.Add(uint8(3), MaxEvents, int64(3600*s), MaxEvents, int64(0), MaxEvents, int64(0))
	f.Fuzz(func(t *testing.T, which uint8, limit, window, burst, delay, cost, at int64) {
		name := Names()[int(which)%len(Names())]
		p := Policy{Limit: limit, Window: window, Burst: burst, MaxDelay: delay}
		if _, err := Check(name, p); err != nil {
			return
		}
		now := base + max(at, 0)%(horizon-base)
		where := fmt.Sprintf("%s %+v at %d", name, p, now)
		next := Policy{Limit: 1 + max(limit/3, 0), Window: max(window/5, 1), Burst: burst / 2, MaxDelay: delay / 2}
		if _, err := Check(name, next); err != nil {
			next = p
		}
		driveAny(t, where, name, p, next, now, append(edgeCosts[:len(edgeCosts):len(edgeCosts)], cost))
	})
}
