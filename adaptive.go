package sluice

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/internal/aimd"
)

// Adaptive makes a limit follow the health of what it protects: every
// interval, the limit grows by Increase while the requests it let through
// were answered fast and without errors, and is multiplied by Decrease as
// soon as their 99th percentile latency or their error rate goes above its
// high mark; between the marks it holds. It starts at the configured limit
// (concurrency, or max_events of a rate) and stays within Min and Max. A
// bucket rate's burst follows max_events in proportion (at least 1).
// Each Caddy instance adapts on the requests it serves; with slots shared
// through Redis, each sends the cap it came to, and the fleet holds at
// most the largest.
type Adaptive struct {
	// Min is the lowest the limit goes, however bad the upstream looks.
	// Default: 1; at most the configured limit.
	Min int64 `json:"min,omitempty"`

	// Max is the highest the limit grows. Default: the configured limit
	// (the limit then only backs off and recovers); at least the
	// configured limit, at most the largest the limit accepts (2^30 for
	// concurrency, max_events' bound for a rate).
	Max int64 `json:"max,omitempty"`

	// Increase is added to the limit after each interval whose p99 latency
	// and error rate were both under their low marks. Default: 1; at least
	// 1.
	Increase int64 `json:"increase,omitempty"`

	// Decrease multiplies the limit after each interval whose p99 latency
	// or error rate was above its high mark (rounded to a whole number,
	// and always at least one less). Default: 0.7; strictly between 0 and
	// 1.
	Decrease float64 `json:"decrease,omitempty"`

	// Interval is how often the limit is reconsidered, over the requests
	// that finished since the last time. An interval without requests
	// leaves the limit as it is. Default: 10s; from 1s to 1h.
	Interval caddy.Duration `json:"interval,omitempty"`

	// LatencyP99Low is the low mark of the 99th percentile latency: the
	// time the handlers after rate_limit took (for reverse_proxy, the
	// upstream's answer and the copy of its body), less the time spent
	// reading the client's body or writing to the client, measured to
	// within 6.25%. The limit grows only below it. Set with LatencyP99High.
	// Default: unset, latency is not watched (only errors).
	LatencyP99Low caddy.Duration `json:"latency_p99_low,omitempty"`

	// LatencyP99High is the high mark of the 99th percentile latency:
	// above it, the limit shrinks. Greater than LatencyP99Low. Default:
	// unset.
	LatencyP99High caddy.Duration `json:"latency_p99_high,omitempty"`

	// ErrorRateLow is the low mark of the share of requests that failed
	// (answered 5xx, or a handler error), as a fraction: 0.01 is 1%. The
	// limit grows only below it. Default: 0.01.
	ErrorRateLow float64 `json:"error_rate_low,omitempty"`

	// ErrorRateHigh is the high mark of the error rate, as a fraction:
	// above it, the limit shrinks. Greater than ErrorRateLow, at most 1.
	// Default: 0.05.
	ErrorRateHigh float64 `json:"error_rate_high,omitempty"`
}

// Adaptive defaults, where the config leaves a field unset.
const (
	defaultAdaptiveDecrease = 0.7
	defaultAdaptiveInterval = 10 * time.Second
	defaultErrorRateLow     = 0.01
	defaultErrorRateHigh    = 0.05
	minAdaptiveInterval     = time.Second
	maxAdaptiveInterval     = time.Hour
)

