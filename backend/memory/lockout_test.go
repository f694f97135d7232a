package memory

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
)

// The escalation, reset and decay scenarios run against this store and the
// Redis store side by side in backend/redis/lockout_test.go; these tests
// cover what only this store has: its lock, its map's bounds and sweeps.

var steps = backend.Lockout{int64(time.Minute), 5 * int64(time.Minute), 24 * int64(time.Hour)}

func lockZone(t *testing.T, s *Store, name string, maxKeys int) backend.Limit {
	t.Helper()
	z, err := s.Register(backend.LimitConfig{Name: t.Name() + name, Algorithm: algorithms.NameSlidingWindow, Policy: algorithms.Policy{Limit: 3, Window: 600 * sec}, MaxKeys: maxKeys, Lockout: steps})
	if err != nil {
		t.Fatal(err)
	}
	return z
}

func lockLevel(t *testing.T, s *Store, z backend.Limit, key string) (int32, int64) {
	t.Helper()
	st, wait, err := s.InspectLockout(context.Background(), z, key)
	if err != nil {
		t.Fatal(err)
	}
	return st.Level, wait
}

// 50 concurrent requests on a key of 3 units: 3 pass, 47 are denied with
// the first lock-out's retry, and the key is at level 1, not 47: the
// lock-out is written under the lock that denied, and a request that finds
// it does not escalate.
func TestLockoutConcurrent(t *testing.T) {
	c := newFakeClock()
	s := newStore(t, c)
	z := lockZone(t, s, "", 0)
	other := lockZone(t, s, "other", 0) // the multi-limit path too
	for _, multi := range []bool{false, true} {
		key := map[bool]string{false: "one", true: "two"}[multi]
		var wg sync.WaitGroup
		var mu sync.Mutex
		allowed, locked := 0, 0
		for range 50 {
			wg.Go(func() {
				reqs := []backend.Request{{Limit: z, Key: key, Cost: 1}}
				if multi {
					reqs = append(reqs, backend.Request{Limit: other, Key: "free" + key, Cost: 0})
				}
				out := make([]algorithms.Result, len(reqs))
				ok, err := s.Decide(context.Background(), reqs, out)
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err != nil:
					t.Error(err)
				case ok:
					allowed++
				case out[0].RetryAfter == int64(time.Minute):
					locked++
				default:
					t.Errorf("denied with %+v", out[0])
				}
			})
		}
		wg.Wait()
		if level, wait := lockLevel(t, s, z, key); allowed != 3 || locked != 47 || level != 1 || wait != int64(time.Minute) {
			t.Fatalf("multi=%v: %d allowed, %d locked out, level %d for %v; want 3, 47, level 1 for 1m", multi, allowed, locked, level, time.Duration(wait))
		}
	}
}

// In a request of several limits, only the limit that denies locks its
// key out; one that allowed is not charged and not locked.
func TestLockoutOnlyTheDenyingLimit(t *testing.T) {
	c := newFakeClock()
	s := newStore(t, c)
	a, b := lockZone(t, s, "a", 0), lockZone(t, s, "b", 0)
	for range 3 {
		decide(t, s, backend.Request{Limit: b, Key: "k", Cost: 1})
	}
	ok, out := decide(t, s, backend.Request{Limit: a, Key: "k", Cost: 1}, backend.Request{Limit: b, Key: "k", Cost: 1})
	if ok || !out[0].Allowed || out[1].RetryAfter != int64(time.Minute) {
		t.Fatalf("%v %+v", ok, out)
	}
	if la, _ := lockLevel(t, s, a, "k"); la != 0 {
		t.Fatalf("the allowing limit got level %d", la)
	}
	if lb, _ := lockLevel(t, s, b, "k"); lb != 1 {
		t.Fatalf("the denying limit got level %d", lb)
	}
}

// The records are bounded by max_keys: a flood of denied keys evicts the
// records whose lock-outs end first, counted as denying evictions, and
// the sweep drops records once forgotten.
func TestLockoutBoundedAndSwept(t *testing.T) {
	c := newFakeClock()
	s := newStore(t, c)
	z := lockZone(t, s, "", 64)
	tab := z.(*zone[*algorithms.Log]).t
	records := func() int {
		n := 0
		for i := range tab.shards {
			sh := &tab.shards[i]
			sh.mu.Lock()
			n += len(sh.lockouts)
			sh.mu.Unlock()
		}
		return n
	}
	for i := range 500 {
		key := string(rune('A'+i%26)) + string(rune('a'+i/26))
		for range 4 {
			decide(t, s, backend.Request{Limit: z, Key: key, Cost: 1})
		}
		c.advance(time.Millisecond)
	}
	if n := records(); n > 64 || n == 0 {
		t.Fatalf("%d records for max_keys 64", n)
	}
	if tab.DenyingEvictions() == 0 {
		t.Fatal("records evicted while locked out are not counted")
	}
	c.advance(time.Minute + 24*time.Hour) // every lock-out ended, and forgotten
	tab.sweep()
	if n := records(); n != 0 {
		t.Fatalf("%d records left after the sweep", n)
	}
}

