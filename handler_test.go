package sluice

import (
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// okHandler is the next handler of the benchmarks: it answers nothing, so
// what is measured is the rate limiter alone.
var okHandler = caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { return nil })

// benchRequest is a request as Caddy hands it to a handler (replacer,
// client_ip variable), from remote. It is made once and sent many times,
// so the benchmark measures the handler, not Caddy's request setup.
func benchRequest(tb testing.TB, target, remote string) (http.ResponseWriter, *http.Request) {
	tb.Helper()
	r := httptest.NewRequest(http.MethodGet, target, nil)
	r.RemoteAddr = remote
	w := httptest.NewRecorder()
	return w, caddyhttp.PrepareRequest(r, caddy.NewReplacer(), w, &caddyhttp.Server{})
}

// hotPathCase is one request sent again and again through a handler.
type hotPathCase struct {
	name, config   string
	now            func() int64
	target, remote string
	denied         bool
	// maxAllocs is the most allocations one request may make.
	maxAllocs float64
}

func hotPathCases() []hotPathCase {
	// The clock moves a second at each reading, so a limit of 100 per
	// minute is back to full at every request: it always allows, with a
	// realistic number of requests remaining.
	var ticking atomic.Int64
	ticking.Store(fuzzStart)
	tick := func() int64 { return ticking.Add(int64(time.Second)) }
	frozen := func() int64 { return fuzzStart }
	return []hotPathCase{
		{"allowed/by_ip", `{"rate_limits": {"hot_ip": {"key": "{http.vars.client_ip}", "ipv6_prefix": 64, "max_events": 100, "window": "1m", "algorithm": "token_bucket"}}}`,
			tick, "http://example.com/", "192.0.2.7:4242", false, 0},
		// A /64 is written out for each request: one string.
		{"allowed/by_ip_v6", `{"rate_limits": {"hot_ip6": {"key": "{http.vars.client_ip}", "ipv6_prefix": 64, "max_events": 100, "window": "1m", "algorithm": "token_bucket"}}}`,
			tick, "http://example.com/", "[2001:db8::7]:4242", false, 2},
		{"allowed/by_query", `{"rate_limits": {"hot_query": {"key": "{http.request.uri.query.user}", "max_events": 100, "window": "1m", "algorithm": "token_bucket"}}}`,
			tick, "http://example.com/search?q=caddy&page=2&user=alice&lang=en", "192.0.2.7:4242", false, 8},
		// Retry-After (a header holds a []string) and the key placeholder
		// (a string in an interface value).
		{"denied/by_ip", `{"rate_limits": {"hot_ip_deny": {"key": "{http.vars.client_ip}", "ipv6_prefix": 64, "max_events": 1, "window": "1h", "algorithm": "token_bucket"}}}`,
			frozen, "http://example.com/", "192.0.2.7:4242", true, 2},
	}
}

// send provisions c's handler and returns a function that sends its
// request once, after a first request that makes the key (and, for a
// denied case, takes the only unit).
func (c hotPathCase) send(tb testing.TB) func() {
	tb.Helper()
	h, cleanup, err := provisionJSON([]byte(c.config), c.now)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(cleanup)
	w, r := benchRequest(tb, c.target, c.remote)
	if err := h.ServeHTTP(w, r, okHandler); err != nil {
		tb.Fatal(err)
	}
	return func() {
		if err := h.ServeHTTP(w, r, okHandler); (err != nil) != c.denied {
			tb.Fatalf("error %v, want one: %v", err, c.denied)
		}
	}
}

// BenchmarkServeHTTP is one request through the handler on an existing key,
// with a next handler that does nothing.
//
//	go test -run '^$' -bench ServeHTTP -benchmem .
func BenchmarkServeHTTP(b *testing.B) {
	for _, c := range hotPathCases() {
		b.Run(c.name, func(b *testing.B) {
			send := c.send(b)
			b.ReportAllocs()
			for b.Loop() {
				send()
			}
		})
	}
}

// The decision of a request on an existing key allocates nothing when it
// is allowed, and only what the answer must hold when it is denied. (The
// race detector drops pooled values at random, so it is not measured
// there.)
func TestServeHTTPAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool drops values at random under the race detector")
	}
	for _, c := range hotPathCases() {
		t.Run(c.name, func(t *testing.T) {
			send := c.send(t)
			if got := testing.AllocsPerRun(200, send); got > c.maxAllocs {
				t.Fatalf("%v allocations per request, want at most %v", got, c.maxAllocs)
			}
		})
	}
}
