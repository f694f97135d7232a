package algorithms

import (
	"testing"
	"time"
)

func TestSlidingLogBoundaryAttack(t *testing.T) {
	// 100 per minute, the fixed-window boundary attack of
	// TestFixedWindowBoundaryBurst run again. The first batch lands during 12:00:59 (here at .5), so it is
	// still in the window at 12:01:59 and gone at 12:02:00.
	a := NewSlidingLog(Policy{Limit: 100, Window: 60 * s})
	noon := base
	at := func(m, sec int64, frac int64) int64 { return noon + m*60*s + sec*s + frac }
	var st *Log
	steps := []struct {
		now         int64
		n, want     int
		retryOfDeny int64
	}{
		{at(0, 59, 500*ms), 100, 100, noDeny},
		{at(1, 0, 0), 100, 0, 59*s + 500*ms},
		{at(1, 59, 0), 1, 0, 500 * ms},
		{at(2, 0, 0), 1, 1, noDeny},
	}
	for _, sp := range steps {
		allowed, retry := 0, int64(noDeny)
		for i := 0; i < sp.n; i++ {
			r := a.Decide(st, sp.now, 1)
			if r.Allowed {
				st = a.Take(st, sp.now, 1)
				allowed++
			} else if retry == noDeny {
				retry = r.RetryAfter
			}
		}
		if allowed != sp.want || retry != sp.retryOfDeny {
			t.Errorf("at %v: %d allowed (want %d), retry %v (want %v)", time.Duration(sp.now-noon), allowed, sp.want, time.Duration(retry), time.Duration(sp.retryOfDeny))
		}
	}
}

func TestSlidingLogCountsOnlyTheWindow(t *testing.T) {
	// At 12:01:30 with a 60 s window, of the events at
	// 12:00:10, 12:00:45, 12:01:02 and 12:01:29 three count.
	a := NewSlidingLog(Policy{Limit: 10, Window: 60 * s})
	var st *Log
	for _, sec := range []int64{10, 45, 62, 89} {
		st = a.Take(st, base+sec*s, 1)
	}
	r := a.Decide(st, base+90*s, 1)
	if !r.Allowed || r.Remaining != 10-3-1 {
		t.Fatalf("got %+v, want allowed with 6 remaining (3 events in the window)", r)
	}
	if n, _ := st.Len(); n != 3 {
		t.Fatalf("log holds %d events after pruning, want 3", n)
	}
}

// mholt/caddy-ratelimit's handler test, on the algorithm: 10 per 60 s at
// one instant, then Retry-After 60, 30 seconds later 30, a window later
// allowed.
func TestSlidingLogMholtTimeline(t *testing.T) {
	a := NewSlidingLog(Policy{Limit: 10, Window: 60 * s})
	var st *Log
	for i := 0; i < 10; i++ {
		if r := a.Decide(st, base, 1); !r.Allowed {
			t.Fatalf("request %d denied", i+1)
		}
		st = a.Take(st, base, 1)
	}
	for _, c := range []struct{ at, retry int64 }{{0, 60 * s}, {30 * s, 30 * s}} {
		if r := a.Decide(st, base+c.at, 1); r.Allowed || r.RetryAfter != c.retry {
			t.Fatalf("at +%v: %+v, want denied with retry %v", time.Duration(c.at), r, time.Duration(c.retry))
		}
	}
	if r := a.Decide(st, base+60*s, 1); !r.Allowed {
		t.Fatalf("a whole window later: %+v, want allowed", r)
	}
}

