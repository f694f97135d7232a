package integration

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// shedSite is a site whose routes /p0 … /p4 have priorities 0 … 4 in the
// group itest_shed of capacity 10, each with a rate limit of one request
// an hour, and /hold (priority 0, no rate) whose requests the upstream
// holds until the test lets them go.
func shedSite(upstream string) string {
	site := `
	handle /hold {
		rate_limit {
			shed itest_shed
		}
		reverse_proxy ` + upstream + `
	}`
	for p := range 5 {
		site += fmt.Sprintf(`
	handle /p%d {
		rate_limit {
			shed itest_shed {
				priority %d
			}
			zone itest_shed_p%d {
				key static
				rate 1/1h
			}
		}
		reverse_proxy %s
	}`, p, p, p, upstream)
	}
	return caddyfileServerWith(`
	rate_limit {
		shed itest_shed {
			capacity 10
		}
	}`, site)
}

// holdRequests sends n requests to /hold and waits until the upstream
// holds them all; the returned func lets them go and waits for their
// answers.
func holdRequests(t *testing.T, u *countingUpstream, release chan struct{}, n int) func() {
	t.Helper()
	var wg sync.WaitGroup
	var failed atomic.Int64
	for range n {
		wg.Go(func() {
			req, _ := http.NewRequest(http.MethodGet, httpBase+"/hold", nil)
			req.Header.Set("X-Hang", "1")
			resp, err := http.DefaultClient.Do(req)
			if err != nil || resp.StatusCode != http.StatusOK {
				failed.Add(1)
			}
			if err == nil {
				resp.Body.Close()
			}
		})
	}
	eventually(t, fmt.Sprintf("%d requests held at the upstream", n), func() bool { return u.now.Load() == int64(n) })
	var once sync.Once
	return func() {
		once.Do(func() { close(release) })
		wg.Wait()
		if failed.Load() > 0 {
			t.Errorf("%d held requests failed", failed.Load())
		}
	}
}

// With 11 requests in flight for a capacity of 10 (load 1.1), priorities
// 0, 1 and 2 pass and 3 and 4 get 503 with Retry-After, never reaching the
// upstream nor taking a unit of their rate limit.
func TestShedDropsLowPrioritiesAtLoad11(t *testing.T) {
	release := make(chan struct{})
	var served atomic.Int64
	u := newCountingUpstream(t, func(r *http.Request) {
		served.Add(1)
		if r.Header.Get("X-Hang") != "" {
			<-release
		}
	})
	tester := newTester(t, shedSite(strings.TrimPrefix(u.URL, "http://")), "caddyfile")
	letGo := holdRequests(t, u, release, 11)
	defer letGo()

	want := []int{200, 200, 200, 503, 503}
	for p, code := range want {
		got, ra, body := do(t, tester, "GET", fmt.Sprintf("/p%d", p))
		if got != code {
			t.Fatalf("priority %d at load 1.1: %d (%q), want %d", p, got, body, code)
		}
		if code == 503 && ra != "1" {
			t.Fatalf("priority %d shed with Retry-After %q, want 1", p, ra)
		}
	}
	if n := served.Load(); n != 11+3 {
		t.Fatalf("the upstream served %d requests, want the 11 held and 3 admitted", n)
	}
	page := adminRequest(t, "GET", "/metrics", "", "")
	if v := metricLine(page, `caddy_rate_limit_refused_requests_total{reason="load_shed",zone="itest_shed"}`); v != 2 {
		t.Fatalf("load_shed refusals %v, want 2", v)
	}
	if v := metricLine(page, `caddy_rate_limit_shed_in_flight_requests{group="itest_shed"}`); v != 11 {
		t.Fatalf("in flight %v, want 11", v)
	}
	if v := metricLine(page, `caddy_rate_limit_shed_capacity_requests{group="itest_shed"}`); v != 10 {
		t.Fatalf("capacity %v, want 10", v)
	}
	if v := metricLine(page, `caddy_rate_limit_refused_requests_total{reason="rate_limit_exceeded",zone="itest_shed_p3"}`); v > 0 {
		t.Fatalf("a shed request counted as a rate refusal: %v", v)
	}

	letGo()
	// The shed requests took nothing: their one unit an hour is still there.
	for p, code := range []int{429, 429, 429, 200, 200} {
		if got, _, _ := do(t, tester, "GET", fmt.Sprintf("/p%d", p)); got != code {
			t.Fatalf("priority %d after the load is gone: %d, want %d", p, got, code)
		}
	}
	page = adminRequest(t, "GET", "/metrics", "", "")
	if v := metricLine(page, `caddy_rate_limit_shed_in_flight_requests{group="itest_shed"}`); v != 0 {
		t.Fatalf("in flight %v once everything was answered, want 0", v)
	}
}

