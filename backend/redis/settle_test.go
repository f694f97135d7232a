package redis

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
)

// settleGrant settles the i-th granted decision at actual (one real cost
// per request) in both stores, then compares the keys' states.
func (tw *twin) settleGrant(i int, actual []int64) {
	tw.t.Helper()
	g := tw.granted[i]
	tw.granted = append(tw.granted[:i], tw.granted[i+1:]...)
	tw.log = append(tw.log, fmt.Sprintf("t=%d settle %s granted %v at %v", tw.clock, describe(g.memReqs), g.out, actual))
	ctx := context.Background()
	merr := tw.cur.mem.Settle(ctx, g.memReqs, g.out, actual)
	rerr := tw.cur.red.Settle(ctx, g.redReqs, g.out, actual)
	if merr != nil || rerr != nil {
		tw.fail("settle: memory %v, redis %v", merr, rerr)
	}
	for k := range g.memReqs {
		mu, merr := tw.cur.mem.Inspect(ctx, g.memReqs[k].Limit, g.memReqs[k].Key)
		ru, rerr := tw.cur.red.Inspect(ctx, g.redReqs[k].Limit, g.redReqs[k].Key)
		if merr != nil || rerr != nil || mu != ru {
			tw.fail("inspect after settle of %s: memory %+v %v\n                             redis  %+v %v", describe(g.memReqs[k:k+1]), mu, merr, ru, rerr)
		}
	}
}

// settleStep settles a random granted decision at random real costs:
// lower (down to 0), the same, higher, and far past any limit.
func (tw *twin) settleStep() {
	if len(tw.granted) == 0 {
		return
	}
	i := tw.c.intn(len(tw.granted))
	g := tw.granted[i]
	actual := make([]int64, len(g.memReqs))
	for k, r := range g.memReqs {
		if tw.zoneOf(r.Limit).policy.MaxDelay > 0 {
			// A queue's request cannot settle: the handler refuses it.
			tw.granted = append(tw.granted[:i], tw.granted[i+1:]...)
			return
		}
		est := r.Cost
		actual[k] = []int64{0, max(est-1, 0), est / 2, est, est + 1, 3*est + 2, 1 << 40, algorithms.MaxSettle}[tw.c.intn(8)]
	}
	tw.settleGrant(i, actual)
}

func (tw *twin) zoneOf(l backend.Limit) zoneSpec {
	for i, z := range tw.cur.memZ {
		if z == l {
			return tw.cur.specs[i]
		}
	}
	tw.t.Fatalf("no zone %s", l.Name())
	return zoneSpec{}
}

// TestSettleDifferential: settling answers alike in both stores, and
// leaves them deciding alike, through random traffic, time, refunds and
// reloads.
func TestSettleDifferential(t *testing.T) {
	client := standaloneClient(t)
	for run := range diffRuns(200) {
		tw := newTwin(t, prng{rand.New(rand.NewPCG(uint64(run), 31))}, client, run%4 == 3)
		for range 150 {
			if tw.c.intn(4) == 0 {
				tw.settleStep()
			} else {
				tw.step()
			}
		}
	}
}

// The LLM example on every algorithm, in both stores: 5000 reserved, 1800
// used, 3200 back; then 4 reserved and 25 used on a limit of 10 a minute,
// owed and waited out.
func TestSettleBothStores(t *testing.T) {
	client := standaloneClient(t)
	t0 := int64(1_764_460_020) * int64(time.Second) // on the minute
	for _, alg := range algorithms.Names() {
		t.Run(alg, func(t *testing.T) {
			tw := newTwinWith(t, client, false, t0,
				zoneSpec{name: "tpm", alg: alg, policy: algorithms.Policy{Limit: 200000, Window: int64(time.Minute)}},
				zoneSpec{name: "small", alg: alg, policy: algorithms.Policy{Limit: 10, Window: int64(time.Minute)}})
			if ok, _ := tw.do(ask{zone: 0, key: "tenant", cost: 5000}); !ok {
				t.Fatal("5000 of 200000 denied")
			}
			tw.settleGrant(0, []int64{1800})
			u, err := tw.cur.red.Inspect(context.Background(), tw.cur.redZ[0], "tenant")
			if err != nil || u.Remaining != 198200 {
				t.Fatalf("after settling 5000 at 1800: %+v %v, want 198200 remaining", u, err)
			}
			if ok, _ := tw.do(ask{zone: 1, key: "tenant", cost: 4}); !ok {
				t.Fatal("4 of 10 denied")
			}
			tw.settleGrant(0, []int64{25})
			_, out := tw.do(ask{zone: 1, key: "tenant", cost: 1})
			wait := map[string]int64{algorithms.NameFixedWindow: 60, algorithms.NameSlidingWindow: 60, algorithms.NameSlidingCounter: 60}[alg]
			if wait == 0 {
				wait = 96 // 150 s owed on a 60 s bucket, and 6 s for the token
			}
			want := wait * int64(time.Second)
			if alg == algorithms.NameSlidingCounter {
				// 25 in the window weigh ⌊25 × (60 − e)/60⌋ on the next:
				// below 10 once e is past 36 s.
				want = 96*int64(time.Second) + 1
			}
			if out[0].Allowed || out[0].RetryAfter != want {
				t.Fatalf("after the debt: %+v, want denied for %ds", out[0], wait)
			}
		})
	}
}

