package redis

import (
	"context"
	"fmt"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/backend/memory"
)

// refund gives back g through Store.Refund on both stores, as the handler
// does for a request another limit refused after the decision.
func (tw *budgetTwin) refund(g budgetGrant) {
	tw.t.Helper()
	if err := tw.mem.Refund(context.Background(), g.mem, g.out); err != nil {
		tw.t.Fatal(err)
	}
	if err := tw.red.Refund(context.Background(), g.red, g.out); err != nil {
		tw.t.Fatal(err)
	}
}

// Refunding a reserving request releases its reservation: the units come
// back once, and neither its expiry nor a later release nor a commit
// gives them back again.
func TestBudgetRefundReleasesReservation(t *testing.T) {
	for _, alg := range []string{algorithms.NameFixedWindow, algorithms.NameSlidingWindow, algorithms.NameSlidingCounter, algorithms.NameTokenBucket, algorithms.NameGCRA} {
		t.Run(alg, func(t *testing.T) {
			tw := newBudgetTwin(t, time.Date(2026, 3, 15, 9, 0, 0, 0, time.UTC), time.Minute,
				budgetZone{alg: alg, p: algorithms.Policy{Limit: 2, Window: int64(24 * time.Hour)}})
			a := tw.must(true, "k")
			tw.settle(a, true) // one unit committed
			b := tw.must(true, "k")
			tw.refund(b) // refused after the decision: back once
			tw.refund(b)
			tw.settle(b, false)
			tw.clock += tw.ttl + int64(time.Second) // b's deadline passed
			tw.must(true, "k")
			tw.must(false, "k")
		})
	}
}

// A reset drops the key's open reservations with its state: releasing
// one afterwards gives back nothing of the fresh quota.
func TestBudgetResetDropsReservations(t *testing.T) {
	for _, alg := range []string{algorithms.NameFixedWindow, algorithms.NameSlidingWindow, algorithms.NameTokenBucket} {
		t.Run(alg, func(t *testing.T) {
			tw := newBudgetTwin(t, time.Date(2026, 3, 15, 9, 0, 0, 0, time.UTC), time.Minute,
				budgetZone{alg: alg, p: algorithms.Policy{Limit: 2, Window: int64(24 * time.Hour)}})
			a := tw.must(true, "k")
			if err := tw.mem.Reset(context.Background(), tw.memZ[0], "k"); err != nil {
				t.Fatal(err)
			}
			if err := tw.red.Reset(context.Background(), tw.redZ[0], "k"); err != nil {
				t.Fatal(err)
			}
			tw.settle(tw.must(true, "k"), true)
			tw.settle(tw.must(true, "k"), true)
			tw.settle(a, false)
			tw.clock += 2 * tw.ttl
			tw.must(false, "k")
		})
	}
}

// budgetTwin runs the same spend budget on the memory store and on Redis,
// at the same instants of one fake clock, and requires the same answers.
type budgetTwin struct {
	t     *testing.T
	clock int64
	mem   *memory.Store
	red   *Store
	memZ  []backend.Limit
	redZ  []backend.Limit
	ttl   int64
	token uint64
}

type budgetZone struct {
	scope, alg string
	p          algorithms.Policy
	cal        *algorithms.Calendar
}

func newBudgetTwin(t *testing.T, clock time.Time, ttl time.Duration, zones ...budgetZone) *budgetTwin {
	t.Helper()
	return newBudgetTwinOn(t, standaloneClient(t), clock, ttl, zones...)
}

func newBudgetTwinOn(t *testing.T, client goredis.UniversalClient, clock time.Time, ttl time.Duration, zones ...budgetZone) *budgetTwin {
	t.Helper()
	tw := &budgetTwin{t: t, clock: clock.UnixNano(), ttl: int64(ttl)}
	tw.mem = memory.New(memory.Options{Now: func() int64 { return tw.clock }, SweepInterval: 24 * time.Hour})
	red, err := New(client, Options{KeyPrefix: uniquePrefix(t), Timeout: 10 * time.Second, now: func() int64 { return tw.clock }, ttlExtra: 3_600_000})
	if err != nil {
		t.Fatal(err)
	}
	tw.red = red
	t.Cleanup(func() { tw.mem.Close(); tw.red.Close() })
	name := fmt.Sprintf("budget-%s-%d", t.Name(), time.Now().UnixNano())
	for _, z := range zones {
		cfg := backend.LimitConfig{Name: name, Scope: z.scope, Algorithm: z.alg, Policy: z.p, Calendar: z.cal}
		mz, err := tw.mem.Register(cfg)
		if err != nil {
			t.Fatal(err)
		}
		rz, err := tw.red.Register(cfg)
		if err != nil {
			t.Fatal(err)
		}
		tw.memZ, tw.redZ = append(tw.memZ, mz), append(tw.redZ, rz)
	}
	return tw
}

