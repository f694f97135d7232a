package integration

import (
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// A site-wide rate_limit that names a shedding group, with routes inside
// that name it again with their priorities, is the natural way to put
// every route in the group. Each request passes through two handlers of
// the group and must still count once: 5 requests in flight for a
// capacity of 10 are a load of 0.5, where nothing is shed.
func TestAttack5ShedNestedHandlersCountOnce(t *testing.T) {
	release := make(chan struct{})
	u := newCountingUpstream(t, func(r *http.Request) {
		if r.Header.Get("X-Hang") != "" {
			<-release
		}
	})
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

	var wg sync.WaitGroup
	defer func() {
		select {
		case <-release:
		default:
			close(release)
		}
		wg.Wait()
	}()
	for range 5 {
		wg.Go(func() {
			req, _ := http.NewRequest(http.MethodGet, httpBase+"/search", nil)
			req.Header.Set("X-Hang", "1")
			if resp, err := http.DefaultClient.Do(req); err == nil {
				resp.Body.Close()
			}
		})
	}
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
	close(release)
	wg.Wait()
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
