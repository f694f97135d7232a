package memory

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
)

const sec = int64(time.Second)

// fakeClock is a settable clock; tests move it, never sleep.
type fakeClock struct{ t atomic.Int64 }

func newFakeClock() *fakeClock {
	c := new(fakeClock)
	c.t.Store(1_767_225_600 * sec)
	return c
}
func (c *fakeClock) now() int64              { return c.t.Load() }
func (c *fakeClock) advance(d time.Duration) { c.t.Add(int64(d)) }

// testZone registers a zone with a name unique to the test, so tests never
// share pool entries.
func testZone(t *testing.T, s *Store, alg string, p algorithms.Policy, maxKeys int) backend.Limit {
	t.Helper()
	z, err := s.Register(backend.LimitConfig{Name: t.Name() + "/" + alg + fmt.Sprint(p), Algorithm: alg, Policy: p, MaxKeys: maxKeys})
	if err != nil {
		t.Fatal(err)
	}
	return z
}

func newStore(t *testing.T, c *fakeClock) *Store {
	s := New(Options{Now: c.now})
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func decide(t *testing.T, s *Store, reqs ...backend.Request) (bool, []algorithms.Result) {
	t.Helper()
	out := make([]algorithms.Result, len(reqs))
	ok, err := s.Decide(context.Background(), reqs, out)
	if err != nil {
		t.Fatal(err)
	}
	return ok, out
}

func TestDecideSingle(t *testing.T) {
	c := newFakeClock()
	s := newStore(t, c)
	for _, alg := range algorithms.Names() {
		t.Run(alg, func(t *testing.T) {
			z := testZone(t, s, alg, algorithms.Policy{Limit: 3, Window: 60 * sec}, 0)
			for i := 0; i < 3; i++ {
				if ok, _ := decide(t, s, backend.Request{Limit: z, Key: "k", Cost: 1}); !ok {
					t.Fatalf("request %d denied", i+1)
				}
			}
			ok, out := decide(t, s, backend.Request{Limit: z, Key: "k", Cost: 1})
			if ok || out[0].RetryAfter <= 0 {
				t.Fatalf("4th request: allowed=%v %+v, want denied with a retry time", ok, out[0])
			}
			if ok, _ := decide(t, s, backend.Request{Limit: z, Key: "other", Cost: 1}); !ok {
				t.Fatal("a different key was denied")
			}
		})
	}
}

// Two zones share a key; the second denies, so the first must not be
// charged (mholt/caddy-ratelimit charges it).
func TestDecideAllOrNothing(t *testing.T) {
	c := newFakeClock()
	s := newStore(t, c)
	loose := testZone(t, s, algorithms.NameSlidingWindow, algorithms.Policy{Limit: 5, Window: 60 * sec}, 0)
	tight := testZone(t, s, algorithms.NameTokenBucket, algorithms.Policy{Limit: 1, Window: 60 * sec}, 0)

	both := []backend.Request{{Limit: loose, Key: "ip", Cost: 1}, {Limit: tight, Key: "ip", Cost: 1}}
	if ok, _ := decide(t, s, both...); !ok {
		t.Fatal("first request denied")
	}
	for i := 0; i < 10; i++ {
		ok, out := decide(t, s, both...)
		if ok || out[1].Allowed || !out[0].Allowed {
			t.Fatalf("try %d: ok=%v %+v; want the tight zone to deny", i, ok, out)
		}
	}
	// Had the loose zone been charged by the denied tries it would be full.
	ok, out := decide(t, s, backend.Request{Limit: loose, Key: "ip", Cost: 1})
	if !ok || out[0].Remaining != 3 {
		t.Fatalf("loose zone: %+v, want allowed with 3 remaining (charged once)", out[0])
	}
}

func TestDecideShadow(t *testing.T) {
	c := newFakeClock()
	s := newStore(t, c)
	enforce := testZone(t, s, algorithms.NameSlidingWindow, algorithms.Policy{Limit: 10, Window: 60 * sec}, 0)
	shadow := testZone(t, s, algorithms.NameSlidingWindow, algorithms.Policy{Limit: 1, Window: 60 * sec}, 0)
	reqs := []backend.Request{{Limit: enforce, Key: "k", Cost: 1}, {Limit: shadow, Key: "k", Cost: 1, Shadow: true}}
	for i := 0; i < 5; i++ {
		ok, out := decide(t, s, reqs...)
		if !ok {
			t.Fatalf("request %d denied by a shadow zone", i+1)
		}
		if out[1].Allowed != (i == 0) {
			t.Fatalf("request %d: shadow result %+v", i+1, out[1])
		}
	}
	_, out := decide(t, s, backend.Request{Limit: enforce, Key: "k", Cost: 1})
	if out[0].Remaining != 4 {
		t.Fatalf("enforcing zone remaining %d, want 4", out[0].Remaining)
	}
}

func TestDecideSameKeyTwiceSumsCost(t *testing.T) {
	c := newFakeClock()
	s := newStore(t, c)
	z := testZone(t, s, algorithms.NameSlidingWindow, algorithms.Policy{Limit: 3, Window: 60 * sec}, 0)
	ok, _ := decide(t, s, backend.Request{Limit: z, Key: "k", Cost: 2}, backend.Request{Limit: z, Key: "k", Cost: 2})
	if ok {
		t.Fatal("2+2 units allowed into a zone of 3")
	}
	ok, out := decide(t, s, backend.Request{Limit: z, Key: "k", Cost: 1}, backend.Request{Limit: z, Key: "k", Cost: 2})
	if !ok || out[0].Remaining != 0 {
		t.Fatalf("1+2 units: ok=%v %+v, want allowed with 0 remaining", ok, out)
	}
}

func TestMaxKeysEvictsIdleFirst(t *testing.T) {
	c := newFakeClock()
	s := newStore(t, c)
	p := algorithms.Policy{Limit: 1, Window: 10 * sec}
	z := testZone(t, s, algorithms.NameSlidingWindow, p, 100)
	tbl := z.(*zone[*algorithms.Log]).t

	use := func(prefix string, n int) {
		for i := 0; i < n; i++ {
			decide(t, s, backend.Request{Limit: z, Key: fmt.Sprintf("%s%d", prefix, i), Cost: 1})
		}
	}
	use("idle", 60) // idle from +10 s
	c.advance(20 * time.Second)
	use("active", 40) // busy until +30 s
	if got := tbl.Keys(); got != 100 {
		t.Fatalf("%d keys, want 100", got)
	}
	c.advance(time.Second)
	use("new", 50)
	if got := tbl.Keys(); got != 90 {
		t.Fatalf("%d keys after the idle ones were swept, want 90", got)
	}
	// Every active key kept its state: its second request is still denied.
	for i := 0; i < 40; i++ {
		if ok, _ := decide(t, s, backend.Request{Limit: z, Key: fmt.Sprintf("active%d", i), Cost: 1}); ok {
			t.Fatalf("active%d lost its state to eviction", i)
		}
	}
	if tbl.Evictions() != 0 {
		t.Fatalf("%d active keys evicted while idle ones were available", tbl.Evictions())
	}

	// With nothing idle, a flood of new keys stays under the cap by
	// evicting active keys, and counts them.
	use("flood", 1000)
	if got := tbl.Keys(); got > 100 {
		t.Fatalf("%d keys, over the cap of 100", got)
	}
	if tbl.Evictions() == 0 {
		t.Fatal("evictions not counted")
	}
}

func TestSweepDropsIdleKeys(t *testing.T) {
	c := newFakeClock()
	s := newStore(t, c)
	bucketZone := testZone(t, s, algorithms.NameTokenBucket, algorithms.Policy{Limit: 10, Window: 10 * sec}, 0)
	logZone := testZone(t, s, algorithms.NameSlidingWindow, algorithms.Policy{Limit: 10, Window: 10 * sec}, 0)
	for i := 0; i < 100; i++ {
		decide(t, s, backend.Request{Limit: bucketZone, Key: fmt.Sprint(i), Cost: 5},
			backend.Request{Limit: logZone, Key: fmt.Sprint(i), Cost: 5})
	}
	bt := bucketZone.(*zone[algorithms.Bucket]).t
	lt := logZone.(*zone[*algorithms.Log]).t

	// 5 tokens at 1/s refill in 5 s; the log empties after the 10 s window.
	c.advance(5*time.Second - 1)
	bt.sweep()
	lt.sweep()
	if bt.Keys() != 100 || lt.Keys() != 100 {
		t.Fatalf("swept before idle: %d bucket keys, %d log keys", bt.Keys(), lt.Keys())
	}
	c.advance(1)
	bt.sweep()
	if bt.Keys() != 0 {
		t.Fatalf("%d bucket keys left once full again", bt.Keys())
	}
	c.advance(5 * time.Second)
	lt.sweep()
	if lt.Keys() != 0 {
		t.Fatalf("%d log keys left after the window", lt.Keys())
	}
}

func TestShrinksAfterFlood(t *testing.T) {
	c := newFakeClock()
	s := newStore(t, c)
	z := testZone(t, s, algorithms.NameTokenBucket, algorithms.Policy{Limit: 10, Window: sec}, 0)
	tbl := z.(*zone[algorithms.Bucket]).t
	for i := 0; i < 200_000; i++ {
		decide(t, s, backend.Request{Limit: z, Key: fmt.Sprint(i), Cost: 1})
	}
	c.advance(time.Second)
	tbl.sweep()
	for i := range tbl.shards {
		if size := len(tbl.shards[i].e); size > minSlots {
			t.Fatalf("shard %d keeps %d slots after every key went idle", i, size)
		}
	}
}

// Config reloads: the new config's store registers the zone before the old
// one is closed; state carries over and survives the old one's Close.
func TestStateOutlivesReload(t *testing.T) {
	c := newFakeClock()
	p := algorithms.Policy{Limit: 3, Window: 60 * sec}
	name := t.Name()
	old := New(Options{Now: c.now})
	oz, err := old.Register(backend.LimitConfig{Name: name, Algorithm: algorithms.NameSlidingWindow, Policy: p})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		decide(t, old, backend.Request{Limit: oz, Key: "k", Cost: 1})
	}

	// Reloaded with a raised limit: usage is kept and the raise applies.
	raised := algorithms.Policy{Limit: 5, Window: 60 * sec}
	cur := New(Options{Now: c.now})
	nz, err := cur.Register(backend.LimitConfig{Name: name, Algorithm: algorithms.NameSlidingWindow, Policy: raised})
	if err != nil {
		t.Fatal(err)
	}
	if err := old.Close(); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		if ok, _ := decide(t, cur, backend.Request{Limit: nz, Key: "k", Cost: 1}); !ok {
			t.Fatalf("request %d after the raise denied", i+1)
		}
	}
	if ok, _ := decide(t, cur, backend.Request{Limit: nz, Key: "k", Cost: 1}); ok {
		t.Fatal("usage was reset by the reload")
	}
	tbl := nz.(*zone[*algorithms.Log]).t
	if err := cur.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-tbl.stop:
	default:
		t.Fatal("the table's sweeper still runs after every config let go of it")
	}
}

