package redis

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/backend/memory"
)

// The lease's unit tests stand a memory store in for Redis (the shared
// store every instance asks), with one fake clock for both: what Redis
// would decide is the memory store's decision, exactly.

// shared counts the calls to the store that stands in for Redis.
type shared struct {
	*memory.Store
	calls atomic.Int64
	gate  chan struct{} // when set, each Decide waits for it: concurrency
	after func()        // when set, runs after each Decide: the reply's way back
}

func (s *shared) Decide(ctx context.Context, reqs []backend.Request, out []algorithms.Result) (bool, error) {
	s.calls.Add(1)
	if s.gate != nil {
		<-s.gate
	}
	ok, err := s.Store.Decide(ctx, reqs, out)
	if s.after != nil {
		s.after()
	}
	return ok, err
}

type leaseWorld struct {
	t     *testing.T
	clock int64
	red   *shared
}

func newLeaseWorld(t *testing.T) *leaseWorld {
	w := &leaseWorld{t: t, clock: t0}
	w.red = &shared{Store: memory.New(memory.Options{Now: func() int64 { return w.clock }, SweepInterval: 24 * time.Hour})}
	t.Cleanup(func() { w.red.Close() })
	return w
}

var leaseSeq atomic.Int64

// instance is one Caddy process: its own leases over the shared store.
func (w *leaseWorld) instance(alg string, p algorithms.Policy, lease int64) (*leaser, backend.Limit) {
	w.t.Helper()
	name := fmt.Sprintf("lease%d", leaseSeq.Add(1))
	return w.instanceOf(name, alg, p, lease)
}

func (w *leaseWorld) instanceOf(name, alg string, p algorithms.Policy, lease int64) (*leaser, backend.Limit) {
	w.t.Helper()
	cfg := backend.LimitConfig{Name: name, Algorithm: alg, Policy: p, Lease: lease}
	if err := leaseable(cfg); err != nil {
		w.t.Fatal(err)
	}
	inner := cfg
	inner.Lease = 0 // the shared store decides what it is asked
	h, err := w.red.Register(inner)
	if err != nil {
		w.t.Fatal(err)
	}
	l := &leaser{now: func() int64 { return w.clock }}
	// Each instance is a process of its own: its pools must not be the
	// others' (in one process they are shared, by design).
	lh, err := l.register(cfg, h, fmt.Sprintf("instance%p", l))
	if err != nil {
		w.t.Fatal(err)
	}
	w.t.Cleanup(func() { l.close(context.Background(), w.red) })
	return l, lh
}

func (w *leaseWorld) ask(l *leaser, reqs ...backend.Request) (bool, []algorithms.Result) {
	w.t.Helper()
	out := make([]algorithms.Result, len(reqs))
	ok, err := l.decide(context.Background(), reqs, out, w.red)
	if err != nil {
		w.t.Fatal(err)
	}
	return ok, out
}

// peek is what the shared store has left for key (a free request).
func (w *leaseWorld) peek(h backend.Limit, key string) int64 {
	w.t.Helper()
	out := make([]algorithms.Result, 1)
	if _, err := w.red.Store.Decide(context.Background(), []backend.Request{{Limit: h.(*leasedLimit).Limit, Key: key, Cost: 0}}, out); err != nil {
		w.t.Fatal(err)
	}
	return out[0].Remaining
}

// A hot key costs one call per lease, and the answers count down.
func TestLeaseServesLocally(t *testing.T) {
	for _, alg := range []string{algorithms.NameTokenBucket, algorithms.NameGCRA, algorithms.NameSlidingWindow, algorithms.NameFixedWindow, algorithms.NameSlidingCounter} {
		t.Run(alg, func(t *testing.T) {
			w := newLeaseWorld(t)
			l, h := w.instance(alg, policy(1000, time.Hour), 10)
			last := int64(1001)
			for i := range 100 {
				ok, out := w.ask(l, backend.Request{Limit: h, Key: "hot", Cost: 1})
				if !ok || !out[0].Allowed || out[0].Limit != 1000 {
					t.Fatalf("request %d: %v %+v", i, ok, out[0])
				}
				if out[0].Remaining != 999-int64(i) || out[0].Remaining >= last {
					t.Fatalf("request %d: remaining %d, want %d", i, out[0].Remaining, 999-i)
				}
				last = out[0].Remaining
			}
			if n := w.red.calls.Load(); n != 10 {
				t.Fatalf("%d calls for 100 requests with a lease of 10, want 10", n)
			}
			if got := w.peek(h, "hot"); got != 900 {
				t.Fatalf("the shared store has %d left, want 900", got)
			}
		})
	}
}

