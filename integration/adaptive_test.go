package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/redistest"
)

// load runs clients that send requests back to back until the test ends,
// pausing 10 ms after a refusal so that refused clients do not spin, and
// counts the answers by status.
type load struct {
	stop   chan struct{}
	wg     sync.WaitGroup
	mu     sync.Mutex
	counts map[int]int
}

func startLoad(t *testing.T, clients int) *load { return startLoadOn(t, clients, httpBase) }

func (l *load) end() {
	select {
	case <-l.stop:
	default:
		close(l.stop)
	}
	l.wg.Wait()
}

// take returns the answers counted since the last call.
func (l *load) take() map[int]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := l.counts
	l.counts = map[int]int{}
	return c
}

// adaptiveState is a limit's adaptive block in the admin API's listing.
type adaptiveState struct {
	Limit      int64   `json:"limit"`
	Min        int64   `json:"min"`
	Max        int64   `json:"max"`
	LatencyP99 float64 `json:"last_latency_p99"`
	ErrorRate  float64 `json:"last_error_rate"`
}

// adaptiveNow reads the adaptive state of a zone's limit of that scope
// from the admin API.
func adaptiveNow(t *testing.T, zone, scope string) adaptiveState {
	t.Helper()
	var listing struct {
		Zones []struct {
			Name   string `json:"name"`
			Limits []struct {
				Scope    string         `json:"scope"`
				Adaptive *adaptiveState `json:"adaptive"`
			} `json:"limits"`
		} `json:"zones"`
	}
	if err := json.Unmarshal([]byte(adminRequest(t, "GET", "/rate_limit/zones", "", "")), &listing); err != nil {
		t.Fatal(err)
	}
	for _, z := range listing.Zones {
		for _, l := range z.Limits {
			if z.Name == zone && l.Scope == scope && l.Adaptive != nil {
				return *l.Adaptive
			}
		}
	}
	t.Fatalf("zone %q scope %q has no adaptive limit in the admin API", zone, scope)
	return adaptiveState{}
}

