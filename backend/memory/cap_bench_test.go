package memory

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
)

// A new key arriving at a full table: every op inserts a key never seen
// before, so every op evicts one. denying is the share of the keys in the
// table that are spent (their next request would be refused): eviction must
// look past them. At 100 % the new keys are spent too, so nothing but
// denying keys is ever left to evict.
func BenchmarkInsertAtCap(b *testing.B) {
	const maxKeys = 100_000
	for _, alg := range []string{algorithms.NameTokenBucket, algorithms.NameSlidingWindow} {
		for _, denying := range []int{0, 90, 100} {
			b.Run(fmt.Sprintf("%s/denying=%d%%", alg, denying), func(b *testing.B) {
				s := New(Options{})
				defer s.Close()
				z, err := s.Register(backend.LimitConfig{Name: b.Name(), Algorithm: alg,
					Policy: algorithms.Policy{Limit: 2, Window: int64(time.Hour)}, MaxKeys: maxKeys})
				if err != nil {
					b.Fatal(err)
				}
				var g keyGen
				reqs := []backend.Request{{Limit: z, Cost: 1}}
				out := make([]algorithms.Result, 1)
				ctx := context.Background()
				for i := 0; i < maxKeys; i++ {
					reqs[0].Key = g.key(i)
					reqs[0].Cost = 1
					if i%100 < denying {
						reqs[0].Cost = 2
					}
					_, _ = s.Decide(ctx, reqs, out)
				}
				reqs[0].Cost = 1
				if denying == 100 {
					reqs[0].Cost = 2
				}
				b.ReportAllocs()
				b.ResetTimer()
				for i := maxKeys; b.Loop(); i++ {
					reqs[0].Key = g.key(i)
					_, _ = s.Decide(ctx, reqs, out)
				}
			})
		}
	}
}

// Live heap of a zone filled to its default max_keys, every key holding
// as much state as its algorithm keeps for a key at its limit (the
// sliding log: a full window of events). Reported per key and in total,
// against the 100 MB the default cap is sized for.
func BenchmarkHeapAtDefaultCap(b *testing.B) {
	const limit = 1000
	type tc struct {
		alg   string
		costs []int64 // cycled through by each key's requests
	}
	var cases []tc
	for _, alg := range algorithms.Names() {
		for _, c := range []int64{1, 3, 7} {
			cases = append(cases, tc{alg, []int64{c}})
		}
	}
	cases = append(cases, tc{algorithms.NameSlidingWindow, []int64{1, 2}}, tc{algorithms.NameSlidingWindow, []int64{2, 1}})
	for _, c := range cases {
		b.Run(fmt.Sprintf("%s/cost=%v", c.alg, c.costs), func(b *testing.B) {
			var perKey, total, spans float64
			var keys int64
			for i := 0; b.Loop(); i++ {
				clock := newFakeClock()
				s := New(Options{Now: clock.now})
				// The handler passes a constant cost on, and 0 for a cost
				// that varies.
				var cost int64
				if len(c.costs) == 1 {
					cost = c.costs[0]
				}
				z, err := s.Register(backend.LimitConfig{Name: fmt.Sprint(b.Name(), i), Algorithm: c.alg,
					Policy: algorithms.Policy{Limit: limit, Window: int64(time.Hour)}, Cost: cost})
				if err != nil {
					b.Fatal(err)
				}
				reqs := []backend.Request{{Limit: z}}
				out := make([]algorithms.Result, 1)
				var g keyGen
				before, beforeSpans := heapNow()
				tbl := tableStats(z)
				// Up to the cap: the first eviction.
				for k := 0; tbl.Evictions() == 0; k++ {
					reqs[0].Key = g.key(k)
					// The log holds a window's worth of events; the other
					// states are the same size after one request.
					for j := 0; ; j++ {
						reqs[0].Cost = c.costs[j%len(c.costs)]
						if ok, _ := s.Decide(context.Background(), reqs, out); !ok || c.alg != algorithms.NameSlidingWindow {
							break
						}
					}
					if k%4096 == 0 {
						clock.advance(time.Microsecond)
					}
				}
				after, afterSpans := heapNow()
				used := after - before
				spans = float64(afterSpans-beforeSpans) / (1 << 20)
				keys = tbl.Keys()
				perKey = float64(used) / float64(keys)
				total = float64(used) / (1 << 20)
				runtime.KeepAlive(z)
				_ = s.Close()
			}
			b.ReportMetric(perKey, "bytes/key")
			b.ReportMetric(total, "MiB")
			b.ReportMetric(float64(keys), "keys")
			b.ReportMetric(spans, "MiB-spans")
		})
	}
}

// A reload that changes the kind of state translates every key of the old
// table while the new config provisions: the time that adds to the reload,
// per key of the old table, into a table that holds them all or only 2 %.
func BenchmarkTakeOver(b *testing.B) {
	for _, newCap := range []int{2_000_000, 20_000} {
		b.Run(fmt.Sprintf("max_keys=%d", newCap), func(b *testing.B) { benchTakeOver(b, newCap) })
	}
}

func benchTakeOver(b *testing.B, newCap int) {
	const n = 1_000_000
	p := algorithms.Policy{Limit: 10, Window: int64(time.Hour)}
	clock := newFakeClock()
	old := New(Options{Now: clock.now})
	defer old.Close()
	oz, err := old.Register(backend.LimitConfig{Name: b.Name(), Algorithm: algorithms.NameTokenBucket, Policy: p, MaxKeys: 2 * n})
	if err != nil {
		b.Fatal(err)
	}
	var g keyGen
	reqs := []backend.Request{{Limit: oz, Cost: 3}}
	out := make([]algorithms.Result, 1)
	for i := 0; i < n; i++ {
		reqs[0].Key = g.key(i)
		_, _ = old.Decide(context.Background(), reqs, out)
	}
	for b.Loop() {
		s := New(Options{Now: clock.now})
		if _, err := s.Register(backend.LimitConfig{Name: b.Name(), Algorithm: algorithms.NameFixedWindow, Policy: p, MaxKeys: newCap}); err != nil {
			b.Fatal(err)
		}
		_ = s.Close()
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/n, "ns/key")
}
