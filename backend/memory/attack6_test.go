package memory

import (
	"context"
	"strconv"
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