// A queued request whose client left gives its slot back.
func TestRefund(t *testing.T) {
	c := newFakeClock()
	s := newStore(t, c)
	for _, alg := range algorithms.Names() {
		t.Run(alg, func(t *testing.T) {
			z := testZone(t, s, alg, algorithms.Policy{Limit: 2, Window: 3600 * sec}, 0)
			req := backend.Request{Limit: z, Key: "k", Cost: 2}
			ok, granted := decide(t, s, req)
			if !ok {
				t.Fatal("first request denied")
			}
			if ok, _ := decide(t, s, req); ok {
				t.Fatal("full zone allowed a request")
			}
			if err := s.Refund(context.Background(), []backend.Request{req}, granted); err != nil {
				t.Fatal(err)
			}
			if ok, _ := decide(t, s, req); !ok {
				t.Fatal("the refunded units were not given back")
			}
		})
	}
}

func TestZoneErrors(t *testing.T) {
	s := newStore(t, newFakeClock())
	tests := []struct {
		cfg  backend.LimitConfig
		want string
	}{
		{backend.LimitConfig{Name: "a", Algorithm: "leaky", Policy: algorithms.Policy{Limit: 1, Window: sec}}, `unknown algorithm "leaky"`},
		{backend.LimitConfig{Name: "b", Policy: algorithms.Policy{Limit: 0, Window: sec}}, "max_events must be at least 1"},
		{backend.LimitConfig{Name: "c", Policy: algorithms.Policy{Limit: 1, Window: sec}, MaxKeys: -1}, "max_keys must be at least 1"},
		{backend.LimitConfig{Name: "d", Policy: algorithms.Policy{Limit: 1, Window: sec, Burst: 2}}, "burst does not apply to algorithm sliding_window"},
	}
	for _, tt := range tests {
		_, err := s.Register(tt.cfg)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("zone %s: error %v, want %q", tt.cfg.Name, err, tt.want)
		}
	}
}

