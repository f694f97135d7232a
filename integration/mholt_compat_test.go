package integration

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"syscall"
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
func TestMholtDistinctZonesAndKeys(t *testing.T) {
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

// A route matcher on the directive, and a zone matcher inside it.
func TestMholtMatchers(t *testing.T) {
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

// The examples of mholt/caddy-ratelimit's README, loaded as its users wrote
// them (only the listen address is the test's), and the behaviour that
// README promises for each.

// fromIP sends a request from a loopback address of its own (127.0.0.0/8 is
// all loopback on Linux), so that {remote_host} tells clients apart.
func fromIP(t *testing.T, ip, method, path string) (int, string, string) {
	t.Helper()
	dialer := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
	client := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return dialer.DialContext(ctx, "tcp4", addr)
		},
		DisableKeepAlives: true,
	}}
	req, err := http.NewRequest(method, strings.Replace(httpBase, "localhost", "127.0.0.1", 1)+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := client.Do(req)
	if errors.Is(err, syscall.EADDRNOTAVAIL) {
		t.Skipf("this system does not route %s to loopback (only Linux does all of 127.0.0.0/8)", ip)
	}
	if err != nil {
		t.Fatalf("%s %s from %s: %v", method, path, ip, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("Retry-After"), string(body)
}

// expectFrom is expectN from the address ip.
func expectFrom(t *testing.T, ip string, n, want int, method, path string) {
	t.Helper()
	for i := 0; i < n; i++ {
		if code, _, body := fromIP(t, ip, method, path); code != want {
			t.Fatalf("%s %s #%d from %s: status %d (%q), want %d", method, path, i+1, ip, code, body, want)
		}
	}
}

// expect429From is expect429 from the address ip; it returns the body.
func expect429From(t *testing.T, ip string, lo, hi int, method, path string) string {
	t.Helper()
	code, ra, body := fromIP(t, ip, method, path)
	secs, err := strconv.Atoi(ra)
	if code != http.StatusTooManyRequests || err != nil || secs < lo || secs > hi {
		t.Fatalf("%s %s from %s: status %d, Retry-After %q (%q); want 429 with Retry-After in [%d, %d]", method, path, ip, code, ra, body, lo, hi)
	}
	return body
}

// checkMholtReadmeExample checks what mholt's README says of its example:
// "Only 100 GET requests will be allowed through every minute, across all
// clients" (static_example) and "only 2 requests per client IP in the last
// 5 seconds" (dynamic_example).
func checkMholtReadmeExample(t *testing.T) {
	const body = "I'm behind the rate limiter!"
	if code, _, got := fromIP(t, "127.0.0.1", "GET", "/"); code != http.StatusOK || got != body {
		t.Fatalf("first GET: %d %q", code, got)
	}
	expectFrom(t, "127.0.0.1", 1, http.StatusOK, "GET", "/")
	// At most 5 s (less the time the test took since the first request).
	expect429From(t, "127.0.0.1", 1, 5, "GET", "/")
	// A POST is not in static_example, but it is in dynamic_example.
	expect429From(t, "127.0.0.1", 1, 5, "POST", "/")
	// 100 GETs in all: 2 already, 49 more clients of 2 each.
	for i := 2; i <= 50; i++ {
		expectFrom(t, "127.0.1."+strconv.Itoa(i), 2, http.StatusOK, "GET", "/")
	}
	expect429From(t, "127.0.2.1", 59, 60, "GET", "/")
	// Other methods still pass, per client.
	expectFrom(t, "127.0.2.1", 2, http.StatusOK, "POST", "/")
	expect429From(t, "127.0.2.1", 1, 5, "POST", "/")
}

func TestMholtReadmeCaddyfile(t *testing.T) {
	newTester(t, `{
	skip_install_trust
	admin localhost:2999
	http_port 9080
}
:9080

rate_limit {
	distributed
	zone static_example {
		match {
			method GET
		}
		key    static
		events 100
		window 1m
	}
	zone dynamic_example {
		key    {remote_host}
		events 2
		window 5s
	}
	log_key
}

respond "I'm behind the rate limiter!"`, "caddyfile")
	checkMholtReadmeExample(t)
}

func TestMholtReadmeJSON(t *testing.T) {
	newTester(t, withPorts(`{
	"admin": {"listen": "localhost:2999"},
	"apps": {
		"http": {
			"servers": {
				"demo": {
					"listen": [":9080"],
					"routes": [
						{
							"handle": [
								{
									"handler": "rate_limit",
									"rate_limits": {
										"static_example": {
											"match": [
												{"method": ["GET"]}
											],
											"key": "static",
											"window": "1m",
											"max_events": 100
										},
										"dynamic_example": {
											"key": "{http.request.remote.host}",
											"window": "5s",
											"max_events": 2
										}
									},
									"distributed": {},
									"log_key": true
								},
								{
									"handler": "static_response",
									"body": "I'm behind the rate limiter!"
								}
							]
						}
					]
				}
			}
		}
	}
}`), "json")
	checkMholtReadmeExample(t)
}

// mholt's network prefix example: IPv6 clients share their /64, each IPv4
// client is limited on its own.
func TestMholtNetworkPrefix(t *testing.T) {
	for _, tt := range []struct{ kind, cfg string }{
		{"json", jsonServer(`{
	"handler": "rate_limit",
	"rate_limits": {
		"per_network": {
			"key": "{http.request.remote.host}",
			"window": "1m",
			"max_events": 100,
			"ipv6_prefix": 64
		}
	}
}, `+okHandler, "")},
		{"caddyfile", caddyfileServer(`	rate_limit {
		zone per_network {
			key         {remote_host}
			events      100
			window      1m
			ipv6_prefix 64
		}
	}
	respond "ok"`)},
	} {
		t.Run(tt.kind, func(t *testing.T) {
			newTester(t, tt.cfg, tt.kind)
			expectFrom(t, "127.0.3.1", 100, http.StatusOK, "GET", "/")
			expect429From(t, "127.0.3.1", 59, 60, "GET", "/")
			expectFrom(t, "127.0.3.2", 1, http.StatusOK, "GET", "/")
		})
	}
}

// mholt's README orders the directive with a global `order` line (its
// older README: before basicauth, the name Caddy had then), or places it in
// a `route`, where it runs in the order written.
func TestMholtOrderAndRoute(t *testing.T) {
	for _, order := range []string{"order rate_limit before basicauth", "order rate_limit after basic_auth"} {
		t.Run(order, func(t *testing.T) {
			tester := newTester(t, caddyfileServerWith("\t"+order, `	rate_limit {
		zone mholt_ordered {
			key    {remote_host}
			events 2
			window 1m
		}
	}
	respond "ok"`), "caddyfile")
			expectN(t, tester, 2, http.StatusOK, "GET", "/")
			expect429(t, tester, 59, 60, "GET", "/")
		})
	}
	t.Run("route", func(t *testing.T) {
		tester := newTester(t, caddyfileServer(`	route {
		# Uncritical resource without rate limit
		respond /ping "pong"

		# Apply rate limit
		rate_limit {
			zone mholt_route {
				key    {remote_host}
				events 2
				window 1m
			}
		}

		# Critical resources after rate limiting
		respond "critical"
	}`), "caddyfile")
		expectN(t, tester, 2, http.StatusOK, "GET", "/critical")
		expect429(t, tester, 59, 60, "GET", "/critical")
		expectN(t, tester, 5, http.StatusOK, "GET", "/ping")
	})
}

// Every handler option of mholt's syntax at once, as its README lists them:
// they load, and the limit is the zone's, with Retry-After stretched by at
// most the jitter.
func TestMholtEveryOption(t *testing.T) {
	storage := storageDir(t)
	tester := newTester(t, caddyfileServer(`	rate_limit {
		zone mholt_every {
			match {
				path /api/*
			}
			key         {remote_host}
			window      10s
			events      3
			ipv4_prefix 24
			ipv6_prefix 64
		}
		distributed {
			read_interval  2s
			write_interval 3s
			purge_age 1h
		}
		log_key
		disable_metrics
		storage file_system `+storage+`
		jitter  0.5
		sweep_interval 30s
	}
	respond "ok"`), "caddyfile")
	expectN(t, tester, 3, http.StatusOK, "GET", "/api/a")
	// At most 10 s, and up to half as much again of jitter.
	expect429(t, tester, 1, 15, "GET", "/api/b")
	// ipv4_prefix 24: another address of 127.0.0.0/24 is the same client.
	expect429From(t, "127.0.0.9", 1, 15, "GET", "/api/c")
	expectFrom(t, "127.0.4.1", 3, http.StatusOK, "GET", "/api/d")
	expectN(t, tester, 3, http.StatusOK, "GET", "/other")
}

// A sweep_interval of 0 is mholt's default (1m) in the Caddyfile, as it is
// in JSON for both: such a config must load and limit.
func TestMholtSweepIntervalZeroIsDefault(t *testing.T) {
	tester := newTester(t, caddyfileServer(`	rate_limit {
		zone mholt_sweep_zero {
			key    static
			events 2
			window 1m
		}
		sweep_interval 0s
	}
	respond "ok"`), "caddyfile")
	expectN(t, tester, 2, http.StatusOK, "GET", "/")
	expect429(t, tester, 59, 60, "GET", "/")
}

// Values mholt's loads, however odd, load and limit: a jitter written as a
// percent adds up to that many times the wait, as it did there; a sweep
// under a second runs at 1s; a flag given twice is the flag.
func TestMholtLooseValuesLoad(t *testing.T) {
	tester := newTester(t, caddyfileServer(`	rate_limit {
		zone mholt_loose {
			key    static
			events 2
			window 5s
		}
		jitter 20
		sweep_interval 500ms
		log_key
		log_key
		disable_metrics
		disable_metrics
	}
	respond "ok"`), "caddyfile")
	expectN(t, tester, 2, http.StatusOK, "GET", "/")
	// 5 s of wait, plus up to 20 times that.
	expect429(t, tester, 5, 105, "GET", "/")
}

// Several match blocks in a zone are OR'ed, as in mholt's.
func TestMholtMatchBlocksOr(t *testing.T) {
	tester := newTester(t, caddyfileServer(`	rate_limit {
		zone mholt_or {
			match {
				method POST
			}
			match {
				path /x
			}
			key    static
			events 2
			window 1m
		}
	}
	respond "ok"`), "caddyfile")
	expectN(t, tester, 1, http.StatusOK, "GET", "/x")
	expectN(t, tester, 1, http.StatusOK, "POST", "/y")
	expect429(t, tester, 59, 60, "POST", "/x")
	expect429(t, tester, 59, 60, "GET", "/x")
	expectN(t, tester, 3, http.StatusOK, "GET", "/y")
}
