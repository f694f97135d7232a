package sluice

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/backend"
)

// budgetCollector reports, at scrape time, what is left of each spend
// budget whose key is a constant: the service's one budget for text
// messages or a paid API, the number an alert watches before it runs out.
// A budget keyed per client is left out, as a series per client would let
// clients create series; its exhaustion is counted in
// refused_requests_total{reason="budget_exhausted"}.
type budgetCollector struct {
	remaining, limit *prometheus.Desc
}

var budgetMetrics = budgetCollector{
	remaining: prometheus.NewDesc("caddy_rate_limit_budget_remaining",
		"Units left in a spend budget (a charge_when limit with a constant key) in its current window, its open reservations deducted.",
		[]string{"zone", "scope"}, nil),
	limit: prometheus.NewDesc("caddy_rate_limit_budget_limit",
		"Units a spend budget (a charge_when limit with a constant key) holds per window.",
		[]string{"zone", "scope"}, nil),
}

// budgetScrapeTimeout bounds what one scrape waits for a shared store: a
// slow Redis must not hold /metrics up.
const budgetScrapeTimeout = time.Second

func (c budgetCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.remaining
	ch <- c.limit
}

func (c budgetCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), budgetScrapeTimeout)
	defer cancel()
	for _, use := range allZones() {
		adm, ok := use.h.store.(backend.Admin)
		if !ok {
			continue
		}
		for _, l := range use.z.limits {
			if l.ChargeWhen == nil || len(l.keyer.Template().Placeholders()) != 0 {
				continue
			}
			key, err := l.keyer.FromValues(nil)
			if err != nil {
				continue
			}
			// A store that cannot answer leaves the series out for this
			// scrape: backend_failures_total and its alert say why.
			u, err := adm.Inspect(ctx, l.handle, key)
			if err != nil {
				continue
			}
			ch <- prometheus.MustNewConstMetric(c.remaining, prometheus.GaugeValue, float64(u.Remaining), use.z.name, l.scope)
			ch <- prometheus.MustNewConstMetric(c.limit, prometheus.GaugeValue, float64(u.Limit), use.z.name, l.scope)
		}
	}
}
