package integration

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

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

// A denial the tarpit held tells the client how long to wait from when it
// is sent: held 2 to 4 s of a 10 s wait, Retry-After and X-RateLimit-Reset
// say what is left, not the 10 s of when the request came in.
func TestTarpitRetryAfterCountsFromSend(t *testing.T) {
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
func TestTarpitWithoutRateRefused(t *testing.T) {
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
func TestTarpitCannotTakeEveryDescriptor(t *testing.T) {
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

// A denial held in a tarpit loads nothing in a shedding group, even when
// an outer handler of the group (a site-wide one) admitted the request
// before the route's rate limit denied it: otherwise a scraper's held
// denials would raise the load until everyone else's requests were shed.
func TestTarpitHeldDenialsLoadNoGroup(t *testing.T) {
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
