package sluice

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/internal/aimd"
	"github.com/sluicehq/sluice/internal/redistest"
)

// adaptiveHandler provisions one handler, on the system clock, and returns
// it with the adaptive limit of its only zone, whose controller runs on a
// clock the test moves.
func adaptiveHandler(t *testing.T, raw string, clock *int64) (*Handler, *adaptiveLimit) {
	t.Helper()
	h, cleanup, err := provisionJSON([]byte(raw), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cleanup)
	a := h.plan.zones[0].keyed[0].adapt
	a.now = func() int64 { return *clock }
	a.ctl = aimd.New(a.l.adaptCfg, a.ctl.Current(), *clock)
	return h, a
}

func requestWithReplacer(r *http.Request) *http.Request {
	return r.WithContext(context.WithValue(r.Context(), caddy.ReplacerCtxKey, caddy.NewReplacer()))
}

func gaugeValue(t *testing.T, g prometheus.Gauge) float64 {
	t.Helper()
	var m dto.Metric
	if err := g.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetGauge().GetValue()
}

// Nonsense in an adaptive block is refused when the config loads, naming
// the field.
func TestAdaptiveProvisionErrors(t *testing.T) {
	for _, tt := range []struct{ name, zone, want string }{
		{"min above max", `"key": "k", "concurrency": 100, "adaptive": {"min": 300, "max": 200}`, `zone "z": adaptive: min 300 is above max 200`},
		{"decrease 1", `"key": "k", "concurrency": 100, "adaptive": {"decrease": 1}`, `adaptive: decrease must be strictly between 0 and 1, got 1`},
		{"decrease 0 is the default, negative is not", `"key": "k", "concurrency": 100, "adaptive": {"decrease": -0.3}`, `adaptive: decrease must be strictly between 0 and 1, got -0.3`},
		{"interval under 1s", `"key": "k", "concurrency": 100, "adaptive": {"interval": "500ms"}`, `adaptive: interval must be from 1s to 1h, got 500ms`},
		{"latency marks reversed", `"key": "k", "concurrency": 100, "adaptive": {"latency_p99_low": "500ms", "latency_p99_high": "200ms"}`, `adaptive: latency_p99 low mark 500ms must be below the high mark 200ms`},
		{"latency high mark negative", `"key": "k", "concurrency": 100, "adaptive": {"latency_p99_low": "200ms", "latency_p99_high": "-1s"}`, `adaptive: latency_p99 marks must be positive, got 200ms and -1s`},
		{"error marks reversed", `"key": "k", "concurrency": 100, "adaptive": {"error_rate_low": 0.05, "error_rate_high": 0.01}`, `adaptive: error_rate low mark 0.05 must be below the high mark 0.01`},
		{"start outside", `"key": "k", "concurrency": 10, "adaptive": {"min": 50, "max": 2000}`, `adaptive: the limit starts at the configured 10, which must be within min 50 and max 2000`},
		{"concurrency max too large", `"key": "k", "concurrency": 10, "adaptive": {"max": 2000000000}`, `adaptive: max must be at most 1073741824`},
		{"sliding_window max too large", `"window": "1s", "max_events": 10, "adaptive": {"max": 5000000000}`, `adaptive: max must be at most 4294967295`},
		{"token bucket burst past its bound at max", `"window": "1ms", "max_events": 1000, "burst": 1000000000000000, "algorithm": "token_bucket", "adaptive": {"max": 2000}`, `adaptive: at 2000 events per window (burst 2000000000000000): burst must be at most 1000000000000000`},
		{"gcra in a scope, cost above the burst at min", `"scopes": {"s": {"window": "1s", "max_events": 10, "burst": 5, "cost": 3, "algorithm": "gcra", "adaptive": {"min": 4}}}`, `zone "z": scope "s": adaptive: at min 4 the bucket holds 2 (burst × min ÷ max_events), below the cost 3`},
		{"queue too short for the cost at min", `"window": "1s", "max_events": 10, "cost": 3, "algorithm": "leaky_bucket", "max_delay": "300ms", "adaptive": {"min": 3}`, `adaptive: at min 3 the bucket holds 1`},
		{"rate and concurrency", `"key": "k", "window": "1s", "max_events": 10, "concurrency": 5, "adaptive": {}`, `adaptive: the limit has both a rate and a concurrency`},
		{"min below the cost", `"window": "1s", "max_events": 100, "cost": 10, "adaptive": {"min": 5}`, `adaptive: min 5 is below the cost 10 of every request`},
		{"tiered", `"key": "k", "tier": "{http.request.header.X-Plan}", "tiers": [{"name": "free", "max_events": 10, "window": "1m"}], "default_tier": "free", "adaptive": {}`, `adaptive: a tiered limit takes its rate and concurrency from each request's tier`},
		{"on a zone of scopes", `"adaptive": {}, "scopes": {"s": {"window": "1s", "max_events": 10}}`, `adaptive would do nothing on a zone without a rate of its own`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := validate(t, `{"handler": "rate_limit", "rate_limits": {"z": {`+tt.zone+`}}}`)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want it to contain %q", err, tt.want)
			}
		})
	}
	for _, ok := range []string{
		`"key": "k", "concurrency": 500, "adaptive": {"min": 50, "max": 2000, "increase": 10, "decrease": 0.7, "interval": "10s", "latency_p99_low": "200ms", "latency_p99_high": "500ms", "error_rate_low": 0.01, "error_rate_high": 0.05}`,
		`"window": "1s", "max_events": 500, "algorithm": "fixed_window", "adaptive": {"max": 2000}`,
		`"scopes": {"s": {"window": "1s", "max_events": 500, "algorithm": "sliding_window_counter", "adaptive": {"min": 100}}}`,
		`"window": "1s", "max_events": 500, "algorithm": "token_bucket", "burst": 50, "adaptive": {"min": 1, "max": 2000}`,
		`"window": "1s", "max_events": 500, "algorithm": "gcra", "adaptive": {"min": 500, "max": 500}`,
		`"window": "1s", "max_events": 10, "algorithm": "gcra", "adaptive": {"max": 1000000000000000}`,
		`"window": "1s", "max_events": 10, "algorithm": "leaky_bucket", "max_delay": "2s", "adaptive": {"min": 1, "max": 1000}`,
	} {
		if err := validate(t, `{"handler": "rate_limit", "rate_limits": {"z": {`+ok+`}}}`); err != nil {
			t.Errorf("%s: %v", ok, err)
		}
	}
}

