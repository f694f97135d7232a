package memory

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
)

// A key whose reservations are all settled is dropped at once: a flood of
// keys, each reserved and settled, leaves nothing behind until the next
// pass over every key (once per reservation_ttl, up to a day), whatever
// max_keys bounds the states to. The emptied lists are reused, so a busy
// key still reserves without allocating.
func TestBudgetSettledKeysDropped(t *testing.T) {
	c := newFakeClock()
	s := newStore(t, c)
	z := testZone(t, s, algorithms.NameFixedWindow, algorithms.Policy{Limit: 10, Window: 3600 * sec}, 0)
	ttl := int64(24 * time.Hour)
	for i := range 1000 {
		req := backend.Request{Limit: z, Key: "k" + strconv.Itoa(i), Cost: 1, Reserve: ttl, Token: uint64(i + 1)}
		ok, out := decide(t, s, req)
		if !ok {
			t.Fatalf("key %d refused", i)
		}
		if err := s.SettleReservations(context.Background(), []backend.Request{req}, out, i%2 == 0); err != nil {
			t.Fatal(err)
		}
	}
	s.resv.mu.Lock()
	n := len(s.resv.keys)
	s.resv.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d keys without a reservation kept, want 0", n)
	}
	req := backend.Request{Limit: z, Key: "hot", Cost: 1, Reserve: ttl}
	out := make([]algorithms.Result, 1)
	allocs := testing.AllocsPerRun(100, func() {
		req.Token++
		_, _ = s.Decide(context.Background(), []backend.Request{req}, out)
		_ = s.SettleReservations(context.Background(), []backend.Request{req}, out, false)
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per reservation of a busy key, want 0", allocs)
	}
}

// Under concurrent reservations, releases, commits and double releases,
// no more than the limit is ever held at once, and once every
// reservation is released the key is back to its full quota: the state
// never goes below empty, and nothing is given back twice.
func TestBudgetConcurrentSettles(t *testing.T) {
	c := newFakeClock()
	s := newStore(t, c)
	for _, alg := range []string{algorithms.NameFixedWindow, algorithms.NameSlidingWindow, algorithms.NameSlidingCounter, algorithms.NameTokenBucket, algorithms.NameGCRA} {
		t.Run(alg, func(t *testing.T) {
			const limit = 10
			z := testZone(t, s, alg, algorithms.Policy{Limit: limit, Window: 3600 * sec}, 0)
			var held, most atomic.Int64
			var token atomic.Uint64
			var wg sync.WaitGroup
			for g := range 32 {
				wg.Go(func() {
					for i := range 200 {
						req := backend.Request{Limit: z, Key: "k", Cost: 1, Reserve: 60 * sec, Token: token.Add(1)}
						out := make([]algorithms.Result, 1)
						ok, err := s.Decide(context.Background(), []backend.Request{req}, out)
						if err != nil {
							t.Error(err)
							return
						}
						if !ok {
							continue
						}
						n := held.Add(1)
						for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
						}
						held.Add(-1)
						// Release twice, or commit then release: the second
						// settle must do nothing.
						commit := (g+i)%7 == 0
						_ = s.SettleReservations(context.Background(), []backend.Request{req}, out, commit)
						_ = s.SettleReservations(context.Background(), []backend.Request{req}, out, false)
						if commit {
							// Give the committed unit back by hand, so that
							// the key can be checked to be full at the end (a
							// refund of the reserving request would only
							// release its reservation, settled already).
							plain := req
							plain.Reserve = 0
							_ = s.Refund(context.Background(), []backend.Request{plain}, out)
						}
					}
				})
			}
			wg.Wait()
			if most.Load() > limit {
				t.Fatalf("%d reservations held at once, limit %d", most.Load(), limit)
			}
			_, out := decide(t, s, backend.Request{Limit: z, Key: "k", Cost: 0})
			if out[0].Remaining != limit {
				t.Fatalf("remaining %d after every reservation was settled, want %d", out[0].Remaining, limit)
			}
		})
	}
}

// A reservation nobody settles (its request never ended: a hijacked
// connection) expires after its life; the keys nobody asks for again are
// dropped by a pass over them all.
func TestBudgetUnsettledExpires(t *testing.T) {
	c := newFakeClock()
	s := newStore(t, c)
	z := testZone(t, s, algorithms.NameSlidingWindow, algorithms.Policy{Limit: 1, Window: 3600 * sec}, 0)
	ttl := int64(time.Minute)
	reserve := func(key string, tok uint64) bool {
		ok, _ := decide(t, s, backend.Request{Limit: z, Key: key, Cost: 1, Reserve: ttl, Token: tok})
		return ok
	}
	if !reserve("a", 1) || !reserve("b", 2) || reserve("a", 3) {
		t.Fatal("want a and b reserved, a's second refused")
	}
	c.advance(time.Minute - time.Nanosecond)
	if reserve("a", 4) {
		t.Fatal("a's reservation came back before its life ended")
	}
	c.advance(time.Nanosecond)
	if !reserve("a", 5) {
		t.Fatal("a's reservation did not come back when its life ended")
	}
	// b was never asked for again: the pass made by a's decision after a
	// minute dropped it.
	s.resv.mu.Lock()
	_, kept := s.resv.keys[resvKey{z.(zoneOps), "b"}]
	s.resv.mu.Unlock()
	if kept {
		t.Fatal("the expired reservation of a key nobody asks for is kept")
	}
	if ok, out := decide(t, s, backend.Request{Limit: z, Key: "b", Cost: 0}); !ok || out[0].Remaining != 1 {
		t.Fatalf("b after its reservation expired: %+v", out[0])
	}
}