// awaitLimit polls the admin API until the limit satisfies ok, and returns
// the limits it went through (each change seen once).
func awaitLimit(t *testing.T, zone, scope, what string, within time.Duration, ok func(int64) bool) []int64 {
	t.Helper()
	deadline := time.Now().Add(within)
	var seen []int64
	for {
		s := adaptiveNow(t, zone, scope)
		if len(seen) == 0 || seen[len(seen)-1] != s.Limit {
			seen = append(seen, s.Limit)
		}
		if ok(s.Limit) {
			return seen
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: after %v the limit went %v (last interval: p99 %.3fs, error rate %.3f)", what, within, seen, s.LatencyP99, s.ErrorRate)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// expectMetric requires the scrape to hold the series with that value.
func expectMetric(t *testing.T, series string, value int64) {
	t.Helper()
	if got := metricLine(adminRequest(t, "GET", "/metrics", "", ""), series); got != float64(value) {
		t.Fatalf("%s is %v in the metrics, want %d", series, got, value)
	}
}

// A concurrency limit through a real Caddy in front of an upstream that
// slows down: the cap falls while the p99 is above its high mark, the
// upstream then never sees more requests at once than the shrunk cap, and
// the cap grows back to its max once the upstream is fast again.
func TestAdaptiveConcurrencyLatencySpike(t *testing.T) {
	u := newSickUpstream(t)
	newTester(t, caddyfileServer(fmt.Sprintf(`
	rate_limit {
		zone adapt_conc_it {
			key static
			concurrency 16
			adaptive {
				min 3
				max 16
				increase 4
				decrease 0.5
				interval 1s
				latency_p99 300ms 1s
			}
		}
	}
	reverse_proxy %s`, strings.TrimPrefix(u.URL, "http://"))), "caddyfile")
	const zone = "adapt_conc_it"
	l := startLoad(t, 10)

	// Healthy: the cap stays at its max, and nothing is refused.
	time.Sleep(1500 * time.Millisecond) // at least one interval of traffic, a lower bound
	if s := adaptiveNow(t, zone, ""); s.Limit != 16 {
		t.Fatalf("healthy upstream: limit %d, want 16", s.Limit)
	}
	if c := l.take(); c[http.StatusServiceUnavailable] != 0 || c[http.StatusOK] == 0 {
		t.Fatalf("healthy upstream, 10 clients under a cap of 16: %v", c)
	}

	// The spike: 1.5 s per request, above the 1 s mark. (The marks leave
	// room for a loaded machine running Caddy under the race detector.)
	u.delay.Store(int64(1500 * time.Millisecond))
	path := awaitLimit(t, zone, "", "during the spike", 20*time.Second, func(n int64) bool { return n == 3 })
	t.Logf("during the spike the cap went %v", path)
	for i := 1; i < len(path); i++ {
		if path[i] >= path[i-1] {
			t.Fatalf("the cap grew during the spike: %v", path)
		}
	}
	expectMetric(t, `caddy_rate_limit_adaptive_limit{scope="",zone="`+zone+`"}`, 3)
	expectMetric(t, `caddy_rate_limit_adaptive_min_limit{scope="",zone="`+zone+`"}`, 3)
	// Requests admitted under the larger cap finish within 1.5 s; from
	// then on the upstream sees at most 3 at once, and clients get 503.
	peak, c := drainedPeak(u, l, 1500*time.Millisecond)
	t.Logf("with the cap at 3: at most %d at once at the upstream; answers in 1.5 s %v", peak, c)
	if peak > 3 {
		t.Fatalf("with the cap at 3, the upstream served %d at once", peak)
	}
	if c[http.StatusServiceUnavailable] == 0 {
		t.Fatalf("10 clients against a cap of 3: no 503 (%v)", c)
	}
	if s := adaptiveNow(t, zone, ""); s.LatencyP99 < 1.4 {
		t.Fatalf("the last interval's p99 is %.3fs, want about 1.5s", s.LatencyP99)
	}

	// Recovery: fast again, the cap climbs by 4 per interval to 16.
	u.delay.Store(int64(5 * time.Millisecond))
	path = awaitLimit(t, zone, "", "after the spike", 20*time.Second, func(n int64) bool { return n == 16 })
	t.Logf("after the spike the cap went %v", path)
	// Additive: never more than 4 at a time. (A stall of this shared
	// machine can make one interval's p99 slow and halve the cap on the
	// way; it still comes back.)
	for i := 1; i < len(path); i++ {
		if d := path[i] - path[i-1]; d > 4 {
			t.Fatalf("the cap grew by more than 4 in an interval: %v", path)
		}
	}
	expectMetric(t, `caddy_rate_limit_adaptive_limit{scope="",zone="`+zone+`"}`, 16)
}

// A rate limit's max_events follows the upstream's errors, on the memory
// store and on Redis: 502s above the 5% mark halve it down to its min, and
// the limit then admits only that many per window; once the upstream
// answers 200 again, it grows back.
func TestAdaptiveRateErrors(t *testing.T) {
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			backend := adaptiveBackend(t, store)
			u := newSickUpstream(t)
			zone := "adapt_rate_it_" + store
			newTester(t, caddyfileServer(fmt.Sprintf(`
	rate_limit {
		%s
		zone %s {
			key static
			rate 400/1s
			algorithm sliding_window_counter
			adaptive {
				min 20
				increase 200
				decrease 0.5
				interval 1s
				error_rate 1%% 5%%
			}
		}
	}
	reverse_proxy %s`, backend, zone, strings.TrimPrefix(u.URL, "http://"))), "caddyfile")
			l := startLoad(t, 4)
			if s := adaptiveNow(t, zone, ""); s.Limit != 400 || s.Max != 400 || s.Min != 20 {
				t.Fatalf("at the start: %+v, want 400 within [20, 400]", s)
			}
			u.fail.Store(true)
			path := awaitLimit(t, zone, "", "while the upstream fails", 20*time.Second, func(n int64) bool { return n == 20 })
			t.Logf("while the upstream failed the limit went %v", path)
			expectMetric(t, `caddy_rate_limit_adaptive_limit{scope="",zone="`+zone+`"}`, 20)
			// At 20 per second, what passes is about 20 a second: 4 clients
			// back to back would send hundreds.
			l.take()
			u.served.Store(0)
			time.Sleep(2 * time.Second) // a window of load to measure over
			c := l.take()
			t.Logf("with the limit at 20/s: the upstream got %d requests in 2 s; answers %v", u.served.Load(), c)
			if served := u.served.Load(); served > 3*20 || c[http.StatusTooManyRequests] == 0 {
				t.Fatalf("with the limit at 20/s: the upstream got %d requests in 2 s, answers %v", served, c)
			}
			u.fail.Store(false)
			path = awaitLimit(t, zone, "", "after the failures", 20*time.Second, func(n int64) bool { return n == 400 })
			t.Logf("after the failures the limit went %v", path)
			l.end()
		})
	}
}

