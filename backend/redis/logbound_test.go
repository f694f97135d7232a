package redis

import (
	"context"
	"fmt"
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

// A long log in a steady state (an event leaves the window for each one
// logged) is rewritten whole only when its pruned part outgrows its live
// part: amortized O(1) events copied per decision, however long. The
// whole rewrites (SET) times the events each copies, per decision, must
// not grow with the log.
func TestLogSteadyRewritesBounded(t *testing.T) {
	c, s, clock := ownClockStore(t)
	const W = int64(time.Hour)
	ctx := context.Background()
	for _, L := range []int{1000, 100_000} {
		z := mustZone(t, s, fmt.Sprintf("z%d", L), algorithms.NameSlidingWindow, algorithms.Policy{Limit: int64(L), Window: W})
		times := make([]int64, L)
		units := make([]uint32, L)
		for i := range times {
			times[i] = *clock - W + int64(i+1)*(W/int64(L))
			units[i] = 1
		}
		if err := c.Set(ctx, z.(*zone).stateKey("k"), logValue(times, units, 0, 0, 0), 0).Err(); err != nil {
			t.Fatal(err)
		}
		out := make([]algorithms.Result, 1)
		req := []backend.Request{{Limit: z, Key: "k", Cost: 1}}
		*clock += W / int64(L)
		if _, err := s.Decide(ctx, req, out); err != nil { // the log in the format it keeps
			t.Fatal(err)
		}
		before := commandCalls(t, c)
		const calls = 600
		for range calls {
			*clock += W / int64(L)
			if ok, err := s.Decide(ctx, req, out); err != nil || !ok {
				t.Fatalf("%v %v", ok, err)
			}
		}
		after := commandCalls(t, c)
		sets := after["set"][0] - before["set"][0]
		usec := (after["script"][1] - before["script"][1]) / calls
		copied := sets * float64(L) / calls
		t.Logf("%d events: %.0f whole rewrites in %d decisions, %.0f events copied and %.1f µs of Redis per decision", L, sets, calls, copied, usec)
		if L > 1000 && copied > 64 {
			t.Errorf("%d events: %.0f events copied per decision in a steady state (%.0f whole rewrites in %d decisions, %.1f µs each)", L, copied, sets, calls, usec)
		}
	}
}

// After max_events falls below the events a long log holds (an adaptive
// limit, a reload), requests are denied until enough events leave, each
// pruning the few that left since the last: a denied call's cost must not
// grow with the log. The reads of the log per denied call (GETRANGE,
// counted by Redis) and the peak of Redis's memory over the calls of a
// log of 100k events must be those of a log of 1k.
func TestLogDeniedAfterLimitFallsIsBounded(t *testing.T) {
	c, s, clock := ownClockStore(t)
	const W = int64(time.Hour)
	ctx := context.Background()
	var reads [2]float64
	var peak [2]int64
	for k, L := range []int{1000, 100_000} {
		z := mustZone(t, s, fmt.Sprintf("z%d", L), algorithms.NameSlidingWindow, algorithms.Policy{Limit: int64(L) + 10, Window: W})
		// A log with room, as this build keeps it: nothing is
		// rewritten whole before the count.
		times := make([]int64, L)
		for i := range times {
			times[i] = *clock - W + int64(i+1)*(W/int64(L))
		}
		base := times[0] / 1e9 * 1e9
		v := roomValue(times, 0, uint32(3+L+L/8+16), float64(times[L-1]-base), float64(times[L-1]+W+W/16-base))
		if err := c.Set(ctx, z.(*zone).stateKey("k"), v, 0).Err(); err != nil {
			t.Fatal(err)
		}
		out := make([]algorithms.Result, 1)
		req := []backend.Request{{Limit: z, Key: "k", Cost: 1}}
		if _, err := s.Decide(ctx, req, out); err != nil {
			t.Fatal(err)
		}
		if err := z.(backend.Adjustable).SetMaxEvents(int64(L / 2)); err != nil {
			t.Fatal(err)
		}
		// (CONFIG RESETSTAT starts the peak of Redis's memory afresh,
		// at what it holds.)
		if err := c.ConfigResetStat(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		held := memoryField(t, c, "used_memory_peak")
		before := commandCalls(t, c)
		const calls = 200
		for range calls {
			*clock += W / int64(L) // an event leaves
			if ok, err := s.Decide(ctx, req, out); err != nil || ok {
				t.Fatalf("%v %v", ok, err)
			}
		}
		after := commandCalls(t, c)
		reads[k] = (after["getrange"][0] - before["getrange"][0]) / calls
		peak[k] = memoryField(t, c, "used_memory_peak") - held
		t.Logf("%d events: %.1f reads, %d bytes of peak memory and %.1f µs of Redis per denied call", L, reads[k], peak[k], (after["script"][1]-before["script"][1])/calls)
	}
	// Read whole, the log of 100k events is a string of 800 KB in Lua.
	if reads[1] > reads[0]+1 || peak[1] > peak[0]+256<<10 {
		t.Errorf("a denied call reads the log %.1f times with 100k events, %.1f with 1k; Redis's memory peaks %d bytes higher, %d",
			reads[1], reads[0], peak[1], peak[0])
	}
}

// memoryField is a number of INFO memory.
func memoryField(t *testing.T, c *goredis.Client, name string) int64 {
	t.Helper()
	info, err := c.Info(context.Background(), "memory").Result()
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^` + name + `:(\d+)`).FindStringSubmatch(info)
	if m == nil {
		t.Fatalf("no %s in INFO memory", name)
	}
	v, _ := strconv.ParseInt(m[1], 10, 64)
	return v
}

// ownClockStore is a store on a server of its own (whose commandstats
// count the test's calls alone), on the test's clock.
func ownClockStore(t *testing.T) (*goredis.Client, *Store, *int64) {
	t.Helper()
	addr, err := startServer()
	if err != nil {
		t.Fatal(err)
	}
	c := goredis.NewClient(&goredis.Options{Addr: addr, ContextTimeoutEnabled: true, PoolSize: 4})
	t.Cleanup(func() { c.Close() })
	clock := new(int64)
	*clock = 1_764_460_000_000_000_000
	s, err := New(c, Options{KeyPrefix: uniquePrefix(t), Timeout: 10 * time.Second, now: func() int64 { return *clock }, ttlExtra: 3_600_000, NoCache: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return c, s, clock
}
