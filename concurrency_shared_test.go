package sluice

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sluicehq/sluice/internal/conc"
	"github.com/sluicehq/sluice/internal/conc/conctest"
)

// While the backend is away: fail open admits without a slot, closed
// answers 503 with the breaker's Retry-After, local caps this instance.
func TestSharedConcFailPolicies(t *testing.T) {
	for _, tc := range []struct {
		fail      string
		wantCodes [2]int // a request, and another sent while it is in flight
	}{
		{FailOpen, [2]int{http.StatusOK, http.StatusOK}},
		{FailClosed, [2]int{http.StatusServiceUnavailable, 0}}, // the second is never sent
		{FailLocal, [2]int{http.StatusOK, http.StatusServiceUnavailable}},
	} {
		t.Run(tc.fail, func(t *testing.T) {
			u := newUnitHandler(t, concConfig, byZone(nil))
			l := u.h.plan.zones[0].limits[0]
			f := conctest.NewSlots(1)
			f.Down = true
			l.fail = tc.fail
			l.shared = testShared(f)
			if tc.fail != FailLocal {
				l.conc = nil
			}
			var inner answer
			outer := u.serveNext(context.Background(), nil, caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error {
				inner = u.serve(context.Background(), nil)
				return nil
			}))
			if outer.code != tc.wantCodes[0] || inner.code != tc.wantCodes[1] {
				t.Fatalf("answers %d, %d; want %v", outer.code, inner.code, tc.wantCodes)
			}
			if tc.fail == FailClosed && outer.header.Get("Retry-After") != "2" {
				t.Fatalf("Retry-After %q, want the breaker's 2", outer.header.Get("Retry-After"))
			}
			if tc.fail == FailLocal && l.conc.Size() != 0 {
				t.Fatal("the local slot was not freed")
			}
		})
	}
}

// Through the handler, slots shared by the backend cap requests in flight
// and are freed when the request ends.
func TestSharedConcHandler(t *testing.T) {
	u := newUnitHandler(t, concConfig, byZone(nil))
	l := u.h.plan.zones[0].limits[0]
	f := conctest.NewSlots(1)
	l.shared, l.conc = testShared(f), nil
	var inner answer
	outer := u.serveNext(context.Background(), nil, caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error {
		if f.Count("static") != 1 {
			t.Errorf("%d slots held in flight, want 1", f.Count("static"))
		}
		inner = u.serve(context.Background(), nil)
		return nil
	}))
	if outer.code != http.StatusOK || inner.code != http.StatusServiceUnavailable {
		t.Fatalf("answers %d, %d; want 200, 503", outer.code, inner.code)
	}
	if n := f.Keys(); n != 1 || f.Count("static") != 0 {
		t.Fatalf("slots left held: %d keys, %d of static", n, f.Count("static"))
	}
}

func TestConcurrencySharedConfig(t *testing.T) {
	for cfg, want := range map[string]string{
		`"concurrency": 2, "queue": "1s", "queue_max": -1`:         "queue_max must be from 1",
		`"concurrency": 2, "queue_max": 3`:                         "queue_max would do nothing without queue",
		`"slot_ttl": "10s"`:                                        "slot_ttl would do nothing without concurrency",
		`"concurrency": 2, "slot_ttl": "100ms"`:                    "slot_ttl must be from 1s to 1h",
		`"concurrency": 2, "slot_ttl": "2h"`:                       "slot_ttl must be from 1s to 1h",
		`"concurrency": 2, "slot_ttl": "10s"`:                      "slot_ttl: on the memory backend",
		`"concurrency": 2, "queue": "1s", "queue_max": 2000000000`: "queue_max must be from 1",
	} {
		_, cleanup, err := provisionJSON([]byte(`{"rate_limits": {"cfg": {"key": "static", "max_events": 10, "window": "1m", `+cfg+`}}}`), nil)
		if cleanup != nil {
			cleanup()
		}
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", cfg, err, want)
		}
	}
}

func testShared(f *conctest.Slots) *conc.Shared {
	return conc.NewShared(f, 0, 0, prometheus.NewGauge(prometheus.GaugeOpts{Name: "t"}), nil)
}

// A limit of shared slots alone counts the requests its backend failed,
// under its fail policy.
func TestSharedConcFailuresCounted(t *testing.T) {
	u := newUnitHandler(t, `{"rate_limits": {"ccf": {"key": "static", "concurrency": 1, "fail": "open"}}}`, byZone(nil))
	l := u.h.plan.zones[0].keyed[0]
	f := conctest.NewSlots(1)
	f.Down = true
	l.shared, l.conc = testShared(f), nil
	l.failC = metrics.failures.WithLabelValues("ccf", "", "open")
	before := testutil.ToFloat64(l.failC)
	if a := u.serve(context.Background(), nil); a.code != http.StatusOK {
		t.Fatalf("fail open: %d", a.code)
	}
	if got := testutil.ToFloat64(l.failC) - before; got != 1 {
		t.Fatalf("%v failures counted, want 1", got)
	}
}