// The complete example of docs/protection.md loads as written, and both
// adaptive limits start at their configured limit within their bounds.
func TestDocsAdaptiveExample(t *testing.T) {
	tester := newTester(t, docSite(t, "../docs/protection.md", "latency_p99 200ms 500ms\n\t\t\t\terror_rate"), "caddyfile")
	expectN(t, tester, 3, http.StatusOK, "GET", "/")
	for _, c := range []struct {
		zone, scope   string
		limit, lo, hi int64
	}{
		{"api_in_flight", "", 500, 50, 2000},
		{"api_rate", "site", 5000, 1000, 10000},
	} {
		if s := adaptiveNow(t, c.zone, c.scope); s.Limit != c.limit || s.Min != c.lo || s.Max != c.hi {
			t.Errorf("%s/%s: %+v, want %d within [%d, %d]", c.zone, c.scope, s, c.limit, c.lo, c.hi)
		}
	}
}

// Nonsense in an adaptive block is refused by a running Caddy's /load,
// naming the field (and the line, from a Caddyfile).
func TestAdaptiveConfigErrors(t *testing.T) {
	site := func(limit, adaptive string) string {
		return caddyfileServer(`
	rate_limit {
		zone adapt_bad {
			key static
			` + limit + `
			adaptive {
				` + adaptive + `
			}
		}
	}
	respond "ok"`)
	}
	for _, c := range []struct{ limit, adaptive, want string }{
		{"concurrency 100", "min 300\n\t\t\t\tmax 200", "adaptive: min 300 is above max 200, at Caddyfile:"},
		{"concurrency 100", "decrease 1.2", "adaptive: decrease must be a fraction strictly between 0 and 1"},
		{"concurrency 100", "latency_p99 500ms 200ms", "adaptive: latency_p99 low mark 500ms must be below the high mark 200ms"},
		{"concurrency 100", "error_rate 5% 1%", "adaptive: error_rate low mark 0.05 must be below the high mark 0.01"},
		{"concurrency 100", "interval 100ms", "adaptive: interval must be from 1s to 1h, got 100ms"},
		{"rate 100/1s\n\t\t\talgorithm token_bucket\n\t\t\tburst 20\n\t\t\tcost 3", "min 10", "adaptive: at min 10 the bucket holds 2 (burst × min ÷ max_events), below the cost 3 of every request"},
	} {
		assertLoadError(t, site(c.limit, c.adaptive), "caddyfile", c.want)
	}
	assertLoadError(t, jsonServer(`{"handler": "rate_limit", "rate_limits": {"adapt_bad_json": {"key": "k", "concurrency": 10, "adaptive": {"min": 50, "max": 2000}}}}`, ""), "json",
		"adaptive: the limit starts at the configured 10, which must be within min 50 and max 2000")
}

