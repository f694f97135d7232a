package sluice

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/dunglas/httpsfv"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
)

// testLimit is a provisioned-enough limit of zone (and scope) for the
// header code: its algorithm, policy and items.
func testLimit(t *testing.T, zoneName, scope, alg string, events int64, window time.Duration, burst int64, send headerSet) *limit {
	t.Helper()
	l := &limit{Limit: &Limit{MaxEvents: events, Window: caddy.Duration(window), Burst: burst, Algorithm: alg}}
	l.zone, l.scope = &zone{Zone: &Zone{}, name: zoneName}, scope
	var err error
	if l.algorithm, err = algorithms.Check(alg, l.policy()); err != nil {
		t.Fatal(err)
	}
	if err := l.provisionHeaders(send); err != nil {
		t.Fatal(err)
	}
	return l
}

// parseItem reads a serialized item back with the structured-field parser.
func parseItem(t *testing.T, s string) (string, map[string]any) {
	t.Helper()
	it, err := httpsfv.UnmarshalItem([]string{s})
	if err != nil {
		t.Fatalf("%q is not a structured-field item: %v", s, err)
	}
	p := map[string]any{}
	for _, k := range it.Params.Names() {
		p[k], _ = it.Params.Get(k)
	}
	return it.Value.(string), p
}

func TestPolicyItemEveryAlgorithm(t *testing.T) {
	tests := []struct {
		name     string
		alg      string
		events   int64
		window   time.Duration
		burst    int64
		maxDelay time.Duration
		q, w     int64
	}{
		{"sliding window", "sliding_window", 100, time.Minute, 0, 0, 100, 60},
		{"counter", "sliding_window_counter", 100, time.Minute, 0, 0, 100, 60},
		{"fixed window, part of a second", "fixed_window", 5, 1500 * time.Millisecond, 0, 0, 5, 2},
		// A bucket of 10 at 5/s refills in 2 s.
		{"token bucket with burst", "token_bucket", 5, time.Second, 10, 0, 10, 2},
		{"gcra", "gcra", 5, 15 * time.Minute, 0, 0, 5, 900},
		{"leaky meter", "leaky_bucket", 20, 15 * time.Minute, 0, 0, 20, 900},
		// A queue of max_delay 4 s at 1 per 2 s holds 3, gone in 6 s.
		{"leaky queue", "leaky_bucket", 4, 8 * time.Second, 0, 4 * time.Second, 3, 6},
		// 10^15 is past a structured field's 15 digits: sent as the most it
		// can carry.
		{"huge quota", "token_bucket", algorithms.MaxEvents, 24 * time.Hour, 0, 0, 999_999_999_999_999, 86400},
		{"a day", "fixed_window", 1000, 24 * time.Hour, 0, 0, 1000, 86400},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := &limit{Limit: &Limit{MaxEvents: tt.events, Window: caddy.Duration(tt.window), Burst: tt.burst, MaxDelay: caddy.Duration(tt.maxDelay), Algorithm: tt.alg}}
			l.zone = &zone{Zone: &Zone{}, name: "login"}
			var err error
			if l.algorithm, err = algorithms.Check(tt.alg, l.policy()); err != nil {
				t.Fatal(err)
			}
			if err := l.provisionHeaders(sendDraft); err != nil {
				t.Fatal(err)
			}
			if tt.q > 99_999_999_999_999 {
				// httpsfv v1.1.1 cannot read a 15-digit integer followed by
				// another parameter: compare the text.
				if want := `"login";q=` + strconv.FormatInt(tt.q, 10) + ";w=" + strconv.FormatInt(tt.w, 10); l.hdr.policy != want {
					t.Fatalf("policy %q, want %q", l.hdr.policy, want)
				}
				return
			}
			name, p := parseItem(t, l.hdr.policy)
			if name != "login" || p["q"] != tt.q || p["w"] != tt.w || len(p) != 2 {
				t.Fatalf("policy %q, want \"login\";q=%d;w=%d", l.hdr.policy, tt.q, tt.w)
			}
		})
	}
}

