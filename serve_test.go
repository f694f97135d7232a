package sluice

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
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

// freshReplacer returns a func that puts r's replacer back as it is now,
// so that each request sent again starts from what a new request has
// (a refusal adds a placeholder provider to it) without allocating.
func freshReplacer(r *http.Request) func() {
	repl := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	base := *repl
	return func() { *repl = base }
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
			tick, "http://example.com/search?q=caddy&page=2&user=alice&lang=en", "192.0.2.7:4242", false, 0},
		// A key that cannot be built: its errors are made once.
		{"allowed/missing_shared", `{"rate_limits": {"hot_missing": {"key": "{http.request.header.X-User}", "max_events": 100, "window": "1m", "algorithm": "token_bucket"}}}`,
			tick, "http://example.com/", "192.0.2.7:4242", false, 0},
		{"allowed/missing_skip", `{"rate_limits": {"hot_skip": {"key": "{http.request.header.X-User}", "missing": "skip", "max_events": 1, "window": "1h"}}}`,
			frozen, "http://example.com/", "192.0.2.7:4242", false, 0},
		{"allowed/ambiguous_shared", `{"rate_limits": {"hot_ambiguous": {"key": "{http.request.uri.query.user}", "max_events": 100, "window": "1m", "algorithm": "token_bucket"}}}`,
			tick, "http://example.com/?user=a&user=b", "192.0.2.7:4242", false, 0},
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
	w, r = benchRequest(tb, c.target, c.remote)
	fresh := freshReplacer(r)
	return func() {
		fresh()
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

// fakeStore decides as a test says and records what it is asked.
type fakeStore struct {
	mu      sync.Mutex
	decide  func(reqs []backend.Request, out []algorithms.Result) bool
	decided [][]backend.Request
	refunds []fakeRefund
}

type fakeRefund struct {
	reqs    []backend.Request
	granted []algorithms.Result
	ctxErr  error // the context's error when Refund was called
}

func (f *fakeStore) Register(backend.LimitConfig) (backend.Limit, error) {
	return nil, errors.New("the fake store registers nothing")
}

func (f *fakeStore) Decide(_ context.Context, reqs []backend.Request, out []algorithms.Result) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.decided = append(f.decided, slices.Clone(reqs))
	return f.decide(reqs, out), nil
}

func (f *fakeStore) Refund(ctx context.Context, reqs []backend.Request, granted []algorithms.Result) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.refunds = append(f.refunds, fakeRefund{slices.Clone(reqs), slices.Clone(granted), ctx.Err()})
	return nil
}

func (f *fakeStore) Close() error { return nil }

// byZone decides each request by its zone's entry in results (allowed when
// absent), all or nothing as a store does: allowed unless an enforcing
// request is denied.
func byZone(results map[string]algorithms.Result) func([]backend.Request, []algorithms.Result) bool {
	return func(reqs []backend.Request, out []algorithms.Result) bool {
		allowed := true
		for i, req := range reqs {
			res, ok := results[req.Limit.Name()]
			if !ok {
				res = algorithms.Result{Allowed: true, Limit: 10, Remaining: 9}
			}
			out[i] = res
			allowed = allowed && (res.Allowed || req.Shadow)
		}
		return allowed
	}
}

// fakeTimer is a timer that fires when the test says.
type fakeTimer struct {
	d       time.Duration
	fire    chan time.Time
	stopped atomic.Bool
}

// unitHandler is a provisioned handler whose store, clock, timer, random
// jitter and logs are the test's.
type unitHandler struct {
	h      *Handler
	store  *fakeStore
	logs   *observer.ObservedLogs
	timers chan *fakeTimer
}