// startLoadOn runs clients spread over the sites at bases, each sending
// requests back to back until the test ends, pausing 10 ms after a refusal
// so that refused clients do not spin, and counts the answers by status.
func startLoadOn(t *testing.T, clients int, bases ...string) *load {
	l := &load{stop: make(chan struct{}), counts: map[int]int{}}
	for i := range clients {
		base := bases[i%len(bases)]
		l.wg.Go(func() {
			for {
				select {
				case <-l.stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				code := status(ctx, base)
				cancel()
				l.mu.Lock()
				l.counts[code]++
				l.mu.Unlock()
				if code != http.StatusOK {
					time.Sleep(10 * time.Millisecond)
				}
			}
		})
	}
	t.Cleanup(l.end)
	return l
}

// drainedPeak waits 3 s, twice the length of the slow requests admitted
// before a cap fell (a lower bound: they have drained), then measures over
// window the most requests the upstream served at once and the answers.
func drainedPeak(u *sickUpstream, l *load, window time.Duration) (int64, map[int]int) {
	time.Sleep(3 * time.Second)
	u.peak.Store(u.now.Load())
	l.take()
	time.Sleep(window)
	return u.peak.Load(), l.take()
}

// Two Caddy instances share a concurrency cap's slots through Redis, each
// adapting the cap it sends from what its own requests meet. When the
// upstream slows, both caps fall to their min, and the upstream then never
// serves more requests at once than the largest cap of the fleet (the slot
// set is one: an acquire succeeds while the set holds fewer than the
// caller's cap); when it is fast again, both caps climb back.
func TestAdaptiveRedisSlotsFleet(t *testing.T) {
	redis := redistest.Standalone(t, "")
	u := newSickUpstream(t)
	const zone = "adaptbucket_slots"
	opts := `key static
				concurrency 8
				adaptive {
					min 2
					max 8
					increase 2
					decrease 0.5
					interval 1s
					latency_p99 300ms 1s
				}`
	a := startSlotInstance(t, redis.Addr, zone, opts, u.URL)
	b := startSlotInstance(t, redis.Addr, zone, opts, u.URL)
	l := startLoadOn(t, 16, a.base, b.base)

	time.Sleep(1500 * time.Millisecond) // at least one interval of healthy traffic, a lower bound
	if la, lb := a.adaptiveLimit(t, zone), b.adaptiveLimit(t, zone); la != 8 || lb != 8 {
		t.Fatalf("healthy upstream: caps %d and %d, want 8 and 8", la, lb)
	}
	if peak := u.peak.Load(); peak > 8 {
		t.Fatalf("healthy upstream: %d at once at the upstream, above the cap of 8", peak)
	}

	u.delay.Store(int64(1500 * time.Millisecond))
	deadline := time.Now().Add(30 * time.Second)
	var pathA, pathB []int64
	for {
		la, lb := a.adaptiveLimit(t, zone), b.adaptiveLimit(t, zone)
		if len(pathA) == 0 || pathA[len(pathA)-1] != la {
			pathA = append(pathA, la)
		}
		if len(pathB) == 0 || pathB[len(pathB)-1] != lb {
			pathB = append(pathB, lb)
		}
		if la == 2 && lb == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("during the spike the caps went %v and %v, want both at 2", pathA, pathB)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("during the spike the caps went %v (instance a) and %v (instance b)", pathA, pathB)
	// The requests admitted under the larger caps finish within 1.5 s;
	// from then on the fleet holds at most 2 slots.
	peak, c := drainedPeak(u, l, 3*time.Second)
	t.Logf("with both caps at 2: at most %d at once at the upstream; answers in 3 s %v", peak, c)
	if peak > 2 {
		t.Fatalf("with both caps at 2, the upstream served %d at once", peak)
	}
	if c[http.StatusServiceUnavailable] == 0 || c[http.StatusOK] == 0 {
		t.Fatalf("16 clients against a fleet cap of 2: %v", c)
	}

	u.delay.Store(int64(5 * time.Millisecond))
	deadline = time.Now().Add(30 * time.Second)
	for a.adaptiveLimit(t, zone) != 8 || b.adaptiveLimit(t, zone) != 8 {
		if time.Now().After(deadline) {
			t.Fatalf("after the spike the caps are %d and %d, want 8 and 8", a.adaptiveLimit(t, zone), b.adaptiveLimit(t, zone))
		}
		time.Sleep(50 * time.Millisecond)
	}
	u.peak.Store(u.now.Load())
	time.Sleep(time.Second) // a window of load to measure over
	if peak := u.peak.Load(); peak > 8 || peak < 3 {
		t.Fatalf("recovered: %d at once at the upstream, want more than the spike's 2 and at most 8", peak)
	}
	l.end()
}

// adaptiveBackend is the backend block of a rate_limit handler for store:
// none for memory, a real redis-server for redis, with a generous timeout
// (a call that times out on a loaded machine would be admitted, fail open,
// and the limit would count nothing).
func adaptiveBackend(t *testing.T, store string) string {
	if store != "redis" {
		return ""
	}
	redis := redistest.Standalone(t, "")
	return "backend redis {\n\t\t\taddress " + redis.Addr + "\n\t\t\ttimeout 5s\n\t\t}"
}

// A bucket rate (token_bucket, gcra, leaky_bucket as a meter or a queue)
// follows the upstream's errors through a real Caddy, on the memory store
// and on Redis: max_events falls to its min, the burst with it (40 at 400
// a second, 2 at 20), and the upstream then gets about 20 requests a
// second; answering 200 again, the limit grows back to 400.
func TestAdaptiveBucketRates(t *testing.T) {
	for _, c := range []struct{ store, alg, extra string }{
		{"memory", "token_bucket", "burst 40"},
		{"redis", "gcra", "burst 40"},
		{"memory", "leaky_bucket", "burst 40"},
		{"redis", "leaky_bucket", "max_delay 200ms"},
	} {
		t.Run(c.store+"_"+c.alg+"_"+strings.Fields(c.extra)[0], func(t *testing.T) {
			backend := adaptiveBackend(t, c.store)
			u := newSickUpstream(t)
			zone := "adaptbucket_" + c.store + "_" + c.alg + "_" + strings.Fields(c.extra)[0]
			tester := newTester(t, caddyfileServer(fmt.Sprintf(`
	rate_limit {
		%s
		zone %s {
			key static
			rate 400/1s
			algorithm %s
			%s
			adaptive {
				min 20
				increase 200
				decrease 0.5
				interval 1s
				error_rate 1%% 5%%
			}
		}
	}
	reverse_proxy %s`, backend, zone, c.alg, c.extra, strings.TrimPrefix(u.URL, "http://"))), "caddyfile")
			l := startLoad(t, 4)
			u.fail.Store(true)
			path := awaitLimit(t, zone, "", "while the upstream fails", 20*time.Second, func(n int64) bool { return n == 20 })
			t.Logf("while the upstream failed the limit went %v", path)
			expectMetric(t, `caddy_rate_limit_adaptive_limit{scope="",zone="`+zone+`"}`, 20)
			l.take()
			u.served.Store(0)
			time.Sleep(2 * time.Second) // a window of load to measure over
			served, answers := u.served.Load(), l.take()
			t.Logf("with the limit at 20/s: the upstream got %d requests in 2 s; answers %v", served, answers)
			// 20 a second for 2 s, and the burst of 2 (a queue: its 5 slots).
			if served > 2*20+5 || served < 20 {
				t.Fatalf("with the limit at 20/s: the upstream got %d requests in 2 s (answers %v)", served, answers)
			}
			if c.extra == "burst 40" && answers[http.StatusTooManyRequests] == 0 {
				t.Fatalf("4 clients back to back at 20/s: no 429 (%v)", answers)
			}
			l.end()
			if c.extra == "burst 40" {
				// A fresh look after the load: the burst shrank with the
				// rate (2 of 40 at 20 of 400), it is full again.
				time.Sleep(200 * time.Millisecond)
				passed := 0
				start := time.Now()
				for range 10 {
					// The upstream still answers 502: what counts is that
					// the limit let the request through.
					if code, _, _ := do(t, tester, "GET", "/"); code != http.StatusTooManyRequests {
						passed++
					}
				}
				// The burst of 2, and what 20/s refills while the ten
				// requests are sent (a busy machine sends them slowly).
				refilled := int(time.Since(start) * 20 / time.Second)
				if passed < 2 || passed > 2+refilled {
					t.Fatalf("a full bucket at 20/s passed %d of 10 requests sent in %v, want its burst of 2 and at most the %d refilled meanwhile", passed, time.Since(start), refilled)
				}
			}
			u.fail.Store(false)
			l = startLoad(t, 4)
			path = awaitLimit(t, zone, "", "after the failures", 20*time.Second, func(n int64) bool { return n == 400 })
			t.Logf("after the failures the limit went %v", path)
			l.end()
		})
	}
}

// A config reload in the middle of an incident, under load: a bucket rate
// that backed off stays where it is (and its burst with it) in the new
// config, on the memory backend and on Redis; the upstream keeps getting
// about the backed-off rate through the reload.
func TestAdaptiveBucketReloadMidLoad(t *testing.T) {
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			backend := adaptiveBackend(t, store)
			u := newSickUpstream(t)
			u.fail.Store(true)
			zone := "adaptbucket_reload_" + store
			cfg := func(header string) string {
				return caddyfileServer(fmt.Sprintf(`
	header X-Config %s
	rate_limit {
		%s
		zone %s {
			key static
			rate 400/1s
			algorithm token_bucket
			burst 40
			adaptive {
				min 20
				decrease 0.1
				interval 1s
			}
		}
	}
	reverse_proxy %s`, header, backend, zone, strings.TrimPrefix(u.URL, "http://")))
			}
			tester := newTester(t, cfg("one"), "caddyfile")
			l := startLoad(t, 4)
			awaitLimit(t, zone, "", "while the upstream fails", 20*time.Second, func(n int64) bool { return n == 20 })
			tester.InitServer(withPorts(cfg("two")), "caddyfile") // a reload: the zone stays
			if s := adaptiveNow(t, zone, ""); s.Limit != 20 {
				t.Fatalf("after the reload the limit is %d, want the 20 it backed off to", s.Limit)
			}
			l.take()
			u.served.Store(0)
			time.Sleep(2 * time.Second) // a window of load to measure over
			served, answers := u.served.Load(), l.take()
			t.Logf("after the reload, at 20/s: the upstream got %d requests in 2 s; answers %v", served, answers)
			if served > 2*20+2+2 || answers[http.StatusTooManyRequests] == 0 {
				t.Fatalf("after the reload, at 20/s: the upstream got %d requests in 2 s (answers %v)", served, answers)
			}
			l.end()
		})
	}
}