func TestPolicyNameMustBeSendable(t *testing.T) {
	l := &limit{Limit: &Limit{MaxEvents: 5, Window: caddy.Duration(time.Minute)}, algorithm: "sliding_window"}
	l.zone = &zone{Zone: &Zone{}, name: "লগইন"}
	if err := l.provisionHeaders(sendLegacy); err != nil {
		t.Fatalf("legacy fields carry no name: %v", err)
	}
	if err := l.provisionHeaders(sendDraft); err == nil || !strings.Contains(err.Error(), "printable ASCII") {
		t.Fatalf("a name a structured field cannot hold: %v", err)
	}
	// Quotes and backslashes are escaped by the serializer.
	l.zone.name, l.scope = `a"b\c`, "ip"
	if err := l.provisionHeaders(sendDraft); err != nil {
		t.Fatal(err)
	}
	if name, _ := parseItem(t, l.hdr.policy); name != `a"b\c.ip` {
		t.Fatalf("name %q read back as %q", l.hdr.policy, name)
	}
}

func TestWriteHeaders(t *testing.T) {
	api := testLimit(t, "api", "", "token_bucket", 10, time.Minute, 0, sendDraft|sendLegacy)
	ip := testLimit(t, "api", "ip", "sliding_window", 6, time.Minute, 0, sendDraft|sendLegacy)
	login := testLimit(t, "login", "", "sliding_window", 2, time.Minute, 0, 0)
	shadow := testLimit(t, "try", "", "sliding_window", 1, time.Minute, 0, sendDraft|sendLegacy)
	shadow.zone.Shadow = true
	limits := []*limit{api, ip, login, shadow}
	reqs := make([]backend.Request, len(limits))
	for i := range reqs {
		reqs[i].Cost = 1
	}
	s := int64(time.Second)

	tests := []struct {
		name      string
		out       []algorithms.Result
		rateLimit string
		legacy    string // limit remaining reset
	}{
		{
			name: "allowed: the scope has the least room",
			out: []algorithms.Result{
				{Allowed: true, Limit: 10, Remaining: 9, ResetAfter: 6 * s},
				{Allowed: true, Limit: 6, Remaining: 5, ResetAfter: 60 * s},
				{Allowed: true, Limit: 2, Remaining: 0, ResetAfter: 60 * s},
				{Allowed: false, Limit: 1, Remaining: 0, RetryAfter: 30 * s},
			},
			rateLimit: `"api.ip";r=5;t=60`,
			legacy:    "6 5 60",
		},
		{
			// The shown zones' numbers would claim quota left on a
			// refusal: only the policies are sent.
			name: "denied by a hidden zone: no numbers",
			out: []algorithms.Result{
				{Allowed: true, Limit: 10, Remaining: 3, ResetAfter: 42 * s},
				{Allowed: true, Limit: 6, Remaining: 5, ResetAfter: 60 * s},
				{Allowed: false, Limit: 2, Remaining: 0, RetryAfter: 50 * s},
				{Allowed: true, Limit: 1, Remaining: 0},
			},
			rateLimit: ``,
			legacy:    "  ",
		},
		{
			name: "denied by a hidden zone and a shown one: the shown one's",
			out: []algorithms.Result{
				{Allowed: false, Limit: 10, Remaining: 0, RetryAfter: 7 * s, ResetAfter: 42 * s},
				{Allowed: true, Limit: 6, Remaining: 5, ResetAfter: 60 * s},
				{Allowed: false, Limit: 2, Remaining: 0, RetryAfter: 50 * s},
				{Allowed: true, Limit: 1, Remaining: 0},
			},
			rateLimit: `"api";r=0;t=7`,
			legacy:    "10 0 7",
		},
		{
			name: "denied by a shown limit: t is its wait, rounded up",
			out: []algorithms.Result{
				{Allowed: false, Limit: 10, Remaining: 0, RetryAfter: 5*s + 1, ResetAfter: 60 * s},
				{Allowed: true, Limit: 6, Remaining: 0, ResetAfter: 60 * s},
				{Allowed: true, Limit: 2, Remaining: 1},
				{Allowed: true, Limit: 1},
			},
			rateLimit: `"api";r=0;t=6`,
			legacy:    "10 0 6",
		},
		{
			name: "two shown limits deny: the longer wait",
			out: []algorithms.Result{
				{Allowed: false, Limit: 10, RetryAfter: 5 * s},
				{Allowed: false, Limit: 6, RetryAfter: 20 * s},
				{Allowed: true, Limit: 2, Remaining: 1},
				{Allowed: true, Limit: 1},
			},
			rateLimit: `"api.ip";r=0;t=20`,
			legacy:    "6 0 20",
		},
		{
			name: "a cost that can never pass has no t",
			out: []algorithms.Result{
				{Allowed: false, Limit: 10, Remaining: 10, RetryAfter: algorithms.Never},
				{Allowed: true, Limit: 6, Remaining: 6},
				{Allowed: true, Limit: 2, Remaining: 2},
				{Allowed: true, Limit: 1},
			},
			rateLimit: `"api";r=10`,
			legacy:    "10 10 0",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			writeHeaders(rec, limits, reqs, tt.out)
			h := rec.Header()
			policy, err := httpsfv.UnmarshalList(values(h, "RateLimit-Policy"))
			if err != nil {
				t.Fatal(err)
			}
			if got, _ := httpsfv.Marshal(policy); got != `"api";q=10;w=60, "api.ip";q=6;w=60` {
				t.Fatalf("RateLimit-Policy %q", got)
			}
			rl, err := httpsfv.UnmarshalList(values(h, "RateLimit"))
			if err != nil {
				t.Fatal(err)
			}
			if got, _ := httpsfv.Marshal(rl); got != tt.rateLimit {
				t.Fatalf("RateLimit %q, want %q", got, tt.rateLimit)
			}
			if got := exact(h, "X-RateLimit-Limit") + " " + exact(h, "X-RateLimit-Remaining") + " " + exact(h, "X-RateLimit-Reset"); got != tt.legacy {
				t.Fatalf("X-RateLimit-* %q, want %q", got, tt.legacy)
			}
		})
	}
}

