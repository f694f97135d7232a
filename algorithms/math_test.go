package algorithms

import (
	"math/rand/v2"
	"testing"
)

func TestFloorDiv(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	check := func(x, d int64) {
		if got, want := floorDiv(x, d, 1/float64(d)), x/d; got != want {
			t.Fatalf("floorDiv(%d, %d) = %d, want %d", x, d, got, want)
		}
	}
	for i := 0; i < 1_000_000; i++ {
		d := 1 + rng.Int64N(1<<uint(1+rng.IntN(61)))
		x := rng.Int64N(1 << uint(1+rng.IntN(62)))
		check(x, d)
		q := rng.Int64N(min(1<<20, (1<<62)/d)) + 1 // exact multiples and their neighbours
		check(q*d, d)
		check(max(q*d-1, 0), d)
	}
	for _, c := range [][2]int64{{0, 1}, {1, 1}, {1<<50 - 1, 3}, {1 << 50, 3}, {1<<61 - 1, 1}, {999_999_999, 333_333_334}} {
		check(c[0], c[1])
	}
}

func TestMulDiv(t *testing.T) {
	if got := mulDiv(1<<62, 1<<62, 1<<62); got != MaxSpan {
		t.Fatalf("saturation: %d", got)
	}
	if got := mulDivCeil(7, 3, 2); got != 11 {
		t.Fatalf("⌈21/2⌉ = %d", got)
	}
	if got := mulDiv(7, 3, 2); got != 10 {
		t.Fatalf("⌊21/2⌋ = %d", got)
	}
}