// Greedy clients against a bucket rate whose limit the upstream's errors
// drive down and back up every second or so: over the span, the requests
// let through must not exceed what the limits in force allowed (the
// integral of the limit over time) plus one bucket at its largest, on
// the memory store and on Redis. With min = max the limit stays put.
func TestAdaptiveOscillationAdmitsNoMoreThanTheLimits(t *testing.T) {
	for _, c := range []struct {
		store    string
		min, max int
	}{{"memory", 10, 100}, {"redis", 10, 100}, {"memory", 50, 50}} {
		store := c.store
		t.Run(fmt.Sprintf("%s_%d_%d", store, c.min, c.max), func(t *testing.T) {
			backend := adaptiveBackend(t, store)
			u := newSickUpstream(t)
			zone := fmt.Sprintf("adaptive_osc_%s_%d", store, c.min)
			newTester(t, caddyfileServer(fmt.Sprintf(`
	rate_limit {
		%s
		zone %s {
			key static
			rate %d/1s
			algorithm token_bucket
			burst 20
			adaptive {
				min %d
				max %d
				increase 90
				decrease 0.1
				interval 1s
				error_rate 1%% 5%%
			}
		}
	}
	reverse_proxy %s`, backend, zone, c.max, c.min, c.max, strings.TrimPrefix(u.URL, "http://"))), "caddyfile")
			l := startLoad(t, 4)
			defer l.end()
			time.Sleep(500 * time.Millisecond)
			l.take()
			u.served.Store(0)
			start := time.Now()
			var allowed float64
			limits := map[int64]int{}
			last := start
			for time.Since(start) < 8*time.Second {
				u.fail.Store(time.Since(start)/(1100*time.Millisecond)%2 == 0)
				n := adaptiveNow(t, zone, "").Limit
				now := time.Now()
				allowed += float64(n) * now.Sub(last).Seconds()
				last = now
				limits[n]++
				time.Sleep(10 * time.Millisecond)
			}
			served, answers := u.served.Load(), l.take()
			t.Logf("%s: limits seen %v; the upstream got %d in %v, the limits in force allowed %.0f + a burst of 20; answers %v",
				store, limits, served, time.Since(start), allowed, answers)
			if len(limits) < 2 && c.min != c.max {
				t.Fatalf("the limit never moved: %v", limits)
			}
			if float64(served) > allowed+20+10 {
				t.Fatalf("the upstream got %d, more than the %.0f the limits in force allowed and a burst", served, allowed)
			}
		})
	}
}

