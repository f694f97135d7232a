package sluice

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/internal/latency"
	"github.com/sluicehq/sluice/internal/shed"
)

func shedConfig(group string, capacity int64, priority int) string {
	return fmt.Sprintf(`{"shed": {"group": %q, "capacity": %d, "priority": %d},
		"rate_limits": {"shed_rate": {"key": "static", "max_events": 100, "window": "1m"}}}`, group, capacity, priority)
}

// A shed request is refused before any rate limit is asked (it takes no
// unit), with 503, Retry-After and the reason load_shed; an admitted one
// counts in the group while the handlers after rate_limit run.
func TestShedHandler(t *testing.T) {
	low := newUnitHandler(t, shedConfig("unit_shed", 10, 3), byZone(nil))
	high := newUnitHandler(t, shedConfig("unit_shed", 10, 2), byZone(nil))
	if low.h.plan.shed != high.h.plan.shed {
		t.Fatal("two handlers of one group do not share it")
	}
	g := low.h.plan.shed
	g.InFlight.Store(11) // load 1.1
	a := low.serve(context.Background(), nil)
	if a.passed || a.code != http.StatusServiceUnavailable || a.header.Get("Retry-After") != "1" {
		t.Fatalf("priority 3 at load 1.1: passed %v, %d, Retry-After %q; want 503, 1", a.passed, a.code, a.header.Get("Retry-After"))
	}
	if got := a.placeholder(phReason); got != "load_shed" {
		t.Fatalf("reason %q", got)
	}
	if got := a.placeholder(phName); got != "unit_shed" {
		t.Fatalf("exceeded.name %q, want the group", got)
	}
	if len(low.store.decided) != 0 {
		t.Fatal("a shed request was decided by the store")
	}
	var during int64
	r := serveNext(high.h, func() { during = g.InFlight.Load() })
	if r != http.StatusOK || during != 12 || g.InFlight.Load() != 11 {
		t.Fatalf("priority 2 at load 1.1: %d, in flight %d while served (want 12), %d after (want 11)", r, during, g.InFlight.Load())
	}
	g.InFlight.Store(9)
	if a := low.serve(context.Background(), nil); !a.passed {
		t.Fatalf("priority 3 at load 0.9 got %d", a.code)
	}
	if g.InFlight.Load() != 9 {
		t.Fatalf("in flight %d after a request, want 9 again", g.InFlight.Load())
	}
	g.InFlight.Store(0)
}

// A request that passes through two handlers of one group (a site-wide
// one and a route's inside it) counts once, and the inner handler judges
// the load without it.
func TestShedNestedHandlersCountOnce(t *testing.T) {
	outer := newUnitHandler(t, shedConfig("unit_shed_nested", 10, 0), byZone(nil))
	inner := newUnitHandler(t, shedConfig("unit_shed_nested", 10, 3), byZone(nil))
	g := outer.h.plan.shed
	defer g.InFlight.Store(0)
	g.InFlight.Store(10) // load 1.0 before the request: priority 3 passes
	var during int64
	r := httptest.NewRequest(http.MethodGet, "http://example.com/", nil)
	r.RemoteAddr = "192.0.2.7:4242"
	w := httptest.NewRecorder()
	r = caddyhttp.PrepareRequest(r, caddy.NewReplacer(), w, &caddyhttp.Server{})
	err := outer.h.ServeHTTP(w, r, caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		return inner.h.ServeHTTP(w, r, caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error {
			during = g.InFlight.Load()
			return nil
		}))
	}))
	if err != nil {
		t.Fatalf("priority 3 at load 1.0 behind a handler of its own group: %v", err)
	}
	if during != 11 || g.InFlight.Load() != 10 {
		t.Fatalf("in flight %d while served (want 11: counted once), %d after (want 10)", during, g.InFlight.Load())
	}
	if _, counted := inner.h.plan.shedCounted(r); counted {
		t.Fatal("the request is still marked as counted once its handlers returned")
	}
	g.InFlight.Store(11) // load 1.1 without the request: priority 3 is shed
	if code := serveNext(inner.h, func() {}); code != http.StatusServiceUnavailable {
		t.Fatalf("priority 3 at load 1.1: %d, want 503", code)
	}
}