// Many goroutines over one hot key and many cold ones, with requests that
// span two zones: run under -race. The hot key admits exactly its limit.
func TestConcurrentUse(t *testing.T) {
	c := newFakeClock()
	s := newStore(t, c)
	hot := testZone(t, s, algorithms.NameTokenBucket, algorithms.Policy{Limit: 500, Window: 3600 * sec}, 0)
	perKey := testZone(t, s, algorithms.NameSlidingWindow, algorithms.Policy{Limit: 3, Window: 3600 * sec}, 1000)
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out := make([]algorithms.Result, 2)
			for i := 0; i < 2000; i++ {
				reqs := []backend.Request{
					{Limit: hot, Key: "all", Cost: 1},
					{Limit: perKey, Key: fmt.Sprint(g, "-", i%300), Cost: 1},
				}
				ok, err := s.Decide(context.Background(), reqs, out)
				if err != nil {
					t.Error(err)
					return
				}
				if ok {
					admitted.Add(1)
				}
				if i%100 == 0 {
					c.advance(time.Millisecond)
				}
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		// A sweeper racing the requests.
		tbl := perKey.(*zone[*algorithms.Log]).t
		for i := 0; i < 20; i++ {
			tbl.sweep()
		}
	}()
	wg.Wait()
	// 16,000 requests, the hot key holds 500 (+ at most 1 token refilled
	// per 7.2 s; the fake clock moves 160 ms).
	if got := admitted.Load(); got != 500 {
		t.Fatalf("admitted %d, want exactly 500", got)
	}
}

