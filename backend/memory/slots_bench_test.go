package memory

import (
	"hash/maphash"
	"testing"
)

// The table alone (hash and probe) over a million keys, for BENCHMARKS.md's
// breakdown of a decision.
func BenchmarkSlotsFind(b *testing.B) {
	const n = 1_000_000
	seed := maphash.MakeSeed()
	var shards [64]slots[int64]
	var g keyGen
	for i := 0; i < n; i++ {
		h := maphash.String(seed, g.key(i))
		shards[h&63].insert(h, 1)
	}
	b.ResetTimer()
	x := uint64(1)
	for i := 0; b.Loop(); i++ {
		h := maphash.String(seed, g.key(i%n))
		t := &shards[h&63]
		j, _ := t.find(h)
		x += uint64(t.e[j].s)
	}
	_ = x
}

// Making and hashing the benchmark's 15-byte key, to subtract.
func BenchmarkKeyHash(b *testing.B) {
	seed := maphash.MakeSeed()
	var g keyGen
	x := uint64(0)
	for i := 0; b.Loop(); i++ {
		x += maphash.String(seed, g.key(i%1_000_000))
	}
	_ = x
}

// Linear probing stays short at the loads the table keeps (≤ 3/4).
func TestProbeLengths(t *testing.T) {
	const n = 200_000
	seed := maphash.MakeSeed()
	var shards [64]slots[int64]
	var g keyGen
	for i := 0; i < n; i++ {
		h := maphash.String(seed, g.key(i))
		shards[h&63].insert(h, 1)
	}
	probes, size := 0, 0
	for i := 0; i < n; i++ {
		h := maphash.String(seed, g.key(i))
		tb := &shards[h&63]
		for j := tb.home(h); tb.e[j].h != h; j = (j + 1) % len(tb.e) {
			probes++
		}
	}
	for i := range shards {
		size += len(shards[i].e)
	}
	extra, load := float64(probes)/n, float64(n)/float64(size)
	t.Logf("extra probes per key %.2f, load %.2f", extra, load)
	if extra > 2 || load < 0.45 || load > 0.75 {
		t.Fatalf("extra probes per key %.2f at load %.2f: the table is clustering", extra, load)
	}
}
