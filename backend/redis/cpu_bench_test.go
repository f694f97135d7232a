package redis

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
)

// BenchmarkRedisCPU measures Redis's CPU per decision of batch calls of
// per decisions, each of one key of 10,000 (of 10 in the hot rows), all allowed: "rt" has one call
// in flight (the store's shape at low load), "pipe" writes 16 calls at
// once. redis_µs/decision is the server process's CPU (INFO cpu: its
// user and system time, so the sockets' work too), cmd_µs/decision the
// script calls' alone (INFO commandstats). Both are CPU time, which other
// load on the machine does not inflate. SLUICE_BENCH_REDIS=host:port runs
// it against that server instead of the test's own, which
// bench/redis-cpu.sh does to compare two versions on one server:
//
//	go test -run '^$' -bench RedisCPU -benchtime 20000x ./backend/redis/
func BenchmarkRedisCPU(b *testing.B) {
	for _, alg := range []string{algorithms.NameTokenBucket, algorithms.NameSlidingWindow} {
		for _, per := range []int{1, 8, 64} {
			for _, pipe := range []int{1, 16} {
				shape := "rt"
				if pipe > 1 {
					shape = "pipe"
				}
				b.Run(fmt.Sprintf("%s/per_call=%d/%s", alg, per, shape), func(b *testing.B) {
					benchRedisCPU(b, alg, per, pipe, 10_000, 1, 0)
				})
				// Ten keys that expire an hour late, as a few busy
				// clients' keys: their values are there when read
				// (decidePlain's keys most often are not,
				// decideAbsent).
				if alg == algorithms.NameTokenBucket {
					b.Run(fmt.Sprintf("%s/hot/per_call=%d/%s", alg, per, shape), func(b *testing.B) {
						benchRedisCPU(b, alg, per, pipe, 10, 1, 0)
					})
				}
				// Logs of 150 events and more, as a log holds after a
				// minute of a few requests a second (the end-to-end
				// bench's, at 1000/1m): each event logged copies them.
				// Past 4 KB (700 events and more), a log is written past
				// its end, not whole.
				if alg == algorithms.NameSlidingWindow {
					b.Run(fmt.Sprintf("%s/full/per_call=%d/%s", alg, per, shape), func(b *testing.B) {
						benchRedisCPU(b, alg, per, pipe, 64, 150, 0)
					})
					b.Run(fmt.Sprintf("%s/long/per_call=%d/%s", alg, per, shape), func(b *testing.B) {
						benchRedisCPU(b, alg, per, pipe, 16, 700, 0)
					})
					// Logs as the end-to-end bench's keep them: a
					// window of a second over which each of 64 keys
					// takes 100 requests, so that each request's event
					// replaces one that left (the clock is the test's).
					b.Run(fmt.Sprintf("%s/steady/per_call=%d/%s", alg, per, shape), func(b *testing.B) {
						benchRedisCPU(b, alg, per, pipe, 64, 150, int64(time.Second)/(64*100))
					})
				}
			}
		}
	}
}

// benchRedisCPU decides per requests a call, pipe calls at once, over
// keys keys in turn, each of which has taken fill requests before the
// count. With tick, the store's clock is the test's, a window is a
// second, and each request moves the clock by tick ns.
func benchRedisCPU(b *testing.B, alg string, per, pipe, keys, fill int, tick int64) {
	addr := os.Getenv("SLUICE_BENCH_REDIS")
	if addr == "" {
		addr = standalone(b)
	}
	c := goredis.NewClient(&goredis.Options{Addr: addr, ContextTimeoutEnabled: true})
	b.Cleanup(func() { c.Close() })
	opts := Options{KeyPrefix: uniquePrefix(b), Timeout: time.Minute, NoCache: true}
	if keys < 10_000 {
		opts.ttlExtra = 3_600_000
	}
	window := time.Hour
	clock := time.Now().UnixNano()
	if tick > 0 {
		opts.now = func() int64 { return clock }
		window = time.Second
	}
	s, err := New(c, opts)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	// A limit no run reaches, over a window that keeps every key alive.
	z := mustZone(b, s, "cpu", alg, policy(1<<30, window))
	ctx := context.Background()
	calls := make([][]*pending, pipe)
	n := 0
	batch := func() []*pending {
		live := make([]*pending, per)
		for i := range live {
			items, _, err := s.resolve([]backend.Request{{Limit: z, Key: fmt.Sprintf("10.0.%d.%d", n/256%40, n%256), Cost: 1}})
			if err != nil {
				b.Fatal(err)
			}
			n = (n + 1) % keys
			live[i] = &pending{ctx: ctx, deadline: time.Now().Add(time.Hour), items: items, results: make([]algorithms.Result, 1), done: make(chan struct{}, 1)}
		}
		return live
	}
	// The calls go as the store sends them: one alone, or several in one
	// pipeline.
	run := func() {
		gs := make([]group, pipe)
		for k := range gs {
			clock += tick * int64(len(calls[k]))
			gs[k].cmd, _ = s.manyCmd(ctx, calls[k], nil)
		}
		s.run(ctx, gs)
		for k := range gs {
			if err := parseBatch(gs[k].cmd, calls[k]); err != nil {
				b.Fatal(err)
			}
			for _, p := range calls[k] {
				if p.err != nil || !p.allowed {
					b.Fatalf("%v %v", p.err, p.allowed)
				}
			}
		}
	}
	// Warm up: the function (or script) is loaded, and every key exists.
	for range (keys*fill + per*pipe - 1) / (per * pipe) {
		for k := range calls {
			calls[k] = batch()
		}
		run()
	}
	// The keys in turn, as many clients' requests, made before the count.
	runs := make([][][]*pending, (b.N+per*pipe-1)/(per*pipe))
	for r := range runs {
		runs[r] = make([][]*pending, pipe)
		for k := range runs[r] {
			runs[r][k] = batch()
		}
	}
	cpu0, cmd0 := redisCPU(b, c)
	b.ResetTimer()
	for _, r := range runs {
		calls = r
		run()
	}
	b.StopTimer()
	cpu1, cmd1 := redisCPU(b, c)
	done := float64((b.N + per*pipe - 1) / (per * pipe) * per * pipe)
	b.ReportMetric((cpu1-cpu0)/done, "redis_µs/decision")
	b.ReportMetric((cmd1-cmd0)/done, "cmd_µs/decision")
	b.ReportMetric(0, "ns/op")
}

// redisCPU is the server's CPU time so far and its script calls', in µs.
func redisCPU(b *testing.B, c *goredis.Client) (process, scripts float64) {
	info, err := c.Info(context.Background(), "cpu", "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	for _, f := range []string{"used_cpu_user", "used_cpu_sys"} {
		m := regexp.MustCompile(f + `:([0-9.]+)`).FindStringSubmatch(info)
		v, _ := strconv.ParseFloat(m[1], 64)
		process += v * 1e6
	}
	for _, name := range []string{"fcall", "evalsha", "eval"} {
		if m := regexp.MustCompile(`cmdstat_` + name + `:calls=\d+,usec=(\d+)`).FindStringSubmatch(info); m != nil {
			v, _ := strconv.ParseFloat(m[1], 64)
			scripts += v
		}
	}
	return process, scripts
}