// The Caddyfile's adaptive block names the line of the option at fault.
func TestAdaptiveCaddyfileErrors(t *testing.T) {
	zone := func(lines ...string) string {
		return "rate_limit {\n\tzone a {\n\t\tkey k\n\t\tconcurrency 100\n\t\tadaptive {\n\t\t\t" + strings.Join(lines, "\n\t\t\t") + "\n\t\t}\n\t}\n}"
	}
	for _, tt := range []struct {
		name, block, want string
		line              int
	}{
		{"unknown option", zone("minimum 5"), `adaptive: unrecognized option "minimum"`, 7},
		{"repeated", zone("min 5", "min 6"), "adaptive: min already specified", 8},
		{"min not a number", zone("min few"), `adaptive min must be a whole number ≥ 1, got "few"`, 7},
		{"decrease 1.5", zone("decrease 1.5"), `decrease must be a fraction strictly between 0 and 1, such as 0.7, got "1.5"`, 7},
		{"one latency mark", zone("latency_p99 200ms"), "latency_p99 takes a low and a high mark, got 1 values", 7},
		{"latency not a duration", zone("latency_p99 fast 500ms"), "latency_p99 fast 500ms", 7},
		{"error rate not a percentage", zone("error_rate 1% lots"), `not a number or a percentage: "lots"`, 7},
		{"argument on the line", "rate_limit {\n\tzone a {\n\t\tkey k\n\t\tconcurrency 100\n\t\tadaptive on\n\t}\n}", `adaptive takes a block, not "on"`, 6},
		// What provisioning refuses, at the adaptive line.
		{"marks reversed", zone("error_rate 5% 1%"), "adaptive: error_rate low mark 0.05 must be below the high mark 0.01", 6},
		{"min above max", zone("min 300", "max 200"), "adaptive: min 300 is above max 200", 6},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(":8080\n"+tt.block+"\n"), nil)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want it to contain %q", err, tt.want)
			}
			if line := "Caddyfile:" + strconv.Itoa(tt.line); !strings.Contains(err.Error(), line) {
				t.Fatalf("error %q does not name %s", err, line)
			}
		})
	}
}