// config checks a and returns the controller's settings for a limit
// configured at start, whose largest accepted value is most. Errors name
// the field as the config writes it.
func (a *Adaptive) config(start, most int64) (aimd.Config, error) {
	c := aimd.Config{
		Min: a.Min, Max: a.Max, Increase: a.Increase, Decrease: a.Decrease,
		Interval: int64(a.Interval), LatLow: int64(a.LatencyP99Low), LatHigh: int64(a.LatencyP99High),
		ErrLow: a.ErrorRateLow, ErrHigh: a.ErrorRateHigh,
	}
	if c.Min == 0 {
		c.Min = 1
	}
	if c.Max == 0 {
		c.Max = start
	}
	if c.Increase == 0 {
		c.Increase = 1
	}
	if c.Decrease == 0 {
		c.Decrease = defaultAdaptiveDecrease
	}
	if c.Interval == 0 {
		c.Interval = int64(defaultAdaptiveInterval)
	}
	if c.ErrLow == 0 && c.ErrHigh == 0 {
		c.ErrLow, c.ErrHigh = defaultErrorRateLow, defaultErrorRateHigh
	}
	switch {
	case c.Min < 1:
		return c, fmt.Errorf("adaptive: min must be at least 1, got %d", c.Min)
	case c.Max > most:
		return c, fmt.Errorf("adaptive: max must be at most %d, got %d", most, c.Max)
	case c.Min > c.Max:
		return c, fmt.Errorf("adaptive: min %d is above max %d", c.Min, c.Max)
	case start < c.Min || start > c.Max:
		return c, fmt.Errorf("adaptive: the limit starts at the configured %d, which must be within min %d and max %d", start, c.Min, c.Max)
	case c.Increase < 1:
		return c, fmt.Errorf("adaptive: increase must be at least 1, got %d", c.Increase)
	case math.IsNaN(c.Decrease) || c.Decrease <= 0 || c.Decrease >= 1:
		return c, fmt.Errorf("adaptive: decrease must be strictly between 0 and 1, got %v", c.Decrease)
	case c.Interval < int64(minAdaptiveInterval) || c.Interval > int64(maxAdaptiveInterval):
		return c, fmt.Errorf("adaptive: interval must be from 1s to 1h, got %s", time.Duration(c.Interval))
	case (c.LatLow == 0) != (c.LatHigh == 0):
		return c, fmt.Errorf("adaptive: latency_p99 needs both marks, low and high (got %s and %s)", time.Duration(c.LatLow), time.Duration(c.LatHigh))
	case c.LatLow < 0 || c.LatHigh < 0:
		return c, fmt.Errorf("adaptive: latency_p99 marks must be positive, got %s and %s", time.Duration(c.LatLow), time.Duration(c.LatHigh))
	case c.LatHigh > 0 && c.LatLow >= c.LatHigh:
		return c, fmt.Errorf("adaptive: latency_p99 low mark %s must be below the high mark %s", time.Duration(c.LatLow), time.Duration(c.LatHigh))
	case !(c.ErrLow > 0 && c.ErrLow <= 1) || !(c.ErrHigh > 0 && c.ErrHigh <= 1):
		return c, fmt.Errorf("adaptive: error_rate marks must be above 0%% and at most 100%%, got %v and %v", c.ErrLow, c.ErrHigh)
	case c.ErrLow >= c.ErrHigh:
		return c, fmt.Errorf("adaptive: error_rate low mark %v must be below the high mark %v", c.ErrLow, c.ErrHigh)
	}
	return c, nil
}

// The adaptive limits' series: the limit in force, its floor (an alert
// watches a limit that sits there), and what the last interval saw.
var (
	adaptiveLimitG = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: "caddy", Subsystem: "rate_limit", Name: "adaptive_limit",
		Help: "The limit an adaptive limit is at: requests in flight for a concurrency limit, max_events for a rate, by zone and scope.",
	}, []string{"zone", "scope"})
	adaptiveMinG = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: "caddy", Subsystem: "rate_limit", Name: "adaptive_min_limit",
		Help: "The lowest an adaptive limit may go (its min), by zone and scope.",
	}, []string{"zone", "scope"})
	adaptiveP99G = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: "caddy", Subsystem: "rate_limit", Name: "adaptive_latency_p99_seconds",
		Help: "The 99th percentile latency of the requests an adaptive limit let through in its last interval with traffic, by zone and scope.",
	}, []string{"zone", "scope"})
	adaptiveErrG = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: "caddy", Subsystem: "rate_limit", Name: "adaptive_error_ratio",
		Help: "The share of the requests an adaptive limit let through in its last interval with traffic that failed (5xx or a handler error), by zone and scope.",
	}, []string{"zone", "scope"})
)

var adaptiveCollectors = []prometheus.Collector{adaptiveLimitG, adaptiveMinG, adaptiveP99G, adaptiveErrG}

