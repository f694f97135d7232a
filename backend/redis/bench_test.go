package redis

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/internal/redistest"
)

// Benchmarks against the local redis-server the tests start (loopback).
// decisions/s is what the client saw; server_µs/call is the script's CPU
// time in Redis (INFO commandstats), which bounds one Redis core at
// 1e6/server_µs decisions per second.

func commandStats(b testing.TB, c *goredis.Client) (calls, usec float64) {
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	for _, name := range []string{"fcall", "evalsha", "eval"} {
		m := regexp.MustCompile(`cmdstat_` + name + `:calls=(\d+),usec=(\d+)`).FindStringSubmatch(info)
		if m != nil {
			n, _ := strconv.ParseFloat(m[1], 64)
			u, _ := strconv.ParseFloat(m[2], 64)
			calls += n
			usec += u
		}
	}
	return calls, usec
}

func benchDecide(b *testing.B, alg string, p algorithms.Policy, keys int) {
	benchDecideWith(b, alg, p, keys, Options{}, 32)
}

// benchAdapted is how many events per window an adaptive limit moved the
// benchmark's zone to (0: as registered).
var benchAdapted int64

func benchDecideWith(b *testing.B, alg string, p algorithms.Policy, keys int, opts Options, parallelism int) {
	benchDecideOn(b, standaloneClient(b), alg, p, keys, opts, parallelism)
}

func benchDecideOn(b *testing.B, c *goredis.Client, alg string, p algorithms.Policy, keys int, opts Options, parallelism int) {
	opts.KeyPrefix = uniquePrefix(b)
	opts.Timeout = 10 * time.Second
	s, err := New(c, opts)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	z := mustZone(b, s, "bench", alg, p)
	if benchAdapted != 0 {
		if err := z.(backend.Adjustable).SetMaxEvents(benchAdapted); err != nil {
			b.Fatal(err)
		}
	}
	names := make([]string, keys)
	for i := range names {
		names[i] = fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255)
	}
	ctx := context.Background()
	// Warm up: the script is loaded and the keys exist.
	for _, k := range names {
		if _, err := s.Decide(ctx, []backend.Request{{Limit: z, Key: k, Cost: 1}}, make([]algorithms.Result, 1)); err != nil {
			b.Fatal(err)
		}
	}
	calls0, usec0 := commandStats(b, c)
	cpu0 := cpuNanos()
	var next atomic.Int64
	b.SetParallelism(parallelism) // × GOMAXPROCS goroutines, as many requests in flight
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		out := make([]algorithms.Result, 1)
		for pb.Next() {
			k := names[int(next.Add(1))%len(names)]
			if _, err := s.Decide(ctx, []backend.Request{{Limit: z, Key: k, Cost: 1}}, out); err != nil {
				b.Error(err)
				return
			}
		}
	})
	elapsed := time.Since(start)
	cpu := cpuNanos() - cpu0
	b.StopTimer()
	if cpu > 0 {
		// The client's side: this process's CPU (the servers are
		// processes of their own).
		b.ReportMetric(float64(cpu)/1e3/float64(b.N), "client_cpu_µs/decision")
	}
	calls1, usec1 := commandStats(b, c)
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "decisions/s")
	if calls1 > calls0 {
		b.ReportMetric((usec1-usec0)/(calls1-calls0), "server_µs/call")
		// A batch decides many requests in one call.
		b.ReportMetric((usec1-usec0)/float64(b.N), "server_µs/decision")
		b.ReportMetric(float64(b.N)/(calls1-calls0), "decisions/call")
	}
}

func BenchmarkScript(b *testing.B) {
	// Policies that allow every request and keep every key alive for the
	// whole run (a key that expires within a millisecond costs Redis its
	// creation and expiry on every decision, which real keys do not).
	const days11 = 1_000_000 * time.Second
	for _, alg := range algorithms.Names() {
		var p algorithms.Policy
		switch alg {
		case algorithms.NameSlidingWindow:
			p = policy(1000, time.Hour) // one key: its log fills, then it denies
		case algorithms.NameFixedWindow, algorithms.NameSlidingCounter:
			p = policy(1<<40, days11)
		case algorithms.NameLeakyBucket:
			p = policy(1_000_000, days11) // one unit per second
			p.MaxDelay = int64(days11)
		default:
			p = policy(1_000_000, days11)
		}
		for _, keys := range []int{1, 10_000} {
			b.Run(fmt.Sprintf("%s/keys=%d", alg, keys), func(b *testing.B) { benchDecide(b, alg, p, keys) })
		}
	}
}