// The count of requests in flight outlives a reload: requests still served
// under the old config load the new one.
func TestShedInFlightSurvivesReload(t *testing.T) {
	release := make(chan struct{})
	u := newCountingUpstream(t, func(r *http.Request) {
		if r.Header.Get("X-Hang") != "" {
			<-release
		}
	})
	cfg := shedSite(strings.TrimPrefix(u.URL, "http://"))
	tester := newTester(t, cfg, "caddyfile")
	letGo := holdRequests(t, u, release, 11)
	defer letGo()
	// The same site with one more route: a config Caddy does reload.
	adminRequest(t, "POST", "/load", "text/caddyfile", strings.Replace(cfg, "\thandle /hold {", "\thandle /other {\n\t\trespond other\n\t}\n\thandle /hold {", 1))
	if got, _, _ := do(t, tester, "GET", "/other"); got != 200 {
		t.Fatalf("the new config is not serving: %d", got)
	}
	if got, _, _ := do(t, tester, "GET", "/p4"); got != 503 {
		t.Fatalf("priority 4 under the new config with 11 requests of the old in flight: %d, want 503", got)
	}
	letGo()
	if got, _, _ := do(t, tester, "GET", "/p4"); got != 200 {
		t.Fatalf("priority 4 once they are answered: %d, want 200", got)
	}
}

// Handlers of one config that give one group two capacities are refused.
func TestShedConflictingCapacity(t *testing.T) {
	assertLoadError(t, jsonServer(`{"handler": "rate_limit", "shed": {"group": "itest_shed_conflict", "capacity": 10}},
		{"handler": "rate_limit", "shed": {"group": "itest_shed_conflict", "capacity": 20, "priority": 2}}, `+okHandler, ""),
		"json", `shed \"itest_shed_conflict\": capacity given twice in this config, 10 and 20`)
}

// A shed request's built-in body and error page say load_shed, in the name
// of the group, distinct from a rate limit's 429.
func TestShedAnswerBodies(t *testing.T) {
	release := make(chan struct{})
	u := newCountingUpstream(t, func(r *http.Request) {
		if r.Header.Get("X-Hang") != "" {
			<-release
		}
	})
	up := strings.TrimPrefix(u.URL, "http://")
	tester := newTester(t, caddyfileServer(`
	handle /hold {
		rate_limit {
			shed itest_shed_body {
				capacity 1
			}
		}
		reverse_proxy `+up+`
	}
	handle /json {
		rate_limit {
			shed itest_shed_body {
				priority 4
				capacity 1
			}
			respond json
		}
		reverse_proxy `+up+`
	}
	handle /page {
		rate_limit {
			shed itest_shed_body {
				priority 4
				capacity 1
			}
		}
		reverse_proxy `+up+`
	}
	handle_errors {
		respond "{http.rate_limit.reason} {http.rate_limit.exceeded.name} {http.error.status_code} {http.error.message}"
	}`), "caddyfile")
	letGo := holdRequests(t, u, release, 1) // load 1.0: priority 4 is shed
	defer letGo()
	code, ra, body := do(t, tester, "GET", "/json")
	if want := `{"error":{"code":"load_shed","message":"The server is busy. Retry in 1 second.","retry_after":1,"zone":"itest_shed_body"}}`; code != 503 || ra != "1" || body != want {
		t.Fatalf("respond json: %d, Retry-After %q, %s; want 503, 1, %s", code, ra, body, want)
	}
	code, _, body = do(t, tester, "GET", "/page")
	if want := "load_shed itest_shed_body 503 server overloaded: request shed"; code != 503 || body != want {
		t.Fatalf("error page: %d %q, want 503 %q", code, body, want)
	}
}