// adaptiveSeries counts the provisioned limits behind each zone and
// scope's series, so that the last one released removes them: a zone
// taken out of the config must not leave its limit exported (and an
// alert on it firing) for the life of the process. During a reload the
// new config counts before the old one lets go.
var adaptiveSeries = struct {
	sync.Mutex
	refs map[[2]string]int
}{refs: map[[2]string]int{}}

func countAdaptiveSeries(zone, scope string, delta int) {
	adaptiveSeries.Lock()
	defer adaptiveSeries.Unlock()
	k := [2]string{zone, scope}
	adaptiveSeries.refs[k] += delta
	if adaptiveSeries.refs[k] > 0 {
		return
	}
	delete(adaptiveSeries.refs, k)
	for _, g := range []*prometheus.GaugeVec{adaptiveLimitG, adaptiveMinG, adaptiveP99G, adaptiveErrG} {
		g.DeleteLabelValues(zone, scope)
	}
}

// errAdaptiveTiers refuses adaptive on a tiered limit, whose numbers are
// each tier's.
var errAdaptiveTiers = errors.New("adaptive: a tiered limit takes its rate and concurrency from each request's tier: adapt a limit without tiers")

// checkAdaptive validates the adaptive block of l, whose rate (if any)
// uses algorithm alg.
func (l *Limit) checkAdaptive(alg string) error {
	_, err := l.adaptiveConfig(alg)
	return err
}

// adaptiveConfig is the controller's settings of l's adaptive block (zero
// without one), whose rate (if any) uses algorithm alg.
func (l *Limit) adaptiveConfig(alg string) (aimd.Config, error) {
	a := l.Adaptive
	if a == nil {
		return aimd.Config{}, nil
	}
	switch {
	case l.tiered():
		return aimd.Config{}, optionErr("adaptive", errAdaptiveTiers)
	case l.Concurrency != 0 && !l.concOnly():
		return aimd.Config{}, optionErrorf("adaptive", "adaptive: the limit has both a rate and a concurrency, and adapts one number: put the concurrency (or the rate) in a scope of its own")
	case l.Lease != 0:
		return aimd.Config{}, optionErrorf("adaptive", "adaptive: a lease takes units in advance under the limit of the moment: remove lease or adaptive")
	}
	start, most := l.Concurrency, int64(MaxConcurrency)
	if l.Concurrency == 0 {
		start, most = l.MaxEvents, algorithms.MaxEvents
		if alg == algorithms.NameSlidingWindow {
			most = math.MaxUint32
		}
	}
	cfg, err := a.config(start, most)
	if err != nil {
		return aimd.Config{}, optionErr("adaptive", err)
	}
	if cost := l.constantCost(); l.Concurrency == 0 && cost > cfg.Min {
		return aimd.Config{}, optionErrorf("adaptive", "adaptive: min %d is below the cost %d of every request: at min, none would pass", cfg.Min, cost)
	}
	if l.Concurrency == 0 && algorithms.KindOf(alg) == algorithms.KindBucket {
		// The burst moves with the rate: both ends must make a policy the
		// algorithm takes (a burst past its bound at max, a burst × interval
		// too long at min).
		for _, n := range []int64{cfg.Min, cfg.Max} {
			p := algorithms.Adapted(alg, l.policy(), n)
			if err := p.Validate(); err != nil {
				return aimd.Config{}, optionErrorf("adaptive", "adaptive: at %d events per window (burst %d): %w", n, p.Burst, err)
			}
			if r := algorithms.NewBucketAlgorithm(alg, p).Decide(algorithms.Bucket{}, 0, l.constantCost()); r.RetryAfter == algorithms.Never {
				return aimd.Config{}, optionErrorf("adaptive", "adaptive: at min %d the bucket holds %d (burst × min ÷ max_events), below the cost %d of every request: none would pass", n, r.Limit, l.constantCost())
			}
		}
	}
	return cfg, nil
}

// adaptiveLimit is a provisioned limit's controller and where its decisions
// go.
type adaptiveLimit struct {
	l    *limit
	ctl  *aimd.Controller
	key  adaptiveKey
	set  func(int64) error
	now  func() int64
	log  *zap.Logger
	lim  prometheus.Gauge
	p99  prometheus.Gauge
	errs prometheus.Gauge

	mu       sync.Mutex   // one apply at a time, so none writes a stale limit
	applied  atomic.Int64 // the limit last given to the slots or the store
	released bool
}