// budgetGrant is one request as both stores granted it.
type budgetGrant struct {
	mem, red []backend.Request
	out      []algorithms.Result
}

// reserve asks every zone for one unit of key, with a reservation.
func (tw *budgetTwin) reserve(key string) (bool, budgetGrant) {
	tw.t.Helper()
	tw.token++
	var g budgetGrant
	for i := range tw.memZ {
		g.mem = append(g.mem, backend.Request{Limit: tw.memZ[i], Key: key, Cost: 1, Reserve: tw.ttl, Token: tw.token})
		g.red = append(g.red, backend.Request{Limit: tw.redZ[i], Key: key, Cost: 1, Reserve: tw.ttl, Token: tw.token})
	}
	mo := make([]algorithms.Result, len(g.mem))
	ro := make([]algorithms.Result, len(g.red))
	ma, merr := tw.mem.Decide(context.Background(), g.mem, mo)
	ra, rerr := tw.red.Decide(context.Background(), g.red, ro)
	if merr != nil || rerr != nil {
		tw.t.Fatalf("errors: memory %v, redis %v", merr, rerr)
	}
	if ma != ra {
		tw.t.Fatalf("at %s: memory allowed %v, redis %v\nmemory %+v\nredis  %+v", tw.at(), ma, ra, mo, ro)
	}
	for i := range mo {
		if mo[i] != ro[i] {
			tw.t.Fatalf("at %s, zone %d: memory %+v\n                redis  %+v", tw.at(), i, mo[i], ro[i])
		}
	}
	g.out = mo
	return ma, g
}

func (tw *budgetTwin) settle(g budgetGrant, commit bool) {
	tw.t.Helper()
	if err := tw.mem.SettleReservations(context.Background(), g.mem, g.out, commit); err != nil {
		tw.t.Fatal(err)
	}
	if err := tw.red.SettleReservations(context.Background(), g.red, g.out, commit); err != nil {
		tw.t.Fatal(err)
	}
}

func (tw *budgetTwin) at() string { return time.Unix(0, tw.clock).UTC().Format(time.RFC3339Nano) }

func (tw *budgetTwin) must(allowed bool, key string) budgetGrant {
	tw.t.Helper()
	ok, g := tw.reserve(key)
	if ok != allowed {
		tw.t.Fatalf("at %s: allowed %v, want %v (%+v)", tw.at(), ok, allowed, g.out)
	}
	return g
}

// The units of a reservation come back when it is released, stay when
// it is committed, and come back by themselves once it expires; nothing
// is given back twice, and the state never goes below empty.
func TestBudgetReservations(t *testing.T) {
	for _, alg := range []string{algorithms.NameFixedWindow, algorithms.NameSlidingWindow, algorithms.NameSlidingCounter, algorithms.NameTokenBucket, algorithms.NameGCRA} {
		t.Run(alg, func(t *testing.T) {
			tw := newBudgetTwin(t, time.Date(2026, 3, 15, 9, 0, 0, 0, time.UTC), time.Minute,
				budgetZone{alg: alg, p: algorithms.Policy{Limit: 2, Window: int64(24 * time.Hour)}})
			a := tw.must(true, "k")
			b := tw.must(true, "k")
			tw.must(false, "k")

			tw.settle(a, false) // released: its unit comes back
			c := tw.must(true, "k")
			if c.out[0].Remaining != 0 {
				t.Fatalf("after a release, remaining %d, want 0", c.out[0].Remaining)
			}
			tw.settle(a, false) // again: nothing more
			tw.must(false, "k")

			tw.settle(b, true) // committed: stays taken
			tw.settle(b, false)
			tw.must(false, "k")

			// c is never settled (its Caddy died): it comes back after
			// the reservation's life, not before.
			tw.clock += tw.ttl - int64(time.Millisecond)
			d := tw.must(false, "k")
			if want := int64(time.Millisecond); d.out[0].RetryAfter != want {
				t.Fatalf("denied with a reservation %v from expiring: retry after %v, want %v", time.Millisecond, time.Duration(d.out[0].RetryAfter), time.Duration(want))
			}
			tw.clock += int64(time.Millisecond)
			e := tw.must(true, "k")
			if e.out[0].Remaining != 0 {
				t.Fatalf("after the expiry, remaining %d, want 0", e.out[0].Remaining)
			}
			// A release of the expired c gives nothing back.
			tw.settle(c, false)
			tw.must(false, "k")
			// Releasing e and committing nothing brings the state back
			// to one unit taken (b), never below.
			tw.settle(e, false)
			tw.settle(e, false)
			f := tw.must(true, "k")
			if f.out[0].Remaining != 0 {
				t.Fatalf("remaining %d, want 0: one unit committed, one reserved", f.out[0].Remaining)
			}
		})
	}
}