func TestParseRatio(t *testing.T) {
	for in, want := range map[string]float64{"1%": 0.01, "5%": 0.05, "0.02": 0.02, "100%": 1, "0.5%": 0.005} {
		if got, err := parseRatio(in); err != nil || got != want {
			t.Errorf("%q: %v %v, want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "%", "NaN", "Inf%", "one%"} {
		if _, err := parseRatio(in); err == nil {
			t.Errorf("%q accepted", in)
		}
	}
}

// nextFunc is a handler after rate_limit.
type nextFunc func(http.ResponseWriter, *http.Request) error

func (f nextFunc) ServeHTTP(w http.ResponseWriter, r *http.Request) error { return f(w, r) }

// The handler tells the controller how long the handlers after it took
// and whether they failed: a 5xx written or an error with a 5xx status
// (or none) is a failure; a 4xx, a client that left, a 200 are not.
func TestAdaptiveObservesOutcomes(t *testing.T) {
	for _, tt := range []struct {
		name   string
		next   nextFunc
		cancel bool
		failed bool
	}{
		{"200", func(w http.ResponseWriter, _ *http.Request) error { _, err := w.Write([]byte("ok")); return err }, false, false},
		{"502 written", func(w http.ResponseWriter, _ *http.Request) error { w.WriteHeader(502); return nil }, false, true},
		{"404 written", func(w http.ResponseWriter, _ *http.Request) error { w.WriteHeader(404); return nil }, false, false},
		{"103 then 500", func(w http.ResponseWriter, _ *http.Request) error { w.WriteHeader(103); w.WriteHeader(500); return nil }, false, true},
		{"error 503", func(http.ResponseWriter, *http.Request) error { return caddyhttp.Error(503, errors.New("down")) }, false, true},
		{"error without status", func(http.ResponseWriter, *http.Request) error { return errors.New("boom") }, false, true},
		{"error 403", func(http.ResponseWriter, *http.Request) error { return caddyhttp.Error(403, errors.New("no")) }, false, false},
		{"client left", func(http.ResponseWriter, *http.Request) error { return context.Canceled }, true, false},
		{"switched protocols", func(w http.ResponseWriter, _ *http.Request) error { w.WriteHeader(101); return nil }, false, false},
		{"hijacked", func(w http.ResponseWriter, _ *http.Request) error {
			_, _, err := http.NewResponseController(w).Hijack()
			return err
		}, false, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var clock int64
			h, a := adaptiveHandler(t, `{"handler": "rate_limit", "rate_limits": {"adapt_obs_`+strings.ReplaceAll(tt.name, " ", "_")+`": {"key": "k", "concurrency": 10, "adaptive": {"interval": "1s"}}}}`, &clock)
			ctx, cancel := context.WithCancel(context.Background())
			if tt.cancel {
				cancel()
			}
			defer cancel()
			r := requestWithReplacer(httptest.NewRequest("GET", "/", nil).WithContext(ctx))
			slow := tt.next
			_ = h.ServeHTTP(httptest.NewRecorder(), r, nextFunc(func(w http.ResponseWriter, r *http.Request) error {
				clock += int64(70 * time.Millisecond)
				return slow(w, r)
			}))
			d, _ := a.ctl.Decide(1 << 62) // ends the interval: its numbers are the request's
			n, p99 := d.Requests, d.P99
			if tt.name == "switched protocols" || tt.name == "hijacked" {
				// A WebSocket's length is its client's, not the upstream's.
				if n != 0 {
					t.Fatalf("%d observations of a connection that left HTTP", n)
				}
				return
			}
			if errs := d.Errors; n != 1 || (errs == 1) != tt.failed {
				t.Fatalf("%d observations, %d errors; want 1, failed %v", n, errs, tt.failed)
			}
			if p99 < int64(70*time.Millisecond) || p99 > int64(75*time.Millisecond) {
				t.Fatalf("latency %v, want 70 ms", time.Duration(p99))
			}
		})
	}
}

// Failing answers shrink a concurrency limit at the end of the interval,
// in the slot table and the gauge; clean ones let it grow back.
func TestAdaptiveConcurrencyFollowsErrors(t *testing.T) {
	var clock int64
	h, a := adaptiveHandler(t, `{"handler": "rate_limit", "rate_limits": {"adapt_conc_errs": {"key": "k", "concurrency": 100, "adaptive": {"min": 10, "max": 200, "increase": 5, "interval": "10s"}}}}`, &clock)
	serve := func(status int) {
		r := requestWithReplacer(httptest.NewRequest("GET", "/", nil))
		_ = h.ServeHTTP(httptest.NewRecorder(), r, nextFunc(func(w http.ResponseWriter, _ *http.Request) error {
			w.WriteHeader(status)
			return nil
		}))
	}
	// An interval of ten answers of one status, ended at end by one more.
	interval := func(status int, end time.Duration) {
		for range 10 {
			serve(status)
		}
		clock = int64(end)
		serve(status)
	}
	interval(500, 10*time.Second)
	if got := a.l.conc.Max(); got != 70 {
		t.Fatalf("after an interval of 500s: cap %d, want 70", got)
	}
	if got := gaugeValue(t, adaptiveLimitG.WithLabelValues("adapt_conc_errs", "")); got != 70 {
		t.Fatalf("gauge %v, want 70", got)
	}
	interval(200, 20*time.Second)
	if got := a.l.conc.Max(); got != 75 {
		t.Fatalf("after a clean interval: cap %d, want 75", got)
	}
}

// On a rate, the limit the store decides with moves: a request past the
// shrunk max_events is denied.
func TestAdaptiveRateFollowsLatency(t *testing.T) {
	var clock int64
	h, a := adaptiveHandler(t, `{"handler": "rate_limit", "rate_limits": {"adapt_rate_lat": {"key": "k", "window": "1h", "max_events": 10, "adaptive": {"min": 2, "decrease": 0.5, "latency_p99_low": "100ms", "latency_p99_high": "1s", "interval": "10s"}}}}`, &clock)
	_ = a
	serve := func(latency time.Duration) error {
		r := requestWithReplacer(httptest.NewRequest("GET", "/", nil))
		return h.ServeHTTP(httptest.NewRecorder(), r, nextFunc(func(http.ResponseWriter, *http.Request) error {
			clock += int64(latency)
			return nil
		}))
	}
	for range 3 {
		if err := serve(2 * time.Second); err != nil {
			t.Fatal(err)
		}
	}
	clock = int64(10 * time.Second)
	if err := serve(2 * time.Second); err != nil { // the 4th event; the limit falls to 5
		t.Fatal(err)
	}
	if err := serve(0); err != nil {
		t.Fatalf("the 5th of 5: %v", err)
	}
	if err := serve(0); err == nil {
		t.Fatal("the 6th request passed a limit shrunk to 5")
	}
}

// adaptiveSend returns a request sent again and again through a handler
// with one limit: a rate (fixed_window) or a concurrency, adaptive or not,
// in front of a next handler that writes 200.
func adaptiveSend(tb testing.TB, name, limit string) func() {
	tb.Helper()
	// A second per request: the window's count, and so the remaining
	// placeholder, stays small (a number above 4095 allocates its value).
	var ticking atomic.Int64
	ticking.Store(fuzzStart)
	tick := func() int64 { return ticking.Add(int64(time.Second)) }
	h, cleanup, err := provisionJSON([]byte(`{"rate_limits": {"hot_adaptive_`+name+`": {"key": "{http.vars.client_ip}", `+limit+`}}}`), tick)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(cleanup)
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) error {
		w.WriteHeader(http.StatusOK)
		return nil
	})
	w, r := benchRequest(tb, "http://example.com/", "192.0.2.7:4242")
	return func() {
		if err := h.ServeHTTP(w, r, next); err != nil {
			tb.Fatal(err)
		}
	}
}

