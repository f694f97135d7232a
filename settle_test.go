package sluice

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
)

func TestParseSettleValue(t *testing.T) {
	for _, tc := range []struct {
		v    string
		want int64
		ok   bool
	}{
		{"1800", 1800, true},
		{" 1800\t", 1800, true},
		{"0", 0, true},
		{"007", 7, true},
		{"1000000000000000", algorithms.MaxSettle, true},
		{"1000000000000001", 0, false},     // past any limit
		{"99999999999999999999", 0, false}, // past 64 bits
		{"", 0, false},
		{"-1", 0, false},
		{"+5", 0, false},
		{"1e3", 0, false},
		{"1.0", 0, false},
		{"0x10", 0, false},
		{"1,2", 0, false},
		{"1 2", 0, false},
		{"١٨٠٠", 0, false}, // Arabic-Indic digits
	} {
		got, ok := parseSettleValue(tc.v)
		if got != tc.want && tc.ok || ok != tc.ok {
			t.Errorf("%q: %d %v, want %d %v", tc.v, got, ok, tc.want, tc.ok)
		}
	}
}

func TestCheckSettle(t *testing.T) {
	for _, tc := range []struct {
		name string
		l    Limit
		want string
	}{
		{"header", Limit{Settle: "{http.response.header.x-tokens-used}"}, ""},
		{"trailer", Limit{Settle: "{http.response.trailer.X-Tokens-Used}"}, ""},
		{"other placeholder", Limit{Settle: "{http.vars.tokens}"}, ""},
		{"text", Limit{Settle: "1800"}, "settle must be one placeholder"},
		{"two placeholders", Limit{Settle: "{http.vars.a}{http.vars.b}"}, "settle must be one placeholder"},
		{"text around", Limit{Settle: "{http.vars.a} tokens"}, "settle must be one placeholder"},
		{"no opening brace", Limit{Settle: "http.vars.tokens}"}, "settle must be one placeholder"},
		{"no closing brace", Limit{Settle: "{http.vars.tokens"}, "settle must be one placeholder"},
		{"no field", Limit{Settle: "{http.response.header.}"}, "names no field"},
		{"request", Limit{Settle: "{http.request.header.X-Tokens}"}, "settle reads the response"},
		{"lease", Limit{Settle: "{http.response.header.X-Tokens-Used}", Lease: 5}, "settle cannot be used with lease on a sliding_window"},
		{"lease, bucket", Limit{Settle: "{http.response.header.X-Tokens-Used}", Lease: 5, Algorithm: algorithms.NameTokenBucket}, ""},
		{"lease, window", Limit{Settle: "{http.response.header.X-Tokens-Used}", Lease: 5, Algorithm: algorithms.NameFixedWindow}, ""},
		{"concurrency alone", Limit{Settle: "{http.response.header.X-Tokens-Used}", Concurrency: 5}, "settle needs a rate"},
		{"queue", Limit{Settle: "{http.response.header.X-Tokens-Used}", MaxDelay: caddy.Duration(time.Second)}, "settle cannot be used with max_delay"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			alg := tc.l.Algorithm
			if alg == "" {
				alg = algorithms.NameSlidingWindow
			}
			err := tc.l.checkSettle(alg)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
	s, err := parseSettle("{http.response.header.x-tokens-used}")
	if err != nil || s.field != "X-Tokens-Used" || s.trailer != "Trailer:X-Tokens-Used" {
		t.Fatalf("settle %+v, %v", s, err)
	}
}

// settleRig is a handler with one settled limit, on a fake clock, whose
// next handler answers what the test says.
type settleRig struct {
	t     testing.TB
	h     *Handler
	clock atomic.Int64
	logs  *observer.ObservedLogs
	// answer writes the response of the next request.
	answer func(w http.ResponseWriter) error
}

func newSettleRig(t testing.TB, zone, limit string) *settleRig {
	t.Helper()
	g := &settleRig{t: t}
	g.clock.Store(fuzzStart)
	cfg := `{"rate_limits": {"` + zone + `": {"key": "tenant", ` + limit + `}}}`
	h, cleanup, err := provisionJSON([]byte(cfg), g.clock.Load)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cleanup)
	core, logs := observer.New(zap.WarnLevel)
	h.plan.logger = zap.New(core)
	g.h, g.logs = h, logs
	return g
}

// send posts a request whose body asks for maxTokens and returns the
// response and whether it reached the next handler.
func (g *settleRig) send(maxTokens string) (*httptest.ResponseRecorder, bool) {
	g.t.Helper()
	r := httptest.NewRequest(http.MethodPost, "http://example.com/v1/chat", strings.NewReader(`{"max_tokens": `+maxTokens+`}`))
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("X-Input-Tokens", "1000")
	w := httptest.NewRecorder()
	r = caddyhttp.PrepareRequest(r, caddy.NewReplacer(), w, &caddyhttp.Server{})
	reached := false
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) error {
		reached = true
		return g.answer(w)
	})
	err := g.h.ServeHTTP(w, r, next)
	if he, ok := err.(caddyhttp.HandlerError); ok {
		w.Code = he.StatusCode
	} else if err != nil {
		g.t.Fatal(err)
	}
	return w, reached
}

