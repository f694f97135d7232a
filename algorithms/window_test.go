package algorithms

import (
	"testing"
	"time"
)

// minute is a window start: base rounded down to a whole minute.
var minute = base - base%(60*s)

// 100 per minute; 100 requests at 12:00:59 and 100 more at
// 12:01:00 all pass, 200 within one second: the boundary burst.
func TestFixedWindowBoundaryBurst(t *testing.T) {
	a := NewFixedWindow(Policy{Limit: 100, Window: 60 * s})
	var st Window
	count := func(now int64, n int) int {
		ok := 0
		for i := 0; i < n; i++ {
			if a.Decide(st, now, 1).Allowed {
				st = a.Take(st, now, 1)
				ok++
			}
		}
		return ok
	}
	if got := count(minute+59*s, 100); got != 100 {
		t.Fatalf("window A: %d of 100 allowed", got)
	}
	if r := a.Decide(st, minute+59*s+500*ms, 1); r.Allowed || r.RetryAfter != 500*ms {
		t.Fatalf("101st in window A: %+v, want denied until the window ends in 500ms", r)
	}
	if got := count(minute+60*s, 100); got != 100 {
		t.Fatalf("window B: %d of 100 allowed, want all (the 2× boundary burst)", got)
	}
	if r := a.Decide(st, minute+61*s, 1); r.Allowed || r.RetryAfter != 59*s || r.ResetAfter != 59*s {
		t.Fatalf("window B full: %+v, want denied for 59s", r)
	}
}

func TestFixedWindowEdges(t *testing.T) {
	a := NewFixedWindow(Policy{Limit: 10, Window: 60 * s})
	var st Window
	st = a.Take(st, minute+10*s, 7)
	if r := a.Decide(st, minute+20*s, 3); !r.Allowed || r.Remaining != 0 {
		t.Fatalf("cost 3 with 3 left: %+v", r)
	}
	if r := a.Decide(st, minute+20*s, 4); r.Allowed || r.RetryAfter != 40*s || r.Remaining != 3 {
		t.Fatalf("cost 4 with 3 left: %+v", r)
	}
	if r := a.Decide(st, minute, 11); r.RetryAfter != Never {
		t.Fatalf("cost above max_events: %+v", r)
	}
	// The clock steps back into the previous window: the spent window stays.
	if r := a.Decide(st, minute-30*s, 4); r.Allowed {
		t.Fatalf("a clock stepping back reopened the window: %+v", r)
	}
	if got := a.IdleAt(st); got != minute+60*s {
		t.Fatalf("IdleAt = %v", time.Duration(got-minute))
	}
	st = a.Refund(st, minute+30*s, Result{At: minute + 10*s}, 5)
	if r := a.Decide(st, minute+30*s, 8); !r.Allowed {
		t.Fatalf("after refunding 5 of 7, 8 must fit: %+v", r)
	}
	// A refund after the window turned gives nothing to the new window.
	if got := a.Refund(st, minute+61*s, Result{At: minute + 10*s}, 5); got != st {
		t.Fatalf("refund into a later window changed the state: %+v", got)
	}
}

// A reload that changes the window moves the count onto the new grid, so
// Retry-After is the real end of the new window (1/2s changed to 1/30s
// once answered 30 s but passed at the next 30 s boundary).
func TestWindowRebase(t *testing.T) {
	oldP := Policy{Limit: 1, Window: 2 * s}
	st := NewFixedWindow(oldP).Take(Window{}, minute+61*s, 1) // window [60 s, 62 s)
	a := NewFixedWindow(Policy{Limit: 1, Window: 30 * s})
	st = a.Rebase(st, minute+61500*ms, oldP) // window [60 s, 90 s)
	r := a.Decide(st, minute+62*s, 1)
	if r.Allowed || r.RetryAfter != 28*s {
		t.Fatalf("after the change: %+v, want denied for 28 s", r)
	}
	if !a.Decide(st, minute+90*s, 1).Allowed || a.Decide(st, minute+90*s-1, 1).Allowed {
		t.Fatal("the request does not pass exactly when Retry-After says")
	}
	// A window that was over before the change carries nothing.
	if got := a.Rebase(NewFixedWindow(oldP).Take(Window{}, minute, 1), minute+10*s, oldP); got != (Window{}) {
		t.Fatalf("an expired window carried over: %+v", got)
	}

	// The counter carries its estimate at the change into the new grid.
	oc := NewSlidingCounter(Policy{Limit: 100, Window: 60 * s})
	cs := Counter{Start: minute, Prev: 90, Curr: 20}
	nc := NewSlidingCounter(Policy{Limit: 100, Window: 10 * s})
	rebased := nc.Rebase(cs, minute+15*s, oc.Policy())
	if got := nc.Estimate(rebased, minute+15*s); got != 87 {
		t.Fatalf("estimate after the change %d, want 87 as before it", got)
	}
}