func newUnitHandler(t *testing.T, config string, decide func([]backend.Request, []algorithms.Result) bool) *unitHandler {
	t.Helper()
	h, cleanup, err := provisionJSON([]byte(config), func() int64 { return fuzzStart })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cleanup)
	// The limits are registered with the memory store, which Cleanup must
	// release.
	registered := h.plan.store
	t.Cleanup(func() { h.plan.store = registered })
	u := &unitHandler{h: h, store: &fakeStore{decide: decide}, timers: make(chan *fakeTimer, 1)}
	h.plan.store = u.store
	core, logs := observer.New(zapcore.InfoLevel)
	h.plan.logger, h.plan.denyLog, u.logs = zap.New(core), zap.New(core), logs
	h.plan.newTimer = func(d time.Duration) (<-chan time.Time, func() bool) {
		ft := &fakeTimer{d: d, fire: make(chan time.Time, 1)}
		u.timers <- ft
		return ft.fire, func() bool { return !ft.stopped.Swap(true) }
	}
	return u
}

// answer is what a request got from the handler.
type answer struct {
	passed bool // next ran
	code   int  // the error's status, or 200 when next ran
	header http.Header
	repl   *caddy.Replacer
	err    error
}

// serve sends one request from 192.0.2.7; setup may change it first.
func (u *unitHandler) serve(ctx context.Context, setup func(*http.Request)) answer {
	return u.serveNext(ctx, setup, okHandler)
}

// serveNext is serve with next as the handler after rate_limit.
func (u *unitHandler) serveNext(ctx context.Context, setup func(*http.Request), next caddyhttp.Handler) answer {
	r := httptest.NewRequestWithContext(ctx, http.MethodGet, "http://example.com/", nil)
	r.RemoteAddr = "192.0.2.7:4242"
	if setup != nil {
		setup(r)
	}
	w := httptest.NewRecorder()
	repl := caddy.NewReplacer()
	r = caddyhttp.PrepareRequest(r, repl, w, &caddyhttp.Server{})
	var a answer
	err := u.h.ServeHTTP(w, r, caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		a.passed = true
		return next.ServeHTTP(w, r)
	}))
	a.header, a.repl, a.err, a.code = w.Header(), repl, err, http.StatusOK
	if he, ok := errors.AsType[caddyhttp.HandlerError](err); ok {
		a.code = he.StatusCode
	} else if err != nil {
		a.code = -1
	} else if w.Code != http.StatusOK {
		a.code = w.Code
	}
	return a
}

func (a answer) placeholder(name string) string {
	v, _ := a.repl.GetString(name)
	return v
}

// messages are the log lines written, in order.
func (u *unitHandler) messages() []string {
	var msgs []string
	for _, e := range u.logs.TakeAll() {
		msgs = append(msgs, e.Message)
	}
	return msgs
}

const threeZones = `{"rate_limits": {
	"u_a": {"key": "static", "max_events": 10, "window": "1m"},
	"u_b": {"key": "static", "max_events": 10, "window": "1m"},
	"u_shadow": {"key": "static", "max_events": 10, "window": "1m", "shadow": true}}}`

func denied(retryAfter time.Duration) algorithms.Result {
	return algorithms.Result{Limit: 10, RetryAfter: int64(retryAfter), ResetAfter: int64(retryAfter)}
}

// A request denied by several zones reports the one that makes the client
// wait longest (one that can never pass above all), since it can pass only
// when all allow; a shadow zone's wait is never the answer.
func TestDenyReportsTheLongestWait(t *testing.T) {
	never := algorithms.Result{Limit: 10, RetryAfter: algorithms.Never}
	for _, tt := range []struct {
		name         string
		results      map[string]algorithms.Result
		zone, header string
	}{
		{"second longer", map[string]algorithms.Result{"u_a": denied(5 * time.Second), "u_b": denied(30 * time.Second)}, "u_b", "30"},
		{"first longer", map[string]algorithms.Result{"u_a": denied(31 * time.Second), "u_b": denied(30 * time.Second)}, "u_a", "31"},
		{"one allows", map[string]algorithms.Result{"u_b": denied(5 * time.Second)}, "u_b", "5"},
		{"never first", map[string]algorithms.Result{"u_a": never, "u_b": denied(30 * time.Second)}, "u_a", ""},
		{"never second", map[string]algorithms.Result{"u_a": denied(30 * time.Second), "u_b": never}, "u_b", ""},
		{"shadow waits longer", map[string]algorithms.Result{"u_a": denied(5 * time.Second), "u_shadow": denied(time.Hour)}, "u_a", "5"},
		{"shadow can never pass", map[string]algorithms.Result{"u_b": denied(5 * time.Second), "u_shadow": never}, "u_b", "5"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			u := newUnitHandler(t, threeZones, byZone(tt.results))
			a := u.serve(t.Context(), nil)
			if a.passed || a.code != http.StatusTooManyRequests || !errors.Is(a.err, ErrRateLimited) || len(u.timers) != 0 {
				t.Fatalf("passed %v, status %d, %v, %d timers; want 429 at once", a.passed, a.code, a.err, len(u.timers))
			}
			if got := a.header.Get("Retry-After"); got != tt.header {
				t.Errorf("Retry-After %q, want %q", got, tt.header)
			}
			if got := a.placeholder(phName); got != tt.zone {
				t.Errorf("exceeded.name %q, want %q", got, tt.zone)
			}
			// -1 when no Retry-After is sent, so a JSON error page stays valid.
			if want := cmp.Or(tt.header, "-1"); a.placeholder(phRetryAfter) != want {
				t.Errorf("exceeded.retry_after %q, want %q", a.placeholder(phRetryAfter), want)
			}
		})
	}
}

