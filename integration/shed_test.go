package integration

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// metricLine is the value of the series written exactly as series (name
// and labels) on a /metrics page, or -1 when it is not there.
func metricLine(page, series string) float64 {
	for _, line := range strings.Split(page, "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			if f, err := strconv.ParseFloat(v, 64); err == nil {
				return f
			}
		}
	}
	return -1
}

// eventually polls cond every 10 ms for up to 10 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}

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

// tarpitSite denies everything after its first request, and holds the
// denials for hold (half to all of it, at random), at most max at once.
func tarpitSite(max int, hold string) string {
	return caddyfileServer(fmt.Sprintf(`
	rate_limit {
		zone itest_tarpit {
			key static
			rate 1/1h
		}
		tarpit %s
		tarpit_max %d
	}
	respond ok`, hold, max))
}

func heldNow(t *testing.T) float64 {
	return metricLine(adminRequest(t, "GET", "/metrics", "", ""), "caddy_rate_limit_tarpit_held_requests")
}

// A held denial ends as soon as its client leaves, and when the config is
// reloaded: neither waits out the tarpit.
func TestTarpitReleasedByClientAndReload(t *testing.T) {
	tester := newTester(t, tarpitSite(5, "10s"), "caddyfile")
	if got, _, _ := do(t, tester, "GET", "/"); got != 200 {
		t.Fatalf("first request: %d", got)
	}
	start := time.Now()
	if resp, err := get(context.Background()); err != nil || resp.StatusCode != 429 || time.Since(start) < 5*time.Second {
		t.Fatalf("a denial came back after %s (%v), want 429 after at least 5s", time.Since(start), err)
	}
	t.Logf("a denial held %s", time.Since(start))

	// Holds of 30 s to 1 m from here: one seen to end before 30 s was cut
	// short, however long a loaded machine took to notice and to tell.
	loadConfig(t, tarpitSite(5, "1m"), "caddyfile")
	ctx, leave := context.WithCancel(context.Background())
	done := make(chan error, 1)
	sent := time.Now()
	go func() {
		_, err := get(ctx)
		done <- err
	}()
	eventually(t, "a denial held", func() bool { return heldNow(t) == 1 })
	leave()
	left := time.Now()
	eventually(t, "the hold of a client that left to end", func() bool { return heldNow(t) == 0 })
	if d := time.Since(sent); d >= 30*time.Second {
		t.Fatalf("the hold ended %s after the request (%s after its client left), as if waited out", d, time.Since(left))
	}
	<-done
	t.Logf("hold freed %s after its client left", time.Since(left))

	answered := make(chan int, 1)
	sent = time.Now()
	go func() {
		resp, err := get(context.Background())
		if err != nil {
			answered <- -1
			return
		}
		answered <- resp.StatusCode
	}()
	eventually(t, "a denial held", func() bool { return heldNow(t) == 1 })
	reload := time.Now()
	adminRequest(t, "POST", "/load", "text/caddyfile", tarpitSite(6, "1m"))
	select {
	case code := <-answered:
		if code != 429 {
			t.Fatalf("a denial let go by a reload: %d", code)
		}
		t.Logf("a held denial answered %s after the reload began", time.Since(reload))
	case <-time.After(time.Until(sent.Add(30 * time.Second))):
		t.Fatalf("a held denial outlived its config: not answered %s after the reload began", time.Since(reload))
	}
}

