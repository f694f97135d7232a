package sluice

import (
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
)

const ms = int64(time.Millisecond)

// The rule on latency alone, as the request count's: at a p99 of 1.1 ×
// the target, priorities 3 and 4 are shed and 0 to 2 kept; at 0.9 ×,
// nothing. In floats, 220ms ÷ 200ms makes priority 2 shed.
func TestShedLatencyRule(t *testing.T) {
	target := 200 * ms
	tests := []struct {
		p99  int64
		shed [MaxShedPriority + 1]bool
	}{
		{0, [5]bool{}},
		{180 * ms, [5]bool{}}, // 0.9
		{180*ms + 1, [5]bool{false, false, false, false, true}},
		{200 * ms, [5]bool{false, false, false, false, true}},                // 1.0
		{220 * ms, [5]bool{false, false, false, true, true}},                 // 1.1
		{220*ms + 1, [5]bool{false, false, true, true, true}},                // just above
		{240 * ms, [5]bool{false, false, true, true, true}},                  // 1.2
		{260*ms + 1, [5]bool{false, true, true, true, true}},                 // above 1.3
		{histUpper(histBuckets - 1), [5]bool{false, true, true, true, true}}, // the top bucket
	}
	for _, tt := range tests {
		for p, want := range tt.shed {
			if got := sheds(tt.p99, target, p); got != want {
				t.Errorf("p99 %s for %s, priority %d: shed %v, want %v", time.Duration(tt.p99), time.Duration(target), p, got, want)
			}
		}
	}
	if load := float64(220*ms) / float64(target); !(2 > 5-(load-0.8)*10) {
		t.Fatal("the float rule no longer misjudges 1.1: this test shows less")
	}
	// The largest target and p99 do not overflow.
	if !sheds(histUpper(histBuckets-1), int64(maxShedLatencyTarget), 1) || sheds(0, int64(maxShedLatencyTarget), 4) {
		t.Fatal("the rule overflows at the bounds")
	}
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
	u.h.shed.now = func() int64 { return *clock }
	return u.h
}

// With a latency target, the load is the greater of the two ratios: a
// slow group sheds with few requests in flight, a full one with fast
// requests; without a capacity only latency counts.
func TestShedLoadIsTheGreaterRatio(t *testing.T) {
	clock := int64(300 * time.Second)
	h3 := latencyShed(t, "unit_lat_max", 10, 3, &clock)
	h2 := latencyShed(t, "unit_lat_max", 10, 2, &clock)
	g := h3.shed
	defer g.inFlight.Store(0)
	check := func(what string, want3, want2 bool) {
		t.Helper()
		if got := h3.shedding(false); got != want3 {
			t.Errorf("%s: priority 3 shed %v, want %v", what, got, want3)
		}
		if got := h2.shedding(false); got != want2 {
			t.Errorf("%s: priority 2 shed %v, want %v", what, got, want2)
		}
	}
	check("idle", false, false)
	// p99 within the 200ms-wide buckets near 220ms: histUpper rounds up,
	// so record a value whose bucket's upper bound is at most 220ms.
	lat := latencyAt(t, 200*ms, 220*ms)
	for range 100 {
		g.latency.add(lat, clock)
	}
	clock += int64(latencyRefresh)
	g.latency.p99At(clock) // as the next request to finish does
	check("p99 1.1, 0 in flight", true, false)
	g.inFlight.Store(12) // load 1.2 by count
	check("p99 1.1, 12 in flight", true, true)
	g.inFlight.Store(0)
	// A quiet spell: nothing finishes, and the check itself finds the
	// slow requests gone from the window.
	clock += int64(latencyWindowSpan)
	check("after the window", false, false)
	g.inFlight.Store(11)
	check("fast, 11 in flight", true, false)

	only := latencyShed(t, "unit_lat_only", 0, 4, &clock)
	only.shed.inFlight.Store(1 << 20)
	defer only.shed.inFlight.Store(0)
	if only.shedding(false) {
		t.Fatal("a group without a capacity shed on its requests in flight")
	}
	only.shed.latency.add(latencyAt(t, 190*ms, 200*ms), clock)
	clock += int64(latencyRefresh)
	only.shed.latency.p99At(clock) // as the next request to finish does
	if !only.shedding(false) {
		t.Fatal("a group without a capacity did not shed priority 4 at a p99 above 0.9")
	}
}

