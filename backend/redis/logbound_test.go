package redis

import (
	"context"
	"math/rand/v2"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
)

// commandCalls reads the calls and µs of each command from INFO
// commandstats (commands a script runs are counted as well).
func commandCalls(t testing.TB, c *goredis.Client) map[string][2]float64 {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][2]float64{}
	for _, m := range regexp.MustCompile(`cmdstat_([\w|]+):calls=(\d+),usec=(\d+)`).FindAllStringSubmatch(info, -1) {
		n, _ := strconv.ParseFloat(m[2], 64)
		u, _ := strconv.ParseFloat(m[3], 64)
		out[m[1]] = [2]float64{n, u}
	}
	// "script" sums the script's calls, whichever way they ran.
	var all [2]float64
	for _, name := range []string{"fcall", "evalsha", "eval"} {
		all[0] += out[name][0]
		all[1] += out[name][1]
	}
	out["script"] = all
	return out
}

// fillLog logs n events of one unit (after one of two, so that the log
// records units) in key, from 32 goroutines.
func fillLog(t *testing.T, s *Store, z backend.Limit, key string, n int) {
	t.Helper()
	ctx := context.Background()
	if ok, err := s.Decide(ctx, []backend.Request{{Limit: z, Key: key, Cost: 2}}, make([]algorithms.Result, 1)); err != nil || !ok {
		t.Fatalf("first event: %v %v", ok, err)
	}
	var wg sync.WaitGroup
	jobs := make(chan struct{}, n)
	for range n {
		jobs <- struct{}{}
	}
	close(jobs)
	for range 32 {
		wg.Go(func() {
			out := make([]algorithms.Result, 1)
			for range jobs {
				if ok, err := s.Decide(ctx, []backend.Request{{Limit: z, Key: key, Cost: 1}}, out); err != nil || !ok {
					t.Errorf("filling the log: %v %v", ok, err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// A client that chooses its costs logs many tiny events, then asks for
// costs close to the limit: each denied call must find its retry time in
// a few reads of the log, not by walking it. The reads per call are
// counted by Redis (GETRANGE calls made by the script) and must grow with
// log2 of the events held, not with the events.
func TestLogDeniedCallIsBounded(t *testing.T) {
	addr, err := startServer()
	if err != nil {
		t.Fatal(err)
	}
	c := goredis.NewClient(&goredis.Options{Addr: addr, ContextTimeoutEnabled: true, PoolSize: 64})
	t.Cleanup(func() { c.Close() })
	s, err := New(c, Options{KeyPrefix: uniquePrefix(t), Timeout: 10 * time.Second, NoCache: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	const limit = 1_000_000
	z := mustZone(t, s, "costly", algorithms.NameSlidingWindow, policy(limit, time.Hour))
	ctx := context.Background()
	for _, n := range []int{1_000, 30_000} {
		key := "k" + strconv.Itoa(n)
		fillLog(t, s, z, key, n)
		before := commandCalls(t, c)
		const calls = 200
		out := make([]algorithms.Result, 1)
		for i := range calls {
			// A new cost each time (the over-limit cache would answer a
			// repeated one): every call needs nearly all the units held.
			cost := int64(limit - i)
			ok, err := s.Decide(ctx, []backend.Request{{Limit: z, Key: key, Cost: cost}}, out)
			if err != nil || ok || out[0].RetryAfter <= 0 {
				t.Fatalf("%d events, cost %d: %v %v %+v", n, cost, ok, err, out[0])
			}
		}
		after := commandCalls(t, c)
		reads := (after["getrange"][0] - before["getrange"][0]) / calls
		evals := after["script"][0] - before["script"][0]
		usec := (after["script"][1] - before["script"][1]) / evals
		t.Logf("%d events: %.1f reads and %.1f µs of Redis per denied call", n+1, reads, usec)
		// The header, one node per level of the tree, one chunk of events.
		if bound := 2 + 2*log2(n+1); reads > float64(bound) {
			t.Fatalf("%d events: %.1f reads per denied call, more than %d", n+1, reads, bound)
		}
	}
}

func log2(n int) int {
	b := 0
	for ; n > 1; n >>= 1 {
		b++
	}
	return b + 1
}

// A long log of varying costs, against the memory store: events given back
// from anywhere in the log (the tree updated above them, the last event
// truncated), denied requests whose retry time lies deep in the log, the
// clock stepping back, compactions along the way.
func TestDifferentialLongVariableLog(t *testing.T) {
	client := standaloneClient(t)
	for run := range diffRuns(3) {
		r := rand.New(rand.NewPCG(uint64(run), 5))
		tw := newTwinWith(t, client, false, t0, zoneSpec{name: "vlog", alg: algorithms.NameSlidingWindow, policy: policy(2000, time.Second)})
		for i := range 4000 {
			var cost int64
			switch r.IntN(10) {
			case 0:
				cost = int64(1 + r.IntN(2000)) // large: mostly denied, retry deep in the log
			case 1:
				cost = 0
			case 2, 3:
				cost = int64(1 + r.IntN(40))
			default:
				cost = 1
			}
			tw.do(ask{0, "k", cost, false})
			if len(tw.granted) > 64 {
				tw.granted = tw.granted[1:]
			}
			if len(tw.granted) > 0 && r.IntN(4) == 0 {
				if r.IntN(3) == 0 {
					tw.giveBackLast()
				} else {
					tw.giveBack(r.IntN(len(tw.granted)))
				}
			}
			switch {
			case i%700 == 699:
				tw.clock -= int64(r.IntN(5_000_000)) // steps back
			case r.IntN(50) == 0:
				tw.clock += int64(r.IntN(int(time.Second)))
			default:
				tw.clock += int64(r.IntN(2_000_000))
			}
		}
	}
}