// A client that sends its body slowly is waited for by the upstream, but
// the wait is the client's: a few such uploads a second must not drive an
// adaptive limit down for everyone (counted as the upstream's latency,
// five a second would take a cap of 100 to 12 in six seconds).
func TestAdaptiveSlowUploadDoesNotShrinkLimit(t *testing.T) {
	_, addr := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = io.WriteString(w, "ok")
	})
	newTester(t, caddyfileServer(fmt.Sprintf(`
	rate_limit {
		zone adaptive_slow_upload {
			key static
			concurrency 50
			adaptive {
				min 5
				interval 1s
				latency_p99 300ms 800ms
			}
		}
	}
	reverse_proxy %s`, addr)), "caddyfile")
	const zone = "adaptive_slow_upload"
	// Ordinary traffic, 20 requests a second: the slow uploads are more
	// than 1% of it, as a few hostile clients are on a quiet site.
	stop := make(chan struct{})
	var normal sync.WaitGroup
	normal.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			if resp, err := http.Get(httpBase + "/"); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}
	})
	defer func() { close(stop); normal.Wait() }()

	// Hostile uploads: 10 bytes, one every 150 ms (1.5 s each), five
	// started a second for four seconds.
	var wg sync.WaitGroup
	deadline := time.Now().Add(4 * time.Second)
	for time.Now().Before(deadline) {
		wg.Go(func() {
			c, err := net.Dial("tcp", strings.TrimPrefix(httpBase, "http://"))
			if err != nil {
				return
			}
			defer c.Close()
			_, _ = io.WriteString(c, "POST / HTTP/1.1\r\nHost: localhost\r\nContent-Length: 10\r\n\r\n")
			for range 10 {
				time.Sleep(150 * time.Millisecond)
				if _, err := c.Write([]byte("x")); err != nil {
					return
				}
			}
			_, _ = c.Read(make([]byte, 512))
		})
		time.Sleep(200 * time.Millisecond)
	}
	wg.Wait()
	s := adaptiveNow(t, zone, "")
	t.Logf("after 4 s of slow uploads: limit %d, last p99 %.3fs", s.Limit, s.LatencyP99)
	if s.Limit != 50 {
		t.Fatalf("slow uploads drove the adaptive cap to %d (p99 %.3fs): the client's wait was counted as the upstream's", s.Limit, s.LatencyP99)
	}
}