// usage is the key's state now.
func (g *settleRig) usage() algorithms.Usage {
	g.t.Helper()
	l := g.h.plan.zones[0].limits[0]
	u, err := g.h.plan.store.(backend.Admin).Inspect(context.Background(), l.handle, "tenant")
	if err != nil {
		g.t.Fatal(err)
	}
	return u
}

func tokensUsed(n string) func(w http.ResponseWriter) error {
	return func(w http.ResponseWriter) error {
		w.Header().Set("X-Tokens-Used", n)
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte("{}"))
		return nil
	}
}

const tpm = `"max_events": 200000, "window": "1m", "algorithm": "token_bucket",
	"cost": "{http.request.header.X-Input-Tokens} + {http.request.body.json.max_tokens}",
	"settle": "{http.response.header.X-Tokens-Used}"`

// 1000 in + max_tokens 4000: 5000 reserved; 1800 used: 3200 back.
func TestSettleRefundsTheDifference(t *testing.T) {
	g := newSettleRig(t, "settle_refund", tpm)
	var during int64
	g.answer = func(w http.ResponseWriter) error {
		during = g.usage().Remaining
		return tokensUsed("1800")(w)
	}
	if _, reached := g.send("4000"); !reached {
		t.Fatal("denied")
	}
	if during != 195000 {
		t.Fatalf("%d remaining while the request ran, want 195000 (5000 reserved)", during)
	}
	if got := g.usage().Remaining; got != 198200 {
		t.Fatalf("%d remaining after the response, want 198200 (3200 given back)", got)
	}
	if g.logs.Len() != 0 {
		t.Fatalf("logged %v", g.logs.All())
	}
}

// A real cost above the estimate is charged past the limit: the key owes
// it and its next request waits until it is paid.
func TestSettleChargesTheExtra(t *testing.T) {
	// 10 per minute: one token per 6 s.
	g := newSettleRig(t, "settle_debt", `"max_events": 10, "window": "1m", "algorithm": "token_bucket",
		"cost": "{http.request.body.json.max_tokens}", "settle": "{http.response.header.X-Tokens-Used}"`)
	g.answer = tokensUsed("25")
	if _, reached := g.send("4"); !reached {
		t.Fatal("denied")
	}
	// 25 × 6 s = 150 s owed on a 60 s bucket: the next token is 96 s away.
	if u := g.usage(); u.Remaining != 0 || u.RetryAfter != int64(96*time.Second) {
		t.Fatalf("usage %+v, want nothing left for 96s", u)
	}
	w, reached := g.send("1")
	if reached || w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After") != "96" {
		t.Fatalf("next request: reached %v, status %d, Retry-After %q; want 429 for 96s", reached, w.Code, w.Header().Get("Retry-After"))
	}
	g.clock.Add(int64(96*time.Second) - 1)
	if _, reached := g.send("1"); reached {
		t.Fatal("passed before the debt was paid")
	}
	g.clock.Add(1)
	g.answer = tokensUsed("1")
	if _, reached := g.send("1"); !reached {
		t.Fatal("denied once the debt was paid")
	}
}