// A request that needs more than the units held tops the lease up to N
// (the held units are spent first, so at most N are ever held); a cost
// above the lease goes to the shared store as asked; a free request is
// answered from the lease.
func TestLeaseCosts(t *testing.T) {
	w := newLeaseWorld(t)
	l, h := w.instance(algorithms.NameTokenBucket, policy(1000, time.Hour), 10)
	steps := []struct {
		cost, calls, held int64
	}{
		{7, 1, 3},  // take 10, spend 7
		{7, 2, 3},  // 3 held: take 7 more, spend 7
		{2, 2, 1},  // local
		{11, 3, 1}, // above the lease: the shared store, as asked
		{0, 3, 1},  // free: local
		{1, 3, 0},  // the last unit held
		{1, 4, 9},  // a new lease
	}
	for i, s := range steps {
		ok, out := w.ask(l, backend.Request{Limit: h, Key: "k", Cost: s.cost})
		if !ok || !out[0].Allowed {
			t.Fatalf("step %d: %v %+v", i, ok, out[0])
		}
		held := h.(*leasedLimit).pool.keys["k"].units
		if n := w.red.calls.Load(); n != s.calls || held != s.held {
			t.Fatalf("step %d (cost %d): %d calls, %d held; want %d, %d", i, s.cost, n, held, s.calls, s.held)
		}
	}
	// Taken from the shared store: 10 + 7 + 11 + 10.
	if got := w.peek(h, "k"); got != 1000-38 {
		t.Fatalf("the shared store has %d left, want %d", got, 1000-38)
	}
}

// Near the limit a take of N is refused, and the request is decided by
// the shared store as asked: one instance never admits more than the
// limit, and the last units are not lost to a lease.
func TestLeaseNearTheLimit(t *testing.T) {
	for _, alg := range []string{algorithms.NameTokenBucket, algorithms.NameSlidingWindow, algorithms.NameFixedWindow} {
		t.Run(alg, func(t *testing.T) {
			w := newLeaseWorld(t)
			l, h := w.instance(alg, policy(1000, time.Hour), 10)
			admitted := 0
			var last algorithms.Result
			var calls int64
			for i := range 1100 {
				if i == 1000 {
					calls = w.red.calls.Load()
				}
				ok, out := w.ask(l, backend.Request{Limit: h, Key: "k", Cost: 3})
				if ok {
					admitted += 3
				}
				last = out[0]
			}
			// Once a take was refused, none is tried again before Redis's
			// retry time: one call per request (which the over-limit cache
			// can then answer), not a take and the request.
			if n := w.red.calls.Load() - calls; n != 100 {
				t.Fatalf("%d calls for 100 requests past the limit, want 100", n)
			}
			if admitted != 999 {
				t.Fatalf("admitted %d units, want 999 (333 requests of 3)", admitted)
			}
			if last.Allowed || last.RetryAfter <= 0 || last.Remaining != 1 {
				t.Fatalf("the last answer %+v, want a denial with a retry time and 1 remaining", last)
			}
		})
	}
}

