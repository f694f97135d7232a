package memory

import (
	"math/rand/v2"
	"testing"
)

// The table against a Go map under random inserts, updates and deletes,
// with hashes crowded into few home slots so probe chains wrap and collide.
func TestSlotsMatchesMap(t *testing.T) {
	for _, spread := range []uint64{0, 1 << 60, 1 << 62} {
		rng := rand.New(rand.NewPCG(1, spread))
		var tb slots[int64]
		ref := map[uint64]int64{}
		for op := 0; op < 50_000; op++ {
			h := rng.Uint64N(400)*7919 + 1 + spread // never 0
			switch rng.IntN(3) {
			case 0, 1:
				v := rng.Int64()
				if tb.n > 0 {
					if i, ok := tb.find(h); ok {
						tb.e[i].s = v
						ref[h] = v
						continue
					}
				}
				tb.insert(h, v)
				ref[h] = v
			case 2:
				if tb.n > 0 {
					if i, ok := tb.find(h); ok {
						tb.remove(i)
					}
				}
				delete(ref, h)
				if op%1000 == 0 {
					tb.shrink()
				}
			}
			if tb.n != len(ref) {
				t.Fatalf("op %d: %d entries, map has %d", op, tb.n, len(ref))
			}
		}
		for h, v := range ref {
			if got := tb.get(h); got != v {
				t.Fatalf("spread %x: key %d = %d, want %d", spread, h, got, v)
			}
		}
		used := 0
		for _, sl := range tb.e {
			if sl.h != 0 {
				used++
				if _, ok := ref[sl.h]; !ok {
					t.Fatalf("stale entry %d", sl.h)
				}
			}
		}
		if used != len(ref) {
			t.Fatalf("%d used slots, want %d", used, len(ref))
		}
	}
}

// Removing every entry while walking the array, as a sweep does, leaves
// nothing behind and never loses an entry it keeps.
func TestSlotsRemoveWhileWalking(t *testing.T) {
	var tb slots[int64]
	for h := uint64(1); h <= 3000; h++ {
		tb.insert(h*0x9E3779B97F4A7C15|1, int64(h%2))
	}
	for i := 0; i < len(tb.e); {
		if tb.e[i].h != 0 && tb.e[i].s == 0 {
			tb.remove(i)
			continue
		}
		i++
	}
	if tb.n != 1500 {
		t.Fatalf("%d left, want 1500", tb.n)
	}
	for h := uint64(1); h <= 3000; h++ {
		k := h*0x9E3779B97F4A7C15 | 1
		_, ok := tb.find(k)
		if ok != (h%2 == 1) {
			t.Fatalf("key %d present=%v", h, ok)
		}
	}
}