// Retry-After is the wait in whole seconds, rounded up, at least 1.
func TestRetryAfterRounding(t *testing.T) {
	for _, tt := range []struct {
		wait time.Duration
		want string
	}{
		{0, "1"},
		{1, "1"},
		{999 * time.Millisecond, "1"},
		{time.Second, "1"},
		{time.Second + 1, "2"},
		{59*time.Second + 500*time.Millisecond, "60"},
		{4095 * time.Second, "4095"},
		{4095*time.Second + 1, "4096"},
		{2 * time.Hour, "7200"},
		{time.Duration(algorithms.MaxSpan), "2305843010"},
	} {
		u := newUnitHandler(t, threeZones, byZone(map[string]algorithms.Result{"u_a": denied(tt.wait)}))
		if got := u.serve(t.Context(), nil).header.Get("Retry-After"); got != tt.want {
			t.Errorf("wait %v: Retry-After %q, want %q", tt.wait, got, tt.want)
		}
	}
}

// Jitter adds up to its fraction of the wait, never less than nothing and
// never more, even on the longest wait at the largest jitter.
func TestJitterBounds(t *testing.T) {
	for _, tt := range []struct {
		jitter float64
		wait   time.Duration
		random float64
		want   string
	}{
		{0.5, 10 * time.Second, 0, "10"},
		{0.5, 10 * time.Second, 0.5, "13"},           // 12.5 s
		{0.5, 10 * time.Second, 0.99999999, "15"},    // just under 15 s
		{1, 100 * time.Millisecond, 0.99999999, "1"}, // under 200 ms
		{10, time.Second, 0.99999999, "11"},
		// `jitter 20` (meant as 20% under mholt's "<percent>") adds up to 20
		// times the wait, as it did there.
		{20, time.Second, 0.99999999, "21"},
		{1e308, time.Second, 0.5, "2305843011"}, // 2^61 ns + 1 s, rounded up
		// The extra wait is capped at the longest span: 2^61 ns more.
		{10, time.Duration(algorithms.MaxSpan), 0.99999999, "4611686019"},
	} {
		u := newUnitHandler(t, fmt.Sprintf(`{"jitter": %v, "rate_limits": {"u_a": {"key": "static", "max_events": 10, "window": "1m"}}}`, tt.jitter),
			byZone(map[string]algorithms.Result{"u_a": denied(tt.wait)}))
		u.h.plan.jitterFn = func() float64 { return tt.random }
		if got := u.serve(t.Context(), nil).header.Get("Retry-After"); got != tt.want {
			t.Errorf("jitter %v of %v at %v: Retry-After %q, want %q", tt.jitter, tt.wait, tt.random, got, tt.want)
		}
	}
}

const queueZones = `{"rate_limits": {
	"u_queue": {"key": "static", "max_events": 10, "window": "1s", "algorithm": "leaky_bucket", "max_delay": "1s"},
	"u_queue_shadow": {"key": "static", "max_events": 10, "window": "1s", "algorithm": "leaky_bucket", "max_delay": "5s", "shadow": true}}}`