// serveNext sends one request through h; next runs as the handler after
// it. It returns the status, 200 when next ran.
func serveNext(h *Handler, next func()) int {
	r := httptest.NewRequest(http.MethodGet, "http://example.com/", nil)
	r.RemoteAddr = "192.0.2.7:4242"
	w := httptest.NewRecorder()
	r = caddyhttp.PrepareRequest(r, caddy.NewReplacer(), w, &caddyhttp.Server{})
	err := h.ServeHTTP(w, r, caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error {
		next()
		return nil
	}))
	if he, ok := errors.AsType[caddyhttp.HandlerError](err); ok {
		return he.StatusCode
	}
	return w.Code
}

// Every mistake in the shed and tarpit options is refused where it is
// written, naming it.
func TestShedTarpitCaddyfileErrors(t *testing.T) {
	tests := []struct{ name, globals, block, want string }{
		{"shed without group", "", "shed", "wrong argument count"},
		{"shed with two names", "", "shed a b", `shed takes one group name, got another: "b"`},
		{"priority 5", "", "shed a {\n\t\tpriority 5\n\t\tcapacity 10\n\t}", `shed "a": priority must be a whole number from 0 to 4, got "5"`},
		{"priority -1", "", "shed a {\n\t\tpriority -1\n\t\tcapacity 10\n\t}", `priority must be a whole number from 0 to 4, got "-1"`},
		{"priority twice", "", "shed a {\n\t\tpriority 1\n\t\tpriority 2\n\t\tcapacity 10\n\t}", `shed "a": priority already specified`},
		{"capacity 0", "", "shed a {\n\t\tcapacity 0\n\t}", `shed "a": capacity must be a whole number ≥ 1, got "0"`},
		{"no capacity", "", "shed a {\n\t\tpriority 2\n\t}", `shed "a": no capacity: set it in the global options`},
		{"unknown shed option", "", "shed a {\n\t\tweight 2\n\t}", `shed "a": unrecognized option "weight"`},
		{"shed twice", "", "shed a {\n\t\tcapacity 1\n\t}\n\tshed b {\n\t\tcapacity 1\n\t}", "shed already specified"},
		{"capacity twice over", "rate_limit {\n\t\tshed a {\n\t\t\tcapacity 10\n\t\t}\n\t}", "shed a {\n\t\tcapacity 20\n\t}", `shed "a": capacity 20 here, 10 in the global options`},
		{"global priority", "rate_limit {\n\t\tshed a {\n\t\t\tcapacity 10\n\t\t\tpriority 1\n\t\t}\n\t}", "shed a", `shed "a": priority is a route's, not the group's`},
		{"global without capacity", "rate_limit {\n\t\tshed a\n\t}", "shed a", `shed "a": capacity or latency_target is required`},
		{"global group twice", "rate_limit {\n\t\tshed a {\n\t\t\tcapacity 1\n\t\t}\n\t\tshed a {\n\t\t\tcapacity 2\n\t\t}\n\t}", "shed a", `shed "a" already defined`},
		{"latency_target zero", "", "shed a {\n\t\tlatency_target 0s\n\t}", `shed "a": latency_target must be positive, got "0s"`},
		{"latency_target negative", "", "shed a {\n\t\tlatency_target -200ms\n\t}", `latency_target must be positive, got "-200ms"`},
		{"latency_target a float", "", "shed a {\n\t\tlatency_target 0.2\n\t}", `shed "a": invalid latency_target "0.2"`},
		{"latency_target a word", "", "shed a {\n\t\tlatency_target fast\n\t}", `invalid latency_target "fast"`},
		{"latency_target no value", "", "shed a {\n\t\tlatency_target\n\t}", "wrong argument count"},
		{"latency_target twice", "", "shed a {\n\t\tlatency_target 1s\n\t\tlatency_target 2s\n\t}", `shed "a": latency_target already specified`},
		{"latency_target two targets", "rate_limit {\n\t\tshed a {\n\t\t\tlatency_target 200ms\n\t\t}\n\t}", "shed a {\n\t\tlatency_target 300ms\n\t}", `shed "a": latency_target 300ms here, 200ms in the global options`},
		{"tarpit word", "", "tarpit long", `invalid tarpit "long"`},
		{"tarpit 0", "", "tarpit 0s", "tarpit must be positive"},
		{"tarpit 2m", "", "tarpit 2m", "tarpit must be at most 1m, got 2m0s"},
		{"tarpit_max 0", "", "tarpit 5s\n\ttarpit_max 0", `tarpit_max must be a whole number ≥ 1, got "0"`},
		{"tarpit_max huge", "", "tarpit 5s\n\ttarpit_max 9223372036854775807", "tarpit_max must be from 1 to 1000000"},
		{"tarpit twice", "", "tarpit 5s\n\ttarpit 6s", "tarpit already specified"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := "{\n\t" + tt.globals + "\n}\n:8080 {\n\trate_limit {\n\t" + tt.block + "\n\t}\n}\n"
			_, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(cfg), nil)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want it to contain %q; config:\n%s", err, tt.want, cfg)
			}
		})
	}
}

