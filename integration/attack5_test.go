package integration

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// hangingUpstream holds every request sent to it with X-Hang until
// letGo; hang sends n such requests to path through Caddy. The test must
// defer letGo: Caddy stops only once they are answered.
func hangingUpstream(t *testing.T) (u *countingUpstream, hang func(path string, n int), letGo func()) {
	release := make(chan struct{})
	u = newCountingUpstream(t, func(r *http.Request) {
		if r.Header.Get("X-Hang") != "" {
			<-release
		}
	})
	var wg sync.WaitGroup
	var once sync.Once
	hang = func(path string, n int) {
		for range n {
			wg.Go(func() {
				req, _ := http.NewRequest(http.MethodGet, httpBase+path, nil)
				req.Header.Set("X-Hang", "1")
				if resp, err := http.DefaultClient.Do(req); err == nil {
					resp.Body.Close()
				}
			})
		}
	}
	return u, hang, func() {
		once.Do(func() { close(release) })
		wg.Wait()
	}
}

// A site-wide rate_limit that names a shedding group, with routes inside
// that name it again with their priorities, is the natural way to put
// every route in the group. Each request passes through two handlers of
// the group and must still count once: 5 requests in flight for a
// capacity of 10 are a load of 0.5, where nothing is shed.
func TestAttack5ShedNestedHandlersCountOnce(t *testing.T) {
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

// A denial the tarpit held tells the client how long to wait from when it
// is sent: held 2 to 4 s of a 10 s wait, Retry-After and X-RateLimit-Reset
// say what is left, not the 10 s of when the request came in.
func TestAttack5TarpitRetryAfterCountsFromSend(t *testing.T) {
	tester := newTester(t, caddyfileServer(`
	rate_limit {
		zone a5_tarpit_sent {
			key static
			rate 1/10s
		}
		headers legacy
		tarpit 4s
	}
	respond ok`), "caddyfile")
	if got, _, _ := do(t, tester, "GET", "/"); got != 200 {
		t.Fatalf("first request: %d", got)
	}
	start := time.Now()
	r := fetch(t, tester, "GET", "/")
	held := time.Since(start)
	if r.code != 429 || held < 2*time.Second {
		t.Fatalf("second request: %d after %s, want 429 held 2 to 4 s", r.code, held)
	}
	left := int((10*time.Second - held + time.Second - 1) / time.Second)
	for _, name := range []string{"Retry-After", "X-RateLimit-Reset"} {
		v, err := strconv.Atoi(r.header.Get(name))
		if err != nil || v > left+1 || v < 1 {
			t.Errorf("%s %q after %s held of a 10 s wait, want about %d", name, r.header.Get(name), held.Round(time.Millisecond), left)
		}
	}
}

// A tarpit in a handler that has no rate to deny with (shed alone, a
// concurrency cap alone, a shadow zone) would hold nothing: the operator
// who expects it to slow clients down is told at load.
func TestAttack5TarpitWithoutRateRefused(t *testing.T) {
	for name, block := range map[string]string{
		"shed alone": `shed a5_tarpit_shed {
			capacity 10
		}`,
		"concurrency alone": `zone a5_tarpit_conc {
			key static
			concurrency 5
		}`,
		"shadow zone": `zone a5_tarpit_shadow {
			key static
			rate 1/1m
			shadow
		}`,
	} {
		t.Run(name, func(t *testing.T) {
			assertLoadError(t, caddyfileServer(`
	rate_limit {
		`+block+`
		tarpit 5s
	}
	respond ok`), "caddyfile", "tarpit would do nothing")
		})
	}
}

// One client that opens more connections than Caddy may have files open,
// each denied and held by a tarpit whose tarpit_max is above that limit,
// must not make Caddy refuse everyone else: all tarpits together hold at
// most half the open-file limit, and other clients are still served.
func TestAttack5TarpitCannotTakeEveryDescriptor(t *testing.T) {
	httpPort, adminPort := freePort(t), freePort(t)
	file := filepath.Join(t.TempDir(), "Caddyfile")
	cfg := fmt.Sprintf(`{
	admin localhost:%d
	metrics
	default_bind 127.0.0.1
}
:%d {
	handle /health {
		respond ok
	}
	handle {
		rate_limit {
			zone a5_fd {
				key static
				rate 1/1h
			}
			tarpit 20s
			tarpit_max 1000000
		}
		respond ok
	}
}`, adminPort, httpPort)
	if err := os.WriteFile(file, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	// The shell sets the limit for the Caddy it becomes, and no other
	// process.
	cmd := exec.Command("sh", "-c", `ulimit -n 256 && exec "$0" run --config "$1"`, binary(t), file)
	logs := startCaddyCmd(t, cmd, file)
	base := fmt.Sprintf("http://127.0.0.1:%d", httpPort)
	waitUp(t, base+"/health")
	if !strings.Contains(logs.String(), "tarpit_max is above half the process's open-file limit") {
		t.Error("no warning that tarpit_max is above what the open-file limit allows")
	}
	get := func(url string, timeout time.Duration) (int, error) {
		c := &http.Client{Timeout: timeout, Transport: &http.Transport{DisableKeepAlives: true}}
		defer c.CloseIdleConnections()
		resp, err := c.Get(url)
		if err != nil {
			return 0, err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	if code, err := get(base+"/", 5*time.Second); code != 200 {
		t.Fatalf("first request: %d %v", code, err)
	}
	// 300 connections, more than the 256 files Caddy may open: each is
	// denied, and those the tarpit does not hold are answered and closed.
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { stop(); wg.Wait() }()
	for range 300 {
		wg.Go(func() {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/", nil)
			c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
			if resp, err := c.Do(req); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
	time.Sleep(2 * time.Second) // the flood is held: nothing to poll that does not need a descriptor
	if code, err := get(base+"/health", 3*time.Second); code != 200 {
		t.Fatalf("another client during the flood: %d %v, want 200", code, err)
	}
	c := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Get(fmt.Sprintf("http://localhost:%d/metrics", adminPort))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if held := metricLine(string(body), "caddy_rate_limit_tarpit_held_requests"); held < 1 || held > 128 {
		t.Fatalf("%v denials held, want 1 to 128 (half of 256 files)", held)
	}
}

// Reloads that change a tier's rate leave no series of the old versions
// behind: after five of them, the zone has one requests_total series per
// tier, not one per version it ever had.
func TestAttack5TierReloadsLeaveNoStaleSeries(t *testing.T) {
	cfg := func(free int) string {
		return caddyfileServerWith("metrics", fmt.Sprintf(`
	rate_limit {
		zone a5_tier_series {
			key static
			tier {http.request.header.X-Plan}
			tiers {
				free %d/1m
				pro 600/1m
				default free
			}
		}
	}
	respond ok`, free))
	}
	tester := newTester(t, cfg(60), "caddyfile")
	for i := range 5 {
		if i > 0 {
			adminRequest(t, "POST", "/load", "text/caddyfile", withPorts(cfg(60+i)))
		}
		do(t, tester, "GET", "/")
		do(t, tester, "GET", "/", "X-Plan", "pro")
	}
	page := adminRequest(t, "GET", "/metrics", "", "")
	var series []string
	for _, line := range strings.Split(page, "\n") {
		if strings.HasPrefix(line, "caddy_rate_limit_requests_total{") && strings.Contains(line, `zone="a5_tier_series"`) {
			series = append(series, line)
		}
	}
	if len(series) != 2 {
		t.Fatalf("%d requests_total series after 5 versions of free, want 2 (free's newest and pro):\n%s", len(series), strings.Join(series, "\n"))
	}
}

// A denial held in a tarpit loads nothing in a shedding group, even when
// an outer handler of the group (a site-wide one) admitted the request
// before the route's rate limit denied it: otherwise a scraper's held
// denials would raise the load until everyone else's requests were shed.
func TestAttack5TarpitHeldDenialsLoadNoGroup(t *testing.T) {
	tester := newTester(t, caddyfileServerWith(`
	rate_limit {
		shed a5_tarpit_load {
			capacity 10
		}
	}`, `
	rate_limit {
		shed a5_tarpit_load
	}
	handle /api {
		rate_limit {
			zone a5_tarpit_load_api {
				key static
				rate 1/1h
			}
			tarpit 10s
		}
		respond ok
	}
	handle /search {
		rate_limit {
			shed a5_tarpit_load {
				priority 4
			}
		}
		respond ok
	}`), "caddyfile")
	if got, _, _ := do(t, tester, "GET", "/api"); got != 200 {
		t.Fatalf("first request: %d", got)
	}
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { stop(); wg.Wait() }()
	for range 10 {
		wg.Go(func() {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, httpBase+"/api", nil)
			if resp, err := http.DefaultClient.Do(req); err == nil {
				resp.Body.Close()
			}
		})
	}
	eventually(t, "10 denials held", func() bool {
		return metricLine(adminRequest(t, "GET", "/metrics", "", ""), "caddy_rate_limit_tarpit_held_requests") == 10
	})
	page := adminRequest(t, "GET", "/metrics", "", "")
	if v := metricLine(page, `caddy_rate_limit_shed_in_flight_requests{group="a5_tarpit_load"}`); v != 0 {
		t.Errorf("in flight %v with only held denials, want 0", v)
	}
	if got, _, body := do(t, tester, "GET", "/search"); got != 200 {
		t.Fatalf("priority 4 with nothing served but 10 held denials: %d (%q), want 200", got, body)
	}
}

// Requests waiting in a concurrency queue load nothing in a shedding group
// that a site-wide handler counts them in: one request served and nine in
// line are a load of 0.1, where priority 4 passes.
func TestAttack5QueuedRequestsLoadNoGroup(t *testing.T) {
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
func TestAttack5DelayedRequestsLoadNoGroup(t *testing.T) {
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
