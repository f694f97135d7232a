package integration

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redistest"
)

// A client that sends its body slowly is waited for by the upstream, but
// the wait is the client's: a few such uploads a second must not drive an
// adaptive limit down for everyone (before, five a second took a cap of
// 100 to 12 in six seconds).
func TestAttack8SlowUploadDoesNotShrinkAdaptive(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = io.WriteString(w, "ok")
	}))
	t.Cleanup(up.Close)
	newTester(t, caddyfileServer(fmt.Sprintf(`
	rate_limit {
		zone attack8_slow_upload {
			key static
			concurrency 50
			adaptive {
				min 5
				interval 1s
				latency_p99 300ms 800ms
			}
		}
	}
	reverse_proxy %s`, strings.TrimPrefix(up.URL, "http://"))), "caddyfile")
	const zone = "attack8_slow_upload"
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

// Slots whose release could not reach Redis (it paused for 1.5 s while
// the requests holding them ended) are freed once Redis answers again:
// before, the key stayed full, every request answered 503, until
// slot_ttl (30 s) after all its requests had ended.
func TestAttack8SlotsFreedAfterRedisHiccup(t *testing.T) {
	redis := redistest.Standalone(t, "")
	arrived := make(chan struct{}, 2)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("slow") != "" {
			arrived <- struct{}{}
			time.Sleep(600 * time.Millisecond)
		}
		_, _ = io.WriteString(w, "ok")
	}))
	t.Cleanup(up.Close)
	newTester(t, caddyfileServer(fmt.Sprintf(`
	rate_limit {
		backend redis {
			address %s
			timeout 100ms
		}
		zone attack8_slot_hiccup {
			key static
			concurrency 2
			slot_ttl 30s
		}
	}
	reverse_proxy %s`, redis.Addr, strings.TrimPrefix(up.URL, "http://"))), "caddyfile")
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			if resp, err := http.Get(httpBase + "/?slow=1"); err == nil {
				resp.Body.Close()
			}
		})
	}
	// Both hold their slots: they reached the upstream.
	within(t, arrived, "the first slow request")
	within(t, arrived, "the second slow request")
	rc := goredis.NewClient(&goredis.Options{Addr: redis.Addr})
	defer rc.Close()
	if err := rc.Do(context.Background(), "CLIENT", "PAUSE", "1500", "ALL").Err(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	// Redis answers again 1.5 s after the pause began; the breaker opens
	// for a moment after the failures.
	time.Sleep(1500 * time.Millisecond)
	deadline := time.Now().Add(5 * time.Second)
	for {
		resp, err := http.Get(httpBase + "/")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			n, _ := rc.ZCard(context.Background(), "sluice:attack8_slot_hiccup//s{static}").Result()
			t.Fatalf("5 s after Redis came back, the key's requests all ended, still refused (last %v %v); %d slots held in Redis", resp.StatusCode, err, n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A zone taken out of the config takes its adaptive series with it: left
// behind, a limit that sat at its min would keep RateLimitAdaptiveAtMin
// firing for a zone that no longer exists. A reload that keeps the zone
// keeps them.
func TestAttack8AdaptiveSeriesLeaveWithTheirZone(t *testing.T) {
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
	newTester(t, site("attack8_series_gone"), "caddyfile")
	const series = `caddy_rate_limit_adaptive_min_limit{scope="",zone="attack8_series_gone"}`
	expectMetric(t, series, 2)
	loadConfig(t, site("attack8_series_gone"), "caddyfile")
	expectMetric(t, series, 2)
	loadConfig(t, site("attack8_series_other"), "caddyfile")
	if gone := grepLines(adminRequest(t, "GET", "/metrics", "", ""), `adaptive_`, `zone="attack8_series_gone"`); gone != "" {
		t.Fatalf("the removed zone's adaptive series are still exported:\n%s", gone)
	}
	expectMetric(t, `caddy_rate_limit_adaptive_min_limit{scope="",zone="attack8_series_other"}`, 2)
}

// grepLines returns the lines of text that hold both a and b.
func grepLines(text, a, b string) string {
	var out []string
	for line := range strings.SplitSeq(text, "\n") {
		if strings.Contains(line, a) && strings.Contains(line, b) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}

// A negative high latency mark in JSON was accepted, and latency then
// silently not watched: it is refused at load, naming the field.
func TestAttack8AdaptiveNegativeLatencyMarkRefused(t *testing.T) {
	assertLoadError(t, jsonServer(`{"handler": "rate_limit", "rate_limits": {"attack8_neg_lat": {"key": "k", "concurrency": 10, "adaptive": {"latency_p99_low": "200ms", "latency_p99_high": "-1s"}}}}`, ""), "json",
		`adaptive: latency_p99 marks must be positive, got 200ms and -1s`)
}