// On a Redis Cluster, a key's reservations live in its state's slot: a
// budget of a zone and a scope over two keys (two slots, two calls, one
// taken back when the other denies) reserves, releases and expires as on
// one server.
func TestBudgetOnCluster(t *testing.T) {
	tw := newBudgetTwinOn(t, clusterClient(t), time.Date(2026, 3, 15, 9, 0, 0, 0, time.UTC), time.Minute,
		budgetZone{alg: algorithms.NameFixedWindow, p: algorithms.Policy{Limit: 2, Window: int64(24 * time.Hour)}},
		budgetZone{scope: "hour", alg: algorithms.NameSlidingWindow, p: algorithms.Policy{Limit: 3, Window: int64(time.Hour)}})
	keys := []string{"a", "b"}
	reserve := func(allowed bool) budgetGrant {
		t.Helper()
		tw.token++
		var g budgetGrant
		for i, k := range keys { // the zone on one key, the scope on another
			g.mem = append(g.mem, backend.Request{Limit: tw.memZ[i], Key: k, Cost: 1, Reserve: tw.ttl, Token: tw.token})
			g.red = append(g.red, backend.Request{Limit: tw.redZ[i], Key: k, Cost: 1, Reserve: tw.ttl, Token: tw.token})
		}
		mo, ro := make([]algorithms.Result, 2), make([]algorithms.Result, 2)
		ma, merr := tw.mem.Decide(context.Background(), g.mem, mo)
		ra, rerr := tw.red.Decide(context.Background(), g.red, ro)
		if merr != nil || rerr != nil || ma != allowed || ra != allowed || mo[0] != ro[0] || mo[1] != ro[1] {
			t.Fatalf("want allowed %v: memory %v %v %+v, redis %v %v %+v", allowed, ma, merr, mo, ra, rerr, ro)
		}
		g.out = mo
		return g
	}
	a := reserve(true)
	tw.settle(reserve(true), true)
	reserve(false) // the day's cap denies; the hour's unit is taken back
	tw.settle(a, false)
	c := reserve(true)
	reserve(false)
	tw.clock += tw.ttl
	reserve(true) // c expired on both keys
	tw.settle(c, false)
	reserve(false) // c's late release gave nothing back twice
}

// Two caps on one budget, reserved, committed and released together: a
// calendar day in Asia/Dhaka (UTC+6, no daylight saving) and a rolling
// hour, the 5000/day + 500/hour of an SMS provider at 5 and 3.
func TestBudgetDualCapDhakaDayBoundary(t *testing.T) {
	cal, err := algorithms.NewCalendar(algorithms.AlignDay, "Asia/Dhaka")
	if err != nil {
		t.Fatal(err)
	}
	// 15:00 in Dhaka.
	tw := newBudgetTwin(t, time.Date(2026, 3, 15, 9, 0, 0, 0, time.UTC), time.Minute,
		budgetZone{alg: algorithms.NameFixedWindow, p: algorithms.Policy{Limit: 5, Window: int64(24 * time.Hour)}, cal: cal},
		budgetZone{scope: "hour", alg: algorithms.NameSlidingWindow, p: algorithms.Policy{Limit: 3, Window: int64(time.Hour)}})
	for range 3 {
		tw.settle(tw.must(true, "sms"), true)
	}
	g := tw.must(false, "sms") // the hour is spent, the day is not
	if g.out[0].Allowed != true || g.out[1].Allowed || g.out[1].RetryAfter != int64(time.Hour) {
		t.Fatalf("the hour's cap: %+v", g.out)
	}
	tw.clock += int64(time.Hour)
	tw.settle(tw.must(true, "sms"), true)
	last := tw.must(true, "sms") // the day's fifth, reserved at 16:00 Dhaka

	// 23:59:30 in Dhaka: the day is spent, and its answer says midnight
	// (18:00 UTC), not 24 hours from the first request.
	tw.clock = time.Date(2026, 3, 15, 17, 59, 30, 0, time.UTC).UnixNano()
	tw.settle(last, true)
	g = tw.must(false, "sms")
	if g.out[0].Allowed || g.out[0].RetryAfter != int64(30*time.Second) {
		t.Fatalf("at 23:59:30 in Dhaka: %+v, want the day's cap with 30s to wait", g.out[0])
	}
	// Midnight in Dhaka: a new day, with five units.
	tw.clock = time.Date(2026, 3, 15, 18, 0, 0, 0, time.UTC).UnixNano()
	late := tw.must(true, "sms")
	if late.out[0].Remaining != 4 || late.out[1].Remaining != 2 {
		t.Fatalf("the new day: %+v", late.out)
	}
	// One reserved a second before the next midnight and released after
	// it gives nothing to the new day, but its unit back to the hour.
	for range 2 {
		tw.settle(tw.must(true, "sms"), true)
	}
	tw.clock = time.Date(2026, 3, 16, 17, 59, 59, 0, time.UTC).UnixNano()
	edge := tw.must(true, "sms")
	if edge.out[1].Remaining != 2 {
		t.Fatalf("the hour at 23:59:59: %+v", edge.out)
	}
	tw.clock += int64(2 * time.Second)
	tw.settle(edge, false)
	g = tw.must(true, "sms")
	if g.out[0].Remaining != 4 || g.out[1].Remaining != 2 {
		t.Fatalf("after the release across midnight: day remaining %d (want 4: the new day's own), hour remaining %d (want 2: the unit came back)", g.out[0].Remaining, g.out[1].Remaining)
	}
}

