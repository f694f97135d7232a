package sluice

import (
	"fmt"
	"math"
	"time"

	"github.com/caddyserver/caddy/v2"
)

// Adaptive makes a limit follow the health of what it protects: every
// interval, the limit grows by Increase while the requests it let through
// were answered fast and without errors, and is multiplied by Decrease as
// soon as their 99th percentile latency or their error rate goes above its
// high mark; between the marks it holds. It starts at the configured limit
// (concurrency, or max_events of a rate) and stays within Min and Max.
// Each Caddy instance adapts on the requests it serves.
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
	// upstream's answer and the copy of its body), measured to within
	// 6.25%. The limit grows only below it. Set with LatencyP99High.
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
func (a *Adaptive) config(start, most int64) (aimdConfig, error) {
	c := aimdConfig{
		min: a.Min, max: a.Max, increase: a.Increase, decrease: a.Decrease,
		interval: int64(a.Interval), latLow: int64(a.LatencyP99Low), latHigh: int64(a.LatencyP99High),
		errLow: a.ErrorRateLow, errHigh: a.ErrorRateHigh,
	}
	if c.min == 0 {
		c.min = 1
	}
	if c.max == 0 {
		c.max = start
	}
	if c.increase == 0 {
		c.increase = 1
	}
	if c.decrease == 0 {
		c.decrease = defaultAdaptiveDecrease
	}
	if c.interval == 0 {
		c.interval = int64(defaultAdaptiveInterval)
	}
	if c.errLow == 0 && c.errHigh == 0 {
		c.errLow, c.errHigh = defaultErrorRateLow, defaultErrorRateHigh
	}
	switch {
	case c.min < 1:
		return c, fmt.Errorf("adaptive: min must be at least 1, got %d", c.min)
	case c.max > most:
		return c, fmt.Errorf("adaptive: max must be at most %d, got %d", most, c.max)
	case c.min > c.max:
		return c, fmt.Errorf("adaptive: min %d is above max %d", c.min, c.max)
	case start < c.min || start > c.max:
		return c, fmt.Errorf("adaptive: the limit starts at the configured %d, which must be within min %d and max %d", start, c.min, c.max)
	case c.increase < 1:
		return c, fmt.Errorf("adaptive: increase must be at least 1, got %d", c.increase)
	case math.IsNaN(c.decrease) || c.decrease <= 0 || c.decrease >= 1:
		return c, fmt.Errorf("adaptive: decrease must be strictly between 0 and 1, got %v", c.decrease)
	case c.interval < int64(minAdaptiveInterval) || c.interval > int64(maxAdaptiveInterval):
		return c, fmt.Errorf("adaptive: interval must be from 1s to 1h, got %s", time.Duration(c.interval))
	case (c.latLow == 0) != (c.latHigh == 0):
		return c, fmt.Errorf("adaptive: latency_p99 needs both marks, low and high (got %s and %s)", time.Duration(c.latLow), time.Duration(c.latHigh))
	case c.latLow < 0:
		return c, fmt.Errorf("adaptive: latency_p99 marks must be positive, got %s", time.Duration(c.latLow))
	case c.latHigh > 0 && c.latLow >= c.latHigh:
		return c, fmt.Errorf("adaptive: latency_p99 low mark %s must be below the high mark %s", time.Duration(c.latLow), time.Duration(c.latHigh))
	case !(c.errLow > 0 && c.errLow <= 1) || !(c.errHigh > 0 && c.errHigh <= 1):
		return c, fmt.Errorf("adaptive: error_rate marks must be above 0%% and at most 100%%, got %v and %v", c.errLow, c.errHigh)
	case c.errLow >= c.errHigh:
		return c, fmt.Errorf("adaptive: error_rate low mark %v must be below the high mark %v", c.errLow, c.errHigh)
	}
	return c, nil
}
