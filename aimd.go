package sluice

import (
	"math"
	"sync"
	"sync/atomic"
)

// aimdConfig is an adaptive limit's settings, in the units the controller
// works in (nanoseconds, fractions), after defaults and validation.
type aimdConfig struct {
	min, max, increase int64
	decrease           float64
	interval           int64 // ns
	// latLow and latHigh are the p99 latency marks in ns; 0 and 0 leave
	// latency out of the decision.
	latLow, latHigh int64
	errLow, errHigh float64
}

// aimd is an adaptive limit's controller: additive increase, multiplicative
// decrease, as TCP backs off from congestion. Requests report what they
// saw (observe); the first call of decide at or after the end of an
// interval moves the limit by what the interval saw and starts the next.
// It reads no clock and runs no goroutine: the caller passes the time, so
// a test feeds it observations and instants.
//
// Observations are lock-free atomic additions to a fixed array of latency
// buckets and an error count, so a request allocates nothing and the
// memory is the same at ten requests a second or a million.
type aimd struct {
	cfg   aimdConfig
	limit atomic.Int64
	// end is when the current interval ends: the earliest time decide
	// moves the limit.
	end  atomic.Int64
	hist latencyHistogram
	errs atomic.Int64
	// last is the last interval with requests, for the admin API: stored
	// once per interval, never per request.
	last atomic.Pointer[decision]

	mu sync.Mutex // one decision at a time
}

func newAIMD(cfg aimdConfig, start, now int64) *aimd {
	a := &aimd{cfg: cfg}
	a.limit.Store(min(max(start, cfg.min), cfg.max))
	a.end.Store(now + cfg.interval)
	return a
}

// current is the limit in force.
func (a *aimd) current() int64 { return a.limit.Load() }

// observe records one request let through: how long the handlers after
// the limit took (ns) and whether it failed (a 5xx answer or an error).
func (a *aimd) observe(latency int64, failed bool) {
	a.hist.add(latency)
	if failed {
		a.errs.Add(1)
	}
}

// verdict is what one interval's observations made of the limit.
type verdict int8

const (
	verdictHold   verdict = iota // between the marks, or no traffic
	verdictGrow                  // p99 and error rate under their low marks
	verdictShrink                // p99 or error rate above its high mark
)

// decision is one interval's numbers and what came of them.
type decision struct {
	requests, errors int64
	p99              int64 // ns, rounded up to its bucket's upper bound
	verdict          verdict
	from, to         int64
}

// decide ends the interval if now is at or past its end: it moves the limit
// by the interval's observations and clears them for the next. ok is false
// when the interval has not ended, or another caller is deciding.
func (a *aimd) decide(now int64) (d decision, ok bool) {
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
	a.end.Store(now + a.cfg.interval)
	d.requests, d.p99 = a.hist.drain()
	d.errors = a.errs.Swap(0)
	d.from = a.limit.Load()
	d.verdict = a.cfg.judge(d.requests, d.errors, d.p99)
	d.to = a.cfg.next(d.from, d.verdict)
	a.limit.Store(d.to)
	if d.requests > 0 {
		last := d
		a.last.Store(&last)
	}
	return d, true
}

// judge is the verdict on an interval. An interval without a request is
// no evidence either way: the limit holds (a quiet night must not raise a
// limit to its max, nor lower it).
func (c *aimdConfig) judge(requests, errors, p99 int64) verdict {
	if requests <= 0 {
		return verdictHold
	}
	rate := float64(errors) / float64(requests)
	watchLatency := c.latHigh > 0
	switch {
	case rate > c.errHigh, watchLatency && p99 > c.latHigh:
		return verdictShrink
	case rate < c.errLow && (!watchLatency || p99 < c.latLow):
		return verdictGrow
	}
	return verdictHold
}

// next is the limit after a verdict, within [min, max]. A decrease always
// takes at least one off (0.9 × 2 rounds back to 2), and rounds to the
// nearest whole number: 520 × 0.7 is 364, where float64 makes it
// 363.99999999999994.
func (c *aimdConfig) next(limit int64, v verdict) int64 {
	switch v {
	case verdictGrow:
		if limit > c.max-c.increase {
			return c.max
		}
		return limit + c.increase
	case verdictShrink:
		n := min(int64(math.Round(float64(limit)*c.decrease)), limit-1)
		return max(n, c.min)
	}
	return limit
}