// 5,000 denied clients hammer a Caddy whose tarpit holds at most 50: it
// never holds more, answers everyone else at once, and ends with the
// goroutines it started with. Run on the built binary, so that its
// goroutines are Caddy's alone.
func TestTarpitCapUnderFlood(t *testing.T) {
	httpPort, adminPort := freePort(t), freePort(t)
	admin := fmt.Sprintf("http://localhost:%d", adminPort)
	cfg := fmt.Sprintf(`{
	admin localhost:%d
	http_port %d
	default_bind 127.0.0.1
	auto_https off
	metrics
}
:%d {
	rate_limit {
		zone flood {
			key static
			rate 1/1h
		}
		tarpit 4s
		tarpit_max 50
	}
	respond ok
}
`, adminPort, httpPort, httpPort)
	file := filepath.Join(t.TempDir(), "Caddyfile")
	if err := os.WriteFile(file, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	startCaddy(t, file)
	base := fmt.Sprintf("http://127.0.0.1:%d/", httpPort)
	waitUp(t, base) // the one request the zone admits
	scrape := func() (held, goroutines float64) {
		resp, err := http.Get(admin + "/metrics")
		if err != nil {
			return -1, -1
		}
		defer resp.Body.Close()
		var b strings.Builder
		_, _ = bufio.NewReader(resp.Body).WriteTo(&b)
		return metricLine(b.String(), "caddy_rate_limit_tarpit_held_requests"), metricLine(b.String(), "go_goroutines")
	}
	time.Sleep(200 * time.Millisecond) // lower bound: let the first connections close
	_, before := scrape()

	const clients, perClient, tarpitMax = 5000, 2, 50
	var peakHeld, peakG atomic.Int64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			held, g := scrape()
			for p := peakHeld.Load(); int64(held) > p && !peakHeld.CompareAndSwap(p, int64(held)); p = peakHeld.Load() {
			}
			for p := peakG.Load(); int64(g) > p && !peakG.CompareAndSwap(p, int64(g)); p = peakG.Load() {
			}
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()

	addr := fmt.Sprintf("127.0.0.1:%d", httpPort)
	var denied, slow, failed atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range clients {
		wg.Go(func() {
			// One connection per client, sending its requests in turn:
			// each client is one goroutine here, and one connection there.
			var conn net.Conn
			var err error
			for try := 0; try < 5; try++ {
				if conn, err = net.DialTimeout("tcp", addr, 10*time.Second); err == nil {
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			if err != nil {
				failed.Add(perClient)
				return
			}
			defer conn.Close()
			br := bufio.NewReader(conn)
			for range perClient {
				sent := time.Now()
				if _, err := conn.Write([]byte("GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")); err != nil {
					failed.Add(1)
					return
				}
				resp, err := http.ReadResponse(br, nil)
				if err != nil {
					failed.Add(1)
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode == http.StatusTooManyRequests {
					denied.Add(1)
				}
				if time.Since(sent) >= 2*time.Second {
					slow.Add(1) // held (or, on a busy machine, slow)
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(stop)
	<-sampled

	if failed.Load() > 0 || denied.Load() != clients*perClient {
		t.Fatalf("%d of %d requests denied, %d failed", denied.Load(), clients*perClient, failed.Load())
	}
	if p := peakHeld.Load(); p > tarpitMax || p < tarpitMax {
		t.Fatalf("the tarpit held %d at its peak, want exactly tarpit_max (%d)", p, tarpitMax)
	}
	if slow.Load() < tarpitMax {
		t.Fatalf("only %d answers were held", slow.Load())
	}
	var after float64
	eventually(t, "Caddy's goroutines back to where they were", func() bool {
		_, after = scrape()
		return after >= 0 && after <= before+5
	})
	// Goroutines grow with connections (one each, and one more reading
	// behind each request being answered at the instant of the scrape:
	// 5,271 extra were seen once under the race detector, where answers are
	// slow), never with the denials held.
	if extra := float64(peakG.Load()) - before; extra > clients+3*tarpitMax+clients/10 {
		t.Fatalf("%v goroutines more at the peak than before, for %d connections", extra, clients)
	}
	t.Logf("%d clients × %d requests in %s: %d answered after 2 s or more, peak held %d (tarpit_max %d); Caddy's goroutines %v before, %d at the peak, %v after",
		clients, perClient, elapsed.Round(time.Millisecond), slow.Load(), peakHeld.Load(), tarpitMax, before, peakG.Load(), after)
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

// The concurrency example of docs/protection.md, as written: 30 reports at
// once run 20 at a time, the rest in line, all served; one API key gets 4
// requests in flight and the others refused at once.
func TestDocsProtectionConcurrency(t *testing.T) {
	var inFlight, peak atomic.Int64
	release := make(chan struct{})
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := inFlight.Add(1)
		defer inFlight.Add(-1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		select {
		case <-release:
		case <-time.After(time.Second):
		}
		w.WriteHeader(http.StatusOK)
	}))
	defer upstream.Close()
	block := docText(t, "../docs/protection.md", "match path /reports/*")
	site := "{\n\tskip_install_trust\n\tadmin localhost:2999\n\thttp_port 9080\n}\n:9080 {\n" + block + "\n\treverse_proxy " + strings.TrimPrefix(upstream.URL, "http://") + "\n}\n"
	newTester(t, site, "caddyfile")

	codes := func(n int, path string, header ...string) map[int]int {
		var mu sync.Mutex
		got := map[int]int{}
		var wg sync.WaitGroup
		for range n {
			wg.Go(func() {
				req, _ := http.NewRequest("GET", httpBase+path, nil)
				for i := 0; i+1 < len(header); i += 2 {
					req.Header.Set(header[i], header[i+1])
				}
				code := 0
				if resp, err := http.DefaultClient.Do(req); err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					code = resp.StatusCode
				}
				mu.Lock()
				got[code]++
				mu.Unlock()
			})
		}
		wg.Wait()
		return got
	}
	if got := codes(30, "/reports/q3"); got[200] != 30 {
		t.Fatalf("30 reports at once: %v, want all 30 served", got)
	}
	if p := peak.Load(); p != 20 {
		t.Fatalf("30 reports at once: %d at the upstream at most, want 20", p)
	}
	peak.Store(0)
	if got := codes(6, "/api/items", "X-API-Key", "k1"); got[200] != 4 || got[503] != 2 {
		t.Fatalf("6 API requests at once of one key: %v, want 4 served and 2 refused", got)
	}
}