func adaptiveCases() []struct{ name, limit string } {
	const adaptive = `, "adaptive": {"max": 2000000, "interval": "1s", "latency_p99_low": "200ms", "latency_p99_high": "500ms"}`
	return []struct{ name, limit string }{
		{"rate", `"max_events": 1000, "window": "1m", "algorithm": "fixed_window"`},
		{"rate_adaptive", `"max_events": 1000, "window": "1m", "algorithm": "fixed_window"` + adaptive},
		{"concurrency", `"concurrency": 1000`},
		{"concurrency_adaptive", `"concurrency": 1000` + adaptive},
		{"bucket", `"max_events": 1000, "window": "1m", "burst": 100, "algorithm": "token_bucket"`},
		{"bucket_adaptive", `"max_events": 1000, "window": "1m", "burst": 100, "algorithm": "token_bucket"` + adaptive},
	}
}

// BenchmarkAdaptiveServeHTTP is what watching a request for an adaptive
// limit adds to it: two clock reads, the pooled writer, the histogram.
//
//	go test -run '^$' -bench 'AdaptiveServeHTTP|AIMDObserve' -benchmem .
func BenchmarkAdaptiveServeHTTP(b *testing.B) {
	for _, c := range adaptiveCases() {
		b.Run(c.name, func(b *testing.B) {
			send := adaptiveSend(b, c.name, c.limit)
			send()
			b.ReportAllocs()
			for b.Loop() {
				send()
			}
		})
	}
}