// A missing or unusable value keeps the estimate and is logged once a
// minute per limit, with how many responses were kept at the estimate.
func TestSettleGarbageKeepsTheEstimate(t *testing.T) {
	g := newSettleRig(t, "settle_garbage", tpm)
	bad := []func(w http.ResponseWriter) error{
		func(w http.ResponseWriter) error { w.WriteHeader(http.StatusOK); return nil }, // missing
		tokensUsed("lots"),
		tokensUsed("-1800"),
		tokensUsed("1.8e3"),
		tokensUsed("99999999999999999999"),
		tokensUsed(""),
		func(w http.ResponseWriter) error {
			w.Header()["X-Tokens-Used"] = []string{"1800", "1"}
			w.WriteHeader(http.StatusOK)
			return nil
		},
	}
	for i, a := range bad {
		g.answer = a
		if _, reached := g.send("4000"); !reached {
			t.Fatalf("request %d denied", i)
		}
		if got, want := g.usage().Remaining, 200000-int64(i+1)*5000; got != want {
			t.Fatalf("request %d: %d remaining, want %d (the estimate kept)", i, got, want)
		}
	}
	if n := g.logs.Len(); n != 1 {
		t.Fatalf("%d log lines for %d unusable values in a minute, want 1", n, len(bad))
	}
	g.clock.Add(int64(time.Minute))
	g.answer = tokensUsed("x")
	g.send("1")
	logs := g.logs.All()
	if len(logs) != 2 || logs[1].ContextMap()["responses"] != int64(len(bad)) {
		t.Fatalf("after a minute: %d lines, last %v; want 2, the last counting %d responses", len(logs), logs[len(logs)-1].ContextMap(), len(bad))
	}
	// An error response without the field is no news: not logged.
	g.clock.Add(int64(time.Minute))
	g.answer = func(w http.ResponseWriter) error { w.WriteHeader(http.StatusBadGateway); return nil }
	g.send("1")
	if g.logs.Len() != 2 {
		t.Fatalf("a 502 without the field was logged: %v", g.logs.All()[2:])
	}
}

// The field is read as the status was written (a handler around this one
// may remove it on its way out), else as a trailer: declared before the
// body and set after it, or set under the trailer prefix as reverse_proxy
// copies an upstream's trailers.
func TestSettleReadsTrailers(t *testing.T) {
	for _, tc := range []struct {
		name, settle string
		answer       func(w http.ResponseWriter) error
		want         int64
	}{
		{"header removed on the way out", "header", func(w http.ResponseWriter) error {
			w.Header().Set("X-Tokens-Used", "1800")
			w.WriteHeader(http.StatusOK)
			w.Header().Del("X-Tokens-Used")
			return nil
		}, 198200},
		{"declared trailer", "header", func(w http.ResponseWriter) error {
			w.Header().Set("Trailer", "X-Tokens-Used")
			w.WriteHeader(http.StatusOK)
			_, _ = w.Write([]byte("streamed"))
			w.Header().Set("X-Tokens-Used", "1800")
			return nil
		}, 198200},
		{"undeclared trailer", "header", func(w http.ResponseWriter) error {
			_, _ = w.Write([]byte("streamed"))
			w.Header().Set(http.TrailerPrefix+"X-Tokens-Used", "1800")
			return nil
		}, 198200},
		{"trailer only, header ignored", "trailer", func(w http.ResponseWriter) error {
			w.Header().Set("X-Tokens-Used", "1")
			_, _ = w.Write([]byte("streamed"))
			w.Header().Set(http.TrailerPrefix+"X-Tokens-Used", "1800")
			return nil
		}, 198200},
		{"trailer only, no trailer", "trailer", tokensUsed("1800"), 195000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := strings.Replace(tpm, "http.response.header.", "http.response."+tc.settle+".", 1)
			g := newSettleRig(t, "settle_trailer_"+strings.ReplaceAll(tc.name, " ", "_"), cfg)
			g.answer = tc.answer
			g.send("4000")
			if got := g.usage().Remaining; got != tc.want {
				t.Fatalf("%d remaining, want %d", got, tc.want)
			}
		})
	}
}

// With count_when, a response that does not count gives the whole
// estimate back whatever it says it used; one that counts is settled.
// reset_when wins over both. A shadow zone settles what it counted.
func TestSettleWithOtherOptions(t *testing.T) {
	for _, tc := range []struct {
		name, extra string
		status      int
		want        int64
	}{
		{"count_when, not counted", `, "count_when": {"status_code": [2]}`, http.StatusTooManyRequests, 200000},
		{"count_when, counted", `, "count_when": {"status_code": [2]}`, http.StatusOK, 198200},
		{"reset_when", `, "reset_when": {"status_code": [201]}`, http.StatusCreated, 200000},
		{"error status settled too", ``, http.StatusInternalServerError, 198200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := newSettleRig(t, "settle_with_"+strings.ReplaceAll(tc.name, " ", "_"), tpm+tc.extra)
			g.answer = func(w http.ResponseWriter) error {
				w.Header().Set("X-Tokens-Used", "1800")
				w.WriteHeader(tc.status)
				return nil
			}
			g.send("4000")
			if got := g.usage().Remaining; got != tc.want {
				t.Fatalf("%d remaining, want %d", got, tc.want)
			}
		})
	}
	t.Run("shadow", func(t *testing.T) {
		g := newSettleRig(t, "settle_shadow", `"shadow": true, `+tpm)
		g.answer = tokensUsed("250000") // past the limit: owed, but never denied
		g.send("4000")
		if u := g.usage(); u.Remaining != 0 {
			t.Fatalf("usage %+v, want the debt counted", u)
		}
		if _, reached := g.send("4000"); !reached {
			t.Fatal("a shadow zone denied")
		}
	})
}