// latencyAt is a latency in (lo, hi] whose bucket's upper bound, the p99
// the window reports, is also in (lo, hi].
func latencyAt(t *testing.T, lo, hi int64) int64 {
	t.Helper()
	for ns := hi; ns > lo; ns -= 1000 {
		if up := histUpper(histBucket(uint64(ns) / 1000)); up > lo && up <= hi {
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
	g := outer.shed
	at := func(what string, n int64, p99 int64) {
		t.Helper()
		clock += int64(latencyRefresh)
		if got, p := windowCount(&g.latency, clock), g.latency.p99At(clock); got != n || (n > 0 && (p < p99 || p > p99*17/16)) {
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
	vars := r.Context().Value(caddyhttp.VarsCtxKey).(map[string]any)
	if _, ok := vars[g.varKey]; ok {
		t.Fatal("the request is still marked as counted (and timed) once it was answered")
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
	g.inFlight.Store(10)
	_, err = serveTimed(t, outer, &clock, 900*ms, caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		return inner.ServeHTTP(w, r, okHandler)
	}))
	g.inFlight.Store(0)
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
	clock += int64(latencyRefresh)
	pa, pb := a.shed.latency.p99At(clock), b.shed.latency.p99At(clock)
	if pa < 50*ms || pa > 54*ms || pb < 40*ms || pb > 43*ms {
		t.Fatalf("p99 %s and %s, want about 50ms (10 + 40) and 40ms", time.Duration(pa), time.Duration(pb))
	}
}

// The group's latency outlives a reload, like its count: the new config's
// handler sees the old one's requests.
func TestShedLatencySurvivesReload(t *testing.T) {
	clock := int64(600 * time.Second)
	old := latencyShed(t, "unit_lat_reload", 10, 3, &clock)
	old.shed.latency.add(latencyAt(t, 200*ms, 220*ms), clock)
	next, cleanup, err := provisionJSON([]byte(`{"shed": {"group": "unit_lat_reload", "capacity": 10, "latency_target": "200ms", "priority": 3}}`), backend.SystemNow)
	if err != nil {
		t.Fatal(err)
	}
	defer cleanup()
	g := old.shed
	old.Cleanup()
	if next.shed != g {
		t.Fatal("the new config has a group of its own")
	}
	clock += int64(latencyRefresh)
	g.latency.p99At(clock) // as the next request to finish does
	if !next.shedding(false) {
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
	if _, ok := shedGroups.References("unit_lat_conflict"); ok {
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
	h.shed.now = func() int64 { clock += 10 * ms; return clock } // a refresh every ten requests
	w, r := benchRequest(t, "http://example.com/", "192.0.2.7:4242")
	if n := testing.AllocsPerRun(200, func() {
		if err := h.ServeHTTP(w, r, okHandler); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Fatalf("%v allocations per admitted, timed request", n)
	}
	if n := windowCount(&h.shed.latency, clock); n == 0 {
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
		h.shed.inFlight.Store(900) // load 0.9 by count: admitted, the arithmetic done
		b.Run(tc.name+"/check", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if h.shedding(false) {
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
		h.shed.inFlight.Store(0)
		cleanup()
	}
	// Working out the p99 of a full window, done at most every 100 ms.
	b.Run("refresh", func(b *testing.B) {
		var w latencyWindow
		now := int64(100 * time.Second)
		for i := range int64(10000) {
			w.add(i*ms/10, now+i*ms)
		}
		now += 10000*ms - 1
		b.ReportAllocs()
		for b.Loop() {
			if _, p99 := w.sum(now); p99 == 0 {
				b.Fatal("empty")
			}
		}
	})
}
