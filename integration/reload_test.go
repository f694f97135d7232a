package integration

import (
	"net/http"
	"strings"
	"testing"
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
	tester.InitServer(cfg("v2"), "json")
	if code, _, body := do(t, tester, "GET", "/"); code != http.StatusTooManyRequests {
		t.Fatalf("after /load: status %d %q, want 429 (usage kept)", code, body)
	}

	// Raise the limit in place: two more requests pass, then 429 again.
	adminRequest(t, "PATCH", "/config/apps/http/servers/srv/routes/0/handle/0/rate_limits/reload_zone/max_events", "application/json", "5")
	expectN(t, tester, 2, http.StatusOK, "GET", "/")
	expect429(t, tester, 3599, 3600, "GET", "/")
}

// After a reload, /metrics must still move (mholt/caddy-ratelimit #100:
// collectors bound to the first config's registry froze at 0).
func TestMetricsAfterReload(t *testing.T) {
	cfg := func(body string) string {
		return jsonServer(`{
			"handler": "rate_limit",
			"rate_limits": {"metrics_zone": {"key": "static", "window": "1h", "max_events": 2}}
		}, {"handler": "static_response", "status_code": 200, "body": "`+body+`"}`, "")
	}
	tester := newTester(t, cfg("a"), "json")
	tester.InitServer(cfg("b"), "json")
	expectN(t, tester, 2, http.StatusOK, "GET", "/")
	expect429(t, tester, 3599, 3600, "GET", "/")
	expect429(t, tester, 3599, 3600, "GET", "/")

	metrics := adminRequest(t, "GET", "/metrics", "", "")
	for _, want := range []string{
		`caddy_rate_limit_declined_requests_total{key="",scope="",zone="metrics_zone"} 2`,
		`caddy_rate_limit_requests_total{key="",scope="",zone="metrics_zone"} 4`,
		`caddy_rate_limit_keys_total{scope="",zone="metrics_zone"} 1`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s; it has:\n%s", want, grep(metrics, "metrics_zone"))
		}
	}
}
