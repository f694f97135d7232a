package algorithms

import (
	"testing"
	"unsafe"
)

// One decision on existing state, allowed and taken, with the clock
// excluded (now is a counter): the algorithms' own cost. The state size is
// reported as bytes/key.
func BenchmarkDecide(b *testing.B) {
	p := Policy{Limit: 1 << 40, Window: 3600 * s}
	b.Run(NameSlidingWindow, func(b *testing.B) {
		// A window of 100 events kept at its size: each decision prunes
		// the oldest and appends one.
		lp := Policy{Limit: 100, Window: 100 * ms}
		bench(b, NewSlidingLog(lp), ms, unsafe.Sizeof(Log{})+8*128)
	})
	b.Run(NameSlidingCounter, func(b *testing.B) { bench(b, NewSlidingCounter(p), 1, unsafe.Sizeof(Counter{})) })
	b.Run(NameFixedWindow, func(b *testing.B) { bench(b, NewFixedWindow(p), 1, unsafe.Sizeof(Window{})) })
	b.Run(NameTokenBucket, func(b *testing.B) { bench(b, NewTokenBucket(p), 1, unsafe.Sizeof(Bucket{})) })
	b.Run(NameGCRA, func(b *testing.B) { bench(b, NewGCRA(p), 1, unsafe.Sizeof(Bucket{})) })
	b.Run(NameLeakyBucket, func(b *testing.B) { bench(b, NewLeakyBucket(p), 1, unsafe.Sizeof(Bucket{})) })
	qp := p
	qp.MaxDelay = 3600 * s
	b.Run(NameLeakyBucket+"_queue", func(b *testing.B) { bench(b, NewLeakyBucket(qp), 1, unsafe.Sizeof(Bucket{})) })
}

func bench[S any](b *testing.B, a Algorithm[S], step int64, size uintptr) {
	var st S
	now := base
	for range 200 {
		now += step
		st = a.Take(st, now, 1)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		now += step
		if r := a.Decide(st, now, 1); r.Allowed {
			st = a.Take(st, now, 1)
		} else {
			b.Fatalf("denied: %+v", r)
		}
	}
	b.ReportMetric(float64(size), "bytes/key")
}
