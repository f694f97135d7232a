package integration

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// sickUpstream is an upstream whose latency and failures the test sets
// while requests flow, and which counts the requests it serves at once.
type sickUpstream struct {
	*httptest.Server
	delay     atomic.Int64 // ns
	fail      atomic.Bool  // answer 502
	now, peak atomic.Int64
	served    atomic.Int64
}

func newSickUpstream(t *testing.T) *sickUpstream {
	u := new(sickUpstream)
	u.delay.Store(int64(5 * time.Millisecond))
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := u.now.Add(1)
		for p := u.peak.Load(); n > p && !u.peak.CompareAndSwap(p, n); p = u.peak.Load() {
		}
		defer u.now.Add(-1)
		u.served.Add(1)
		select {
		case <-time.After(time.Duration(u.delay.Load())):
		case <-r.Context().Done():
			return
		}
		if u.fail.Load() {
			w.WriteHeader(http.StatusBadGateway)
			return
		}
		_, _ = io.WriteString(w, "ok")
	}))
	t.Cleanup(u.Close)
	return u
}

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