// The JSON form is checked as strictly at provision.
func TestShedTarpitProvisionErrors(t *testing.T) {
	tests := []struct{ name, config, want string }{
		{"no group", `{"shed": {"capacity": 10}}`, "shed: group is required"},
		{"no capacity", `{"shed": {"group": "p_a"}}`, `shed "p_a": capacity is required (or latency_target, to shed on latency alone)`},
		{"huge capacity", `{"shed": {"group": "p_a", "capacity": 1073741825}}`, "capacity must be from 1 to 1073741824"},
		{"priority 5", `{"shed": {"group": "p_a", "capacity": 10, "priority": 5}}`, `shed "p_a": priority must be from 0 (never shed) to 4 (shed first), got 5`},
		{"negative priority", `{"shed": {"group": "p_a", "capacity": 10, "priority": -1}}`, "got -1"},
		{"latency_target negative", `{"shed": {"group": "p_lat", "latency_target": "-200ms"}}`, `shed "p_lat": latency_target must be from 1ms to 1h0m0s, got -200ms`},
		{"latency_target negative with a capacity", `{"shed": {"group": "p_lat", "capacity": 5, "latency_target": -1}}`, `latency_target must be from 1ms to 1h0m0s, got -1ns`},
		{"latency_target too small", `{"shed": {"group": "p_lat", "latency_target": "999us"}}`, "latency_target must be from 1ms to 1h0m0s, got 999µs"},
		{"latency_target absurd", `{"shed": {"group": "p_lat", "latency_target": "100h"}}`, "latency_target must be from 1ms to 1h0m0s, got 100h0m0s"},
		{"latency_target a float string", `{"shed": {"group": "p_lat", "latency_target": "0.2"}}`, `shed "p_lat": latency_target "0.2": time: missing unit in duration "0.2"`},
		{"latency_target a word", `{"shed": {"group": "p_lat", "latency_target": "fast"}}`, `shed "p_lat": latency_target "fast": time: invalid duration "fast"`},
		{"latency_target an object", `{"shed": {"group": "p_lat", "latency_target": {}}}`, `shed "p_lat": latency_target {}:`},
		{"unknown field in shed", `{"shed": {"group": "p_lat", "capacity": 5, "latency": "1s"}}`, `unknown field "latency"`},
		{"latency_target a float", `{"shed": {"group": "p_lat", "latency_target": 0.2}}`, `shed "p_lat": latency_target 0.2: json: cannot unmarshal number 0.2`},
		{"latency_target neither capacity nor target", `{"shed": {"group": "p_lat", "priority": 2}}`, `shed "p_lat": capacity is required (or latency_target, to shed on latency alone)`},
		{"negative tarpit", `{"tarpit": -1}`, "tarpit must be from 0 to 1m, got -1ns"},
		{"tarpit of an hour", `{"tarpit": "1h"}`, "tarpit must be from 0 to 1m, got 1h0m0s"},
		{"tarpit_max alone", `{"tarpit_max": 5}`, "tarpit_max would do nothing without tarpit"},
		{"tarpit_max negative", `{"tarpit": "1s", "tarpit_max": -5, "rate_limits": {"p_r": {"key": "static", "max_events": 1, "window": "1m"}}}`, "tarpit_max must be from 1 to 1000000, got -5"},
		{"tarpit without a zone", `{"tarpit": "1s", "shed": {"group": "p_a", "capacity": 10}}`, "tarpit would do nothing"},
		{"tarpit with concurrency alone", `{"tarpit": "1s", "rate_limits": {"p_c": {"key": "static", "concurrency": 5}}}`, "tarpit would do nothing"},
		{"tarpit with a shadow rate", `{"tarpit": "1s", "rate_limits": {"p_s": {"key": "static", "max_events": 1, "window": "1m", "shadow": true}}}`, "tarpit would do nothing"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, cleanup, err := provisionJSON([]byte(tt.config), backend.SystemNow)
			if err == nil {
				cleanup()
				t.Fatal("provisioned")
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %q, want it to contain %q", err, tt.want)
			}
		})
	}
	for _, group := range []string{"p_a", "p_lat"} {
		if shed.Registered(group) {
			t.Fatalf("a refused config left its group %q behind", group)
		}
	}
}