// An adaptive limit adds no allocation to a request it lets through.
func TestAdaptiveAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool drops values at random under the race detector")
	}
	allocs := map[string]float64{}
	for _, c := range adaptiveCases() {
		send := adaptiveSend(t, c.name, c.limit)
		send()
		allocs[c.name] = testing.AllocsPerRun(500, send)
	}
	for _, base := range []string{"rate", "concurrency", "bucket"} {
		if allocs[base+"_adaptive"] != allocs[base] {
			t.Errorf("%s: %v allocations per request, %v when adaptive", base, allocs[base], allocs[base+"_adaptive"])
		}
	}
	for _, c := range []string{"rate_adaptive", "bucket_adaptive"} {
		if allocs[c] != 0 {
			t.Errorf("%s: %v allocations per request, want 0", c, allocs[c])
		}
	}
}

func TestPrintZonesAdaptive(t *testing.T) {
	var b strings.Builder
	err := printZones(&b, []zoneInfo{{Name: "api", Backend: "memory", Limits: []limitInfo{
		{Concurrency: 500, Adaptive: &adaptiveInfo{Limit: 364, Min: 50, Max: 2000}},
		{Scope: "site", MaxEvents: 5000, Window: "1s", Algorithm: "sliding_window_counter", Adaptive: &adaptiveInfo{Limit: 4100, Min: 1000, Max: 10000}},
		{Scope: "ip", MaxEvents: 100, Window: "1s", Algorithm: "sliding_window", Concurrency: 4},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"concurrency 500 (adaptive: 364 in 50–2000)", "5000/1s (adaptive: 4100 in 1000–10000)", "100/1s, concurrency 4"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("no %q in\n%s", want, b.String())
		}
	}
}

// A limit that counts by the response and adapts sees the same response
// through both writers: a 500 is counted (count_when) and is a failure.
func TestAdaptiveWithCountWhen(t *testing.T) {
	var clock int64
	h, a := adaptiveHandler(t, `{"handler": "rate_limit", "rate_limits": {"adapt_count_when": {"key": "k", "window": "1h", "max_events": 3, "count_when": {"status_code": [5]}, "adaptive": {"interval": "1s"}}}}`, &clock)
	serve := func(status int) error {
		r := requestWithReplacer(httptest.NewRequest("GET", "/", nil))
		return h.ServeHTTP(httptest.NewRecorder(), r, nextFunc(func(w http.ResponseWriter, _ *http.Request) error {
			w.WriteHeader(status)
			return nil
		}))
	}
	for range 5 {
		if err := serve(200); err != nil {
			t.Fatalf("a 200 is not counted, yet: %v", err)
		}
	}
	for range 3 {
		if err := serve(500); err != nil {
			t.Fatal(err)
		}
	}
	if err := serve(500); err == nil {
		t.Fatal("three 500s counted, a fourth request passed")
	}
	if d, _ := a.ctl.Decide(1 << 62); d.Errors != 3 {
		t.Fatalf("%d failures observed, want 3", d.Errors)
	}
}

// reloadBackedOff provisions cfg (one zone, one adaptive limit starting at
// 100), makes its controller back off to 70 on an interval of errors, and
// provisions cfg again, as a reload does; the first config is then
// cleaned up. It returns the second config and the controller.
func reloadBackedOff(t *testing.T, cfg string) (*Handler, *aimd.Controller) {
	t.Helper()
	old, cleanupOld, err := provisionJSON([]byte(cfg), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctl := old.plan.zones[0].keyed[0].adapt.ctl
	for range 10 {
		ctl.Observe(int64(time.Millisecond), true)
	}
	if d, ok := ctl.Decide(monotonic() + int64(time.Hour)); !ok || d.To != 70 {
		t.Fatalf("decision %+v %v, want 70", d, ok)
	}
	nw, cleanupNew, err := provisionJSON([]byte(cfg), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cleanupNew)
	cleanupOld()
	return nw, ctl
}

// A reload keeps what the limit learned: the new config's slots start at
// the limit the running config backed off to, not at the configured one.
// A reload that changes the adaptive settings starts afresh.
func TestAdaptiveSurvivesReload(t *testing.T) {
	const cfg = `{"rate_limits": {"adapt_reload": {"key": "k", "concurrency": 100, "adaptive": {"min": 10, "interval": "1s"}}}}`
	nw, ctl := reloadBackedOff(t, cfg)
	if got := nw.plan.zones[0].keyed[0].conc.Max(); got != 70 {
		t.Fatalf("the reloaded config's cap is %d, want 70", got)
	}
	if nw.plan.zones[0].keyed[0].adapt.ctl != ctl {
		t.Fatal("the reloaded config has a controller of its own")
	}
	changed, cleanupChanged, err := provisionJSON([]byte(strings.Replace(cfg, `"min": 10`, `"min": 20`, 1)), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cleanupChanged()
	if got := changed.plan.zones[0].keyed[0].conc.Max(); got != 100 {
		t.Fatalf("with other settings the cap is %d, want the configured 100", got)
	}
}

// After a reload that keeps a backed-off limit, the local fallback of a
// fail local limit decides with the backed-off max_events too, not the
// configured one.
func TestAdaptiveLocalFallbackAfterReload(t *testing.T) {
	redis := redistest.Standalone(t, "")
	nw, _ := reloadBackedOff(t, `{"backend": {"name": "redis", "addresses": ["`+redis.Addr+`"]}, "rate_limits": {"adapt_local": {"key": "k", "max_events": 100, "window": "1h", "fail": "local", "adaptive": {"min": 10, "interval": "1s"}}}}`)
	l := nw.plan.zones[0].keyed[0]
	out := make([]algorithms.Result, 1)
	if _, err := nw.plan.local.Decide(context.Background(), []backend.Request{{Limit: l.local, Key: "k", Cost: 1}}, out); err != nil || out[0].Limit != 70 {
		t.Fatalf("the local fallback decides with %+v (%v), want a limit of 70", out[0], err)
	}
}

// slowClientWriter is a client that takes a second to take each write.
type slowClientWriter struct {
	*httptest.ResponseRecorder
	clock *int64
}

func (w slowClientWriter) Write(b []byte) (int, error) {
	*w.clock += int64(time.Second)
	return w.ResponseRecorder.Write(b)
}

func (w slowClientWriter) WriteString(s string) (int, error) { return w.Write([]byte(s)) }

// slowClientBody is a body whose every read waits a second for the client.
type slowClientBody struct {
	clock *int64
	left  int
}

func (b *slowClientBody) Read(p []byte) (int, error) {
	*b.clock += int64(time.Second)
	if b.left == 0 {
		return 0, io.EOF
	}
	b.left--
	p[0] = 'x'
	return 1, nil
}

func (*slowClientBody) Close() error { return nil }

// The latency is the handlers' own: the time spent waiting for a client
// that sends its body slowly, or takes the answer slowly, is the client's,
// and does not count (one hostile client would otherwise drive the limit
// down for everyone). The upstream's own time still counts, streaming
// included.
func TestAdaptiveLatencyLeavesOutTheClient(t *testing.T) {
	for _, tt := range []struct {
		name string
		next func(clock *int64) nextFunc
	}{
		{"slow upload", func(clock *int64) nextFunc {
			return func(w http.ResponseWriter, r *http.Request) error {
				_, _ = io.Copy(io.Discard, r.Body)
				*clock += int64(70 * time.Millisecond)
				_, err := w.Write([]byte("ok"))
				return err
			}
		}},
		{"slow reader", func(clock *int64) nextFunc {
			return func(w http.ResponseWriter, _ *http.Request) error {
				*clock += int64(30 * time.Millisecond)
				_, _ = w.Write([]byte("part"))
				*clock += int64(40 * time.Millisecond)
				_, err := w.Write([]byte("rest"))
				return err
			}
		}},
		{"slow reader through ReadFrom", func(clock *int64) nextFunc {
			return func(w http.ResponseWriter, _ *http.Request) error {
				*clock += int64(70 * time.Millisecond)
				_, err := w.(io.ReaderFrom).ReadFrom(strings.NewReader("ok"))
				return err
			}
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var clock int64
			h, a := adaptiveHandler(t, `{"handler": "rate_limit", "rate_limits": {"adapt_client_`+strings.ReplaceAll(tt.name, " ", "_")+`": {"key": "k", "concurrency": 10, "adaptive": {"interval": "1h"}}}}`, &clock)
			r := requestWithReplacer(httptest.NewRequest("POST", "/", &slowClientBody{clock: &clock, left: 3}))
			_ = h.ServeHTTP(slowClientWriter{httptest.NewRecorder(), &clock}, r, tt.next(&clock))
			d, _ := a.ctl.Decide(1 << 62) // ends the interval: its numbers are the request's
			n, p99 := d.Requests, d.P99
			if n != 1 || p99 < int64(70*time.Millisecond) || p99 > int64(75*time.Millisecond) {
				t.Fatalf("%d observations, latency %v; want 1 of 70 ms (clock moved %v)", n, time.Duration(p99), time.Duration(clock))
			}
			if _, ok := r.Body.(*slowClientBody); !ok {
				t.Fatalf("the request's body is %T after the handler, want the client's", r.Body)
			}
		})
	}
}

// hasAdaptiveSeries tells whether the adaptive gauges export zone.
func hasAdaptiveSeries(t *testing.T, zone string) bool {
	t.Helper()
	ch := make(chan prometheus.Metric, 1024)
	adaptiveMinG.Collect(ch)
	close(ch)
	for m := range ch {
		var d dto.Metric
		if err := m.Write(&d); err != nil {
			t.Fatal(err)
		}
		for _, l := range d.GetLabel() {
			if l.GetName() == "zone" && l.GetValue() == zone {
				return true
			}
		}
	}
	return false
}

// The series of an adaptive limit outlive a reload (the new config counts
// before the old lets go) and leave with the last config that has it.
func TestAdaptiveSeriesRemovedWithTheLastConfig(t *testing.T) {
	raw := []byte(`{"handler": "rate_limit", "rate_limits": {"adapt_series_gone": {"key": "k", "concurrency": 10, "adaptive": {"min": 2}}}}`)
	_, cleanOld, err := provisionJSON(raw, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, cleanNew, err := provisionJSON(raw, nil)
	if err != nil {
		t.Fatal(err)
	}
	cleanOld()
	if !hasAdaptiveSeries(t, "adapt_series_gone") {
		t.Fatal("the old config's cleanup removed the series of the running one")
	}
	cleanNew()
	if hasAdaptiveSeries(t, "adapt_series_gone") {
		t.Fatal("the series outlived the last config with the zone")
	}
}

func TestAdaptiveConfigErrors(t *testing.T) {
	ms := func(n int64) caddy.Duration { return caddy.Duration(n * int64(time.Millisecond)) }
	for _, tc := range []struct {
		name  string
		a     Adaptive
		start int64
		want  string
	}{
		{"min above max", Adaptive{Min: 600, Max: 500}, 500, "min 600 is above max 500"},
		{"start below min", Adaptive{Min: 600, Max: 900}, 500, "starts at the configured 500"},
		{"start above max", Adaptive{Max: 400}, 500, "starts at the configured 500"},
		{"max too large", Adaptive{Max: MaxConcurrency + 1}, 500, "max must be at most"},
		{"negative min", Adaptive{Min: -1}, 500, "min must be at least 1"},
		{"negative increase", Adaptive{Increase: -5}, 500, "increase must be at least 1"},
		{"decrease 1", Adaptive{Decrease: 1}, 500, "decrease must be strictly between 0 and 1"},
		{"decrease 1.5", Adaptive{Decrease: 1.5}, 500, "decrease must be strictly between 0 and 1"},
		{"negative decrease", Adaptive{Decrease: -0.5}, 500, "decrease must be strictly between 0 and 1"},
		{"interval under 1s", Adaptive{Interval: ms(500)}, 500, "interval must be from 1s to 1h"},
		{"interval over 1h", Adaptive{Interval: caddy.Duration(2 * time.Hour)}, 500, "interval must be from 1s to 1h"},
		{"one latency mark", Adaptive{LatencyP99Low: ms(200)}, 500, "latency_p99 needs both marks"},
		{"latency marks reversed", Adaptive{LatencyP99Low: ms(500), LatencyP99High: ms(200)}, 500, "low mark 500ms must be below the high mark 200ms"},
		{"latency marks equal", Adaptive{LatencyP99Low: ms(200), LatencyP99High: ms(200)}, 500, "must be below the high mark"},
		{"negative latency", Adaptive{LatencyP99Low: ms(-1), LatencyP99High: ms(200)}, 500, "must be positive"},
		{"error marks reversed", Adaptive{ErrorRateLow: 0.05, ErrorRateHigh: 0.01}, 500, "error_rate low mark 0.05 must be below the high mark 0.01"},
		{"one error mark", Adaptive{ErrorRateLow: 0.05}, 500, "error_rate marks must be above 0%"},
		{"error rate over 100%", Adaptive{ErrorRateLow: 0.5, ErrorRateHigh: 2}, 500, "at most 100%"},
	} {
		_, err := tc.a.config(tc.start, MaxConcurrency)
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "adaptive: ") {
			t.Errorf("%s: %v, want an error with %q", tc.name, err, tc.want)
		}
	}
	c, err := (&Adaptive{}).config(40, MaxConcurrency)
	if err != nil {
		t.Fatal(err)
	}
	if want := (aimd.Config{Min: 1, Max: 40, Increase: 1, Decrease: 0.7, Interval: int64(10 * time.Second), ErrLow: 0.01, ErrHigh: 0.05}); c != want {
		t.Fatalf("defaults: %+v, want %+v", c, want)
	}
	worked := Adaptive{
		Min: 50, Max: 2000, Increase: 10, Decrease: 0.7, Interval: caddy.Duration(10 * time.Second),
		LatencyP99Low: caddy.Duration(200 * time.Millisecond), LatencyP99High: caddy.Duration(500 * time.Millisecond),
		ErrorRateLow: 0.01, ErrorRateHigh: 0.05,
	}
	c, err = worked.config(500, MaxConcurrency)
	if want := (aimd.Config{Min: 50, Max: 2000, Increase: 10, Decrease: 0.7, Interval: int64(10 * time.Second), LatLow: int64(200 * time.Millisecond), LatHigh: int64(500 * time.Millisecond), ErrLow: 0.01, ErrHigh: 0.05}); err != nil || c != want {
		t.Fatalf("the worked example: %+v, %v; want %+v", c, err, want)
	}
}
