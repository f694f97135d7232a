package memory

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/time/rate"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
)

// keys15 returns n distinct 15-byte keys (the size of an IPv4 address).
func keys15(n int) []string {
	k := make([]string, n)
	for i := range k {
		k[i] = fmt.Sprintf("%015d", i)
	}
	return k
}

// keyGen writes the i-th 15-byte key into one reused buffer, as a request
// brings a fresh key each time: a benchmark walking a slice of a million
// strings would stream 32 MB through the cache and measure that instead.
type keyGen struct{ buf [15]byte }

func (g *keyGen) key(i int) string {
	for j := len(g.buf) - 1; j >= 0; j-- {
		g.buf[j] = byte('0' + i%10)
		i /= 10
	}
	return unsafe.String(&g.buf[0], len(g.buf))
}

// benchZone is a zone that never denies, so every decision also takes.
func benchZone(b *testing.B, s *Store, alg string) backend.Limit {
	z, err := s.Register(backend.LimitConfig{
		Name:      b.Name(),
		Algorithm: alg,
		Policy:    algorithms.Policy{Limit: 1 << 40, Window: int64(time.Hour)},
		MaxKeys:   4 << 20,
	})
	if err != nil {
		b.Fatal(err)
	}
	return z
}

// One decision on an existing key, the system clock read included.
func BenchmarkDecide(b *testing.B) {
	for _, alg := range []string{algorithms.NameTokenBucket, algorithms.NameGCRA} {
		for _, n := range []int{1, 1_000_000} {
			b.Run(fmt.Sprintf("%s/keys=%d", alg, n), func(b *testing.B) {
				s := New(Options{})
				defer s.Close()
				z := benchZone(b, s, alg)
				var g keyGen
				reqs := []backend.Request{{Limit: z, Cost: 1}}
				out := make([]algorithms.Result, 1)
				ctx := context.Background()
				for i := 0; i < n; i++ {
					reqs[0].Key = g.key(i)
					_, _ = s.Decide(ctx, reqs, out)
				}
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; b.Loop(); i++ {
					reqs[0].Key = g.key(i % n)
					if ok, _ := s.Decide(ctx, reqs, out); !ok {
						b.Fatal("denied")
					}
				}
			})
		}
	}
}

func BenchmarkDecideParallel(b *testing.B) {
	for _, n := range []int{1, 1_000_000} {
		b.Run(fmt.Sprintf("token_bucket/keys=%d", n), func(b *testing.B) {
			s := New(Options{})
			defer s.Close()
			z := benchZone(b, s, algorithms.NameTokenBucket)
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				var g keyGen
				reqs := []backend.Request{{Limit: z, Cost: 1}}
				out := make([]algorithms.Result, 1)
				i := 0
				for pb.Next() {
					reqs[0].Key = g.key(i % n)
					i += 7919
					_, _ = s.Decide(context.Background(), reqs, out)
				}
			})
		})
	}
}

// A request over two zones (all-or-nothing path).
func BenchmarkDecideTwoZones(b *testing.B) {
	s := New(Options{})
	defer s.Close()
	z1 := benchZone(b, s, algorithms.NameTokenBucket)
	z2, _ := s.Register(backend.LimitConfig{Name: b.Name() + "2", Algorithm: algorithms.NameSlidingWindow,
		Policy: algorithms.Policy{Limit: 1 << 30, Window: int64(time.Millisecond)}})
	reqs := []backend.Request{{Limit: z1, Key: "203.0.113.195", Cost: 1}, {Limit: z2, Key: "203.0.113.195", Cost: 1}}
	out := make([]algorithms.Result, 2)
	b.ReportAllocs()
	for b.Loop() {
		_, _ = s.Decide(context.Background(), reqs, out)
	}
}

// Heap growth per tracked key over 1,000,000 15-byte keys, map index
// included: reported as bytes/key.
func BenchmarkBytesPerKey(b *testing.B) {
	for _, alg := range []string{algorithms.NameTokenBucket, algorithms.NameSlidingWindow} {
		b.Run(alg, func(b *testing.B) {
			const n = 1_000_000
			keys := keys15(n)
			reqs := []backend.Request{{Cost: 1}}
			out := make([]algorithms.Result, 1)
			var perKey float64
			for i := 0; b.Loop(); i++ {
				s := New(Options{})
				z, err := s.Register(backend.LimitConfig{Name: fmt.Sprint(b.Name(), i), Algorithm: alg,
					Policy: algorithms.Policy{Limit: 10, Window: int64(time.Hour)}, MaxKeys: 2 * n})
				if err != nil {
					b.Fatal(err)
				}
				reqs[0].Limit = z
				before := heapInUse()
				for _, k := range keys {
					reqs[0].Key = k
					_, _ = s.Decide(context.Background(), reqs, out)
				}
				perKey = float64(heapInUse()-before) / n
				runtime.KeepAlive(z)
				_ = s.Close()
			}
			b.ReportMetric(perKey, "bytes/key")
		})
	}
}

func heapInUse() int64 {
	alloc, _ := heapNow()
	return alloc
}

// heapNow returns, after a collection, the live heap and the heap in spans
// in use (live objects plus the free room inside their spans).
func heapNow() (alloc, spans int64) {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc), int64(m.HeapInuse)
}

// The usual in-process design, for ratios in the same run: one
// golang.org/x/time/rate token bucket per key in a map behind a mutex.
type baseline struct {
	mu sync.Mutex
	m  map[string]*rate.Limiter
}

func (bl *baseline) get(k string) *rate.Limiter {
	bl.mu.Lock()
	l, ok := bl.m[k]
	if !ok {
		// A rate that never denies, but not rate.Inf, which skips the math.
		l = rate.NewLimiter(rate.Limit(1e9), 1<<30)
		bl.m[strings.Clone(k)] = l
	}
	bl.mu.Unlock()
	return l
}

func BenchmarkBaselineXTimeRate(b *testing.B) {
	for _, n := range []int{1, 1_000_000} {
		b.Run(fmt.Sprintf("keys=%d", n), func(b *testing.B) {
			bl := &baseline{m: make(map[string]*rate.Limiter)}
			var g keyGen
			for i := 0; i < n; i++ {
				bl.get(g.key(i))
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				if !bl.get(g.key(i % n)).Allow() {
					b.Fatal("denied")
				}
			}
		})
	}
}

func BenchmarkBaselineXTimeRateBytesPerKey(b *testing.B) {
	const n = 1_000_000
	var perKey float64
	for b.Loop() {
		bl := &baseline{m: make(map[string]*rate.Limiter)}
		var g keyGen
		before := heapInUse()
		for i := 0; i < n; i++ {
			bl.get(g.key(i)).Allow()
		}
		perKey = float64(heapInUse()-before) / n
		runtime.KeepAlive(bl)
	}
	b.ReportMetric(perKey, "bytes/key")
}