// BenchmarkShed is the shedding check and count of one request:
//
//	go test -run '^$' -bench 'Shed' -benchmem -count 3 .
func BenchmarkShed(b *testing.B) {
	h, cleanup, err := provisionJSON([]byte(`{"shed": {"group": "bench_shed", "capacity": 1000, "priority": 3}}`), backend.SystemNow)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(cleanup)
	h.plan.shed.InFlight.Store(900) // load 0.9: admitted, the arithmetic done
	b.Run("check", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if h.plan.shedding(false) {
				b.Fatal("shed at load 0.9")
			}
		}
	})
	b.Run("check_and_count_parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if h.plan.shedding(false) {
					b.Fatal("shed")
				}
				h.plan.shed.InFlight.Add(1)
				h.plan.shed.InFlight.Add(-1)
			}
		})
	})
	// Through ServeHTTP, a handler with shed alone (no zone).
	b.Run("serve_admitted", func(b *testing.B) {
		w, r := benchRequest(b, "http://example.com/", "192.0.2.7:4242")
		b.ReportAllocs()
		for b.Loop() {
			if err := h.ServeHTTP(w, r, okHandler); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("serve_without_shed", func(b *testing.B) {
		bare, cleanup, err := provisionJSON([]byte(`{}`), backend.SystemNow)
		if err != nil {
			b.Fatal(err)
		}
		defer cleanup()
		w, r := benchRequest(b, "http://example.com/", "192.0.2.7:4242")
		b.ReportAllocs()
		for b.Loop() {
			if err := bare.ServeHTTP(w, r, okHandler); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("serve_shed", func(b *testing.B) {
		h.plan.shed.InFlight.Store(1500)
		defer h.plan.shed.InFlight.Store(900)
		w, r := benchRequest(b, "http://example.com/", "192.0.2.7:4242")
		fresh := freshReplacer(r)
		b.ReportAllocs()
		for b.Loop() {
			fresh()
			if err := h.ServeHTTP(w, r, okHandler); err == nil {
				b.Fatal("not shed")
			}
		}
	})
}

// The check and count of an admitted request allocate nothing.
func TestShedAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector drops pooled values")
	}
	h, cleanup, err := provisionJSON([]byte(`{"shed": {"group": "alloc_shed", "capacity": 10, "priority": 4}}`), backend.SystemNow)
	if err != nil {
		t.Fatal(err)
	}
	defer cleanup()
	w, r := benchRequest(t, "http://example.com/", "192.0.2.7:4242")
	if n := testing.AllocsPerRun(100, func() {
		if err := h.ServeHTTP(w, r, okHandler); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Fatalf("%v allocations per admitted request", n)
	}
}

// A wait takes the request out of every group a handler before counts it
// in, and puts it back after; groups that do not count it are untouched.
func TestLeaveAndRejoinGroups(t *testing.T) {
	a := newUnitHandler(t, shedConfig("unit_shed_leave_a", 10, 0), byZone(nil)).h.plan.shed
	b := newUnitHandler(t, shedConfig("unit_shed_leave_b", 10, 0), byZone(nil)).h.plan.shed
	other := newUnitHandler(t, shedConfig("unit_shed_leave_c", 10, 0), byZone(nil)).h.plan.shed
	r := httptest.NewRequest(http.MethodGet, "http://example.com/", nil)
	r = caddyhttp.PrepareRequest(r, caddy.NewReplacer(), httptest.NewRecorder(), &caddyhttp.Server{})
	vars := r.Context().Value(caddyhttp.VarsCtxKey).(map[string]any)
	ma := enterGroup(a, vars, nil)
	mb := enterGroup(b, vars, nil)
	other.InFlight.Add(3)
	defer other.InFlight.Add(-3)
	paused := leaveGroups(r)
	if a.InFlight.Load() != 0 || b.InFlight.Load() != 0 || other.InFlight.Load() != 3 {
		t.Fatalf("while waiting: %d, %d, %d; want 0, 0 and the other group's 3", a.InFlight.Load(), b.InFlight.Load(), other.InFlight.Load())
	}
	rejoinGroups(paused)
	if a.InFlight.Load() != 1 || b.InFlight.Load() != 1 {
		t.Fatalf("after the wait: %d, %d; want 1, 1", a.InFlight.Load(), b.InFlight.Load())
	}
	ma.exit()
	mb.exit()
	if len(leaveGroups(r)) != len(vars) || a.InFlight.Load() != 0 {
		t.Fatal("a request no group counts any more left a group")
	}
}

const ms = int64(time.Millisecond)

// windowCount is how many latencies the window holds at now.
func windowCount(w *latency.Window, now int64) int64 {
	n, _ := w.Sum(now)
	return n
}

// latencyShed is a handler of group with a latency target, a fake clock,
// and the given capacity (0: none) and priority.
func latencyShed(t *testing.T, group string, capacity int64, priority int, clock *int64) *Handler {
	t.Helper()
	capField := ""
	if capacity > 0 {
		capField = fmt.Sprintf(`, "capacity": %d`, capacity)
	}
	u := newUnitHandler(t, fmt.Sprintf(`{"shed": {"group": %q, "latency_target": "200ms", "priority": %d%s}}`, group, priority, capField), byZone(nil))
	u.h.plan.shed.Now = func() int64 { return *clock }
	return u.h
}

// With a latency target, the load is the greater of the two ratios: a
// slow group sheds with few requests in flight, a full one with fast
// requests; without a capacity only latency counts.
func TestShedLoadIsTheGreaterRatio(t *testing.T) {
	clock := int64(300 * time.Second)
	h3 := latencyShed(t, "unit_lat_max", 10, 3, &clock)
	h2 := latencyShed(t, "unit_lat_max", 10, 2, &clock)
	g := h3.plan.shed
	defer g.InFlight.Store(0)
	check := func(what string, want3, want2 bool) {
		t.Helper()
		if got := h3.plan.shedding(false); got != want3 {
			t.Errorf("%s: priority 3 shed %v, want %v", what, got, want3)
		}
		if got := h2.plan.shedding(false); got != want2 {
			t.Errorf("%s: priority 2 shed %v, want %v", what, got, want2)
		}
	}
	check("idle", false, false)
	// p99 within the 200ms-wide buckets near 220ms: latency.Upper rounds up,
	// so record a value whose bucket's upper bound is at most 220ms.
	lat := latencyAt(t, 200*ms, 220*ms)
	for range 100 {
		g.Latency.Add(lat, clock)
	}
	clock += int64(latency.Refresh)
	g.Latency.P99At(clock) // as the next request to finish does
	check("p99 1.1, 0 in flight", true, false)
	g.InFlight.Store(12) // load 1.2 by count
	check("p99 1.1, 12 in flight", true, true)
	g.InFlight.Store(0)
	// A quiet spell: nothing finishes, and the check itself finds the
	// slow requests gone from the window.
	clock += int64(latency.WindowSpan)
	check("after the window", false, false)
	g.InFlight.Store(11)
	check("fast, 11 in flight", true, false)

	only := latencyShed(t, "unit_lat_only", 0, 4, &clock)
	only.plan.shed.InFlight.Store(1 << 20)
	defer only.plan.shed.InFlight.Store(0)
	if only.plan.shedding(false) {
		t.Fatal("a group without a capacity shed on its requests in flight")
	}
	only.plan.shed.Latency.Add(latencyAt(t, 190*ms, 200*ms), clock)
	clock += int64(latency.Refresh)
	only.plan.shed.Latency.P99At(clock) // as the next request to finish does
	if !only.plan.shedding(false) {
		t.Fatal("a group without a capacity did not shed priority 4 at a p99 above 0.9")
	}
}

// latencyAt is a latency in (lo, hi] whose bucket's upper bound, the p99
// the window reports, is also in (lo, hi].
func latencyAt(t *testing.T, lo, hi int64) int64 {
	t.Helper()
	for ns := hi; ns > lo; ns -= 1000 {
		if up := latency.Upper(latency.Bucket(uint64(ns) / 1000)); up > lo && up <= hi {
			return up
		}
	}
	t.Fatalf("no bucket ends in (%d, %d]", lo, hi)
	return 0
}

// serveTimed sends one request through h; next advances the clock by d
// (the upstream's time) after running inside.
func serveTimed(t *testing.T, h *Handler, clock *int64, d int64, inside caddyhttp.Handler) (*http.Request, error) {
	t.Helper()
	r := httptest.NewRequest(http.MethodGet, "http://example.com/", nil)
	r.RemoteAddr = "192.0.2.7:4242"
	w := httptest.NewRecorder()
	r = caddyhttp.PrepareRequest(r, caddy.NewReplacer(), w, &caddyhttp.Server{})
	err := h.ServeHTTP(w, r, caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		*clock += d
		if inside != nil {
			return inside.ServeHTTP(w, r)
		}
		return nil
	}))
	return r, err
}

// A request is timed by the handler that counts it in its group, once,
// however many handlers of the group it passes; a wait out of the group
// (a tarpit, a queue, a max_delay behind) and a refusal behind leave the
// group's latency alone, and the timer is gone once the request is.
func TestShedLatencyTiming(t *testing.T) {
	clock := int64(400 * time.Second)
	outer := latencyShed(t, "unit_lat_timing", 10, 0, &clock)
	inner := latencyShed(t, "unit_lat_timing", 10, 4, &clock)
	g := outer.plan.shed
	at := func(what string, n int64, p99 int64) {
		t.Helper()
		clock += int64(latency.Refresh)
		if got, p := windowCount(&g.Latency, clock), g.Latency.P99At(clock); got != n || (n > 0 && (p < p99 || p > p99*17/16)) {
			t.Fatalf("%s: %d latencies, p99 %s; want %d, %s", what, got, time.Duration(p), n, time.Duration(p99))
		}
	}
	if _, err := serveTimed(t, outer, &clock, 150*ms, nil); err != nil {
		t.Fatal(err)
	}
	at("one request", 1, 150*ms)

	// Nested: the inner handler of the group neither counts nor times it.
	r, err := serveTimed(t, outer, &clock, 0, caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		return inner.ServeHTTP(w, r, caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error {
			clock += 160 * ms
			return nil
		}))
	}))
	if err != nil {
		t.Fatal(err)
	}
	at("a request through two handlers of the group", 2, 160*ms)
	if _, counted := inner.plan.shedCounted(r); counted {
		t.Fatal("the request is still marked as counted (and timed) once it was answered")
	}
	if paused := leaveGroups(r); g.InFlight.Load() != 0 {
		t.Fatal("a request answered was taken out of its group again")
	} else {
		rejoinGroups(paused)
	}

	// A wait out of the group: 5 s in a tarpit, 20 ms upstream.
	if _, err := serveTimed(t, outer, &clock, 20*ms, caddyhttp.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) error {
		vars := leaveGroups(r)
		clock += 5000 * ms
		rejoinGroups(vars)
		return nil
	})); err != nil {
		t.Fatal(err)
	}
	at("a request held 5 s out of the group", 3, 160*ms)

	// Shed by the inner handler (priority 4 at 10 in flight of 10): no
	// latency of its own.
	g.InFlight.Store(10)
	_, err = serveTimed(t, outer, &clock, 900*ms, caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		return inner.ServeHTTP(w, r, okHandler)
	}))
	g.InFlight.Store(0)
	if code := statusOf(err); code != http.StatusServiceUnavailable {
		t.Fatalf("inner priority 4 at load 1.0 (plus the outer's count): %v", err)
	}
	at("a request shed behind", 3, 160*ms)
}