// A zone taken out of the config takes its adaptive series with it: left
// behind, a limit that sat at its min would keep RateLimitAdaptiveAtMin
// firing for a zone that no longer exists. A reload that keeps the zone
// keeps them.
func TestAdaptiveSeriesLeaveWithTheirZone(t *testing.T) {
	site := func(zone string) string {
		return caddyfileServer(`
	rate_limit {
		zone ` + zone + ` {
			key static
			concurrency 10
			adaptive {
				min 2
			}
		}
	}
	respond ok`)
	}
	newTester(t, site("removed_zone"), "caddyfile")
	const series = `caddy_rate_limit_adaptive_min_limit{scope="",zone="removed_zone"}`
	expectMetric(t, series, 2)
	loadConfig(t, site("removed_zone"), "caddyfile")
	expectMetric(t, series, 2)
	loadConfig(t, site("kept_zone"), "caddyfile")
	if gone := grepLines(adminRequest(t, "GET", "/metrics", "", ""), `adaptive_`, `zone="removed_zone"`); gone != "" {
		t.Fatalf("the removed zone's adaptive series are still exported:\n%s", gone)
	}
	expectMetric(t, `caddy_rate_limit_adaptive_min_limit{scope="",zone="kept_zone"}`, 2)
}

// A negative high latency mark in JSON is refused at load, naming the
// field: accepted, it would leave latency silently unwatched.
func TestAdaptiveNegativeLatencyMarkRefused(t *testing.T) {
	assertLoadError(t, jsonServer(`{"handler": "rate_limit", "rate_limits": {"adaptive_neg_lat": {"key": "k", "concurrency": 10, "adaptive": {"latency_p99_low": "200ms", "latency_p99_high": "-1s"}}}}`, ""), "json",
		`adaptive: latency_p99 marks must be positive, got 200ms and -1s`)
}