func queued(delay time.Duration) algorithms.Result {
	return algorithms.Result{Allowed: true, Limit: 10, Remaining: 3, Delay: int64(delay), At: fuzzStart}
}

// A request given a slot in a queue is held until the slot (the longest
// delay of its enforcing zones; a shadow zone never holds one), then
// passed on.
func TestQueuedRequestWaitsForItsSlot(t *testing.T) {
	u := newUnitHandler(t, queueZones, byZone(map[string]algorithms.Result{"u_queue": queued(300 * time.Millisecond), "u_queue_shadow": queued(4 * time.Second)}))
	done := make(chan answer)
	go func() { done <- u.serve(t.Context(), nil) }()
	timer := <-u.timers
	if timer.d != 300*time.Millisecond {
		t.Fatalf("waits %v, want 300ms", timer.d)
	}
	select {
	case a := <-done:
		t.Fatalf("answered before its slot: %+v", a)
	default:
	}
	timer.fire <- time.Time{}
	if a := <-done; !a.passed || a.err != nil {
		t.Fatalf("after its slot: passed %v, %v", a.passed, a.err)
	}
	if !timer.stopped.Load() {
		t.Error("timer not stopped")
	}
	if len(u.store.refunds) != 0 {
		t.Errorf("refunded %v", u.store.refunds)
	}

	// Without a delay, no timer at all.
	u = newUnitHandler(t, queueZones, byZone(map[string]algorithms.Result{"u_queue": queued(0), "u_queue_shadow": queued(time.Second)}))
	if a := u.serve(t.Context(), nil); !a.passed || len(u.timers) != 0 {
		t.Fatalf("no delay: passed %v, %d timers", a.passed, len(u.timers))
	}
}

// A client that leaves while queued gets nothing, and what its request took
// is given back, exactly, with a context the departure did not cancel.
func TestQueuedRequestRefundedWhenClientLeaves(t *testing.T) {
	u := newUnitHandler(t, queueZones, byZone(map[string]algorithms.Result{"u_queue": queued(300 * time.Millisecond)}))
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan answer)
	go func() { done <- u.serve(ctx, nil) }()
	timer := <-u.timers
	cancel()
	a := <-done
	if a.passed || a.code != statusClientClosed || !errors.Is(a.err, context.Canceled) {
		t.Fatalf("passed %v, status %d, %v; want 499 with the cancellation", a.passed, a.code, a.err)
	}
	if !timer.stopped.Load() {
		t.Error("timer not stopped")
	}
	if len(u.store.refunds) != 1 || len(u.store.decided) != 1 {
		t.Fatalf("%d refunds for %d decisions, want 1", len(u.store.refunds), len(u.store.decided))
	}
	got := u.store.refunds[0]
	if !slices.Equal(got.reqs, u.store.decided[0]) || got.ctxErr != nil {
		t.Fatalf("refunded %+v (context error %v), decided %+v", got.reqs, got.ctxErr, u.store.decided[0])
	}
	for i, req := range got.reqs {
		if want := byZoneResult(req); got.granted[i] != want {
			t.Errorf("refund of %s: granted %+v, want the decision %+v", req.Limit.Name(), got.granted[i], want)
		}
	}
}

// byZoneResult is what byZone gave the queue zones' requests above.
func byZoneResult(req backend.Request) algorithms.Result {
	var out [1]algorithms.Result
	byZone(map[string]algorithms.Result{"u_queue": queued(300 * time.Millisecond)})([]backend.Request{req}, out[:])
	return out[0]
}