func statusOf(err error) int {
	if he, ok := err.(caddyhttp.HandlerError); ok {
		return he.StatusCode
	}
	return 0
}

// Two groups time one request each, the inner one inside the outer's
// time; a tarpit wait inside both is left out of both.
func TestShedLatencyTwoGroups(t *testing.T) {
	clock := int64(500 * time.Second)
	a := latencyShed(t, "unit_lat_two_a", 10, 0, &clock)
	b := latencyShed(t, "unit_lat_two_b", 10, 0, &clock)
	if _, err := serveTimed(t, a, &clock, 10*ms, caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		return b.ServeHTTP(w, r, caddyhttp.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) error {
			vars := leaveGroups(r)
			clock += 3000 * ms
			rejoinGroups(vars)
			clock += 40 * ms
			return nil
		}))
	})); err != nil {
		t.Fatal(err)
	}
	clock += int64(latency.Refresh)
	pa, pb := a.plan.shed.Latency.P99At(clock), b.plan.shed.Latency.P99At(clock)
	if pa < 50*ms || pa > 54*ms || pb < 40*ms || pb > 43*ms {
		t.Fatalf("p99 %s and %s, want about 50ms (10 + 40) and 40ms", time.Duration(pa), time.Duration(pb))
	}
}

// The group's latency outlives a reload, like its count: the new config's
// handler sees the old one's requests.
func TestShedLatencySurvivesReload(t *testing.T) {
	clock := int64(600 * time.Second)
	old := latencyShed(t, "unit_lat_reload", 10, 3, &clock)
	old.plan.shed.Latency.Add(latencyAt(t, 200*ms, 220*ms), clock)
	next, cleanup, err := provisionJSON([]byte(`{"shed": {"group": "unit_lat_reload", "capacity": 10, "latency_target": "200ms", "priority": 3}}`), backend.SystemNow)
	if err != nil {
		t.Fatal(err)
	}
	defer cleanup()
	g := old.plan.shed
	old.Cleanup()
	if next.plan.shed != g {
		t.Fatal("the new config has a group of its own")
	}
	clock += int64(latency.Refresh)
	g.Latency.P99At(clock) // as the next request to finish does
	if !next.plan.shedding(false) {
		t.Fatal("the new config does not shed on the old config's latency")
	}
}