// BenchmarkScriptAdapted is BenchmarkScript's buckets with max_events
// moved by an adaptive limit: the script then reads the interval it decides
// with apart from the one the state is written under ("T/R").
func BenchmarkScriptAdapted(b *testing.B) {
	benchAdapted = 1_500_000
	defer func() { benchAdapted = 0 }()
	for _, alg := range []string{algorithms.NameTokenBucket, algorithms.NameGCRA} {
		b.Run(alg+"/keys=10000", func(b *testing.B) { benchDecide(b, alg, policy(1_000_000, 1_000_000*time.Second), 10_000) })
	}
}

// BenchmarkBatching compares the ways concurrent decisions reach Redis, at
// 64 and 2 requests in flight (GOMAXPROCS=2), 10,000 keys: one script call
// deciding each batch (the default), go-redis automatic pipelining of one
// script call per decision, and one call per decision on a connection of
// its own.
func BenchmarkBatching(b *testing.B) {
	p := policy(1_000_000, 1_000_000*time.Second)
	modes := []struct {
		name string
		opts Options
	}{
		{"script", Options{NoCache: true}},
		{"pipeline", Options{NoCache: true, pipeline: true}},
		{"unbatched", Options{NoCache: true, NoBatch: true}},
	}
	for _, par := range []int{32, 1} {
		for _, m := range modes {
			b.Run(fmt.Sprintf("batched=%s/parallelism=%d", m.name, par), func(b *testing.B) {
				benchDecideWith(b, algorithms.NameTokenBucket, p, 10_000, m.opts, par)
			})
		}
	}
}

// BenchmarkProtocol is BenchmarkBatching's batched calls, at 64 and 2
// requests in flight, over a client speaking RESP2 and one speaking RESP3
// (go-redis's default, which peeks for push notifications before each
// reply).
func BenchmarkProtocol(b *testing.B) {
	p := policy(1_000_000, 1_000_000*time.Second)
	for _, par := range []int{32, 1} {
		for _, proto := range []int{2, 3} {
			b.Run(fmt.Sprintf("parallelism=%d/resp=%d", par, proto), func(b *testing.B) {
				c := goredis.NewClient(&goredis.Options{Addr: standalone(b), ContextTimeoutEnabled: true, PoolSize: 64, Protocol: proto})
				b.Cleanup(func() { c.Close() })
				benchDecideOn(b, c, algorithms.NameTokenBucket, p, 10_000, Options{NoCache: true}, par)
			})
		}
	}
}

