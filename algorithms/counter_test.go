package algorithms

import (
	"testing"
	"time"
)

func TestSlidingCounterWorkedExamples(t *testing.T) {
	tests := []struct {
		name              string
		limit             int64
		prev, curr        int64
		elapsed           int64 // into the current 60 s window
		wantEst           int64
		wantAllow         bool
		wantRemainingLeft int64
	}{
		// docs/algorithms.md: 100 per minute; at 12:01:15 (25%),
		// 90 × 0.75 + 20 = 87.5 → 87.
		{"at 25%", 100, 90, 20, 15 * s, 87, true, 12},
		// At 12:01:30 (50%), 90 × 0.5 + 40 = 85.
		{"at 50%", 100, 90, 40, 30 * s, 85, true, 14},
		// At 12:01:05 (8.3%), 90 × 0.9167 + 30 = 112.5 → 112 > 100.
		{"at 8.3%", 100, 90, 30, 5 * s, 112, false, 0},
		// 60 × 0.7 + 45 = 87.
		{"at 30%", 100, 60, 45, 18 * s, 87, true, 12},
		// 200/min, 180 × 0.6 + 50 = 158.
		{"200 per minute at 40%", 200, 180, 50, 24 * s, 158, true, 41},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := NewSlidingCounter(Policy{Limit: tt.limit, Window: 60 * s})
			st := Counter{Start: minute, Prev: tt.prev, Curr: tt.curr}
			now := minute + tt.elapsed
			if got := a.Estimate(st, now); got != tt.wantEst {
				t.Fatalf("estimate %d, want %d", got, tt.wantEst)
			}
			r := a.Decide(st, now, 1)
			if r.Allowed != tt.wantAllow || r.Remaining != tt.wantRemainingLeft {
				t.Fatalf("got %+v, want allowed=%v remaining=%d", r, tt.wantAllow, tt.wantRemainingLeft)
			}
		})
	}
}

// The 8.3% row again, waiting: the estimate falls as the previous window
// slides out; Retry-After is the first instant it fits, to the nanosecond.
func TestSlidingCounterRetryAfterIsExact(t *testing.T) {
	a := NewSlidingCounter(Policy{Limit: 100, Window: 60 * s})
	st := Counter{Start: minute, Prev: 90, Curr: 30}
	now := minute + 5*s
	r := a.Decide(st, now, 1)
	if r.Allowed {
		t.Fatal("allowed")
	}
	// 30 + 1 + ⌊90·m/60s⌋ ≤ 100 needs 90·m/60s < 70: m < 46.666… s, so
	// the first fit is at elapsed 13.333333334 s.
	at := now + r.RetryAfter
	if !a.Decide(st, at, 1).Allowed || a.Decide(st, at-1, 1).Allowed {
		t.Fatalf("RetryAfter %v is not the first instant that fits", time.Duration(r.RetryAfter))
	}
	if r.RetryAfter != 8_333_333_334 {
		t.Fatalf("RetryAfter %v, want 8.333333334s", time.Duration(r.RetryAfter))
	}
}

func TestSlidingCounterRolls(t *testing.T) {
	a := NewSlidingCounter(Policy{Limit: 10, Window: 60 * s})
	var st Counter
	st = a.Take(st, minute+50*s, 10)
	// Next window, 30 s in: 10 × 0.5 = 5 counted.
	if got := a.Estimate(st, minute+90*s); got != 5 {
		t.Fatalf("estimate %d one and a half windows later, want 5", got)
	}
	// Two windows later nothing is left.
	if got := a.Estimate(st, minute+120*s); got != 0 {
		t.Fatalf("estimate %d two windows later, want 0", got)
	}
	if got := a.IdleAt(st); got != minute+120*s {
		t.Fatalf("IdleAt %v", time.Duration(got-minute))
	}
	// Full in the current window: the wait reaches into the next one.
	r := a.Decide(st, minute+55*s, 1)
	if r.Allowed {
		t.Fatal("allowed into a full window")
	}
	at := minute + 55*s + r.RetryAfter
	if !a.Decide(st, at, 1).Allowed || a.Decide(st, at-1, 1).Allowed {
		t.Fatalf("RetryAfter %v is not the first instant that fits", time.Duration(r.RetryAfter))
	}
	// Clock stepping back counts the previous window in full.
	st = Counter{Start: minute, Prev: 10}
	if r := a.Decide(st, minute-time.Hour.Nanoseconds(), 1); r.Allowed {
		t.Fatalf("a clock stepping back emptied the window: %+v", r)
	}
	if r := a.Decide(Counter{}, minute, 11); r.RetryAfter != Never {
		t.Fatalf("cost above max_events: %+v", r)
	}
	// Refunds come out of the window the request was counted in.
	st = a.Refund(Counter{Start: minute, Prev: 4, Curr: 2}, minute+s, Result{At: minute}, 2)
	if st.Curr != 0 || st.Prev != 4 {
		t.Fatalf("refund 2 counted now: %+v", st)
	}
	st = a.Refund(Counter{Start: minute, Prev: 4, Curr: 2}, minute+s, Result{At: minute - s}, 3)
	if st.Curr != 2 || st.Prev != 1 {
		t.Fatalf("refund 3 counted in the previous window: %+v", st)
	}
}
