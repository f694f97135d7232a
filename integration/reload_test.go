package integration

import (
	"net/http"
	"strings"
	"testing"
	"time"
)

// A reload through /load keeps everyone's usage; a PATCH that raises one
// zone's max_events applies at once to keys that were full.
func TestReloadKeepsUsage(t *testing.T) {
	cfg := func(body string) string {
		return jsonServer(`{
			"handler": "rate_limit",
			"rate_limits": {"reload_zone": {"key": "static", "window": "1h", "max_events": 3}}
		}, {"handler": "static_response", "status_code": 200, "body": "`+body+`"}`, "")
	}
	tester := newTester(t, cfg("v1"), "json")
	expectN(t, tester, 3, http.StatusOK, "GET", "/")
	expect429(t, tester, 3599, 3600, "GET", "/")

	// A new config (different body) through the admin API: still full.
	loadConfig(t, cfg("v2"), "json")
	if code, _, body := do(t, tester, "GET", "/"); code != http.StatusTooManyRequests {
		t.Fatalf("after /load: status %d %q, want 429 (usage kept)", code, body)
	}

	// Raise the limit in place: two more requests pass, then 429 again.
	adminRequest(t, "PATCH", "/config/apps/http/servers/srv/routes/0/handle/0/rate_limits/reload_zone/max_events", "application/json", "5")
	expectN(t, tester, 2, http.StatusOK, "GET", "/")
	expect429(t, tester, 3599, 3600, "GET", "/")
}

// A reload that raises a token bucket's rate: the new rate refills from the
// reload on (once the first config's rate kept refilling it).
func TestReloadChangesBucketRate(t *testing.T) {
	cfg := func(rate string) string {
		return jsonServer(`{
			"handler": "rate_limit",
			"rate_limits": {"reload_bucket": {"key": "static", "algorithm": "token_bucket", "burst": 10, `+rate+`}}
		}, `+okHandler, "")
	}
	tester := newTester(t, cfg(`"window": "1m", "max_events": 10`), "json")
	start := time.Now()
	expectN(t, tester, 10, http.StatusOK, "GET", "/")
	// A token every 6 s, refilling since the first request: 6 s to wait,
	// less what a slow machine took for the ten.
	expect429(t, tester, 6-int(time.Since(start)/time.Second), 6, "GET", "/")
	loadConfig(t, cfg(`"window": "1s", "max_events": 10`), "json")
	time.Sleep(1100 * time.Millisecond) // real time: 10 tokens at 10/s
	expectN(t, tester, 10, http.StatusOK, "GET", "/")
}

// After a reload, /metrics must still move (mholt/caddy-ratelimit #100:
// collectors bound to the first config's registry froze at 0).
func TestMetricsAfterReload(t *testing.T) {
	zone := freshZone("metrics_zone") // Prometheus counters are the process's
	cfg := func(body string) string {
		return jsonServer(`{
			"handler": "rate_limit",
			"rate_limits": {"`+zone+`": {"key": "static", "window": "1h", "max_events": 2}}
		}, {"handler": "static_response", "status_code": 200, "body": "`+body+`"}`, "")
	}
	tester := newTester(t, cfg("a"), "json")
	loadConfig(t, cfg("b"), "json")
	expectN(t, tester, 2, http.StatusOK, "GET", "/")
	expect429(t, tester, 3599, 3600, "GET", "/")
	expect429(t, tester, 3599, 3600, "GET", "/")

	metrics := adminRequest(t, "GET", "/metrics", "", "")
	for _, want := range []string{
		`caddy_rate_limit_declined_requests_total{key="",scope="",zone="` + zone + `"} 2`,
		`caddy_rate_limit_requests_total{key="",scope="",zone="` + zone + `"} 4`,
		`caddy_rate_limit_keys_total{scope="",zone="` + zone + `"} 1`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s; it has:\n%s", want, grep(metrics, zone))
		}
	}
}