// A global latency_target, without a capacity, reaches the handler.
func TestShedLatencyCaddyfile(t *testing.T) {
	// The global target (and no capacity) reaches the handler.
	cfg := "{\n\trate_limit {\n\t\tshed a {\n\t\t\tlatency_target 250ms\n\t\t}\n\t}\n}\n:8080 {\n\trate_limit {\n\t\tshed a {\n\t\t\tpriority 3\n\t\t}\n\t}\n}\n"
	out, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(cfg), nil)
	if err != nil {
		t.Fatal(err)
	}
	if want := `"shed":{"group":"a","latency_target":250000000,"priority":3}`; !strings.Contains(string(out), want) {
		t.Fatalf("adapted to %s, want it to contain %s", out, want)
	}
}

// Handlers of one config that give one group two targets (or one a target
// and the other none) are refused.
func TestShedLatencyConflict(t *testing.T) {
	first := `{"shed": {"group": "unit_lat_conflict", "capacity": 10, "latency_target": "200ms"}}`
	for _, second := range []string{`"latency_target": "300ms", "capacity": 10`, `"capacity": 10`} {
		_, done, err := provisionJSON([]byte(`{}`), backend.SystemNow) // sets fuzzBase up
		if err != nil {
			t.Fatal(err)
		}
		done()
		a, err := decodeHandler([]byte(first))
		if err != nil {
			t.Fatal(err)
		}
		b, err := decodeHandler([]byte(`{"shed": {"group": "unit_lat_conflict", "priority": 2, ` + second + `}}`))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := caddy.NewContext(fuzzBase)
		if err := a.Provision(ctx); err != nil {
			t.Fatal(err)
		}
		err = b.Provision(ctx)
		_ = a.Cleanup()
		_ = b.Cleanup()
		cancel()
		if err == nil || !strings.Contains(err.Error(), `shed "unit_lat_conflict": latency_target given twice in this config`) {
			t.Fatalf("%s: error %v", second, err)
		}
	}
	if shed.Registered("unit_lat_conflict") {
		t.Fatal("the refused configs left the group behind")
	}
}

