package memory

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
)

// script sends requests of two keys every 4s (a third, new key after the
// reload attempt) and records each answer; between the halves it calls
// between.
func script(t *testing.T, c *fakeClock, s *Store, z backend.Limit, between func()) []string {
	t.Helper()
	var got []string
	send := func(keys, n int) {
		for i := range n {
			c.advance(4*time.Second + 1234567)
			ok, out := decide(t, s, backend.Request{Limit: z, Key: fmt.Sprint("k", i%keys), Cost: 1})
			got = append(got, fmt.Sprintf("%v/%d/%d", ok, out[0].Remaining, out[0].RetryAfter))
		}
	}
	send(2, 16)
	between()
	send(3, 24)
	return got
}

// A config that registers other rates (in two handlers, cleaned up in the
// order Caddy cleans them) and then fails leaves every algorithm deciding
// exactly as if it had never been loaded, even where rebasing there and
// back would not (the sliding window counter folds its previous window into
// the current one; the buckets round twice). A lower max_keys it set
// evicts nobody.
func TestFailedReloadIsUndoneExactly(t *testing.T) {
	for _, alg := range algorithms.Names() {
		t.Run(alg, func(t *testing.T) {
			running := algorithms.Policy{Limit: 3, Window: 60 * sec}
			failed := algorithms.Policy{Limit: 7, Window: 13 * sec}
			run := func(name string, between func(name string, c *fakeClock)) []string {
				c := newFakeClock()
				s := New(Options{Now: c.now})
				defer s.Close()
				z, err := s.Register(backend.LimitConfig{Name: name, Algorithm: alg, Policy: running, MaxKeys: 100})
				if err != nil {
					t.Fatal(err)
				}
				return script(t, c, s, z, func() { between(name, c) })
			}
			want := run(t.Name()+"/reference", func(string, *fakeClock) {})
			var keysBefore, keysAfter int64
			got := run(t.Name()+"/undone", func(name string, c *fakeClock) {
				tbl := tableOf(name, alg)
				keysBefore = tbl.Keys()
				owner := new(int)
				first, second := New(Options{Now: c.now}), New(Options{Now: c.now})
				for _, s := range []*Store{first, second} {
					if _, err := s.Register(backend.LimitConfig{Name: name, Algorithm: alg, Policy: failed, MaxKeys: 1, Owner: owner}); err != nil {
						t.Fatal(err)
					}
				}
				// The rest of that config failed; Caddy cleans up its
				// modules in the order it loaded them.
				_ = first.Close()
				_ = second.Close()
				time.Sleep(10 * time.Millisecond) // a lower bound: a trim would have run by now
				keysAfter = tbl.Keys()
			})
			if !slices.Equal(got, want) {
				t.Fatalf("after a failed reload:\n got %v\nwant %v", got, want)
			}
			if keysAfter != keysBefore {
				t.Fatalf("the failed config's max_keys 1 evicted running keys: %d before, %d after", keysBefore, keysAfter)
			}
		})
	}
}

// When the running config decided requests between the failed config's
// registration and its undo, the shards were rebased under the failed
// rates: the undo switches back from then on, and later reloads still work.
func TestUndoAfterRequestsSwitchesBack(t *testing.T) {
	c := newFakeClock()
	name := t.Name()
	cfg := func(limit int64) backend.LimitConfig {
		return backend.LimitConfig{Name: name, Algorithm: algorithms.NameTokenBucket, Policy: algorithms.Policy{Limit: limit, Window: 60 * sec}, Owner: new(int)}
	}
	running := New(Options{Now: c.now})
	z, err := running.Register(cfg(2))
	if err != nil {
		t.Fatal(err)
	}
	failed := New(Options{Now: c.now})
	if _, err := failed.Register(cfg(1000)); err != nil {
		t.Fatal(err)
	}
	decide(t, running, backend.Request{Limit: z, Key: "k", Cost: 1}) // under 1000/min
	_ = failed.Close()
	if ok, _ := decide(t, running, backend.Request{Limit: z, Key: "k", Cost: 1}); !ok {
		t.Fatal("second request denied")
	}
	if ok, _ := decide(t, running, backend.Request{Limit: z, Key: "k", Cost: 1}); ok {
		t.Fatal("the failed config's 1000/min is still in force")
	}
	// A reload that succeeds: 5/min from now on, and the old config leaves.
	next := New(Options{Now: c.now})
	defer next.Close()
	nz, err := next.Register(cfg(5))
	if err != nil {
		t.Fatal(err)
	}
	_ = running.Close()
	c.advance(12 * time.Second) // one token at 5/min
	if ok, _ := decide(t, next, backend.Request{Limit: nz, Key: "k", Cost: 1}); !ok {
		t.Fatal("a token refilled at the new rate was denied")
	}
}

// A lower max_keys trims the table once its config is in force: when the
// config it replaced lets go.
func TestLoweredMaxKeysTrimsOnceInForce(t *testing.T) {
	c := newFakeClock()
	name := t.Name()
	p := algorithms.Policy{Limit: 10, Window: 3600 * sec}
	old := New(Options{Now: c.now})
	z, err := old.Register(backend.LimitConfig{Name: name, Algorithm: algorithms.NameGCRA, Policy: p, MaxKeys: 10_000})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 500 {
		decide(t, old, backend.Request{Limit: z, Key: fmt.Sprint(i), Cost: 1})
	}
	cur := New(Options{Now: c.now})
	defer cur.Close()
	if _, err := cur.Register(backend.LimitConfig{Name: name, Algorithm: algorithms.NameGCRA, Policy: p, MaxKeys: 100}); err != nil {
		t.Fatal(err)
	}
	tbl := tableOf(name, algorithms.NameGCRA)
	if got := tbl.Keys(); got != 500 {
		t.Fatalf("%d keys while the new config may still fail, want all 500", got)
	}
	_ = old.Close()
	for deadline := time.Now().Add(5 * time.Second); tbl.Keys() > 100; {
		if time.Now().After(deadline) {
			t.Fatalf("%d keys after the config with max_keys 100 took over", tbl.Keys())
		}
		time.Sleep(time.Millisecond)
	}
}

// tableOf returns the live table of a zone, of the kind alg uses.
func tableOf(name, alg string) interface{ Keys() int64 } {
	kind := algorithms.KindOf(alg)
	var found interface{ Keys() int64 }
	tables.Range(func(k, v any) bool {
		if pk := k.(poolKey); pk.name == name && pk.kind == kind {
			found = v.(interface{ Keys() int64 })
		}
		return true
	})
	return found
}