// A calendar window decides the same on both stores across a change of
// the clocks: the 23-hour day in New York ends at local midnight.
func TestBudgetCalendarNewYork(t *testing.T) {
	cal, err := algorithms.NewCalendar(algorithms.AlignDay, "America/New_York")
	if err != nil {
		t.Fatal(err)
	}
	tw := newBudgetTwin(t, time.Date(2026, 3, 8, 20, 0, 0, 0, time.UTC), time.Minute,
		budgetZone{alg: algorithms.NameFixedWindow, p: algorithms.Policy{Limit: 1, Window: int64(24 * time.Hour)}, cal: cal})
	tw.settle(tw.must(true, "k"), true)
	g := tw.must(false, "k")
	if want := time.Date(2026, 3, 9, 4, 0, 0, 0, time.UTC).UnixNano() - tw.clock; g.out[0].RetryAfter != want {
		t.Fatalf("retry after %v, want %v (local midnight)", time.Duration(g.out[0].RetryAfter), time.Duration(want))
	}
	// The admin API reads the key by the same calendar on both stores.
	mu, merr := tw.mem.Inspect(context.Background(), tw.memZ[0], "k")
	ru, rerr := tw.red.Inspect(context.Background(), tw.redZ[0], "k")
	if merr != nil || rerr != nil || mu != ru || mu.RetryAfter != g.out[0].RetryAfter {
		t.Fatalf("inspect: memory %+v %v, redis %+v %v", mu, merr, ru, rerr)
	}
	tw.clock = time.Date(2026, 3, 9, 4, 0, 0, 0, time.UTC).UnixNano()
	tw.must(true, "k")
}

// BenchmarkBudgetRedis is one request's store calls on one client, in
// series: a decision alone, against a decision with a reservation and its
// commit (two script calls) or release, and a calendar window's decision.
//
//	go test -run '^$' -bench BudgetRedis -benchmem ./backend/redis/
func BenchmarkBudgetRedis(b *testing.B) {
	cal, err := algorithms.NewCalendar(algorithms.AlignDay, "Asia/Dhaka")
	if err != nil {
		b.Fatal(err)
	}
	day := algorithms.Policy{Limit: algorithms.MaxEvents, Window: int64(24 * time.Hour)}
	for _, c := range []struct {
		name   string
		cal    *algorithms.Calendar
		settle int // 0: none, 1: commit, 2: release
	}{{"plain", nil, 0}, {"charge_when/commit", nil, 1}, {"charge_when/release", nil, 2}, {"align_day", cal, 0}} {
		b.Run(c.name, func(b *testing.B) {
			s := newStore(b, standaloneClient(b))
			z, err := s.Register(backend.LimitConfig{Name: "bench-budget", Algorithm: algorithms.NameFixedWindow, Policy: day, Calendar: c.cal})
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			out := make([]algorithms.Result, 1)
			var token uint64
			b.ReportAllocs()
			for b.Loop() {
				token++
				req := []backend.Request{{Limit: z, Key: "k", Cost: 1}}
				if c.settle > 0 {
					req[0].Reserve, req[0].Token = int64(time.Minute), token
				}
				if _, err := s.Decide(ctx, req, out); err != nil {
					b.Fatal(err)
				}
				if c.settle > 0 {
					if err := s.SettleReservations(ctx, req, out, c.settle == 1); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}