// BenchmarkSettle is what settling adds on Redis: one more script call
// per request after its decision (token bucket, one key, the estimate
// 5000 settled at 1800, and back at 5000 on the next decision's refill).
//
//	go test -run '^$' -bench Settle -benchmem ./backend/redis/
func BenchmarkSettle(b *testing.B) {
	client := standaloneClient(b)
	for _, settle := range []bool{false, true} {
		name := "decide"
		if settle {
			name = "decide_then_settle"
		}
		b.Run(name, func(b *testing.B) {
			s, err := New(client, Options{KeyPrefix: uniquePrefix(b), Timeout: time.Second})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			z, err := s.Register(backend.LimitConfig{Name: "bench_settle", Algorithm: algorithms.NameTokenBucket, Policy: algorithms.Policy{Limit: 1_000_000_000_000, Window: int64(time.Minute)}})
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			reqs := []backend.Request{{Limit: z, Key: "tenant", Cost: 5000}}
			out := make([]algorithms.Result, 1)
			actual := []int64{1800}
			b.ReportAllocs()
			for b.Loop() {
				if ok, err := s.Decide(ctx, reqs, out); !ok || err != nil {
					b.Fatal(ok, err)
				}
				if settle {
					if err := s.Settle(ctx, reqs, out, actual); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}

// A leased limit settles in Redis itself: the request's estimate was
// spent from a lease, and the difference is given back to (or charged
// in) Redis's state, exactly, for buckets and window counters alike.
func TestSettleThroughLease(t *testing.T) {
	addr := standalone(t)
	for _, alg := range []string{algorithms.NameTokenBucket, algorithms.NameFixedWindow, algorithms.NameSlidingCounter} {
		t.Run(alg, func(t *testing.T) {
			prefix := uniquePrefix(t)
			m, err := provisionModule(t, `{"addresses": ["`+addr+`"], "key_prefix": "`+prefix+`", "timeout": "10s"}`)
			if err != nil {
				t.Fatal(err)
			}
			p := policy(1000, time.Hour)
			h, err := m.Register(backend.LimitConfig{Name: "leased_settle", Algorithm: alg, Policy: p, Lease: 10})
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			left := func() int64 {
				t.Helper()
				s := newStore(t, standaloneClient(t))
				s.prefix = prefix
				z := mustZone(t, s, "leased_settle", alg, p)
				u, err := s.Inspect(ctx, z, "k")
				if err != nil {
					t.Fatal(err)
				}
				return u.Remaining
			}
			reqs := []backend.Request{{Limit: h, Key: "k", Cost: 5}}
			out := make([]algorithms.Result, 1)
			if ok, err := m.Decide(ctx, reqs, out); !ok || err != nil {
				t.Fatal(ok, err)
			}
			if got := left(); got != 990 {
				t.Fatalf("Redis has %d left, want 990 (a lease of 10)", got)
			}
			if err := m.Settle(ctx, reqs, out, []int64{2}); err != nil {
				t.Fatal(err)
			}
			if got := left(); got != 993 {
				t.Fatalf("after settling 5 at 2: Redis has %d left, want 993", got)
			}
			if ok, err := m.Decide(ctx, reqs, out); !ok || err != nil { // the lease's last 5
				t.Fatal(ok, err)
			}
			if err := m.Settle(ctx, reqs, out, []int64{9}); err != nil {
				t.Fatal(err)
			}
			if got := left(); got != 989 {
				t.Fatalf("after settling 5 at 9: Redis has %d left, want 989", got)
			}
		})
	}
}

// A log keeps an expiry through a refund or a settle: one that rewrites
// it (format 0, small or with room, to format 2) writes it again with the
// expiry its newest event needs. A refund of an event that has left the
// window, and a settle of a live event, left the key with none: never
// expiring, though its client is gone.
func TestLogRefundSettleKeepExpiry(t *testing.T) {
	c := standaloneClient(t)
	const W = int64(time.Minute)
	for _, op := range []string{"refund-gone", "refund-live", "settle-gone", "settle-live"} {
		for _, n := range []int{1, 40} {
			clock := int64(1_764_460_000_000_000_000)
			s, err := New(c, Options{KeyPrefix: uniquePrefix(t), Timeout: 10 * time.Second, now: func() int64 { return clock }, NoCache: true})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			z := mustZone(t, s, "l", algorithms.NameSlidingWindow, algorithms.Policy{Limit: 100, Window: W})
			req := []backend.Request{{Limit: z, Key: "k", Cost: 1}}
			out := make([]algorithms.Result, 1)
			decide := func() algorithms.Result {
				if _, err := s.Decide(context.Background(), req, out); err != nil {
					t.Fatal(err)
				}
				return out[0]
			}
			target := decide()
			clock += W / 2
			prev, newest := int64(0), target.At
			for range n {
				clock += 1000
				last := decide()
				prev, newest = newest, last.At
				if strings.HasSuffix(op, "-live") {
					target = last
				}
			}
			if strings.HasSuffix(op, "-gone") {
				clock += W/2 + 1 // the first event has left the window
			}
			if op == "refund-live" {
				newest = prev // the newest event goes
			}
			if strings.HasPrefix(op, "refund") {
				err = s.Refund(context.Background(), req, []algorithms.Result{target})
			} else {
				err = s.Settle(context.Background(), req, []algorithms.Result{target}, []int64{2})
			}
			if err != nil {
				t.Fatal(err)
			}
			pttl := c.PTTL(context.Background(), z.(*zone).stateKey("k")).Val()
			if need := time.Duration(newest + W - clock); pttl < 0 || pttl < need-time.Second {
				t.Errorf("%s of a log of %d events: the key expires in %v, its newest event leaves the window in %v", op, n+1, pttl, need)
			}
		}
	}
}