// A reload that changes the steps decides with the new ones; one config
// may not give one zone two sets of steps; without lockout a record is
// not read (the lock-out is lifted with the option).
func TestLockoutReload(t *testing.T) {
	c := newFakeClock()
	s1 := newStore(t, c)
	cfg := backend.LimitConfig{Name: t.Name(), Algorithm: algorithms.NameGCRA, Policy: algorithms.Policy{Limit: 1, Window: 600 * sec}, Lockout: steps, Owner: s1}
	z1, err := s1.Register(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Lockout = backend.Lockout{int64(time.Hour)}
	if _, err := s1.Register(cfg); err == nil {
		t.Fatal("one config gave one zone two lockouts")
	}
	decide(t, s1, backend.Request{Limit: z1, Key: "k", Cost: 1})
	if _, out := decide(t, s1, backend.Request{Limit: z1, Key: "k", Cost: 1}); out[0].RetryAfter != int64(time.Minute) {
		t.Fatalf("%+v", out[0])
	}
	s2 := newStore(t, c)
	cfg.Owner = s2
	z2, err := s2.Register(cfg)
	if err != nil {
		t.Fatal(err)
	}
	c.advance(time.Minute)
	if _, out := decide(t, s2, backend.Request{Limit: z2, Key: "k", Cost: 1}); out[0].RetryAfter != int64(time.Hour) {
		t.Fatalf("after the reload: %+v, want the new steps' 1h", out[0])
	}
	s3 := newStore(t, c)
	cfg.Owner, cfg.Lockout = s3, nil
	z3, err := s3.Register(cfg)
	if err != nil {
		t.Fatal(err)
	}
	c.advance(10 * time.Minute)
	if ok, _ := decide(t, s3, backend.Request{Limit: z3, Key: "k", Cost: 1}); !ok {
		t.Fatal("still locked out after lockout was removed")
	}
}

// BenchmarkLockoutDecide is what lockout adds to a decision: allowed (a
// nil check while no key of the shard was ever locked out, a map lookup
// after), and denied (the limit's own denial against a lock-out's), on
// one key, against the same zone without lockout.
//
//	go test -run '^$' -bench LockoutDecide -benchmem ./backend/memory/
func BenchmarkLockoutDecide(b *testing.B) {
	for _, denied := range []bool{false, true} {
		for _, lo := range []backend.Lockout{nil, steps} {
			name := map[bool]string{false: "allowed", true: "denied"}[denied] + map[bool]string{false: "/plain", true: "/lockout"}[lo != nil]
			b.Run(name, func(b *testing.B) {
				c := newFakeClock()
				s := New(Options{Now: c.now})
				b.Cleanup(func() { _ = s.Close() })
				p := algorithms.Policy{Limit: 1 << 40, Window: 1 << 50}
				if denied {
					p = algorithms.Policy{Limit: 1, Window: int64(time.Hour)}
				}
				z, err := s.Register(backend.LimitConfig{Name: b.Name(), Algorithm: algorithms.NameTokenBucket, Policy: p, Lockout: lo})
				if err != nil {
					b.Fatal(err)
				}
				reqs := []backend.Request{{Limit: z, Key: "10.0.0.1", Cost: 1}}
				out := make([]algorithms.Result, 1)
				ctx := context.Background()
				for range 2 {
					_, _ = s.Decide(ctx, reqs, out)
				}
				b.ReportAllocs()
				cpu0 := cpuNanos()
				for b.Loop() {
					_, _ = s.Decide(ctx, reqs, out)
				}
				if cpu := cpuNanos() - cpu0; cpu > 0 {
					b.ReportMetric(float64(cpu)/float64(b.N), "cpu-ns/op")
				}
			})
		}
	}
}

// A reload that changes the kind of state (a window to a bucket) keeps
// the lock-outs: the new table adopts the old one's records with its keys.
func TestLockoutSurvivesKindChange(t *testing.T) {
	c := newFakeClock()
	p := algorithms.Policy{Limit: 1, Window: 3600 * sec}
	register := func(alg string) (*Store, backend.Limit) {
		s := New(Options{Now: c.now})
		z, err := s.Register(backend.LimitConfig{Name: t.Name(), Algorithm: alg, Policy: p, Lockout: steps})
		if err != nil {
			t.Fatal(err)
		}
		return s, z
	}
	old, oz := register(algorithms.NameSlidingWindow)
	decide(t, old, backend.Request{Limit: oz, Key: "k", Cost: 1})
	decide(t, old, backend.Request{Limit: oz, Key: "k", Cost: 1}) // locked out 1m
	c.advance(time.Minute)
	decide(t, old, backend.Request{Limit: oz, Key: "k", Cost: 1}) // 5m
	cur, nz := register(algorithms.NameTokenBucket)
	defer cur.Close()
	if err := old.Close(); err != nil {
		t.Fatal(err)
	}
	if level, wait := lockLevel(t, cur, nz, "k"); level != 2 || wait != 5*int64(time.Minute) {
		t.Fatalf("after the switch: level %d for %v, want 2 for 5m", level, time.Duration(wait))
	}
	if _, out := decide(t, cur, backend.Request{Limit: nz, Key: "k", Cost: 1}); out[0].RetryAfter != 5*int64(time.Minute) {
		t.Fatalf("%+v", out[0])
	}
}
