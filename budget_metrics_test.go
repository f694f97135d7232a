package sluice

import (
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// budgetGauges collects the budget collector's series of zone, by scope
// and metric: "remaining/", "limit/hour"...
func budgetGauges(t *testing.T, zone string) map[string]float64 {
	t.Helper()
	ch := make(chan prometheus.Metric, 64)
	go func() {
		budgetMetrics.Collect(ch)
		close(ch)
	}()
	out := map[string]float64{}
	for m := range ch {
		var pb dto.Metric
		if err := m.Write(&pb); err != nil {
			t.Fatal(err)
		}
		labels := map[string]string{}
		for _, lp := range pb.GetLabel() {
			labels[lp.GetName()] = lp.GetValue()
		}
		if labels["zone"] != zone {
			continue
		}
		name := "limit/"
		if m.Desc() == budgetMetrics.remaining {
			name = "remaining/"
		}
		out[name+labels["scope"]] = pb.GetGauge().GetValue()
	}
	return out
}

// The gauge is read from the store when scraped: sent units are deducted,
// failed ones given back, and a new window is full again without a request.
func TestBudgetGaugeFollowsTheStore(t *testing.T) {
	var clock atomic.Int64
	clock.Store(fuzzStart)
	h := budgetHandler(t, "budget_gauge_unit", `"max_events": 5, "window": "24h", "algorithm": "fixed_window", "charge_when": {"status_code": [2]}, "scopes": {"hour": {"max_events": 4, "window": "1h", "charge_when": {"status_code": [2]}}}`, &clock)
	want := func(what string, exp map[string]float64) {
		t.Helper()
		got := budgetGauges(t, "budget_gauge_unit")
		for k, v := range exp {
			if got[k] != v {
				t.Fatalf("%s: %s = %v, want %v (all: %v)", what, k, got[k], v, got)
			}
		}
	}
	want("fresh", map[string]float64{"remaining/": 5, "limit/": 5, "remaining/hour": 4, "limit/hour": 4})
	budgetSend(t, h, http.StatusOK)()
	budgetSend(t, h, http.StatusBadGateway)()
	budgetSend(t, h, http.StatusOK)()
	want("2 sent, 1 failed", map[string]float64{"remaining/": 3, "remaining/hour": 2})
	clock.Add(int64(24 * time.Hour))
	want("a day later", map[string]float64{"remaining/": 5, "remaining/hour": 4})
}

// A budget per client has no series: clients would create them.
func TestBudgetGaugeSkipsKeysPerClient(t *testing.T) {
	var clock atomic.Int64
	clock.Store(fuzzStart)
	h, cleanup, err := provisionJSON([]byte(`{"rate_limits": {"budget_gauge_per_client": {"key": "{http.request.header.X-User}", "max_events": 5, "window": "1h", "charge_when": {"status_code": [2]}}}}`), clock.Load)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cleanup)
	budgetSend(t, h, http.StatusOK)()
	if got := budgetGauges(t, "budget_gauge_per_client"); len(got) != 0 {
		t.Fatalf("series of a per-client budget: %v", got)
	}
}
