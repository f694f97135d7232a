package algorithms

import (
	"math/rand/v2"
	"testing"
	"time"
)

// grantCase runs random traffic against one key, then grants units and
// checks that exactly that many (or up to the full quota) came back, and
// that nothing else changed: a second grant of 0 is a no-op.
// maxCost bounds the costs of that traffic.
func grantCase[S any](t *testing.T, name string, maxCost int64, a interface {
	Algorithm[S]
	Granter[S]
}) {
	t.Helper()
	rng := rand.New(rand.NewPCG(1, uint64(len(name))))
	p := a.Policy()
	for trial := range 300 {
		var s S
		now := int64(1_700_000_000)*int64(time.Second) + rng.Int64N(p.Window)
		for range rng.IntN(40) {
			now += rng.Int64N(p.Window / 8)
			cost := 1 + rng.Int64N(maxCost)
			if r := a.Decide(s, now, cost); r.Allowed {
				s = a.Take(s, now, cost)
			}
		}
		limit := a.Usage(s, now).Limit
		before := a.Available(s, now)
		units := rng.Int64N(limit + 2)
		s = a.Grant(s, now, units)
		got := a.Available(s, now)
		if want := min(before+units, limit); got != want {
			t.Fatalf("%s trial %d: available %d, grant %d: got %d, want %d", name, trial, before, units, got, want)
		}
		if again := a.Available(a.Grant(s, now, 0), now); again != got {
			t.Fatalf("%s trial %d: a grant of 0 changed available from %d to %d", name, trial, got, again)
		}
	}
}

func TestGrantGivesBackExactlyUnits(t *testing.T) {
	p := Policy{Limit: 10, Window: int64(time.Minute)}
	grantCase[*Log](t, NameSlidingWindow, 3, NewSlidingLog(p))
	grantCase[Counter](t, NameSlidingCounter, 3, NewSlidingCounter(p))
	grantCase[Window](t, NameFixedWindow, 3, NewFixedWindow(p))
	grantCase[Bucket](t, NameTokenBucket, 3, NewTokenBucket(Policy{Limit: 10, Window: int64(time.Minute), Burst: 15}))
	grantCase[Bucket](t, NameGCRA, 3, NewGCRA(p))
	// A queued request of several units may reach past the queue's last
	// slot; what it holds there is given back first, so unit requests.
	grantCase[Bucket](t, "leaky_queue", 1, NewLeakyBucket(Policy{Limit: 10, Window: int64(time.Minute), MaxDelay: int64(30 * time.Second)}))
}

// TestGrantNewestEventsFirst: the log gives back its newest units, so a
// partial grant splits the newest event and the key resets sooner.
func TestGrantNewestEventsFirst(t *testing.T) {
	a := NewSlidingLog(Policy{Limit: 10, Window: 100})
	var l *Log
	l = a.Take(l, 1000, 3)
	l = a.Take(l, 1050, 4)
	l = a.Grant(l, 1060, 5)
	if n, units := l.Len(); n != 1 || units != 2 {
		t.Fatalf("after granting 5 of 3+4: %d events, %d units; want 1 event of 2", n, units)
	}
	if r := a.Decide(l, 1060, 9); r.Allowed || r.RetryAfter != 40 {
		t.Fatalf("the remaining event is the oldest, leaving at 1100: got %+v", r)
	}
}

// TestGrantCounterPrevious: units beyond the current window come out of the
// previous window's weighted share, exactly.
func TestGrantCounterPrevious(t *testing.T) {
	a := NewSlidingCounter(Policy{Limit: 100, Window: 60})
	s := Counter{Start: 60, Prev: 90, Curr: 5} // at 80: ⌊90·40/60⌋ + 5 = 65
	if est := a.Estimate(s, 80); est != 65 {
		t.Fatalf("estimate %d, want 65", est)
	}
	s = a.Grant(s, 80, 20)
	if est := a.Estimate(s, 80); est != 45 {
		t.Fatalf("after granting 20: estimate %d, want 45 (state %+v)", est, s)
	}
}
