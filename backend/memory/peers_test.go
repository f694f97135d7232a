package memory

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
)

// reloadTo registers name with alg in a new store, as a reload provisions
// the new config while the old one still runs.
func reloadTo(t *testing.T, c *fakeClock, name, alg string, p algorithms.Policy) (*Store, backend.Limit) {
	t.Helper()
	s := New(Options{Now: c.now})
	z, err := s.Register(backend.LimitConfig{Name: name, Algorithm: alg, Policy: p})
	if err != nil {
		t.Fatal(err)
	}
	return s, z
}

// admits sends n unit requests for key and requires want of them to pass.
func admits(t *testing.T, s *Store, z backend.Limit, key string, n, want int, why string) {
	t.Helper()
	got := 0
	for i := 0; i < n; i++ {
		if ok, _ := decide(t, s, backend.Request{Limit: z, Key: key, Cost: 1}); ok {
			got++
		}
	}
	if got != want {
		t.Errorf("%s: %d of %d requests for %s passed, want %d", why, got, n, key, want)
	}
}

// A reload from any algorithm to one with another kind of state carries
// each key's usage: 7 of 10 used leaves 3, a spent key stays denied.
func TestSwitchingKindCarriesUsage(t *testing.T) {
	p := algorithms.Policy{Limit: 10, Window: 3600 * sec}
	for _, from := range algorithms.Names() {
		for _, to := range algorithms.Names() {
			if algorithms.KindOf(from) == algorithms.KindOf(to) {
				continue
			}
			t.Run(from+"→"+to, func(t *testing.T) {
				c := newFakeClock()
				name := t.Name()
				old, oz := reloadTo(t, c, name, from, p)
				spend(t, old, oz, "used", []int64{7})
				spend(t, old, oz, "spent", []int64{10})
				cur, nz := reloadTo(t, c, name, to, p)
				defer cur.Close()
				if err := old.Close(); err != nil {
					t.Fatal(err)
				}
				admits(t, cur, nz, "used", 5, 3, "7 of 10 used before the switch")
				admits(t, cur, nz, "spent", 1, 0, "spent before the switch")
				admits(t, cur, nz, "fresh", 11, 10, "a new key")
			})
		}
	}
}

// While both configs serve, a request of either is decided by both tables
// and taken in both, through one zone or several.
func TestSwitchingKindDecidesTheOverlapByBoth(t *testing.T) {
	c := newFakeClock()
	name := t.Name()
	p := algorithms.Policy{Limit: 10, Window: 3600 * sec}
	old, oz := reloadTo(t, c, name, algorithms.NameSlidingWindow, p)
	defer old.Close()
	other := testZone(t, old, algorithms.NameTokenBucket, algorithms.Policy{Limit: 100, Window: 3600 * sec}, 0)
	spend(t, old, oz, "k", []int64{4})
	cur, nz := reloadTo(t, c, name, algorithms.NameFixedWindow, p)
	defer cur.Close()
	spend(t, old, oz, "k", []int64{1, 1})                                                                           // one zone
	decide(t, old, backend.Request{Limit: oz, Key: "k", Cost: 1}, backend.Request{Limit: other, Key: "k", Cost: 1}) // two
	spend(t, cur, nz, "k", []int64{2})
	admits(t, old, oz, "k", 3, 1, "the old config, 4 + 3 + 2 of 10 taken")
	admits(t, cur, nz, "k", 3, 0, "the new config after that")
}

// A new config that fails after registering lets go of its table: the
// running one no longer feeds it, and decides as before.
func TestFailedSwitchLetsGo(t *testing.T) {
	c := newFakeClock()
	name := t.Name()
	p := algorithms.Policy{Limit: 3, Window: 3600 * sec}
	old, oz := reloadTo(t, c, name, algorithms.NameSlidingWindow, p)
	defer old.Close()
	spend(t, old, oz, "k", []int64{1})
	failed, fz := reloadTo(t, c, name, algorithms.NameGCRA, algorithms.Policy{Limit: 1000, Window: 3600 * sec})
	_ = failed.Close()
	if ps := oz.(*zone[*algorithms.Log]).t.peers.Load(); ps != nil {
		t.Fatalf("the running table still feeds %d tables", len(*ps))
	}
	if ps := fz.(*zone[algorithms.Bucket]).t.peers.Load(); ps != nil {
		t.Fatal("the failed config's table is still linked")
	}
	admits(t, old, oz, "k", 5, 2, "1 of 3 used, after the failed reload")
	// A later reload to that kind starts from the running table again.
	cur, nz := reloadTo(t, c, name, algorithms.NameGCRA, p)
	defer cur.Close()
	admits(t, cur, nz, "k", 5, 0, "spent, then switched to gcra")
}