// A reload that changes a bucket's rate: the new rate is the refill rate
// from the reload on, for the old config's state too (it once did not: the
// rate of the config that first created the state kept refilling it).
func TestReloadChangesRateFromThenOn(t *testing.T) {
	c := newFakeClock()
	name := t.Name()
	reload := func(old *Store, p algorithms.Policy) (*Store, backend.Limit) {
		s := New(Options{Now: c.now})
		z, err := s.Register(backend.LimitConfig{Name: name, Algorithm: algorithms.NameTokenBucket, Policy: p})
		if err != nil {
			t.Fatal(err)
		}
		if old != nil {
			if err := old.Close(); err != nil {
				t.Fatal(err)
			}
		}
		return s, z
	}
	allowed := func(s *Store, z backend.Limit, n int) int {
		ok := 0
		for i := 0; i < n; i++ {
			if pass, _ := decide(t, s, backend.Request{Limit: z, Key: "k", Cost: 1}); pass {
				ok++
			}
		}
		return ok
	}

	s, z := reload(nil, algorithms.Policy{Limit: 10, Window: 60 * sec})
	if got := allowed(s, z, 11); got != 10 {
		t.Fatalf("%d allowed of 11 at 10/min", got)
	}
	c.advance(6 * time.Second) // one token back at the old rate
	s, z = reload(s, algorithms.Policy{Limit: 10, Window: sec})
	c.advance(time.Second) // at 10/s the other 9 are back
	if got := allowed(s, z, 12); got != 10 {
		t.Fatalf("1 s after raising to 10/s: %d allowed, want 10", got)
	}
	c.advance(time.Second)
	if got := allowed(s, z, 12); got != 10 {
		t.Fatalf("2 s after raising: %d allowed, want 10 (refilling at the new rate)", got)
	}

	// Lowered to 1/min with room for 10: the 10 in use come back one a
	// minute, not at the old rate.
	s, z = reload(s, algorithms.Policy{Limit: 1, Window: 60 * sec, Burst: 10})
	c.advance(30 * time.Second)
	if got := allowed(s, z, 5); got != 0 {
		t.Fatalf("30 s after lowering to 1/min: %d allowed", got)
	}
	c.advance(31 * time.Second)
	if got := allowed(s, z, 5); got != 1 {
		t.Fatalf("61 s after lowering to 1/min: %d allowed, want 1", got)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

// A reload whose new config fails after registering gives the table back
// to the running config's rate.
func TestFailedReloadKeepsRunningRate(t *testing.T) {
	c := newFakeClock()
	name := t.Name()
	cfg := func(p algorithms.Policy) backend.LimitConfig {
		return backend.LimitConfig{Name: name, Algorithm: algorithms.NameGCRA, Policy: p}
	}
	running := New(Options{Now: c.now})
	z, err := running.Register(cfg(algorithms.Policy{Limit: 2, Window: 60 * sec}))
	if err != nil {
		t.Fatal(err)
	}
	defer running.Close()
	failed := New(Options{Now: c.now})
	if _, err := failed.Register(cfg(algorithms.Policy{Limit: 1000, Window: 60 * sec})); err != nil {
		t.Fatal(err)
	}
	_ = failed.Close() // the rest of that config did not provision
	for i := 0; i < 2; i++ {
		if ok, _ := decide(t, running, backend.Request{Limit: z, Key: "k", Cost: 1}); !ok {
			t.Fatalf("request %d denied", i+1)
		}
	}
	if ok, _ := decide(t, running, backend.Request{Limit: z, Key: "k", Cost: 1}); ok {
		t.Fatal("the failed config's rate of 1000/min is still in force")
	}
}

// A config may use one zone name twice only with one policy.
func TestSameNameTwiceInOneConfig(t *testing.T) {
	c := newFakeClock()
	owner := new(int)
	a, b := New(Options{Now: c.now}), New(Options{Now: c.now})
	defer a.Close()
	defer b.Close()
	cfg := backend.LimitConfig{Name: t.Name(), Algorithm: algorithms.NameSlidingWindow, Policy: algorithms.Policy{Limit: 2, Window: 3600 * sec}, Owner: owner}
	if _, err := a.Register(cfg); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Register(cfg); err != nil {
		t.Fatalf("the same policy twice: %v", err)
	}
	cfg.Policy.Limit = 100
	if _, err := b.Register(cfg); err == nil || !strings.Contains(err.Error(), "defined twice in this config") {
		t.Fatalf("two rates for one name in one config: %v", err)
	}
	cfg.Owner = new(int) // another config (a reload) may change it
	if _, err := b.Register(cfg); err != nil {
		t.Fatalf("a reload with a new rate: %v", err)
	}
}

// Lowering max_keys in a reload brings the table down to the new cap, even
// when the new cap is smaller than the number of shards.
func TestLoweredMaxKeys(t *testing.T) {
	c := newFakeClock()
	name := t.Name()
	p := algorithms.Policy{Limit: 10, Window: 3600 * sec}
	old := New(Options{Now: c.now})
	z, _ := old.Register(backend.LimitConfig{Name: name, Algorithm: algorithms.NameTokenBucket, Policy: p, MaxKeys: 1_000_000})
	for i := 0; i < 5000; i++ {
		decide(t, old, backend.Request{Limit: z, Key: fmt.Sprint(i), Cost: 1})
	}
	cur := New(Options{Now: c.now})
	defer cur.Close()
	z, _ = cur.Register(backend.LimitConfig{Name: name, Algorithm: algorithms.NameTokenBucket, Policy: p, MaxKeys: 10})
	_ = old.Close()
	tbl := z.(*zone[algorithms.Bucket]).t
	for i := 0; i < 2000; i++ {
		decide(t, cur, backend.Request{Limit: z, Key: fmt.Sprint("new", i), Cost: 1})
	}
	if got := tbl.Keys(); got > 10 {
		t.Fatalf("%d keys after lowering max_keys to 10 and 2000 new keys", got)
	}
}
