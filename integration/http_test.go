package integration

import (
	"net/http"
	"strings"
	"testing"
)

// mholt/caddy-ratelimit's own handler test, as JSON: 10 GETs per 60 s on
// one static key, then 429 with Retry-After 60. A POST does not match.
func TestMholtConfigLimitsAndRetryAfter(t *testing.T) {
	tester := newTester(t, jsonServer(`{
		"handler": "rate_limit",
		"rate_limits": {"mholt_json": {"match": [{"method": ["GET"]}], "key": "static", "window": "60s", "max_events": 10}}
	}, `+okHandler, ""), "json")

	expectN(t, tester, 10, http.StatusOK, "GET", "/")
	expect429(t, tester, 59, 60, "GET", "/")
	expectN(t, tester, 3, http.StatusOK, "POST", "/")
}

// The same, from mholt/caddy-ratelimit's Caddyfile test.
func TestMholtCaddyfile(t *testing.T) {
	tester := newTester(t, `{
	skip_install_trust
	admin localhost:2999
	http_port 9080
}
localhost:9080 {
	rate_limit {
		zone mholt_caddyfile {
			match {
				method GET
			}
			key static
			window 60s
			events 10
		}
	}
	respond 200
}`, "caddyfile")
	expectN(t, tester, 10, http.StatusOK, "GET", "/")
	expect429(t, tester, 59, 60, "GET", "/")
	expectN(t, tester, 1, http.StatusOK, "POST", "/")
}

// mholt/caddy-ratelimit's distinct zones and keys: a GET zone and a DELETE
// zone, keyed by path; each (zone, key) has its own 10.
func TestDistinctZonesAndKeys(t *testing.T) {
	tester := newTester(t, jsonServer(`{
		"handler": "rate_limit",
		"rate_limits": {
			"distinct_get": {"match": [{"method": ["GET"]}], "key": "{http.request.orig_uri.path}", "window": "60s", "max_events": 10},
			"distinct_delete": {"match": [{"method": ["DELETE"]}], "key": "{http.request.orig_uri.path}", "window": "60s", "max_events": 10}
		}
	}, `+okHandler, ""), "json")
	for _, method := range []string{"GET", "DELETE"} {
		for _, path := range []string{"/path1", "/path2"} {
			expectN(t, tester, 10, http.StatusOK, method, path)
			expect429(t, tester, 59, 60, method, path)
		}
	}
}

// Two zones share a key and the second denies: the first must not be
// charged for the denied requests (mholt/caddy-ratelimit charges it).
func TestDeniedRequestChargesNoZone(t *testing.T) {
	tester := newTester(t, jsonServer(`{
		"handler": "rate_limit",
		"rate_limits": {
			"aon_site": {"key": "{http.request.remote.host}", "window": "1h", "max_events": 5},
			"aon_upload": {"match": [{"path": ["/upload"]}], "key": "{http.request.remote.host}", "window": "1h", "max_events": 1, "algorithm": "token_bucket"}
		}
	}, `+okHandler, ""), "json")

	expectN(t, tester, 1, http.StatusOK, "POST", "/upload")
	for i := 0; i < 10; i++ {
		expect429(t, tester, 3599, 3600, "POST", "/upload")
	}
	// aon_site was charged once: 4 left for other pages.
	expectN(t, tester, 4, http.StatusOK, "GET", "/page")
	expect429(t, tester, 3599, 3600, "GET", "/page")
}

// handle_errors shapes the 429 and reads the zone's name and the wait.
func TestHandleErrorsPage(t *testing.T) {
	tester := newTester(t, caddyfileServer(`	rate_limit {
		zone errpage_login {
			key {remote_host}
			rate 2/1m
		}
	}
	handle_errors 429 {
		respond "zone={http.rate_limit.exceeded.name} retry={http.rate_limit.exceeded.retry_after} msg={err.message}" 429
	}
	respond "welcome"`), "caddyfile")
	expectN(t, tester, 2, http.StatusOK, "GET", "/")
	body := expect429(t, tester, 59, 60, "GET", "/")
	if !strings.HasPrefix(body, "zone=errpage_login retry=") || !strings.HasSuffix(body, " msg=rate limit exceeded") {
		t.Fatalf("error page %q does not show the zone, the wait and the message", body)
	}
}

// A route matcher on the directive, and a zone matcher inside it.
func TestMatchers(t *testing.T) {
	tester := newTester(t, caddyfileServer(`	rate_limit /api/* {
		zone match_api {
			match {
				header X-Tenant *
			}
			key {header.X-Tenant}
			rate 3/1h
		}
	}
	respond "ok"`), "caddyfile")
	expectN(t, tester, 3, http.StatusOK, "GET", "/api/x", "X-Tenant", "acme")
	expect429(t, tester, 3599, 3600, "GET", "/api/x", "X-Tenant", "acme")
	// Another tenant, no tenant, or outside /api: not limited by acme's use.
	expectN(t, tester, 3, http.StatusOK, "GET", "/api/x", "X-Tenant", "globex")
	expectN(t, tester, 10, http.StatusOK, "GET", "/api/x")
	expectN(t, tester, 10, http.StatusOK, "GET", "/other", "X-Tenant", "acme")
}