// A client that hangs up before the status keeps the estimate charged.
func TestSettleClientLeft(t *testing.T) {
	g := newSettleRig(t, "settle_left", tpm)
	r := httptest.NewRequest(http.MethodPost, "http://example.com/v1/chat", strings.NewReader(`{"max_tokens": 4000}`))
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("X-Input-Tokens", "1000")
	ctx, cancel := context.WithCancel(r.Context())
	w := httptest.NewRecorder()
	r = caddyhttp.PrepareRequest(r.WithContext(ctx), caddy.NewReplacer(), w, &caddyhttp.Server{})
	_ = g.h.ServeHTTP(w, r, caddyhttp.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) error {
		cancel()
		return tokensUsed("10")(w)
	}))
	if got := g.usage().Remaining; got != 195000 {
		t.Fatalf("%d remaining, want 195000 (the estimate kept)", got)
	}
}

// hotSend is one request sent again and again through a handler of cfg on
// a clock that ticks a second per reading, with the request headers given.
func hotSend(tb testing.TB, cfg string, next caddyhttp.Handler, header ...string) func() {
	tb.Helper()
	var ticking atomic.Int64
	ticking.Store(fuzzStart)
	tick := func() int64 { return ticking.Add(int64(time.Second)) }
	h, cleanup, err := provisionJSON([]byte(cfg), tick)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(cleanup)
	w, r := benchRequest(tb, "http://example.com/login", "192.0.2.7:4242")
	for i := 0; i+1 < len(header); i += 2 {
		r.Header.Set(header[i], header[i+1])
	}
	return func() {
		if err := h.ServeHTTP(w, r, next); err != nil {
			tb.Fatal(err)
		}
	}
}

// settleSend is one request through a token bucket whose cost is read
// from a request header, settled (settle != "") at used by the answer.
func settleSend(tb testing.TB, name, settle, used string) func() {
	tb.Helper()
	cfg := `{"rate_limits": {"hot_settle_` + name + `": {"key": "{http.vars.client_ip}", "max_events": 200000, "window": "1m", "algorithm": "token_bucket",
		"cost": "{http.request.header.X-Cost}"` + settle + `}}}`
	return hotSend(tb, cfg, caddyhttp.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) error {
		w.Header().Set("X-Tokens-Used", used)
		w.WriteHeader(http.StatusOK)
		return nil
	}), "X-Cost", "5000")
}

var settleCases = []struct{ name, settle, used string }{
	{"no_settle", "", "1800"},
	{"settle_refund", `, "settle": "{http.response.header.X-Tokens-Used}"`, "1800"},
	{"settle_extra", `, "settle": "{http.response.header.X-Tokens-Used}"`, "5001"},
	{"settle_equal", `, "settle": "{http.response.header.X-Tokens-Used}"`, "5000"},
	{"settle_garbage", `, "settle": "{http.response.header.X-Tokens-Used}"`, "lots"},
}

// BenchmarkSettleServeHTTP is what settling adds to a request on an
// existing key (memory store, the cost read from a request header).
//
//	go test -run '^$' -bench SettleServeHTTP -benchmem .
func BenchmarkSettleServeHTTP(b *testing.B) {
	for _, c := range settleCases {
		benchSend(b, c.name, func(tb testing.TB) func() { return settleSend(tb, c.name, c.settle, c.used) })
	}
}

// benchSend benchmarks, as name, the request mk makes, sent again and
// again on an existing key.
func benchSend(b *testing.B, name string, mk func(testing.TB) func()) {
	b.Run(name, func(b *testing.B) {
		send := mk(b)
		send()
		b.ReportAllocs()
		for b.Loop() {
			send()
		}
	})
}

// A settled request allocates one value: the writer that notes the
// status and the settled field, in one allocation.
func TestSettleAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool drops values at random under the race detector")
	}
	// The cost read from a header allocates the same with or without.
	base := settleSend(t, "alloc_base", "", "1800")
	base()
	baseline := testing.AllocsPerRun(200, base)
	for _, c := range settleCases[1:] {
		t.Run(c.name, func(t *testing.T) {
			send := settleSend(t, "alloc_"+c.name, c.settle, c.used)
			send()
			if got := testing.AllocsPerRun(200, send); got > baseline+1 {
				t.Fatalf("%v allocations per request, want at most %v (one more than without settle)", got, baseline+1)
			}
		})
	}
}
