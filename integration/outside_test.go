package integration

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
)

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

func TestOutsideMholtReadmeCaddyfile(t *testing.T) {
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

func TestOutsideMholtReadmeJSON(t *testing.T) {
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
func TestOutsideMholtNetworkPrefix(t *testing.T) {
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
func TestOutsideMholtOrderAndRoute(t *testing.T) {
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
func TestOutsideMholtEveryOption(t *testing.T) {
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
func TestOutsideSweepIntervalZeroIsDefault(t *testing.T) {
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
func TestOutsideMholtLooseValuesLoad(t *testing.T) {
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
func TestOutsideMholtMatchBlocksOr(t *testing.T) {
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

// Two zones that both deny: the answer names the one with the longest wait
// and its Retry-After, the earliest time the request can pass. mholt's
// stopped at the first zone that denied (the most permissive first, by its
// sort), so it said "za, 10 s" and denied the retry again for zb.
func TestOutsideSeveralZonesDenyLongestWait(t *testing.T) {
	tester := newTester(t, caddyfileServer(`	rate_limit {
		zone outside_za {
			key    static
			events 2
			window 10s
		}
		zone outside_zb {
			key    static
			events 2
			window 1m
		}
	}
	handle_errors {
		respond "{http.rate_limit.exceeded.name}"
	}
	respond "ok"`), "caddyfile")
	expectN(t, tester, 2, http.StatusOK, "GET", "/")
	if body := expect429(t, tester, 59, 60, "GET", "/"); body != "outside_zb" {
		t.Fatalf("exceeded.name %q, want outside_zb (the longest wait)", body)
	}
}

// A query parameter given twice is ambiguous: it counts under the missing
// policy's shared quota (with the empty value), never as a fresh key per
// combination, which is what Caddy's joined value "a,b" made it in mholt's.
func TestOutsideRepeatedValueSharesTheMissingQuota(t *testing.T) {
	tester := newTester(t, caddyfileServer(`	rate_limit {
		zone outside_repeated {
			key    {http.request.uri.query.u}
			events 2
			window 1m
		}
	}
	respond "ok"`), "caddyfile")
	expectN(t, tester, 1, http.StatusOK, "GET", "/?u=a&u=b")
	expectN(t, tester, 1, http.StatusOK, "GET", "/?u=c&u=d")
	expect429(t, tester, 59, 60, "GET", "/?u=e&u=f")
	expect429(t, tester, 59, 60, "GET", "/?u=")
	expect429(t, tester, 59, 60, "GET", "/")
	expectN(t, tester, 2, http.StatusOK, "GET", "/?u=a")
	expect429(t, tester, 59, 60, "GET", "/?u=a")
}

// A zone whose requests all lack their key (a client that lost its header,
// a key template that reads the wrong field) is refused with 400 by
// `missing deny`, and no request is decided: `caddy rate-limit report`
// must not call that "no traffic yet".
func TestOutsideReportMissingKeysAreTraffic(t *testing.T) {
	zone := freshZone("outside_report_nokey") // Prometheus counters are the process's
	tester := newTester(t, jsonServer(`{
		"handler": "rate_limit",
		"rate_limits": {"`+zone+`": {"key": "{http.request.header.X-Api-Key}", "missing": "deny", "window": "1m", "max_events": 10}}
	}, `+okHandler, ""), "json")
	expectN(t, tester, 3, http.StatusBadRequest, "GET", "/")
	out, err := runCaddy(t, "rate-limit", "report", "--metrics", "http://"+adminAddr+"/metrics", "--address", adminAddr)
	if err != nil {
		t.Fatalf("report: %v\n%s", err, out)
	}
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, zone+" ") {
			if !strings.Contains(line, "CHECK: 3 requests without a usable key") {
				t.Fatalf("report line %q, want the 3 requests without a key flagged", line)
			}
			return
		}
	}
	t.Fatalf("zone %s not in the report:\n%s", zone, out)
}

// outsideRecorder is an event handler module that keeps the events it is
// given, so a test sees what a subscriber of Caddy's events app sees.
type outsideRecorder struct{}

var outsideEvents struct {
	sync.Mutex
	got []caddy.Event
}

func init() { caddy.RegisterModule(outsideRecorder{}) }

func (outsideRecorder) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "events.handlers.outside_recorder", New: func() caddy.Module { return new(outsideRecorder) }}
}

func (outsideRecorder) Handle(_ context.Context, e caddy.Event) error {
	outsideEvents.Lock()
	defer outsideEvents.Unlock()
	outsideEvents.got = append(outsideEvents.got, e)
	return nil
}

// A denial emits the rate_limit_exceeded event with the zone, the scope,
// the wait and the peer's address, as mholt's does, so a subscriber can act
// on it; an allowed request emits nothing.
func TestOutsideDenialEmitsEvent(t *testing.T) {
	outsideEvents.Lock()
	outsideEvents.got = nil
	outsideEvents.Unlock()
	tester := newTester(t, withPorts(`{
	"admin": {"listen": "localhost:2999"},
	"logging": {"logs": {"default": {"level": "ERROR"}}},
	"apps": {
		"events": {"subscriptions": [{"events": ["rate_limit_exceeded"], "handlers": [{"handler": "outside_recorder"}]}]},
		"http": {"http_port": 9080, "servers": {"srv": {
			"listen": [":9080"],
			"routes": [{"handle": [
				{"handler": "rate_limit", "rate_limits": {"outside_event": {"key": "{http.request.remote.host}", "window": "1m", "max_events": 2}}},
				`+okHandler+`
			]}]
		}}}
	}
}`), "json")
	expectN(t, tester, 2, http.StatusOK, "GET", "/")
	outsideEvents.Lock()
	n := len(outsideEvents.got)
	outsideEvents.Unlock()
	if n != 0 {
		t.Fatalf("%d events for allowed requests", n)
	}
	expect429(t, tester, 59, 60, "GET", "/")
	outsideEvents.Lock()
	defer outsideEvents.Unlock()
	if len(outsideEvents.got) != 1 {
		t.Fatalf("%d events for one denial, want 1", len(outsideEvents.got))
	}
	e := outsideEvents.got[0]
	wait, _ := e.Data["wait"].(time.Duration)
	if e.Name() != "rate_limit_exceeded" || e.Origin() == nil || e.Origin().CaddyModule().ID != "http.handlers.rate_limit" ||
		e.Data["zone"] != "outside_event" || e.Data["scope"] != "" || e.Data["remote_ip"] != "127.0.0.1" ||
		wait <= 59*time.Second || wait > time.Minute {
		t.Fatalf("event %s from %v: %v; want rate_limit_exceeded from http.handlers.rate_limit, zone outside_event, scope \"\", remote_ip 127.0.0.1, a wait just under 1m", e.Name(), e.Origin(), e.Data)
	}
}

// Every JSON block of the documentation loads into a running Caddy: a
// handler as it is, a zone's fields inside a zone. (The Caddyfile blocks
// are validated by TestExamplesValidate.)
func TestOutsideDocJSONLoads(t *testing.T) {
	newTester(t, jsonServer(okHandler, ""), "json")
	n := 0
	for _, b := range docBlocks(t) {
		if b.lang != "json" {
			continue
		}
		handler := b.text
		if !strings.Contains(b.text, `"handler"`) {
			handler = `{"handler": "rate_limit", "rate_limits": {"outside_doc_json": ` + b.text + `}}`
			if !strings.Contains(b.text, `"key"`) {
				handler = strings.Replace(handler, `"outside_doc_json": {`, `"outside_doc_json": {"key": "{http.request.header.X-Api-Key}",`, 1)
			}
		}
		t.Run(b.where, func(t *testing.T) {
			adminRequest(t, "POST", "/load", "application/json", jsonServer(handler+`, `+okHandler, ""))
		})
		n++
	}
	if n < 3 {
		t.Fatalf("%d JSON blocks found in the documentation, want at least 3", n)
	}
}
