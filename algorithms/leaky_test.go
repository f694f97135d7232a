package algorithms

import (
	"math/rand/v2"
	"testing"
	"time"
)

// As a meter the leaky bucket admits exactly what the token bucket admits.
func TestLeakyMeterIsTokenBucket(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for trial := 0; trial < 50; trial++ {
		p := Policy{Limit: 1 + rng.Int64N(20), Window: (1 + rng.Int64N(10)) * s, Burst: 1 + rng.Int64N(30)}
		lb, tb := NewLeakyBucket(p), NewTokenBucket(p)
		var ls, ts Bucket
		now := base
		for i := 0; i < 500; i++ {
			now += rng.Int64N(int64(p.Window) / max(p.Limit, 1))
			cost := rng.Int64N(4)
			lr, tr := lb.Decide(ls, now, cost), tb.Decide(ts, now, cost)
			if lr != tr {
				t.Fatalf("policy %+v step %d: leaky %+v, token %+v", p, i, lr, tr)
			}
			if lr.Allowed {
				ls, ts = lb.Take(ls, now, cost), tb.Take(ts, now, cost)
			}
		}
	}
}

// As a queue: 10 per second, waiting up to 1 s. Eleven requests at once
// are all admitted, released 100 ms apart; the twelfth would wait 1.1 s
// and is denied for 100 ms.
func TestLeakyQueue(t *testing.T) {
	q := NewLeakyBucket(Policy{Limit: 10, Window: s, MaxDelay: s})
	var st Bucket
	var granted []Result
	for i := int64(0); i < 11; i++ {
		r := q.Decide(st, base, 1)
		r.At = base
		granted = append(granted, r)
		if !r.Allowed || r.Delay != i*100*ms {
			t.Fatalf("request %d: %+v, want allowed with delay %v", i+1, r, time.Duration(i*100*ms))
		}
		if r.Limit != 11 || r.Remaining != 10-i {
			t.Fatalf("request %d: queue size %d, room %d; want 11 and %d", i+1, r.Limit, r.Remaining, 10-i)
		}
		st = q.Take(st, base, 1)
	}
	r := q.Decide(st, base, 1)
	if r.Allowed || r.RetryAfter != 100*ms {
		t.Fatalf("12th: %+v, want denied for 100ms", r)
	}
	// The client of a slot in the middle leaves: its slot stays empty,
	// since those behind it keep theirs (giving it away would release two
	// at once).
	if got := q.Refund(st, base+50*ms, granted[4], 1); got != st {
		t.Fatalf("refunding a middle slot changed the schedule: %+v", got)
	}
	// The last in line leaves: its slot goes to the next one.
	st = q.Refund(st, base+50*ms, granted[10], 1)
	if r := q.Decide(st, base+50*ms, 1); !r.Allowed || r.Delay != 950*ms {
		t.Fatalf("after the last one left: %+v, want allowed with delay 950ms", r)
	}
	// A free request neither waits nor is refused on a full queue.
	if r := q.Decide(q.Take(st, base, 1), base, 0); !r.Allowed || r.Delay != 0 {
		t.Fatalf("cost 0 on a full queue: %+v", r)
	}
	// Cost counts slots; a cost beyond the queue can never pass.
	if r := q.Decide(Bucket{}, base, 12); r.RetryAfter != Never {
		t.Fatalf("cost 12 in a queue of 11: %+v", r)
	}
	if r := q.Decide(Bucket{}, base, 5); !r.Allowed || r.Delay != 0 || r.ResetAfter != 500*ms {
		t.Fatalf("cost 5 on an idle queue: %+v", r)
	}
}

// nginx's limit_req mapped onto the queue: limit_req rate=10r/s burst=20 without
// nodelay queues up to 20 excess requests, i.e. a wait of up to 2 s.
func TestLeakyQueueNginxBurst(t *testing.T) {
	q := NewLeakyBucket(Policy{Limit: 10, Window: s, MaxDelay: 2 * s})
	var st Bucket
	admitted := 0
	for i := 0; i < 30; i++ {
		if r := q.Decide(st, base, 1); r.Allowed {
			st = q.Take(st, base, 1)
			admitted++
		}
	}
	if admitted != 21 {
		t.Fatalf("%d admitted, want 21 (one now, 20 queued)", admitted)
	}
}