// A shadow zone refuses nothing, and everything it would have refused is
// logged: over its rate, its deny list, a missing key, a bad cost (then
// the limit is left out of the decision). Notes of one request never leak
// into the next.
func TestShadowZonesReportEverything(t *testing.T) {
	const config = `{"rate_limits": {
		"s_listed": {"key": "static", "deny": ["192.0.2.0/24"], "max_events": 10, "window": "1m", "shadow": true},
		"s_rate": {"key": "static", "max_events": 10, "window": "1m", "shadow": true},
		"s_strict": {"key": "{http.request.header.X-User}", "missing": "deny", "cost": "{http.request.header.X-Cost}", "max_events": 10, "window": "1m", "shadow": true}}}`
	u := newUnitHandler(t, config, byZone(map[string]algorithms.Result{"s_rate": denied(time.Minute)}))
	a := u.serve(t.Context(), func(r *http.Request) { r.Header.Set("X-Cost", "lots") })
	if !a.passed || a.err != nil {
		t.Fatalf("a shadow zone refused: %d %v", a.code, a.err)
	}
	want := []string{
		"request would be refused by deny list (shadow zone)",
		"request would be refused for a missing key (shadow zone)",
		"request would be refused for its cost (shadow zone)",
		"rate limit would be exceeded (shadow zone)",
	}
	if got := u.messages(); !slices.Equal(got, want) {
		t.Fatalf("logged %q, want %q", got, want)
	}
	if zones := limitNames(u.store.decided[0]); !slices.Equal(zones, []string{"s_listed", "s_rate"}) {
		t.Errorf("decided %v: the limit of the bad cost must be left out", zones)
	}

	// A request from elsewhere, with a key and a good cost: nothing to say.
	u.store.decide = byZone(nil)
	a = u.serve(t.Context(), func(r *http.Request) {
		r.RemoteAddr = "198.51.100.1:1"
		r.Header.Set("X-User", "ann")
		r.Header.Set("X-Cost", "2")
	})
	if got := u.messages(); !a.passed || len(got) != 0 {
		t.Fatalf("passed %v, logged %q", a.passed, got)
	}
}

// The shadow zones' notes are reported when an enforcing zone refuses the
// request too.
func TestShadowNotesReportedWhenRefused(t *testing.T) {
	const config = `{"rate_limits": {
		"a_shadow": {"key": "{http.request.header.X-User}", "missing": "deny", "max_events": 10, "window": "1m", "shadow": true},
		"b_listed": {"key": "static", "deny": ["192.0.2.0/24"], "max_events": 10, "window": "1m"}}}`
	u := newUnitHandler(t, config, byZone(nil))
	a := u.serve(t.Context(), nil)
	if a.code != http.StatusForbidden {
		t.Fatalf("status %d, want 403", a.code)
	}
	want := []string{"request refused by deny list", "request would be refused for a missing key (shadow zone)"}
	if got := u.messages(); !slices.Equal(got, want) {
		t.Fatalf("logged %q, want %q", got, want)
	}
}

// A request matching more limits than a pooled request state holds at first
// is decided whole, and the next, smaller one sees none of it.
func TestRequestStateGrowsAndIsCleared(t *testing.T) {
	zones := map[string]any{}
	for i := range 12 {
		zones[fmt.Sprintf("g_%02d", i)] = map[string]any{"key": "static", "max_events": 10, "window": "1m",
			"match": []map[string]any{{"header": map[string][]string{"X-Many": {"1"}}}}}
	}
	zones["g_one"] = map[string]any{"key": "static", "max_events": 10, "window": "1m"}
	config, err := json.Marshal(map[string]any{"rate_limits": zones})
	if err != nil {
		t.Fatal(err)
	}
	u := newUnitHandler(t, string(config), byZone(map[string]algorithms.Result{"g_11": denied(7 * time.Second)}))
	for range 3 {
		if a := u.serve(t.Context(), func(r *http.Request) { r.Header.Set("X-Many", "1") }); a.code != http.StatusTooManyRequests || a.header.Get("Retry-After") != "7" {
			t.Fatalf("13 limits: %d, Retry-After %q", a.code, a.header.Get("Retry-After"))
		}
		if a := u.serve(t.Context(), nil); !a.passed {
			t.Fatalf("1 limit: %d %v", a.code, a.err)
		}
	}
	for i, reqs := range u.store.decided {
		if want := []int{13, 1}[i%2]; len(reqs) != want {
			t.Fatalf("decision %d had %d requests, want %d", i, len(reqs), want)
		}
	}
}

func limitNames(reqs []backend.Request) []string {
	var names []string
	for _, r := range reqs {
		names = append(names, r.Limit.Name())
	}
	return names
}