// A limit that hashes its keys sends the HMAC as pk; an unhashed key, or a
// key that is not an HMAC, is never sent.
func TestWriteHeadersPartitionKey(t *testing.T) {
	l := testLimit(t, "otp", "", "sliding_window", 3, 10*time.Minute, 0, sendDraft)
	l.hdr.partitioned = true
	out := []algorithms.Result{{Allowed: true, Limit: 3, Remaining: 2, ResetAfter: int64(time.Minute)}}
	for key, want := range map[string]string{
		"hmac:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8": `"otp";r=2;t=60;pk=:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=:`,
		"sha256:AAEC":      `"otp";r=2;t=60`,
		"hmac:not base64!": `"otp";r=2;t=60`,
	} {
		rec := httptest.NewRecorder()
		writeHeaders(rec, []*limit{l}, []backend.Request{{Key: key, Cost: 1}}, out)
		if got := exact(rec.Header(), "RateLimit"); got != want {
			t.Errorf("key %q: RateLimit %q, want %q", key, got, want)
		}
		if !strings.HasSuffix(want, "=:") {
			continue
		}
		if got := exact(rec.Header(), "RateLimit-Policy"); got != `"otp";q=3;w=600;pk=:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=:` {
			t.Errorf("RateLimit-Policy %q", got)
		}
	}
}

// A request whose zones send no fields gets none, and writing the draft's
// costs one array of value slices and the RateLimit string.
func TestWriteHeadersAllocs(t *testing.T) {
	limits := []*limit{testLimit(t, "api", "", "token_bucket", 10, time.Minute, 0, sendDraft)}
	reqs := []backend.Request{{Key: "192.0.2.1", Cost: 1}}
	out := []algorithms.Result{{Allowed: true, Limit: 10, Remaining: 9, ResetAfter: int64(time.Second)}}
	h := http.Header{}
	w := headerWriter{h}
	allocs := testing.AllocsPerRun(100, func() {
		clear(h)
		writeHeaders(w, limits, reqs, out)
	})
	if allocs > 2 {
		t.Fatalf("draft headers: %v allocations, want at most 2", allocs)
	}
	limits[0].hdr.send = 0
	clear(h)
	writeHeaders(w, limits, reqs, out)
	if len(h) != 0 {
		t.Fatalf("headers none sent %v", h)
	}
}

// headerWriter is a ResponseWriter that only has headers.
type headerWriter struct{ h http.Header }