// BenchmarkMemory reports Redis memory per tracked key (MEMORY USAGE of
// each key a client's first request writes, and the growth of used_memory
// over 10,000 clients, which adds the expiry entries and the hash tables)
// for every kind of state, and per sliding-log event.
//
//	CI=true go test -run '^$' -bench Memory -benchtime 1x ./backend/redis/
func BenchmarkMemory(b *testing.B) {
	ctx := context.Background()
	c := standaloneClient(b)
	// Each count starts from an empty server of its own: the hash tables'
	// growth depends on how many keys were there before.
	fresh := func(b *testing.B) *goredis.Client {
		srv, err := redistest.StartServer(nil)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(srv.Stop)
		c := goredis.NewClient(&goredis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
		b.Cleanup(func() { c.Close() })
		return c
	}
	usedMemory := func(c *goredis.Client) float64 {
		info, err := c.Info(ctx, "memory").Result()
		if err != nil {
			b.Fatal(err)
		}
		m := regexp.MustCompile(`used_memory:(\d+)`).FindStringSubmatch(info)
		v, _ := strconv.ParseFloat(m[1], 64)
		return v
	}
	const keys = 10_000
	p := policy(100, time.Hour)
	q := p
	q.MaxDelay = 10 * q.Interval()
	for _, st := range []struct {
		name, alg string
		p         algorithms.Policy
		cfg       func(*backend.LimitConfig)
		req       func(*backend.Request)
		requests  int // per key; 1 when 0
	}{
		{name: "token_bucket", alg: algorithms.NameTokenBucket, p: p},
		{name: "gcra", alg: algorithms.NameGCRA, p: p},
		{name: "leaky_bucket", alg: algorithms.NameLeakyBucket, p: p},
		{name: "leaky_bucket_queue", alg: algorithms.NameLeakyBucket, p: q},
		{name: "fixed_window", alg: algorithms.NameFixedWindow, p: p},
		{name: "sliding_window_counter", alg: algorithms.NameSlidingCounter, p: p},
		{name: "sliding_window", alg: algorithms.NameSlidingWindow, p: p},
		// A spend budget's state and its one open reservation.
		{name: "budget_reserved", alg: algorithms.NameSlidingWindow, p: p, req: func(r *backend.Request) {
			r.Reserve, r.Token = int64(time.Minute), 1
		}},
		// A key of limit 1 denied once: its state and its lock-out record.
		{name: "lockout_locked", alg: algorithms.NameTokenBucket, p: policy(1, time.Hour), requests: 2, cfg: func(c *backend.LimitConfig) {
			c.Lockout = backend.Lockout{int64(time.Minute)}
		}},
	} {
		b.Run("per_key/"+st.name, func(b *testing.B) {
			for range b.N {
				c := fresh(b)
				s := newStore(b, c)
				cfg := backend.LimitConfig{Name: "mem", Algorithm: st.alg, Policy: st.p}
				if st.cfg != nil {
					st.cfg(&cfg)
				}
				z, err := s.Register(cfg)
				if err != nil {
					b.Fatal(err)
				}
				before := usedMemory(c)
				for i := range keys {
					r := backend.Request{Limit: z, Key: fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255), Cost: 1}
					if st.req != nil {
						st.req(&r)
					}
					for range max(st.requests, 1) {
						if _, err := s.Decide(ctx, []backend.Request{r}, make([]algorithms.Result, 1)); err != nil {
							b.Fatal(err)
						}
					}
				}
				grown := usedMemory(c) - before
				state := z.(*zone).stateKey("10.0.0.1")
				var usage int64
				for _, k := range []string{state, reservationsKey(state), clientKey(z.(*zone).lockPrefix, "10.0.0.1")} {
					n, err := c.MemoryUsage(ctx, k).Result()
					if err != nil && err != goredis.Nil {
						b.Fatal(err)
					}
					usage += n
				}
				b.ReportMetric(float64(usage), "MEMORY_USAGE_B/key")
				b.ReportMetric(grown/keys, "used_memory_B/key")
				b.ReportMetric(float64(len(state)), "key_name_B")
			}
		})
	}
	b.Run("per_key/concurrency_slot", func(b *testing.B) {
		for range b.N {
			c := fresh(b)
			s := newStore(b, c)
			z := mustSlots(b, s, "mem", 10, time.Minute)
			before := usedMemory(c)
			for i := range keys {
				if _, err := z.Acquire(ctx, fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255)); err != nil {
					b.Fatal(err)
				}
			}
			grown := usedMemory(c) - before
			set := clientKey(z.(*slotZone).prefix, "10.0.0.1")
			usage, err := c.MemoryUsage(ctx, set).Result()
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(usage), "MEMORY_USAGE_B/key")
			b.ReportMetric(grown/keys, "used_memory_B/key")
			b.ReportMetric(float64(len(set)), "key_name_B")
			s.Close() // stops renewing; the sets expire with their slots
		}
	})
	for _, events := range []int{100, 1000} {
		for _, wide := range []bool{false, true} {
			b.Run(fmt.Sprintf("per_event/sliding_window/events=%d/costs=%v", events, wide), func(b *testing.B) {
				for range b.N {
					s := newStore(b, c)
					z := mustZone(b, s, "log", algorithms.NameSlidingWindow, policy(1<<30, time.Hour))
					key := z.(*zone).prefix + "k}"
					cost := int64(1)
					if wide {
						cost = 2
					}
					var first int64
					for i := range events {
						if _, err := s.Decide(ctx, []backend.Request{{Limit: z, Key: "k", Cost: cost}}, make([]algorithms.Result, 1)); err != nil {
							b.Fatal(err)
						}
						if i == 0 {
							first, _ = c.MemoryUsage(ctx, key).Result()
						}
					}
					usage, err := c.MemoryUsage(ctx, key).Result()
					if err != nil {
						b.Fatal(err)
					}
					b.ReportMetric(float64(usage), "MEMORY_USAGE_B")
					b.ReportMetric(float64(usage-first)/float64(events-1), "B/event")
				}
			})
		}
	}
}