func TestRefundNeverOverfills(t *testing.T) {
	tb := NewTokenBucket(Policy{Limit: 10, Window: 10 * s})
	st := tb.Take(Bucket{}, base, 2)
	st = tb.Refund(st, base+time.Hour.Nanoseconds(), Result{At: base}, 5)
	if got := tb.Tokens(st, base+time.Hour.Nanoseconds()); got != 10 {
		t.Fatalf("%v tokens after refunding into a full bucket, want 10", got)
	}
	// The log gives back the refunded request's own event, not the newest
	// (B refunded after C was logged must take B's event out).
	a := NewSlidingLog(Policy{Limit: 3, Window: 5 * s})
	var l *Log
	l = a.Take(l, base, 1)        // A
	l = a.Take(l, base+100*ms, 1) // B
	l = a.Take(l, base+200*ms, 1) // C
	l = a.Refund(l, base+500*ms, Result{At: base + 100*ms}, 1)
	l = a.Take(l, base+2050*ms, 1) // D
	if r := a.Decide(l, base+5100*ms, 1); !r.Allowed {
		t.Fatalf("E at 5.1 s: %+v; A has left, C and D are in the window", r)
	}
	l = a.Take(l, base+5100*ms, 1) // E
	if r := a.Decide(l, base+5120*ms, 1); r.Allowed {
		t.Fatal("F at 5.12 s allowed: C, D, E are three in the last 5 s")
	}
	// Nothing to give back: a cost the log never took, or a time it did
	// not (before C leaves the window at 5.2 s: a refund prunes).
	before, _ := l.Len()
	l = a.Refund(l, base+5150*ms, Result{At: base + 3*s}, 1)
	l = a.Refund(l, base+5150*ms, Result{At: base + 200*ms}, 2)
	if after, _ := l.Len(); after != before {
		t.Fatalf("a refund of something never logged removed an event")
	}
}

// A queue's slots given out reach past 2^52 ns with a 30-day window: a
// change of rate keeps all of them, at the new interval.
func TestLeakyQueueRebaseKeepsLongDebt(t *testing.T) {
	day := int64(24 * time.Hour)
	old := Policy{Limit: 4, Window: 30 * day, MaxDelay: 30 * day / 4 * 3}
	q := NewLeakyBucket(old)
	var st Bucket
	for _, c := range []int64{1, 1, 1, 4} {
		if r := q.Decide(st, base, c); !r.Allowed {
			t.Fatalf("cost %d: %+v", c, r)
		}
		st = q.Take(st, base, c)
	}
	p := old
	p.Window += 4 // a nanosecond more per slot
	p.MaxDelay = 3 * p.Interval()
	got := NewLeakyBucket(p).Rebase(st, base, old).TAT - base
	if want := 7 * p.Interval(); got != want {
		t.Fatalf("debt %d after the change, want %d (7 slots of the new interval)", got, want)
	}
}

// A refund gives back no more than the request's charge still holds: a
// reservation that the refill paid off while it was held (its bucket full
// again, then spent by others) cannot be cashed as a second burst. One
// still outstanding is given back whole, as is what is left of one the
// refill is paying off.
func TestBucketRefundAfterRefill(t *testing.T) {
	for _, b := range []interface {
		Decide(Bucket, int64, int64) Result
		Take(Bucket, int64, int64) Bucket
		Refund(Bucket, int64, Result, int64) Bucket
		Settle(Bucket, int64, Result, int64, int64) Bucket
		Tokens(Bucket, int64) float64
	}{NewTokenBucket(Policy{Limit: 100, Window: 2 * s}), NewGCRA(Policy{Limit: 100, Window: 2 * s})} {
		grant := func(st Bucket, now, cost int64) (Bucket, Result) {
			r := b.Decide(st, now, cost)
			if !r.Allowed {
				t.Fatalf("%T: %d at %d denied", b, cost, now)
			}
			r.At = now
			return b.Take(st, now, cost), r
		}
		st, a := grant(Bucket{}, base, 100) // held 2.5 s, used nothing
		st, _ = grant(st, base+2100*ms, 100)
		st = b.Settle(st, base+2500*ms, a, 100, 0)
		if got := b.Tokens(st, base+2500*ms); got > 21 {
			t.Errorf("%T: %v tokens after settling a paid-off reservation, want the refill alone (20)", b, got)
		}
		st = b.Refund(st, base+2500*ms, a, 100)
		if got := b.Tokens(st, base+2500*ms); got > 21 {
			t.Errorf("%T: %v tokens after refunding a paid-off reservation, want 20", b, got)
		}
		// Half paid off: 1 s of a 2 s charge is still held.
		st, a = grant(Bucket{}, base, 100)
		st = b.Settle(st, base+s, a, 100, 0)
		if got := b.Tokens(st, base+s); got != 100 {
			t.Errorf("%T: %v tokens after settling a half paid-off reservation, want 100", b, got)
		}
		st, a = grant(Bucket{}, base, 60)
		st, _ = grant(st, base+10*ms, 40)
		st = b.Refund(st, base+20*ms, a, 60)
		if got := b.Tokens(st, base+20*ms); got < 60 || got > 61 {
			t.Errorf("%T: %v tokens after refunding an outstanding 60, want 60 and the refill", b, got)
		}
	}
}