// adaptiveStates keeps each adaptive limit's controller across config
// reloads, so that a reload in the middle of an incident does not put a
// limit that backed off back to its configured value. A reload that
// changes the limit's settings (or its configured value) starts afresh.
var adaptiveStates = caddy.NewUsagePool()

type adaptiveKey struct {
	zone, scope string
	conc        bool
	start       int64
	cfg         aimd.Config
}

// provisionAdaptive gives l its controller, once its slots or its store
// handle exist: the one a running config shares, or a new one at the
// configured limit.
func (l *limit) provisionAdaptive(logger *zap.Logger) error {
	if l.Adaptive == nil {
		return nil
	}
	a := &adaptiveLimit{
		l: l, now: monotonic, log: logger,
		lim:  adaptiveLimitG.WithLabelValues(l.zone.name, l.scope),
		p99:  adaptiveP99G.WithLabelValues(l.zone.name, l.scope),
		errs: adaptiveErrG.WithLabelValues(l.zone.name, l.scope),
	}
	start := l.Concurrency
	switch {
	case l.shared != nil:
		// Each instance moves the cap it sends with its own acquires, from
		// what its own requests meet; the set of slots is the fleet's.
		slots, ok := l.shared.Slots().(backend.AdjustableSlots)
		if !ok {
			return fmt.Errorf("adaptive: this backend cannot change the concurrency of its shared slots while the limit runs")
		}
		a.set = func(n int64) error {
			if l.conc != nil { // the local cap while Redis is away
				l.conc.SetMax(n)
			}
			err := slots.SetLimit(n)
			l.shared.WakeAll()
			return err
		}
	case l.conc != nil:
		a.set = func(n int64) error { l.conc.SetMax(n); return nil }
	default:
		start = l.MaxEvents
		if h, ok := l.handle.(backend.Adjustable); !ok || !h.CanAdjust() {
			return fmt.Errorf("adaptive: this backend cannot change max_events while the limit runs")
		}
		a.set = l.setMaxEvents
	}
	a.key = adaptiveKey{zone: l.zone.name, scope: l.scope, conc: l.Concurrency != 0, start: start, cfg: l.adaptCfg}
	v, _, err := adaptiveStates.LoadOrNew(a.key, func() (caddy.Destructor, error) {
		return aimd.New(l.adaptCfg, start, monotonic()), nil
	})
	if err != nil {
		return err
	}
	a.ctl = v.(*aimd.Controller)
	l.adapt = a
	countAdaptiveSeries(l.zone.name, l.scope, 1)
	a.applied.Store(start)
	a.lim.Set(float64(start))
	a.apply()
	adaptiveMinG.WithLabelValues(l.zone.name, l.scope).Set(float64(l.adaptCfg.Min))
	return nil
}

// releaseAdaptive lets go of the controllers of h's adaptive limits, those
// of a zone that failed to provision included.
func (h *plan) releaseAdaptive() {
	for _, z := range h.zones {
		for _, l := range z.keyed {
			if a := l.adapt; a != nil && !a.released {
				a.released = true
				_, _ = adaptiveStates.Delete(a.key)
				countAdaptiveSeries(a.l.zone.name, a.l.scope, -1)
			}
		}
	}
}

// setMaxEvents sets a rate's max_events in its store and in its local
// fallback, which decides while a shared store is unavailable.
func (l *limit) setMaxEvents(n int64) error {
	err := l.handle.(backend.Adjustable).SetMaxEvents(n)
	if h, ok := l.local.(backend.Adjustable); ok && h.CanAdjust() {
		err = errors.Join(err, h.SetMaxEvents(n))
	}
	return err
}