func TestSlidingLogDeniedAreNotLogged(t *testing.T) {
	a := NewSlidingLog(Policy{Limit: 2, Window: 10 * s})
	var st *Log
	st = a.Take(st, base, 1)
	st = a.Take(st, base+s, 1)
	// Hammering a full window must not push its end out.
	for i := int64(0); i < 1000; i++ {
		if r := a.Decide(st, base+2*s+i*ms, 1); r.Allowed {
			t.Fatalf("allowed a request into a full window")
		}
	}
	if n, _ := st.Len(); n != 2 {
		t.Fatalf("log holds %d events, want 2", n)
	}
	if r := a.Decide(st, base+10*s, 1); !r.Allowed {
		t.Fatalf("the oldest event left the window but the request was denied: %+v", r)
	}
}

func TestSlidingLogCost(t *testing.T) {
	a := NewSlidingLog(Policy{Limit: 10, Window: 10 * s})
	var st *Log
	st = a.Take(st, base, 3)     // leaves at +10
	st = a.Take(st, base+s, 1)   // leaves at +11
	st = a.Take(st, base+2*s, 4) // leaves at +12
	r := a.Decide(st, base+3*s, 5)
	// 8 held, 5 wanted: 3 must leave, which the first entry does at +10.
	if r.Allowed || r.RetryAfter != 7*s || r.Remaining != 2 {
		t.Fatalf("got %+v, want denied, retry 7s, 2 remaining", r)
	}
	r = a.Decide(st, base+3*s, 7)
	// 5 must leave: the first two entries free only 4, the third leaves
	// at +12.
	if r.Allowed || r.RetryAfter != 9*s {
		t.Fatalf("got %+v, want denied with retry 9s", r)
	}
	if r := a.Decide(st, base, 11); r.RetryAfter != Never {
		t.Fatalf("a cost above max_events: %+v, want RetryAfter Never", r)
	}
	if n, units := st.Len(); n != 3 || units != 8 {
		t.Fatalf("log = %d events / %d units, want 3 / 8", n, units)
	}
}

func TestSlidingLogClockBackwards(t *testing.T) {
	a := NewSlidingLog(Policy{Limit: 2, Window: 10 * s})
	var st *Log
	st = a.Take(st, base+5*s, 1)
	st = a.Take(st, base, 1) // clock stepped back 5 s: recorded at +5 s
	if got := a.IdleAt(st); got != base+15*s {
		t.Fatalf("IdleAt = +%v, want +15s", time.Duration(got-base))
	}
	if r := a.Decide(st, base+14*s, 1); r.Allowed {
		t.Fatalf("allowed before either event left the window")
	}
}

func TestSlidingLogGrowsAndShrinks(t *testing.T) {
	a := NewSlidingLog(Policy{Limit: 1000, Window: 10 * s})
	var st *Log
	if st != nil {
		t.Fatal("fresh log allocated")
	}
	for i := int64(0); i < 1000; i++ {
		st = a.Take(st, base+i*ms, 1)
	}
	if len(st.at) != 1024 {
		t.Fatalf("ring size %d after 1000 events, want 1024", len(st.at))
	}
	// All but the last few events leave; the ring gives memory back.
	a.Decide(st, base+10*s+995*ms, 1)
	if n, _ := st.Len(); n != 4 {
		t.Fatalf("%d events left, want 4", n)
	}
	if len(st.at) > 512 {
		t.Fatalf("ring size %d after pruning to 4 events, want it shrunk", len(st.at))
	}
}

// A refund drops the events that have left the window, as a decision
// does: a longer window after a reload must not count them again.
func TestSlidingLogRefundPrunes(t *testing.T) {
	a := NewSlidingLog(Policy{Limit: 5, Window: s})
	var l *Log
	l = a.Take(l, base, 1)
	l = a.Take(l, base, 2)
	l = a.Take(l, base+900*ms, 1)
	l = a.Refund(l, base+1500*ms, Result{At: base + 900*ms}, 1)
	long := NewSlidingLog(Policy{Limit: 5, Window: 10 * s})
	if r := long.Decide(l, base+1500*ms, 0); r.Remaining != 5 {
		t.Fatalf("remaining %d under a longer window after the refund, want 5: the events that left came back", r.Remaining)
	}
}
