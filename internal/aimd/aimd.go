// Package aimd is an adaptive limit's controller: additive increase,
// multiplicative decrease by the p99 latency and error rate of each
// interval. It reads no clock; callers pass the time.
package aimd

import (
	"math"
	"sync"
	"sync/atomic"

	"github.com/sluicehq/sluice/internal/latency"
)

// Config is an adaptive limit's settings, in the units the controller
// works in (nanoseconds, fractions), after defaults and validation.
type Config struct {
	Min, Max, Increase int64
	Decrease           float64
	Interval           int64 // ns
	// LatLow and LatHigh are the p99 latency marks in ns; 0 and 0 leave
	// latency out of the decision.
	LatLow, LatHigh int64
	ErrLow, ErrHigh float64
}

// Controller is an adaptive limit's controller: additive increase, multiplicative
// decrease, as TCP backs off from congestion. Requests report what they
// saw (Observe); the first call of Decide at or after the end of an
// interval moves the limit by what the interval saw and starts the next.
// It reads no clock and runs no goroutine: the caller passes the time, so
// a test feeds it observations and instants.
//
// Observations are lock-free atomic additions to a fixed array of latency
// buckets and an error count, so a request allocates nothing and the
// memory is the same at ten requests a second or a million.
type Controller struct {
	cfg   Config
	limit atomic.Int64
	// end is when the current interval ends: the earliest time Decide
	// moves the limit.
	end  atomic.Int64
	hist latency.Histogram
	errs atomic.Int64
	// last is the last interval with requests, for the admin API: stored
	// once per interval, never per request.
	last atomic.Pointer[Decision]

	mu sync.Mutex // one decision at a time
}

// New is a controller whose limit starts at start (within the bounds) and
// whose first interval ends one interval after now.
func New(cfg Config, start, now int64) *Controller {
	a := &Controller{cfg: cfg}
	a.limit.Store(min(max(start, cfg.Min), cfg.Max))
	a.end.Store(now + cfg.Interval)
	return a
}

// Current is the limit in force.
func (a *Controller) Current() int64 { return a.limit.Load() }

// Observe records one request let through: how long the handlers after
// the limit took (ns) and whether it failed (a 5xx answer or an error).
func (a *Controller) Observe(latency int64, failed bool) {
	a.hist.Add(latency)
	if failed {
		a.errs.Add(1)
	}
}

// Last is the last interval with requests, nil before one ended.
func (a *Controller) Last() *Decision { return a.last.Load() }

// Destruct lets a controller live in a caddy.UsagePool, which keeps it
// across config reloads; it holds nothing to release.
func (*Controller) Destruct() error { return nil }

// Verdict is what one interval's observations made of the limit.
type Verdict int8

const (
	Hold   Verdict = iota // between the marks, or no traffic
	Grow                  // p99 and error rate under their low marks
	Shrink                // p99 or error rate above its high mark
)

// Decision is one interval's numbers and what came of them.
type Decision struct {
	Requests, Errors int64
	P99              int64 // ns, rounded up to its bucket's upper bound
	Verdict          Verdict
	From, To         int64
}

// Decide ends the interval if now is at or past its end: it moves the limit
// by the interval's observations and clears them for the next. ok is false
// when the interval has not ended, or another caller is deciding.
func (a *Controller) Decide(now int64) (d Decision, ok bool) {
	if now < a.end.Load() || !a.mu.TryLock() {
		return d, false
	}
	defer a.mu.Unlock()
	if now < a.end.Load() { // decided while this caller waited
		return d, false
	}
	// The next interval starts now, not at the planned end: after a
	// quiet spell, the next decision still waits a whole interval of
	// observations.
	a.end.Store(now + a.cfg.Interval)
	d.Requests, d.P99 = a.hist.Drain()
	d.Errors = a.errs.Swap(0)
	d.From = a.limit.Load()
	d.Verdict = a.cfg.judge(d.Requests, d.Errors, d.P99)
	d.To = a.cfg.next(d.From, d.Verdict)
	a.limit.Store(d.To)
	if d.Requests > 0 {
		last := d
		a.last.Store(&last)
	}
	return d, true
}

// judge is the verdict on an interval. An interval without a request is
// no evidence either way: the limit holds (a quiet night must not raise a
// limit to its max, nor lower it).
func (c *Config) judge(requests, errors, p99 int64) Verdict {
	if requests <= 0 {
		return Hold
	}
	rate := float64(errors) / float64(requests)
	watchLatency := c.LatHigh > 0
	switch {
	case rate > c.ErrHigh, watchLatency && p99 > c.LatHigh:
		return Shrink
	case rate < c.ErrLow && (!watchLatency || p99 < c.LatLow):
		return Grow
	}
	return Hold
}

// next is the limit after a verdict, within [min, max]. A decrease always
// takes at least one off (0.9 × 2 rounds back to 2), and rounds to the
// nearest whole number: 520 × 0.7 is 364, where float64 makes it
// 363.99999999999994.
func (c *Config) next(limit int64, v Verdict) int64 {
	switch v {
	case Grow:
		if limit > c.Max-c.Increase {
			return c.Max
		}
		return limit + c.Increase
	case Shrink:
		n := min(int64(math.Round(float64(limit)*c.Decrease)), limit-1)
		return max(n, c.Min)
	}
	return limit
}