// applyLocal gives the local fallback, registered after the limit, the
// limit in force (one a running config backed off to, after a reload).
func (a *adaptiveLimit) applyLocal() error {
	if a == nil || a.set == nil {
		return nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if h, ok := a.l.local.(backend.Adjustable); ok && h.CanAdjust() {
		return h.SetMaxEvents(a.applied.Load())
	}
	return nil
}

// observe records one request the limit let through, and moves the limit
// when an interval has ended. A controller shared with another config
// (during a reload) may have moved it: each config applies the current
// limit to its own slots or store handle on its next request.
func (a *adaptiveLimit) observe(latency int64, failed bool, now int64) {
	a.ctl.Observe(latency, failed)
	if d, ok := a.ctl.Decide(now); ok {
		a.report(d)
	}
	if a.ctl.Current() != a.applied.Load() {
		a.apply()
	}
}

// report publishes an interval's numbers, and logs a change.
func (a *adaptiveLimit) report(d aimd.Decision) {
	if d.Requests > 0 {
		a.p99.Set(float64(d.P99) / 1e9)
		a.errs.Set(float64(d.Errors) / float64(d.Requests))
	}
	if d.To != d.From {
		a.log.Info("adaptive limit changed", zap.String("zone", a.l.zone.name), zap.String("scope", a.l.scope),
			zap.Int64("from", d.From), zap.Int64("to", d.To), zap.Int64("requests", d.Requests),
			zap.Duration("latency_p99", time.Duration(d.P99)), zap.Int64("errors", d.Errors))
	}
}

// apply gives the controller's limit to the slots or the store.
func (a *adaptiveLimit) apply() {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := a.ctl.Current()
	if n == a.applied.Load() {
		return
	}
	// Marked applied even if the store refuses it, so that a refusal is
	// logged once, not on every request; the limits were checked at load.
	a.applied.Store(n)
	if err := a.set(n); err != nil {
		a.log.Error("adaptive limit: cannot apply the new limit", zap.String("zone", a.l.zone.name), zap.String("scope", a.l.scope), zap.Int64("limit", n), zap.Error(err))
		return
	}
	a.lim.Set(float64(n))
}

var monoStart = time.Now()

// monotonic is the time since the process started, on the monotonic clock:
// a step of the wall clock must not make a latency or an interval.
func monotonic() int64 { return int64(time.Since(monoStart)) }

// adaptiveInfo is an adaptive limit in the admin API's zones listing.
type adaptiveInfo struct {
	// Limit is the limit in force: requests in flight, or max_events.
	Limit    int64  `json:"limit"`
	Min      int64  `json:"min"`
	Max      int64  `json:"max"`
	Interval string `json:"interval"`
	// What the last interval with requests saw: how many, their p99
	// latency in seconds and the share that failed.
	Requests   int64   `json:"last_requests"`
	LatencyP99 float64 `json:"last_latency_p99"`
	ErrorRate  float64 `json:"last_error_rate"`
}

// info describes a for the admin API; nil for a limit that is not
// adaptive.
func (a *adaptiveLimit) info() *adaptiveInfo {
	if a == nil {
		return nil
	}
	c := a.l.adaptCfg
	in := &adaptiveInfo{Limit: a.ctl.Current(), Min: c.Min, Max: c.Max, Interval: time.Duration(c.Interval).String()}
	if d := a.ctl.Last(); d != nil {
		in.Requests, in.LatencyP99 = d.Requests, float64(d.P99)/1e9
		in.ErrorRate = float64(d.Errors) / float64(d.Requests)
	}
	return in
}

// listedLimits are the limits of z the zones listing shows: its rates (a
// tiered limit's, one per tier), then its limits of concurrency alone.
func listedLimits(z *zone) []*limit {
	out := slices.Clip(z.limits)
	for _, l := range z.keyed {
		if l.concOnly() && l.tiers == nil {
			out = append(out, l)
		}
	}
	return out
}

// limitText completes the RATE column of `caddy rate-limit zones` with the
// concurrency, and where an adaptive limit is.
func limitText(rate string, l limitInfo) string {
	switch {
	case l.Window == "":
		rate = fmt.Sprintf("concurrency %d", l.Concurrency)
	case l.Concurrency > 0:
		rate += fmt.Sprintf(", concurrency %d", l.Concurrency)
	}
	if a := l.Adaptive; a != nil {
		rate += fmt.Sprintf(" (adaptive: %d in %d–%d)", a.Limit, a.Min, a.Max)
	}
	return rate
}
