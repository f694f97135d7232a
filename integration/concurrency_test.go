package integration

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddytest"
	"github.com/sluicehq/sluice/internal/redistest"
)

func concSite(t *testing.T, zone, opts string, u *countingUpstream) *caddytest.Tester {
	return newTester(t, caddyfileServer(fmt.Sprintf(`
	rate_limit {
		zone %s {
			%s
		}
	}
	reverse_proxy %s`, zone, opts, strings.TrimPrefix(u.URL, "http://"))), "caddyfile")
}

// Under 200 concurrent clients, the upstream never serves more than the
// cap at once, and every client is served in its turn from the queue.
func TestConcurrencyCapUnderLoad(t *testing.T) {
	u := newCountingUpstream(t, func(*http.Request) { time.Sleep(20 * time.Millisecond) })
	concSite(t, "conc_load", "key static\n\t\t\tconcurrency 5\n\t\t\tqueue 30s", u)
	const clients = 200
	var wg sync.WaitGroup
	var ok, other atomic.Int64
	for range clients {
		wg.Go(func() {
			resp, err := get(context.Background())
			if err == nil && resp.StatusCode == http.StatusOK {
				ok.Add(1)
			} else {
				other.Add(1)
			}
		})
	}
	wg.Wait()
	if peak := u.peak.Load(); peak > 5 || peak < 2 {
		t.Fatalf("the upstream served %d requests at once, want at most 5 (and the cap used)", peak)
	}
	if ok.Load() != clients {
		t.Fatalf("%d of %d clients served, %d not", ok.Load(), clients, other.Load())
	}
	t.Logf("peak in flight at the upstream: %d of 5", u.peak.Load())
}

// Requests waiting for a slot leave the queue in the order they arrived.
func TestConcurrencyQueueOrder(t *testing.T) {
	expectQueueOrder(t, func(u *countingUpstream) {
		concSite(t, "conc_order", "key static\n\t\t\tconcurrency 1\n\t\t\tqueue 30s", u)
	})
}

// A client that goes away frees its slot for the next request.
func TestConcurrencyDisconnectFreesSlot(t *testing.T) {
	arrived := make(chan struct{}, 1)
	u := newCountingUpstream(t, func(r *http.Request) {
		if r.Header.Get("X-Hang") != "" {
			arrived <- struct{}{}
			<-r.Context().Done()
		}
	})
	concSite(t, "conc_gone", "key static\n\t\t\tconcurrency 1", u)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		_, _ = get(ctx, "X-Hang", "1")
		close(done)
	}()
	within(t, arrived, "the hanging request")
	if resp, err := get(context.Background()); err != nil || resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("a second request while the slot is held: %v %v, want 503", resp, err)
	}
	cancel()
	within(t, done, "the client that left")
	eventuallyOK(t, "the slot of a client that left was never freed")
}

// Beyond the queue's wait, a request is refused with 503 and Retry-After,
// counted under reason concurrency; the rate's unit is given back.
func TestConcurrencyRefusal(t *testing.T) {
	u, arrived, release := holdingUpstream(t)
	concSite(t, "conc_refuse", "key static\n\t\t\trate 3/1h\n\t\t\tconcurrency 1\n\t\t\tqueue 200ms", u)
	done := make(chan struct{})
	go func() {
		_, _ = get(context.Background(), "X-Hang", "1")
		close(done)
	}()
	within(t, arrived, "the held request")
	// Counters live as long as the process (go test -count=N).
	const refused = `caddy_rate_limit_refused_requests_total{reason="concurrency",zone="conc_refuse"}`
	before := max(metricLine(adminRequest(t, "GET", "/metrics", "", ""), refused), 0)
	start := time.Now()
	resp, err := get(context.Background())
	if err != nil || resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "1" {
		t.Fatalf("beyond the queue: %v %v, want 503 with Retry-After 1", resp, err)
	}
	if waited := time.Since(start); waited < 200*time.Millisecond {
		t.Fatalf("refused after %v, before the queue's 200ms", waited)
	}
	close(release)
	<-done
	// 3 per hour: the held request and two more, the refused one's unit
	// having been given back.
	for i := range 2 {
		if resp, err := get(context.Background()); err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d after the refusal: %v %v, want 200 (the refused request's unit given back)", i, resp, err)
		}
	}
	if resp, _ := get(context.Background()); resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("the 4th request got %d, want 429", resp.StatusCode)
	}
	metrics := adminRequest(t, "GET", "/metrics", "", "")
	if got := metricLine(metrics, refused); got != before+1 {
		t.Fatalf("the refusal is not counted under reason concurrency: %v, then %v", before, got)
	}
	if !strings.Contains(metrics, `caddy_rate_limit_in_flight_requests{scope="",zone="conc_refuse"} 0`) {
		t.Fatal("the in-flight gauge is missing or not back to 0")
	}
}