// All or nothing: when another limit of the request denies, the units
// served from the lease go back to it.
func TestLeaseAllOrNothing(t *testing.T) {
	w := newLeaseWorld(t)
	l, h := w.instance(algorithms.NameTokenBucket, policy(1000, time.Hour), 10)
	tight, err := w.red.Register(backend.LimitConfig{Name: "lease_tight", Algorithm: algorithms.NameTokenBucket, Policy: policy(1, time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	w.ask(l, backend.Request{Limit: h, Key: "k", Cost: 1}) // 9 held
	if ok, _ := w.ask(l, backend.Request{Limit: h, Key: "k", Cost: 4}, backend.Request{Limit: tight, Key: "k", Cost: 1}); !ok {
		t.Fatal("the first request with both limits was denied")
	}
	ok, out := w.ask(l, backend.Request{Limit: h, Key: "k", Cost: 4}, backend.Request{Limit: tight, Key: "k", Cost: 1})
	if ok || out[1].Allowed {
		t.Fatalf("the tight limit allowed twice: %+v", out)
	}
	if held := h.(*leasedLimit).pool.keys["k"].units; held != 5 {
		t.Fatalf("%d units held after a denied request, want 5", held)
	}
	// A take in a denied request goes back too (the shared store undoes it).
	w.ask(l, backend.Request{Limit: h, Key: "k", Cost: 5})
	before := w.peek(h, "k")
	if ok, _ := w.ask(l, backend.Request{Limit: h, Key: "k", Cost: 2}, backend.Request{Limit: tight, Key: "k", Cost: 1}); ok {
		t.Fatal("the tight limit allowed")
	}
	if after := w.peek(h, "k"); after != before || h.(*leasedLimit).pool.keys["k"].units != 0 {
		t.Fatalf("a denied take changed the shared store (%d → %d) or the units held", before, after)
	}
}

// Units are spent for one window at most, and for the window algorithms
// only in the window they were counted in: then they are dropped, and the
// next request takes a new lease.
func TestLeaseExpiry(t *testing.T) {
	for _, c := range []struct {
		alg  string
		life int64 // from the first take at t0 (1 ns before an hour turns)
	}{
		{algorithms.NameFixedWindow, 1},
		{algorithms.NameSlidingCounter, 1},
		{algorithms.NameTokenBucket, int64(time.Hour)},
		{algorithms.NameSlidingWindow, int64(time.Hour)},
	} {
		t.Run(c.alg, func(t *testing.T) {
			w := newLeaseWorld(t)
			l, h := w.instance(c.alg, policy(1000, time.Hour), 10)
			w.ask(l, backend.Request{Limit: h, Key: "k", Cost: 1})
			w.clock += c.life - 1
			w.ask(l, backend.Request{Limit: h, Key: "k", Cost: 1})
			if n := w.red.calls.Load(); n != 1 {
				t.Fatalf("%d calls before the lease expired, want 1", n)
			}
			w.clock++
			_, out := w.ask(l, backend.Request{Limit: h, Key: "k", Cost: 1})
			if n := w.red.calls.Load(); n != 2 {
				t.Fatalf("%d calls once the lease expired, want 2", n)
			}
			if held := h.(*leasedLimit).pool.keys["k"].units; held != 9 || !out[0].Allowed {
				t.Fatalf("%d held after a new lease (%+v), want 9", held, out[0])
			}
		})
	}
}

// Local answers report the shared store's remaining at the take plus the
// units held, and a reset and time that move on from the take's.
func TestLeaseReportsFromTheTake(t *testing.T) {
	w := newLeaseWorld(t)
	l, h := w.instance(algorithms.NameFixedWindow, policy(1000, time.Hour), 10)
	w.clock = t0 + 1 // an hour turns: the window ends in an hour
	_, first := w.ask(l, backend.Request{Limit: h, Key: "k", Cost: 1})
	w.clock += int64(time.Minute)
	_, out := w.ask(l, backend.Request{Limit: h, Key: "k", Cost: 1})
	want := algorithms.Result{Allowed: true, Limit: 1000, Remaining: 998, ResetAfter: first[0].ResetAfter - int64(time.Minute), At: first[0].At + int64(time.Minute)}
	if out[0] != want || first[0].ResetAfter != int64(time.Hour) {
		t.Fatalf("local answer %+v, want %+v (first %+v)", out[0], want, first[0])
	}
}

// Several instances: however their requests interleave, no window of the
// sliding log sees more than limit + instances × lease admitted, and a
// bucket never admits more than burst + instances × lease in a moment
// (here: all at once).
func TestLeaseOverAdmissionBound(t *testing.T) {
	const instances, n, limit = 3, 10, 1000
	for _, alg := range []string{algorithms.NameSlidingWindow, algorithms.NameTokenBucket, algorithms.NameGCRA, algorithms.NameFixedWindow, algorithms.NameSlidingCounter} {
		t.Run(alg, func(t *testing.T) {
			w := newLeaseWorld(t)
			name := fmt.Sprintf("leasebound%d", leaseSeq.Add(1))
			var ls []*leaser
			var hs []backend.Limit
			for range instances {
				l, h := w.instanceOf(name, alg, policy(limit, time.Minute), n)
				ls, hs = append(ls, l), append(hs, h)
			}
			// Each instance takes a lease and spends one unit at t0; the
			// fleet floods just before the window moves past them, and
			// again just after (when a log's leased event has left).
			for i := range instances {
				w.ask(ls[i], backend.Request{Limit: hs[i], Key: "k", Cost: 1})
			}
			admitted := 0
			for _, step := range []int64{int64(time.Minute) - 1, 1} {
				w.clock += step
				for i := range 3 * limit {
					if ok, _ := w.ask(ls[i%instances], backend.Request{Limit: hs[i%instances], Key: "k", Cost: 1}); ok {
						admitted++
					}
				}
			}
			// Both floods fall in one window (and one fixed window: t0 is
			// a nanosecond before a minute turns).
			most := limit + instances*n
			if alg == algorithms.NameFixedWindow || alg == algorithms.NameSlidingCounter {
				most = limit // leased units are spent in the window they were counted in
			}
			if admitted > most {
				t.Fatalf("admitted %d in one window, more than %d", admitted, most)
			}
			t.Logf("admitted %d in one window (bound %d)", admitted, most)
		})
	}
}

// Concurrent requests on a key whose lease ran out wait for the one take
// in flight instead of taking a lease each: one instance holds one lease.
func TestLeaseOneTakeInFlight(t *testing.T) {
	w := newLeaseWorld(t)
	l, h := w.instance(algorithms.NameTokenBucket, policy(100_000, time.Hour), 100)
	w.red.gate = make(chan struct{})
	var wg sync.WaitGroup
	var admitted atomic.Int64
	for range 50 {
		wg.Go(func() {
			out := make([]algorithms.Result, 1)
			ok, err := l.decide(context.Background(), []backend.Request{{Limit: h, Key: "k", Cost: 1}}, out, w.red)
			if err != nil {
				t.Error(err)
			}
			if ok {
				admitted.Add(1)
			}
		})
	}
	for w.red.calls.Load() == 0 {
		time.Sleep(time.Millisecond) // polling for the first take to start
	}
	close(w.red.gate)
	wg.Wait()
	if n := w.red.calls.Load(); n != 1 || admitted.Load() != 50 {
		t.Fatalf("%d calls, %d admitted for 50 concurrent requests and a lease of 100; want 1 and 50", n, admitted.Load())
	}
}

// A request given back returns its units to the lease; when the last
// config using a lease closes, its unused units go back to the shared
// store where the algorithm allows (not a sliding log's event, whose
// spent units it holds too).
func TestLeaseGivesBack(t *testing.T) {
	for _, c := range []struct {
		alg  string
		back bool
	}{{algorithms.NameTokenBucket, true}, {algorithms.NameFixedWindow, true}, {algorithms.NameSlidingCounter, true}, {algorithms.NameSlidingWindow, false}} {
		t.Run(c.alg, func(t *testing.T) {
			w := newLeaseWorld(t)
			l, h := w.instance(c.alg, policy(1000, time.Hour), 10)
			reqs := []backend.Request{{Limit: h, Key: "k", Cost: 3}}
			_, out := w.ask(l, reqs...)
			if err := l.refund(context.Background(), reqs, out, w.red); err != nil {
				t.Fatal(err)
			}
			if held := h.(*leasedLimit).pool.keys["k"].units; held != 10 {
				t.Fatalf("%d held after a refund, want 10", held)
			}
			w.ask(l, backend.Request{Limit: h, Key: "k", Cost: 4})
			l.close(context.Background(), w.red)
			want := int64(996)
			if c.back {
				want = 996 // 4 spent, 6 given back
			} else {
				want = 990 // the event of 10 stays
			}
			if got := w.peek(h, "k"); got != want {
				t.Fatalf("the shared store has %d left after close, want %d", got, want)
			}
		})
	}
}

// What cannot lease is refused with the reason.
func TestLeaseable(t *testing.T) {
	p := policy(1000, time.Hour)
	for _, c := range []struct {
		alg   string
		p     algorithms.Policy
		lease int64
		want  string
	}{
		{algorithms.NameLeakyBucket, p, 10, "leaky_bucket lets requests out one interval apart"},
		{algorithms.NameTokenBucket, p, 1, "at least 2"},
		{algorithms.NameTokenBucket, algorithms.Policy{Limit: 1000, Window: int64(time.Hour), Burst: 5}, 10, "more than the limit holds (5)"},
	} {
		err := leaseable(backend.LimitConfig{Name: "z", Algorithm: c.alg, Policy: c.p, Lease: c.lease})
		if err == nil || !contains(err.Error(), c.want) {
			t.Errorf("%s lease %d: %v, want %q", c.alg, c.lease, err, c.want)
		}
	}
	if err := leaseable(backend.LimitConfig{Name: "z", Algorithm: algorithms.NameGCRA, Policy: p, Lease: 10}); err != nil {
		t.Errorf("gcra: %v", err)
	}
}

// A pool holds leases for at most maxLeasedKeys keys: a flood of new keys
// beyond is decided by the shared store, one call each, and a full pool is
// swept of expired leases at most once a second.
func TestLeaseKeysBounded(t *testing.T) {
	w := newLeaseWorld(t)
	l, h := w.instance(algorithms.NameTokenBucket, policy(1000, time.Minute), 10)
	pool := h.(*leasedLimit).pool
	for i := range maxLeasedKeys + 100 {
		if ok, _ := w.ask(l, backend.Request{Limit: h, Key: fmt.Sprint(i), Cost: 1}); !ok {
			t.Fatalf("key %d denied", i)
		}
	}
	if len(pool.keys) != maxLeasedKeys {
		t.Fatalf("%d keys leased, want the cap %d", len(pool.keys), maxLeasedKeys)
	}
	calls := w.red.calls.Load()
	w.ask(l, backend.Request{Limit: h, Key: "9", Cost: 1}) // leased: local
	w.ask(l, backend.Request{Limit: h, Key: "new", Cost: 1})
	if n := w.red.calls.Load() - calls; n != 1 {
		t.Fatalf("%d calls for a leased key and a new one, want 1", n)
	}
	w.clock += int64(time.Minute) // every lease expires
	w.ask(l, backend.Request{Limit: h, Key: "new", Cost: 1})
	if len(pool.keys) != 1 {
		t.Fatalf("%d keys after the leases expired, want 1 (the new one)", len(pool.keys))
	}
}

// Under concurrency, with requests that also match a tight limit (some
// denied by it) and costs of every size, the units add up: what the
// shared store charged is what was admitted plus what is held.
func TestLeaseConservesUnits(t *testing.T) {
	w := newLeaseWorld(t)
	l, h := w.instance(algorithms.NameTokenBucket, policy(100_000, time.Hour), 50)
	tight, err := w.red.Register(backend.LimitConfig{Name: "lease_conserve_tight", Algorithm: algorithms.NameTokenBucket, Policy: policy(300, time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	keys := []string{"a", "b", "c"}
	var admitted [3]atomic.Int64
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			out := make([]algorithms.Result, 2)
			for i := range 400 {
				k := (g + i) % 3
				cost := int64((g*7 + i) % 60) // 0 to 59: some above the lease
				reqs := []backend.Request{{Limit: h, Key: keys[k], Cost: cost}}
				if i%4 == 0 {
					reqs = append(reqs, backend.Request{Limit: tight, Key: keys[k], Cost: 1})
				}
				ok, err := l.decide(context.Background(), reqs, out, w.red)
				if err != nil {
					t.Error(err)
					return
				}
				if ok {
					admitted[k].Add(cost)
				}
			}
		})
	}
	wg.Wait()
	pool := h.(*leasedLimit).pool
	for k, key := range keys {
		held := int64(0)
		if e := pool.keys[key]; e != nil {
			held = e.units
		}
		charged := 100_000 - w.peek(h, key)
		if charged != admitted[k].Load()+held {
			t.Errorf("key %s: the shared store charged %d, admitted %d + held %d", key, charged, admitted[k].Load(), held)
		}
	}
}

// A take's units are timed from when it was sent: an answer that takes
// 5 ms to come back does not let a fixed window's units be spent 5 ms into
// the next window.
func TestLeaseExpiryFromSend(t *testing.T) {
	w := newLeaseWorld(t)
	l, h := w.instance(algorithms.NameFixedWindow, policy(1000, time.Hour), 10)
	w.clock = t0 + 1 - int64(time.Second) // a second before an hour turns
	w.red.after = func() { w.clock += int64(5 * time.Millisecond) }
	w.ask(l, backend.Request{Limit: h, Key: "k", Cost: 1})
	w.red.after = nil
	w.clock = t0 + 1 // the window turns in Redis
	w.ask(l, backend.Request{Limit: h, Key: "k", Cost: 1})
	if n := w.red.calls.Load(); n != 2 {
		t.Fatalf("%d calls: a unit of the last window was spent in the next", n)
	}
}
