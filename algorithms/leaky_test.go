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
	for i := int64(0); i < 11; i++ {
		r := q.Decide(st, base, 1)
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
	// A queued client leaves: its slot goes to the next one.
	st = q.Refund(st, base+50*ms, 1)
	if r := q.Decide(st, base+50*ms, 1); !r.Allowed || r.Delay != 950*ms {
		t.Fatalf("after a refund: %+v, want allowed with delay 950ms", r)
	}
	// Cost counts slots; a cost beyond the queue can never pass.
	if r := q.Decide(Bucket{}, base, 12); r.RetryAfter != Never {
		t.Fatalf("cost 12 in a queue of 11: %+v", r)
	}
	if r := q.Decide(Bucket{}, base, 5); !r.Allowed || r.Delay != 0 || r.ResetAfter != 500*ms {
		t.Fatalf("cost 5 on an idle queue: %+v", r)
	}
}

// The nginx mapping of seed part 5.3: limit_req rate=10r/s burst=20 without
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
	st = tb.Refund(st, base+time.Hour.Nanoseconds(), 5)
	if got := tb.Tokens(st, base+time.Hour.Nanoseconds()); got != 10 {
		t.Fatalf("%v tokens after refunding into a full bucket, want 10", got)
	}
	a := NewSlidingLog(Policy{Limit: 10, Window: 10 * s})
	var l *Log
	l = a.Take(l, base, 3)
	l = a.Take(l, base+s, 1)
	l = a.Refund(l, base+s, 2)
	if n, u := l.Len(); n != 1 || u != 2 {
		t.Fatalf("log after refunding 2 of [3, 1]: %d events, %d units; want 1, 2", n, u)
	}
	l = a.Refund(l, base+s, 9)
	if n, u := l.Len(); n != 0 || u != 0 {
		t.Fatalf("log after refunding more than held: %d, %d", n, u)
	}
}
