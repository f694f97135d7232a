package sluice

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/internal/shed"
)

// The collectors are made once and registered into the registry of every
// config that loads the handler: Caddy serves /metrics from the registry of
// the newest config, and counters must carry on across reloads (the bug of
// mholt/caddy-ratelimit #100 was collectors bound to the first registry).
//
// Metric names are mholt/caddy-ratelimit's, so dashboards keep working, but
// the key label is always empty: per-key series would let any client create
// series without bound.
var metrics = newMetricSet()

type metricSet struct {
	requests *prometheus.CounterVec
	declined *prometheus.CounterVec
	shadow   *prometheus.CounterVec
	listed   *prometheus.CounterVec
	missing  *prometheus.CounterVec
	failures *prometheus.CounterVec
	refused  *prometheus.CounterVec
	near     *prometheus.CounterVec
	duration *prometheus.HistogramVec
	state    stateCollector
}

func newMetricSet() *metricSet {
	const ns, sub = "caddy", "rate_limit"
	return &metricSet{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "requests_total",
			Help: "Requests decided by a rate limit zone.",
		}, []string{"zone", "scope", "key"}),
		declined: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "declined_requests_total",
			Help: "Requests denied with 429, by the zone and scope that denied them.",
		}, []string{"zone", "scope", "key"}),
		shadow: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "shadow_declined_requests_total",
			Help: "Requests a shadow zone would have denied.",
		}, []string{"zone", "scope"}),
		listed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "listed_requests_total",
			Help: "Requests a zone's allow list exempted (list=allow) or its deny list refused (list=deny).",
		}, []string{"zone", "list"}),
		missing: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "missing_key_requests_total",
			Help: "Requests whose key could not be built, by the policy applied.",
		}, []string{"zone", "scope", "policy"}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "backend_failures_total",
			Help: "Requests a limit could not decide because its backend was unavailable, by the fail policy applied.",
		}, []string{"zone", "scope", "policy"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "refused_requests_total",
			Help: "Requests refused, by the zone that refused them and why: rate_limit_exceeded, quota_exceeded, backend_unavailable, missing_key, bad_cost, denylisted, concurrency or load_shed (whose zone label is the shedding group).",
		}, []string{"zone", "reason"}),
		near: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "near_limit_total",
			Help: "Allowed requests that left their key near its limit: under 20% of it left by default (the zone's near_limit).",
		}, []string{"zone", "scope"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: ns, Subsystem: sub, Name: "process_time_seconds",
			Help:    "Time taken to decide a request, for each zone it matched.",
			Buckets: []float64{.00001, .00005, .0001, .0005, .001, .005, .01, .025, .05, .1, .25, .5, 1},
		}, []string{"zone", "scope", "key"}),
		state: stateCollector{
			keys: prometheus.NewDesc("caddy_rate_limit_keys_total",
				"Keys tracked in memory by a zone's limit.", []string{"zone", "scope"}, nil),
			evictions: prometheus.NewDesc("caddy_rate_limit_evictions_total",
				"Keys dropped before they were idle to keep a limit under max_keys.", []string{"zone", "scope"}, nil),
			denyingEvictions: prometheus.NewDesc("caddy_rate_limit_denying_evictions_total",
				"Keys dropped to keep a limit under max_keys while the limit was denying them, because no other key was left: each got a fresh quota.", []string{"zone", "scope"}, nil),
		},
	}
}

// registerMetrics registers the collectors into reg, with the state of
// store when it can report it.
func registerMetrics(reg *prometheus.Registry, store backend.Store) error {
	if reg == nil {
		return nil
	}
	collectors := []prometheus.Collector{metrics.requests, metrics.declined, metrics.shadow, metrics.listed, metrics.missing, metrics.failures, metrics.refused, metrics.near, metrics.duration, inFlight, shed.Metrics, tarpitHeld, tarpitSkipped, budgetMetrics}
	collectors = append(collectors, adaptiveCollectors...)
	if src, ok := store.(backend.StatsReporter); ok {
		// The collectors of several handlers are one to the registry (the
		// same descriptions): the first registered reports. A memory
		// store reports every memory table of the process, so any one
		// will do.
		state := metrics.state
		state.src = src
		collectors = append(collectors, state)
	}
	for _, c := range collectors {
		if err := reg.Register(c); err != nil {
			if _, ok := errors.AsType[prometheus.AlreadyRegisteredError](err); !ok {
				return err
			}
		}
	}
	return nil
}

// limitMetrics are one limit's series, looked up once at provision so the
// request path does no label hashing. The zero value records nothing.
type limitMetrics struct {
	requests  prometheus.Counter
	declinedC prometheus.Counter
	shadowC   prometheus.Counter
	duration  prometheus.Observer
	missingC  map[string]prometheus.Counter
	nearC     prometheus.Counter
	nearLeft  float64 // the fraction of the limit left under which a key is near it
}

func newLimitMetrics(zone, scope string, nearLeft float64) limitMetrics {
	return limitMetrics{
		requests:  metrics.requests.WithLabelValues(zone, scope, ""),
		declinedC: metrics.declined.WithLabelValues(zone, scope, ""),
		shadowC:   metrics.shadow.WithLabelValues(zone, scope),
		nearC:     metrics.near.WithLabelValues(zone, scope),
		nearLeft:  nearLeft,
		duration:  metrics.duration.WithLabelValues(zone, scope, ""),
		missingC: map[string]prometheus.Counter{
			"shared": metrics.missing.WithLabelValues(zone, scope, "shared"),
			"skip":   metrics.missing.WithLabelValues(zone, scope, "skip"),
			"deny":   metrics.missing.WithLabelValues(zone, scope, "deny"),
		},
	}
}

func (m limitMetrics) missing(policy string) {
	if c := m.missingC[policy]; c != nil {
		c.Inc()
	}
}

func (m limitMetrics) observe(seconds float64) {
	if m.requests != nil {
		m.requests.Inc()
		m.duration.Observe(seconds)
	}
}

func (m limitMetrics) declined() {
	if m.declinedC != nil {
		m.declinedC.Inc()
	}
}

// near counts an allowed decision that left its key under the near-limit
// fraction of the limit.
func (m limitMetrics) near(res algorithms.Result) {
	if m.nearC != nil && res.Limit > 0 && float64(res.Remaining) < m.nearLeft*float64(res.Limit) {
		m.nearC.Inc()
	}
}

func (m limitMetrics) shadowDeny() {
	if m.shadowC != nil {
		m.shadowC.Inc()
	}
}

// stateCollector reports a store's state live, at scrape time.
type stateCollector struct {
	keys, evictions, denyingEvictions *prometheus.Desc
	src                               backend.StatsReporter
}

func (c stateCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.keys
	ch <- c.evictions
	ch <- c.denyingEvictions
}

func (c stateCollector) Collect(ch chan<- prometheus.Metric) {
	for _, st := range c.src.Stats() {
		ch <- prometheus.MustNewConstMetric(c.keys, prometheus.GaugeValue, float64(st.Keys), st.Zone, st.Scope)
		ch <- prometheus.MustNewConstMetric(c.evictions, prometheus.CounterValue, float64(st.Evictions), st.Zone, st.Scope)
		ch <- prometheus.MustNewConstMetric(c.denyingEvictions, prometheus.CounterValue, float64(st.DenyingEvictions), st.Zone, st.Scope)
	}
}
