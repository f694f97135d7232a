package redis

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backend"
)

// Two instances share one key's slots with caps that differ for an
// interval: each acquire is judged by its caller's cap against the slots
// the whole fleet holds. Lowered, a cap keeps the slots held; raised, it
// lets the next acquire through at once.
func TestSlotsSetLimitPerInstance(t *testing.T) {
	stores := slotStores(t, 2, standaloneU)
	a := mustSlots(t, stores[0], "adjust", 4, 30*time.Second)
	b := mustSlots(t, stores[1], "adjust", 4, 30*time.Second)
	ctx := context.Background()
	take := func(z backend.Slots) string {
		t.Helper()
		id, err := z.Acquire(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	var held []string
	for range 3 {
		if id := take(a); id == "" {
			t.Fatal("a refused a slot under the cap of 4")
		} else {
			held = append(held, id)
		}
	}
	// a backs off to 2 while 3 slots are held: they stay held, and a gets
	// none until the set holds fewer than 2.
	if err := a.(backend.AdjustableSlots).SetLimit(2); err != nil {
		t.Fatal(err)
	}
	if id := take(a); id != "" {
		t.Fatalf("a at cap 2 got a slot while the fleet holds 3: %q", id)
	}
	// b still sends 4: the one slot left under its cap is its.
	idB := take(b)
	if idB == "" {
		t.Fatal("b at cap 4 refused while the fleet holds 3")
	}
	if id := take(b); id != "" {
		t.Fatal("b at cap 4 got a fifth slot")
	}
	for _, id := range held[:3] {
		if err := a.Release(ctx, "k", id); err != nil {
			t.Fatal(err)
		}
	}
	// The fleet holds 1 (b's): a at cap 2 gets one, not two.
	if take(a) == "" {
		t.Fatal("a at cap 2 refused while the fleet holds 1")
	}
	if id := take(a); id != "" {
		t.Fatal("a at cap 2 got a slot while the fleet holds 2")
	}
	// Raised, the next acquire passes at once.
	if err := a.(backend.AdjustableSlots).SetLimit(3); err != nil {
		t.Fatal(err)
	}
	if take(a) == "" {
		t.Fatal("a raised to 3 refused while the fleet holds 2")
	}
	if err := a.(backend.AdjustableSlots).SetLimit(0); err == nil {
		t.Fatal("a cap of 0 accepted")
	}
}