// Timing an admitted request for its group's latency, and the check that
// reads the p99 (refreshed meanwhile), allocate nothing.
func TestShedLatencyAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector drops pooled values")
	}
	clock := int64(700 * time.Second)
	h := latencyShed(t, "alloc_shed_lat", 1000, 3, &clock)
	h.plan.shed.Now = func() int64 { clock += 10 * ms; return clock } // a refresh every ten requests
	w, r := benchRequest(t, "http://example.com/", "192.0.2.7:4242")
	if n := testing.AllocsPerRun(200, func() {
		if err := h.ServeHTTP(w, r, okHandler); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Fatalf("%v allocations per admitted, timed request", n)
	}
	if n := windowCount(&h.plan.shed.Latency, clock); n == 0 {
		t.Fatal("no latency recorded: the test measured nothing")
	}
}

// BenchmarkShedLatency is the cost of a latency target on the hot path,
// beside the same handler without one:
//
//	go test -run '^$' -bench 'ShedLatency' -benchmem -count 3 .
func BenchmarkShedLatency(b *testing.B) {
	for _, tc := range []struct{ name, config string }{
		{"capacity", `{"shed": {"group": "bench_shed_cap", "capacity": 1000, "priority": 3}}`},
		{"capacity_and_target", `{"shed": {"group": "bench_shed_lat", "capacity": 1000, "latency_target": "1s", "priority": 3}}`},
	} {
		h, cleanup, err := provisionJSON([]byte(tc.config), backend.SystemNow)
		if err != nil {
			b.Fatal(err)
		}
		h.plan.shed.InFlight.Store(900) // load 0.9 by count: admitted, the arithmetic done
		b.Run(tc.name+"/check", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if h.plan.shedding(false) {
					b.Fatal("shed")
				}
			}
		})
		b.Run(tc.name+"/serve_admitted", func(b *testing.B) {
			w, r := benchRequest(b, "http://example.com/", "192.0.2.7:4242")
			b.ReportAllocs()
			for b.Loop() {
				if err := h.ServeHTTP(w, r, okHandler); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(tc.name+"/serve_admitted_parallel", func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				w, r := benchRequest(b, "http://example.com/", "192.0.2.7:4242")
				for pb.Next() {
					if err := h.ServeHTTP(w, r, okHandler); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
		h.plan.shed.InFlight.Store(0)
		cleanup()
	}
	// Working out the p99 of a full window, done at most every 100 ms.
	b.Run("refresh", func(b *testing.B) {
		var w latency.Window
		now := int64(100 * time.Second)
		for i := range int64(10000) {
			w.Add(i*ms/10, now+i*ms)
		}
		now += 10000*ms - 1
		b.ReportAllocs()
		for b.Loop() {
			if _, p99 := w.Sum(now); p99 == 0 {
				b.Fatal("empty")
			}
		}
	})
}

// The vars map is read by goroutines that outlive a request's handlers
// (the reverse proxy's dial reads it after a request that gave up on
// it): the group's handler writes it only before handing the request on,
// and a mark left behind counts for nobody.
func TestShedWritesNoVarOnceHandedOn(t *testing.T) {
	if !raceEnabled {
		t.Skip("the race detector tells")
	}
	u := newUnitHandler(t, shedConfig("unit_shed_vars", 10, 0), byZone(nil))
	g := u.h.plan.shed
	r := httptest.NewRequest(http.MethodGet, "http://example.com/", nil)
	r = caddyhttp.PrepareRequest(r, caddy.NewReplacer(), httptest.NewRecorder(), &caddyhttp.Server{})
	read := make(chan struct{})
	if err := u.h.ServeHTTP(httptest.NewRecorder(), r, caddyhttp.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) error {
		ctx := r.Context()
		go func() {
			defer close(read)
			_ = caddyhttp.GetVar(ctx, "reverse_proxy.proxy")
		}()
		return nil
	})); err != nil {
		t.Fatal(err)
	}
	<-read
	if _, counted := u.h.plan.shedCounted(r); counted || g.InFlight.Load() != 0 {
		t.Fatalf("once answered: counted %v, in flight %d", counted, g.InFlight.Load())
	}
}

// A request that left a handler of one group and is then served by a
// handler of another (an error route's) counts once in the second, also
// while a wait inside takes it out of its groups: the first group's var
// still holds its spent mark, which the pool may hand to the second
// handler for the same request.
func TestShedSpentMarkOfAnotherGroup(t *testing.T) {
	a := newUnitHandler(t, shedConfig("unit_shed_spent_a", 10, 0), byZone(nil)).h
	b := newUnitHandler(t, shedConfig("unit_shed_spent_b", 10, 0), byZone(nil)).h
	gb := b.plan.shed
	gb.InFlight.Store(5)
	defer gb.InFlight.Store(0)
	for i := range 50 {
		r := httptest.NewRequest(http.MethodGet, "http://example.com/", nil)
		r.RemoteAddr = "192.0.2.7:4242"
		w := httptest.NewRecorder()
		r = caddyhttp.PrepareRequest(r, caddy.NewReplacer(), w, &caddyhttp.Server{})
		next := caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { return nil })
		if err := a.ServeHTTP(w, r, next); err != nil {
			t.Fatal(err)
		}
		var during, waiting int64
		if err := b.ServeHTTP(w, r, caddyhttp.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) error {
			during = gb.InFlight.Load()
			vars := leaveGroups(r)
			waiting = gb.InFlight.Load()
			rejoinGroups(vars)
			return nil
		})); err != nil {
			t.Fatal(err)
		}
		if during != 6 || waiting != 5 || gb.InFlight.Load() != 5 {
			t.Fatalf("request %d: in flight %d while served (want 6), %d while it waits (want 5), %d after (want 5)", i, during, waiting, gb.InFlight.Load())
		}
	}
}