// Requests through the old config race the translation and then requests
// through the new one: whatever the interleaving, one key gets its limit
// once (run with -race).
func TestSwitchUnderConcurrentLoad(t *testing.T) {
	c := newFakeClock()
	name := t.Name()
	p := algorithms.Policy{Limit: 2000, Window: 3600 * sec}
	old, oz := reloadTo(t, c, name, algorithms.NameSlidingWindow, p)
	defer old.Close()
	var admitted atomic.Int64
	var wg sync.WaitGroup
	hammer := func(s *Store, z backend.Limit, n int) {
		defer wg.Done()
		out := make([]algorithms.Result, 1)
		for i := 0; i < n; i++ {
			reqs := []backend.Request{{Limit: z, Key: fmt.Sprint("k", i%4), Cost: 1}}
			if ok, _ := s.Decide(context.Background(), reqs, out); ok {
				admitted.Add(1)
			}
		}
	}
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go hammer(old, oz, 3000)
	}
	cur, nz := reloadTo(t, c, name, algorithms.NameTokenBucket, p)
	defer cur.Close()
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go hammer(cur, nz, 3000)
	}
	wg.Wait()
	// Four keys of 2000 each.
	if got := admitted.Load(); got > 4*2000 {
		t.Fatalf("%d admitted for four keys of 2000", got)
	}
}

// Stepping by coprimeStep(n) visits every one of n places once.
func TestCoprimeStepVisitsAll(t *testing.T) {
	for n := 1; n < 3000; n++ {
		seen := make([]bool, n)
		step := coprimeStep(n)
		for k, j := 0, 0; k < n; k, j = k+1, (j+step)%n {
			if seen[j] {
				t.Fatalf("n=%d step=%d: %d visited twice", n, step, j)
			}
			seen[j] = true
		}
	}
}

// A request of the old config that looked for peers just before the new
// table was linked, and took its unit just after its key was translated,
// would be counted by the old table only: once the old config is gone, the
// new table has that unit to give again. Many reloads race deciders so
// that some land in that gap; none may leave the new table more room than
// the limit minus what was admitted.
func TestSwitchNeverLosesARacingRequest(t *testing.T) {
	const limit = 1_000_000_000 // never reached: every request takes a unit
	p := algorithms.Policy{Limit: limit, Window: 3600 * sec}
	kinds := []string{algorithms.NameSlidingCounter, algorithms.NameTokenBucket, algorithms.NameFixedWindow}
	iterations := 100
	if testing.Short() {
		iterations = 30
	}
	for it := 0; it < iterations; it++ {
		c := newFakeClock()
		name := fmt.Sprint(t.Name(), it)
		old, oz := reloadTo(t, c, name, kinds[it%len(kinds)], p)
		var admitted atomic.Int64
		var started sync.WaitGroup
		var wg sync.WaitGroup
		stop := make(chan struct{})
		for g := 0; g < 4; g++ {
			wg.Add(1)
			started.Add(1)
			go func() {
				defer wg.Done()
				out := make([]algorithms.Result, 1)
				reqs := []backend.Request{{Limit: oz, Key: "k", Cost: 1}}
				first := true
				for {
					if ok, _ := old.Decide(context.Background(), reqs, out); ok {
						admitted.Add(1)
					}
					if first {
						started.Done()
						first = false
					}
					select {
					case <-stop:
						return
					default:
					}
				}
			}()
		}
		started.Wait()
		cur, nz := reloadTo(t, c, name, kinds[(it+1)%len(kinds)], p)
		close(stop)
		wg.Wait()
		if err := old.Close(); err != nil {
			t.Fatal(err)
		}
		n := admitted.Load()
		// The new table may have less room (translation rounds down), never
		// more than limit − n.
		if ok, out := decide(t, cur, backend.Request{Limit: nz, Key: "k", Cost: limit - n + 1}); ok {
			t.Fatalf("iteration %d: %d admitted through the old config, yet the new one (%s → %s) took %d more (remaining %d): a racing request was lost",
				it, n, kinds[it%len(kinds)], kinds[(it+1)%len(kinds)], limit-n+1, out[0].Remaining)
		}
		_ = cur.Close()
	}
}

// Caddy does not wait for the old config's requests to finish before it
// cleans the old config up: a request already in its handler decides
// through a table that is gone from the pool, after its keys were
// translated, perhaps after more reloads. It must be counted by the tables
// in force then, not by the dead one alone.
func TestStragglerOfAFinishedConfigIsCounted(t *testing.T) {
	c := newFakeClock()
	name := t.Name()
	p := algorithms.Policy{Limit: 10, Window: 3600 * sec}
	first, fz := reloadTo(t, c, name, algorithms.NameSlidingWindow, p)
	spend(t, first, fz, "k", []int64{3})
	second, sz := reloadTo(t, c, name, algorithms.NameTokenBucket, p)
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	spend(t, first, fz, "k", []int64{1}) // in flight across the clean-up
	admits(t, second, sz, "k", 7, 6, "4 of 10 used through the first config")

	third, tz := reloadTo(t, c, name, algorithms.NameFixedWindow, p)
	defer third.Close()
	if err := second.Close(); err != nil {
		t.Fatal(err)
	}
	spend(t, first, fz, "other", []int64{2}) // in flight across two reloads
	admits(t, third, tz, "other", 9, 8, "2 of 10 used through the first config")
	admits(t, third, tz, "k", 1, 0, "spent")
}