func TestTokenBucketAndCost(t *testing.T) {
	tester := newTester(t, jsonServer(`{
		"handler": "rate_limit",
		"rate_limits": {
			"cost_bucket": {"key": "{http.request.header.X-User}", "window": "1h", "max_events": 10, "algorithm": "token_bucket", "cost": "{http.request.header.X-Cost}"}
		}
	}, `+okHandler, ""), "json")

	expectN(t, tester, 3, http.StatusOK, "GET", "/", "X-User", "u1", "X-Cost", "3")
	// 1 token left; the 2 missing refill at 10/h in 12 minutes.
	expect429(t, tester, 719, 720, "GET", "/", "X-User", "u1", "X-Cost", "3")
	expectN(t, tester, 1, http.StatusOK, "GET", "/", "X-User", "u1", "X-Cost", "1")
	// No X-Cost header: cost 1; cost 0 is free.
	expectN(t, tester, 10, http.StatusOK, "GET", "/", "X-User", "u2")
	expectN(t, tester, 5, http.StatusOK, "GET", "/", "X-User", "u2", "X-Cost", "0")
	// A cost that can never pass: 429 without a misleading Retry-After,
	// however large the number.
	for _, huge := range []string{"11", "9223372036854775807", "99999999999999999999"} {
		code, ra, _ := do(t, tester, "GET", "/", "X-User", "u3", "X-Cost", huge)
		if code != http.StatusTooManyRequests || ra != "" {
			t.Fatalf("cost %s: status %d, Retry-After %q; want 429 without Retry-After", huge, code, ra)
		}
	}
	// A cost that is not a number is the client's error.
	expectN(t, tester, 1, http.StatusBadRequest, "GET", "/", "X-User", "u4", "X-Cost", "lots")
	expectN(t, tester, 1, http.StatusBadRequest, "GET", "/", "X-User", "u4", "X-Cost", "-2")
}

func TestShadowZoneNeverDenies(t *testing.T) {
	zone := freshZone("shadow_zone") // Prometheus counters are the process's
	tester := newTester(t, jsonServer(`{
		"handler": "rate_limit",
		"rate_limits": {"`+zone+`": {"key": "static", "window": "1h", "max_events": 1, "shadow": true}}
	}, `+okHandler, ""), "json")
	expectN(t, tester, 5, http.StatusOK, "GET", "/")
	metrics := adminRequest(t, "GET", "/metrics", "", "")
	if !strings.Contains(metrics, `caddy_rate_limit_shadow_declined_requests_total{scope="",zone="`+zone+`"} 4`) {
		t.Fatalf("shadow denials not counted:\n%s", grep(metrics, "shadow"))
	}
}

// A shadow zone refuses nothing: not over its rate, not for a missing
// key, not for its deny list.
func TestShadowZoneRefusesNothing(t *testing.T) {
	tester := newTester(t, jsonServer(`{
		"handler": "rate_limit",
		"rate_limits": {
			"shadow_listed": {"key": "static", "deny": ["127.0.0.0/8", "::1"], "window": "1h", "max_events": 100, "shadow": true},
			"shadow_strict": {"key": "{http.request.header.X-User}", "missing": "deny", "cost": "{http.request.header.X-Cost}", "window": "1h", "max_events": 1, "shadow": true}
		}
	}, `+okHandler, ""), "json")
	expectN(t, tester, 3, http.StatusOK, "GET", "/")
	expectN(t, tester, 3, http.StatusOK, "GET", "/", "X-User", "u", "X-Cost", "lots")
}

func TestJitterStretchesRetryAfter(t *testing.T) {
	tester := newTester(t, jsonServer(`{
		"handler": "rate_limit",
		"jitter": 1.0,
		"rate_limits": {"jitter_zone": {"key": "static", "window": "100s", "max_events": 1}}
	}, `+okHandler, ""), "json")
	expectN(t, tester, 1, http.StatusOK, "GET", "/")
	seen := map[string]bool{}
	for i := 0; i < 20; i++ {
		_, ra, _ := do(t, tester, "GET", "/")
		seen[ra] = true
		expect429(t, tester, 99, 200, "GET", "/")
	}
	if len(seen) < 2 {
		t.Fatalf("20 denials with jitter 1.0 all had Retry-After %v", seen)
	}
}

func grep(text, word string) string {
	var out []string
	for _, line := range strings.Split(text, "\n") {
		if strings.Contains(line, word) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}