// A site-wide rate_limit that names a shedding group, with routes inside
// that name it again with their priorities, is the natural way to put
// every route in the group. Each request passes through two handlers of
// the group and must still count once: 5 requests in flight for a
// capacity of 10 are a load of 0.5, where nothing is shed.
func TestShedNestedHandlersCountOnce(t *testing.T) {
	u, hang, letGo := hangingUpstream(t)
	defer letGo()
	up := strings.TrimPrefix(u.URL, "http://")
	tester := newTester(t, caddyfileServerWith(`
	rate_limit {
		shed a5_nested {
			capacity 10
		}
	}`, `
	rate_limit {
		shed a5_nested
	}
	handle /search {
		rate_limit {
			shed a5_nested {
				priority 3
			}
		}
		reverse_proxy `+up+`
	}
	handle {
		reverse_proxy `+up+`
	}`), "caddyfile")

	hang("/search", 5)
	eventually(t, "5 searches held at the upstream", func() bool { return u.now.Load() == 5 })
	page := adminRequest(t, "GET", "/metrics", "", "")
	if v := metricLine(page, `caddy_rate_limit_shed_in_flight_requests{group="a5_nested"}`); v != 5 {
		t.Errorf("in flight %v with 5 requests held, want 5", v)
	}
	// Priority 3 is shed above a load of 1.0: at 0.5 it passes, and the
	// outer handler's count of this very request does not load it either.
	for i := range 5 {
		if got, _, body := do(t, tester, "GET", "/search"); got != 200 {
			t.Fatalf("search #%d at a load of 0.5: %d (%q), want 200", i+1, got, body)
		}
	}
	letGo()
	page = adminRequest(t, "GET", "/metrics", "", "")
	if v := metricLine(page, `caddy_rate_limit_shed_in_flight_requests{group="a5_nested"}`); v != 0 {
		t.Fatalf("in flight %v once everything was answered, want 0", v)
	}
}

// Requests waiting in a concurrency queue load nothing in a shedding group
// that a site-wide handler counts them in: one request served and nine in
// line are a load of 0.1, where priority 4 passes.
func TestShedQueuedRequestsLoadNoGroup(t *testing.T) {
	u, hang, letGo := hangingUpstream(t)
	defer letGo()
	tester := newTester(t, caddyfileServerWith(`
	rate_limit {
		shed a5_queue_load {
			capacity 10
		}
	}`, `
	rate_limit {
		shed a5_queue_load
	}
	handle /report {
		rate_limit {
			zone a5_queue_load_report {
				key static
				concurrency 1
				queue 10s
			}
		}
		reverse_proxy `+strings.TrimPrefix(u.URL, "http://")+`
	}
	handle /search {
		rate_limit {
			shed a5_queue_load {
				priority 4
			}
		}
		respond ok
	}`), "caddyfile")
	hang("/report", 10)
	eventually(t, "one report served and nine in line", func() bool {
		return u.now.Load() == 1 && strings.Contains(adminRequest(t, "GET", "/metrics", "", ""), `caddy_rate_limit_in_flight_requests{scope="",zone="a5_queue_load_report"} 1`)
	})
	waitInLine(t, 9, "the other nine")
	page := adminRequest(t, "GET", "/metrics", "", "")
	if v := metricLine(page, `caddy_rate_limit_shed_in_flight_requests{group="a5_queue_load"}`); v != 1 {
		t.Errorf("in flight %v with one request served and nine in line, want 1", v)
	}
	if got, _, body := do(t, tester, "GET", "/search"); got != 200 {
		t.Fatalf("priority 4 at a real load of 0.1: %d (%q), want 200", got, body)
	}
}

// Requests waiting for their max_delay slot load nothing in a shedding
// group a site-wide handler counts them in.
func TestShedDelayedRequestsLoadNoGroup(t *testing.T) {
	tester := newTester(t, caddyfileServerWith(`
	rate_limit {
		shed a5_delay_load {
			capacity 10
		}
	}`, `
	rate_limit {
		shed a5_delay_load
	}
	handle /paced {
		rate_limit {
			zone a5_delay_load_paced {
				key static
				rate 1/2s
				algorithm leaky_bucket
				max_delay 30s
			}
		}
		respond ok
	}
	handle /search {
		rate_limit {
			shed a5_delay_load {
				priority 4
			}
		}
		respond ok
	}`), "caddyfile")
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { stop(); wg.Wait() }()
	for range 10 {
		wg.Go(func() {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, httpBase+"/paced", nil)
			if resp, err := http.DefaultClient.Do(req); err == nil {
				resp.Body.Close()
			}
		})
	}
	eventually(t, "ten paced requests decided", func() bool {
		return metricLine(adminRequest(t, "GET", "/metrics", "", ""), `caddy_rate_limit_requests_total{key="",scope="",zone="a5_delay_load_paced"}`) == 10
	})
	page := adminRequest(t, "GET", "/metrics", "", "")
	if v := metricLine(page, `caddy_rate_limit_shed_in_flight_requests{group="a5_delay_load"}`); v > 1 {
		t.Errorf("in flight %v with the paced requests waiting for their slots, want at most the one served", v)
	}
	if got, _, body := do(t, tester, "GET", "/search"); got != 200 {
		t.Fatalf("priority 4 while paced requests wait: %d (%q), want 200", got, body)
	}
}
