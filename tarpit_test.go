package sluice

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/internal/tarpit"
)

const tarpitConfig = `{"tarpit": "4s", "tarpit_max": 2,
	"shed": {"group": "unit_tarpit", "capacity": 10},
	"rate_limits": {"tp": {"key": "static", "max_events": 10, "window": "1m"}}}`

// The tarpit holds a denial for between half and all of its delay, at most
// tarpit_max at once; beyond that, and once the client leaves or the
// config stops, the answer goes at once. A held denial never counts as a
// request in flight for load shedding.
func TestTarpitHolds(t *testing.T) {
	u := newUnitHandler(t, tarpitConfig, byZone(map[string]algorithms.Result{"tp": denied(30 * time.Second)}))
	u.timers = make(chan *fakeTimer, 10)
	var random float64
	u.h.plan.jitterFn = func() float64 { return random }
	send := func(ctx context.Context) chan answer {
		done := make(chan answer, 1)
		go func() { done <- u.serve(ctx, nil) }()
		return done
	}
	nextTimer := func() *fakeTimer {
		select {
		case ft := <-u.timers:
			return ft
		case <-time.After(10 * time.Second):
			t.Fatal("no request was held")
		}
		return nil
	}
	skipped := testutil.ToFloat64(tarpitSkipped)
	held0 := testutil.ToFloat64(tarpitHeld)

	random = 0
	first := send(context.Background())
	if ft := nextTimer(); ft.d != 2*time.Second {
		t.Fatalf("held for %s with the lowest draw, want half of 4s", ft.d)
	}
	random = 0.999999
	ctx, leave := context.WithCancel(context.Background())
	second := send(ctx)
	if ft := nextTimer(); ft.d < 3999*time.Millisecond || ft.d > 4*time.Second {
		t.Fatalf("held for %s with the highest draw, want just under 4s", ft.d)
	}
	if got := testutil.ToFloat64(tarpitHeld) - held0; got != 2 {
		t.Fatalf("held gauge %v, want 2", got)
	}
	if n := u.h.plan.shed.InFlight.Load(); n != 0 {
		t.Fatalf("%d in flight for load shedding while only denials are held", n)
	}
	// Full: the third denial is answered at once.
	third := u.serve(context.Background(), nil)
	if third.code != http.StatusTooManyRequests || testutil.ToFloat64(tarpitSkipped)-skipped != 1 {
		t.Fatalf("beyond tarpit_max: %d, skipped %v; want 429 at once, counted", third.code, testutil.ToFloat64(tarpitSkipped)-skipped)
	}
	// The client of the second leaves: its hold ends now.
	leave()
	select {
	case a := <-second:
		if a.code != http.StatusTooManyRequests {
			t.Fatalf("a held request whose client left: %d", a.code)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a client that left is still held")
	}
	// Its place is free again.
	fourth := send(context.Background())
	nextTimer()
	// The config stops: everything held goes at once, and nothing more is held.
	u.h.plan.tarpit.Stop()
	for _, ch := range []chan answer{first, fourth} {
		select {
		case a := <-ch:
			if a.code != http.StatusTooManyRequests || a.header.Get("Retry-After") != "30" {
				t.Fatalf("released: %d, Retry-After %q", a.code, a.header.Get("Retry-After"))
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a held request outlived its config")
		}
	}
	if got := testutil.ToFloat64(tarpitHeld) - held0; got != 0 {
		t.Fatalf("held gauge %v after all were let go", got)
	}
	if u.h.plan.tarpit.Held() != 0 {
		t.Fatal("the handler still counts held requests")
	}
}

// Only a rate limit's denial is held: an admitted request, and a shed one
// (the server's state, not the client's doing), are answered at once.
func TestTarpitOnlyDenials(t *testing.T) {
	u := newUnitHandler(t, tarpitConfig, byZone(nil))
	u.timers = make(chan *fakeTimer) // a held request would block here
	if a := u.serve(context.Background(), nil); !a.passed {
		t.Fatalf("admitted request: %d", a.code)
	}
	u.h.plan.shed.InFlight.Store(1000)
	defer u.h.plan.shed.InFlight.Store(0)
	u.h.Shed.Priority = 4
	if a := u.serve(context.Background(), nil); a.code != http.StatusServiceUnavailable {
		t.Fatalf("shed request: %d", a.code)
	}
}

// A held denial's waits count from when it is sent: after 12 s in the
// tarpit, a wait of 30 s is answered as 18 s, in Retry-After and in the
// rate limit fields alike.
func TestTarpitAnswerCountsFromWhenSent(t *testing.T) {
	u := newUnitHandler(t, `{"tarpit": "20s", "headers": "legacy",
		"rate_limits": {"tp_sent": {"key": "static", "max_events": 10, "window": "1m"}}}`,
		byZone(map[string]algorithms.Result{"tp_sent": denied(30 * time.Second)}))
	var clock atomic.Int64
	clock.Store(fuzzStart)
	u.h.plan.now = clock.Load
	done := make(chan answer, 1)
	go func() { done <- u.serve(t.Context(), nil) }()
	var ft *fakeTimer
	select {
	case ft = <-u.timers:
	case <-time.After(10 * time.Second):
		t.Fatal("the denial was not held")
	}
	clock.Add(int64(12 * time.Second))
	ft.fire <- time.Time{}
	a := <-done
	if a.code != http.StatusTooManyRequests || a.header.Get("Retry-After") != "18" || exact(a.header, "X-RateLimit-Reset") != "18" {
		t.Fatalf("after 12 s held: %d, Retry-After %q, X-RateLimit-Reset %q; want 429, 18, 18",
			a.code, a.header.Get("Retry-After"), exact(a.header, "X-RateLimit-Reset"))
	}
}

// All tarpits together hold at most the ceiling (half the open-file
// limit), whatever each one's tarpit_max: beyond it a denial is answered
// at once, so held connections never take every descriptor.
func TestTarpitCeiling(t *testing.T) {
	u := newUnitHandler(t, `{"tarpit": "4s", "tarpit_max": 1000000,
		"rate_limits": {"tp_ceiling": {"key": "static", "max_events": 10, "window": "1m"}}}`,
		byZone(map[string]algorithms.Result{"tp_ceiling": denied(30 * time.Second)}))
	if openFileLimit() > 0 && tarpit.Ceiling() != openFileLimit()/2 {
		t.Fatalf("ceiling %d, want half the open-file limit %d", tarpit.Ceiling(), openFileLimit())
	}
	saved := tarpit.Ceiling()
	defer tarpit.SetCeiling(saved)
	tarpit.SetCeiling(tarpit.HeldAll() + 1)
	u.timers = make(chan *fakeTimer, 10)
	skipped := testutil.ToFloat64(tarpitSkipped)
	first := make(chan answer, 1)
	go func() { first <- u.serve(t.Context(), nil) }()
	var ft *fakeTimer
	select {
	case ft = <-u.timers:
	case <-time.After(10 * time.Second):
		t.Fatal("the first denial was not held")
	}
	if a := u.serve(t.Context(), nil); a.code != http.StatusTooManyRequests || testutil.ToFloat64(tarpitSkipped)-skipped != 1 {
		t.Fatalf("beyond the ceiling: %d, skipped %v; want 429 at once, counted", a.code, testutil.ToFloat64(tarpitSkipped)-skipped)
	}
	if u.h.plan.tarpit.Held() != 1 {
		t.Fatalf("the handler counts %d held, want 1: a denial refused by the ceiling is not held", u.h.plan.tarpit.Held())
	}
	ft.fire <- time.Time{}
	<-first
	if u.h.plan.tarpit.Held() != 0 {
		t.Fatal("the handler still counts a held request")
	}
}

// A denial held behind a handler that counts the request in a shedding
// group leaves the group while held, and the outer handler's count is
// whole again once the hold ends.
func TestTarpitHeldLeavesOuterGroup(t *testing.T) {
	outer := newUnitHandler(t, shedConfig("unit_tarpit_outer", 10, 0), byZone(nil))
	inner := newUnitHandler(t, `{"tarpit": "4s", "rate_limits": {"tp_outer": {"key": "static", "max_events": 10, "window": "1m"}}}`,
		byZone(map[string]algorithms.Result{"tp_outer": denied(30 * time.Second)}))
	g := outer.h.plan.shed
	r := httptest.NewRequest(http.MethodGet, "http://example.com/", nil)
	r.RemoteAddr = "192.0.2.7:4242"
	w := httptest.NewRecorder()
	r = caddyhttp.PrepareRequest(r, caddy.NewReplacer(), w, &caddyhttp.Server{})
	var after int64
	done := make(chan error, 1)
	go func() {
		done <- outer.h.ServeHTTP(w, r, caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
			err := inner.h.ServeHTTP(w, r, okHandler)
			after = g.InFlight.Load()
			return err
		}))
	}()
	var ft *fakeTimer
	select {
	case ft = <-inner.timers:
	case <-time.After(10 * time.Second):
		t.Fatal("the denial was not held")
	}
	if n := g.InFlight.Load(); n != 0 {
		t.Fatalf("%d in flight in the outer group while the denial is held, want 0", n)
	}
	ft.fire <- time.Time{}
	if err := <-done; err == nil {
		t.Fatal("the denial passed")
	}
	if after != 1 || g.InFlight.Load() != 0 {
		t.Fatalf("in flight %d once the hold ended (want 1, the outer handler's), %d after (want 0)", after, g.InFlight.Load())
	}
}