func (w headerWriter) Header() http.Header       { return w.h }
func (headerWriter) Write(b []byte) (int, error) { return len(b), nil }
func (headerWriter) WriteHeader(int)             {}

// contractCases are hot-path requests through a handler that sends rate
// limit fields or writes its own refusals.
func contractCases() []hotPathCase {
	var ticking atomic.Int64
	ticking.Store(fuzzStart)
	tick := func() int64 { return ticking.Add(int64(time.Second)) }
	frozen := func() int64 { return fuzzStart }
	zone := func(name string, events int) string {
		return `"rate_limits": {"` + name + `": {"key": "{http.vars.client_ip}", "ipv6_prefix": 64, "max_events": ` + strconv.Itoa(events) + `, "window": "1m", "algorithm": "token_bucket"}}`
	}
	return []hotPathCase{
		// The value slices share one array; the RateLimit value is a
		// string (one zone's policy is ready from provision, small numbers
		// are in a table).
		{"allowed/headers_draft", `{"headers": "draft", ` + zone("hdr_hot_draft", 100) + `}`, tick, "http://example.com/", "192.0.2.7:4242", false, 2},
		{"allowed/headers_legacy", `{"headers": "legacy", ` + zone("hdr_hot_legacy", 100) + `}`, tick, "http://example.com/", "192.0.2.7:4242", false, 1},
		{"allowed/headers_both", `{"headers": "both", ` + zone("hdr_hot_both", 100) + `}`, tick, "http://example.com/", "192.0.2.7:4242", false, 2},
		// Retry-After and the key placeholder, as before.
		{"denied/default", `{` + zone("hdr_hot_deny", 1) + `}`, frozen, "http://example.com/", "192.0.2.7:4242", true, 2},
		{"denied/headers_both", `{"headers": "both", ` + zone("hdr_hot_deny_both", 1) + `}`, frozen, "http://example.com/", "192.0.2.7:4242", true, 4},
		// The body is built in a pooled buffer.
		{"denied/respond_json", `{"respond": "json", ` + zone("hdr_hot_json", 1) + `}`, frozen, "http://example.com/", "192.0.2.7:4242", false, 2},
	}
}

// sendDiscard is c.send with a ResponseWriter that keeps no body, so that
// a written refusal costs what it costs a server.
func (c hotPathCase) sendDiscard(tb testing.TB) func() {
	tb.Helper()
	h, cleanup, err := provisionJSON([]byte(c.config), c.now)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(cleanup)
	_, r := benchRequest(tb, c.target, c.remote)
	w := headerWriter{http.Header{}}
	if err := h.ServeHTTP(w, r, okHandler); err != nil {
		tb.Fatal(err)
	}
	_, r = benchRequest(tb, c.target, c.remote)
	fresh := freshReplacer(r)
	return func() {
		fresh()
		if err := h.ServeHTTP(w, r, okHandler); (err != nil) != c.denied {
			tb.Fatalf("error %v, want one: %v", err, c.denied)
		}
	}
}

// BenchmarkContractServeHTTP: go test -run '^$' -bench ContractServeHTTP -benchmem .
func BenchmarkContractServeHTTP(b *testing.B) {
	for _, c := range append(hotPathCases()[:1], contractCases()...) {
		b.Run(c.name, func(b *testing.B) {
			send := c.sendDiscard(b)
			b.ReportAllocs()
			for b.Loop() {
				send()
			}
		})
	}
}

func TestContractAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool drops values at random under the race detector")
	}
	for _, c := range contractCases() {
		t.Run(c.name, func(t *testing.T) {
			send := c.sendDiscard(t)
			if got := testing.AllocsPerRun(200, send); got > c.maxAllocs {
				t.Fatalf("%v allocations per request, want at most %v", got, c.maxAllocs)
			}
		})
	}
}

// exact is the first value of the field spelled name, as written: the
// fields are set under the draft's spelling, which Header.Get (by the
// canonical "Ratelimit") would not find.
func exact(h http.Header, name string) string {
	if v := values(h, name); len(v) > 0 {
		return v[0]
	}
	return ""
}

// values are the values of the field spelled name, as written.
func values(h http.Header, name string) []string { return h[name] }