// Options only a rate reads are refused on a limit of concurrency alone.
func TestConcurrencyConfigErrors(t *testing.T) {
	for cfg, want := range map[string]string{
		"key static\n\t\t\tconcurrency 2\n\t\t\tburst 5":       "burst would do nothing",
		"key static\n\t\t\tqueue 1s":                           "requires both a window",
		"key static\n\t\t\tconcurrency 2\n\t\t\tqueue 2h":      "queue must be",
		"key static\n\t\t\tconcurrency 2000000000":             "concurrency must be",
		"key static\n\t\t\tconcurrency 2\n\t\t\tshadow":        "shadow zone",
		"key static\n\t\t\trate 1/1s\n\t\t\tqueue 1s":          "queue would do nothing",
		"key static\n\t\t\tconcurrency 0":                      "concurrency",
		"key static\n\t\t\tconcurrency 2\n\t\t\tconcurrency 3": "already specified",
	} {
		assertLoadError(t, caddyfileServer(`
	rate_limit {
		zone conc_bad {
			`+cfg+`
		}
	}
	respond "ok"`), "caddyfile", want)
	}
}

// In JSON, a scope may cap concurrency alone beside the zone's rate: the
// zone's rate and the scope's cap both apply.
func TestConcurrencyJSONScope(t *testing.T) {
	u, arrived, release := holdingUpstream(t)
	newTester(t, jsonServer(`{"handler": "rate_limit", "rate_limits": {"conc_json": {
		"key": "static", "max_events": 100, "window": "1m",
		"scopes": {"inflight": {"key": "{http.request.header.X-Tenant}", "concurrency": 1}}}}},
		{"handler": "reverse_proxy", "upstreams": [{"dial": "`+strings.TrimPrefix(u.URL, "http://")+`"}]}`, ""), "json")
	done := make(chan struct{})
	go func() {
		_, _ = get(context.Background(), "X-Hang", "1", "X-Tenant", "a")
		close(done)
	}()
	within(t, arrived, "tenant a's first request")
	if resp, err := get(context.Background(), "X-Tenant", "a"); err != nil || resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("tenant a's second request in flight: %v %v, want 503", resp, err)
	}
	if resp, err := get(context.Background(), "X-Tenant", "b"); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("tenant b: %v %v, want 200 (its own slot)", resp, err)
	}
	close(release)
	within(t, done, "tenant a's first request to end")
	eventuallyOK(t, "tenant a after its slot was freed", "X-Tenant", "a")
}

// A request waiting in line whose client leaves gives up its place: it
// never reaches the upstream, and the slot goes to the next request.
func TestConcurrencyWaiterLeaves(t *testing.T) {
	u, arrived, release := holdingUpstream(t)
	var quitterSeen atomic.Bool
	hold := u.hold
	u.hold = func(r *http.Request) {
		if r.Header.Get("X-Quitter") != "" {
			quitterSeen.Store(true)
		}
		hold(r)
	}
	concSite(t, "conc_quit", "key static\n\t\t\tconcurrency 1\n\t\t\tqueue 30s", u)
	done := make(chan struct{})
	go func() {
		_, _ = get(context.Background(), "X-Hang", "1")
		close(done)
	}()
	within(t, arrived, "the held request")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	quit := make(chan error, 1)
	go func() {
		_, err := get(ctx, "X-Quitter", "1")
		quit <- err
	}()
	waitInLine(t, 1, "the request about to leave")
	cancel()
	if err := <-quit; err == nil {
		t.Fatal("the waiting request was answered while the only slot was held")
	}
	// Caddy learns that the client left when it reads the closed
	// connection: the slot is freed only once the request left the line.
	waitInLine(t, 0, "the request whose client left")
	close(release)
	within(t, done, "the held request to end")
	if resp, err := get(context.Background()); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("the next request: %v %v, want 200", resp, err)
	}
	if quitterSeen.Load() {
		t.Fatal("a request whose client left while in line reached the upstream")
	}
}

// queue_max: beyond that many requests waiting, a request is answered 503
// at once, on the memory backend and on Redis.
func TestConcurrencyQueueMaxRefuses(t *testing.T) {
	redis := redistest.Standalone(t, "")
	for _, backend := range []string{"", "backend redis {\n\t\t\taddress " + redis.Addr + "\n\t\t\ttimeout 2s\n\t\t}"} {
		name := "memory"
		if backend != "" {
			name = "redis"
		}
		t.Run(name, func(t *testing.T) {
			u, arrived, release := holdingUpstream(t)
			newTester(t, caddyfileServer(fmt.Sprintf(`
	rate_limit {
		%s
		zone rslots_qmax_%s {
			key static
			concurrency 1
			queue 30s
			queue_max 2
		}
	}
	reverse_proxy %s`, backend, name, strings.TrimPrefix(u.URL, "http://"))), "caddyfile")
			var wg sync.WaitGroup
			codes := make([]int, 3)
			wg.Go(func() { codes[0] = status(context.Background(), httpBase, "X-Hang", "1") })
			within(t, arrived, "the held request")
			for i := 1; i <= 2; i++ {
				wg.Go(func() { codes[i] = status(context.Background(), httpBase) })
			}
			waitInLine(t, 2, "the two waiters")
			start := time.Now()
			req, _ := http.NewRequest(http.MethodGet, httpBase+"/", nil)
			resp, err := slotClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "30" {
				t.Fatalf("a third waiter got %d, Retry-After %q; want 503, 30", resp.StatusCode, resp.Header.Get("Retry-After"))
			}
			if waited := time.Since(start); waited > 5*time.Second {
				t.Fatalf("refused after %v, not at once", waited)
			}
			close(release)
			wg.Wait()
			if fmt.Sprint(codes) != "[200 200 200]" {
				t.Fatalf("the held and the two waiting requests got %v, want all 200", codes)
			}
		})
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
