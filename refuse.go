package sluice

import (
	"cmp"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zapcore"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
)

// ErrMissingKey is the error behind a 400 answer of a "missing deny" limit
// whose key the request does not give in a usable form. Its text, shown by
// {http.error.message}, says nothing of how the key is configured.
var ErrMissingKey = errors.New("the request lacks a value it is rate limited by, or gives it in a form that cannot be used")

// ErrBadCost is the error behind a 400 answer to a request whose cost is
// not a whole number ≥ 0, or cannot be read.
var ErrBadCost = errors.New("the request's cost is not a whole number of at least 0, or cannot be read")

// ErrQuotaExceeded is the error behind a denial by a limit whose status is
// 402 or 403: a quota (per day, per month) that waiting a little will not
// bring back, told apart from the 429 of a rate so that clients stop
// retrying.
var ErrQuotaExceeded = errors.New("quota exceeded")

// reason is why a request was refused: the reason label of
// caddy_rate_limit_refused_requests_total and the error code of the
// built-in bodies.
type reason uint8

const (
	reasonRateLimited reason = iota
	reasonUnavailable
	reasonMissingKey
	reasonBadCost
	reasonDenylisted
	reasonConcurrency
	reasonShed
	reasonQuota
	reasonBudget
	numReasons
)

var reasonInfo = [numReasons]struct {
	name   string // metric label, {http.rate_limit.reason}, the JSON body's code
	value  any    // name, boxed once for the replacer
	status int    // 0: the zone's status
	err    error  // behind the Caddy error; {http.error.message}
	log    string
	lvl    zapcore.Level
}{
	reasonRateLimited: {"rate_limit_exceeded", nil, 0, ErrRateLimited, "rate limit exceeded", zapcore.InfoLevel},
	reasonUnavailable: {"backend_unavailable", nil, http.StatusServiceUnavailable, ErrBackendUnavailable, "rate limit backend unavailable: refusing the request of a zone that fails closed", zapcore.WarnLevel},
	reasonMissingKey:  {"missing_key", nil, http.StatusBadRequest, ErrMissingKey, "request refused: its rate limit key is missing", zapcore.InfoLevel},
	reasonBadCost:     {"bad_cost", nil, http.StatusBadRequest, ErrBadCost, "request refused: its cost cannot be used", zapcore.InfoLevel},
	reasonDenylisted:  {"denylisted", nil, http.StatusForbidden, ErrDenylisted, "request refused by deny list", zapcore.InfoLevel},
	reasonConcurrency: {"concurrency", nil, http.StatusServiceUnavailable, ErrConcurrency, "request refused: too many requests in flight", zapcore.InfoLevel},
	reasonShed:        {"load_shed", nil, http.StatusServiceUnavailable, ErrShed, "request shed: the server is overloaded", zapcore.InfoLevel},
	reasonQuota:       {"quota_exceeded", nil, 0, ErrQuotaExceeded, "quota exceeded", zapcore.InfoLevel},
	reasonBudget:      {"budget_exhausted", nil, 0, ErrBudgetExhausted, "spend budget exhausted", zapcore.InfoLevel},
}

func init() {
	for i := range reasonInfo {
		reasonInfo[i].value = reasonInfo[i].name
	}
}

// minusOne is the retry_after placeholder of a refusal that no wait
// helps, boxed once.
var minusOne any = int64(-1)

// refusalStatus is the HTTP status of a refusal for reason rs by zone z.
func (z *zone) refusalStatus(rs reason) int {
	if s := reasonInfo[rs].status; s != 0 {
		return s
	}
	if rs == reasonBudget {
		return cmp.Or(z.Status, http.StatusServiceUnavailable)
	}
	return cmp.Or(z.status, http.StatusTooManyRequests)
}

// denialReason is the reason of a denial by a limit answering status: a
// spent quota (402, 403) or a rate exceeded.
func denialReason(status int) reason {
	if status == http.StatusPaymentRequired || status == http.StatusForbidden {
		return reasonQuota
	}
	return reasonRateLimited
}

// status is the HTTP status of f: a denial answers with its limit's
// status (a scope's own, else its zone's).
func (f *refusal) status() int {
	if f.limit != nil && f.limit.denyErr != nil && (f.reason == reasonRateLimited || f.reason == reasonQuota || f.reason == reasonBudget) {
		return f.limit.denyStatus
	}
	return f.zone.refusalStatus(f.reason)
}

// err is the Caddy error of f.
func (f *refusal) err() error {
	if f.limit != nil && f.limit.denyErr != nil && (f.reason == reasonRateLimited || f.reason == reasonQuota || f.reason == reasonBudget) {
		return f.limit.denyErr
	}
	return f.zone.refusalError(f.reason)
}

// refusalError is the Caddy error of a refusal for reason rs, made at
// provision. Like a denial's, it carries no error ID or trace: Caddy's
// caddyhttp.Error would cost seven allocations per refusal, under floods
// of them, for an ID and a trace that name nothing a refusal needs.
func (z *zone) refusalError(rs reason) error {
	if e := z.errs[rs]; e != nil {
		return e
	}
	return caddyhttp.HandlerError{StatusCode: z.refusalStatus(rs), Err: reasonInfo[rs].err}
}

// scope is the scope that refused ("" for a zone's own limit or its deny
// list), and scopeValue the same as a placeholder value.
func (f *refusal) scope() string {
	if f.limit == nil {
		return ""
	}
	return f.limit.scope
}

func (f *refusal) scopeValue() any {
	if f.limit == nil || f.limit.scopeName == nil {
		return f.scope()
	}
	return f.limit.scopeName
}

// phReason names why a request was refused, on every refusal; phPrefix
// starts every placeholder Sluice sets.
const (
	phReason = "http.rate_limit.reason"
	phPrefix = "http.rate_limit."
)

// refusal is one refused request: what the client is told, and what the
// operator's log and metrics get.
type refusal struct {
	reason reason
	zone   *zone
	limit  *limit // the limit that refused; nil when the zone did (a deny list)
	// retryAfter is the Retry-After header's seconds, or -1 when waiting
	// cannot help and none is sent.
	retryAfter int64
	wait       time.Duration // logged: the wait with jitter
	key        string        // logged with log_key
	detail     error         // logged: what exactly was wrong
	violated   []*limit      // the limits that denied, for problem bodies
	// The denying limit's numbers for placeholders: its quota, what
	// remains and the seconds until it is full again.
	quota, remaining, reset int64
	// The decisions whose rate limit fields a denial carries (limits
	// nil: none are sent). They are the request state's, which is
	// released only once the refusal is written.
	limits []*limit
	reqs   []backend.Request
	out    []algorithms.Result
}

// refusalCounters are a zone's series of refused requests, one per reason,
// looked up at provision so that a refusal does no label hashing.
type refusalCounters [numReasons]prometheus.Counter

// policyName is the limit's name in rate limit fields and problem bodies:
// the zone, or "zone.scope".
func (l *limit) policyName() string {
	if l.shownScope() == "" {
		return l.zone.name
	}
	return l.zone.name + "." + l.shownScope()
}

// deny makes the refusal of a request that an enforcing limit denied. The
// limit reported is the one that makes the client wait longest, since the
// request can pass only once every limit allows it.
func (h *plan) deny(r *http.Request, s *requestState) *refusal {
	worst := -1
	var violated []*limit
	for i, l := range s.limits {
		if l.zone.Shadow || s.out[i].Allowed {
			continue
		}
		if h.Respond == RespondProblem {
			violated = append(violated, l)
		}
		if worst < 0 || later(s.out[i].RetryAfter, s.out[worst].RetryAfter) {
			worst = i
		}
	}
	l, res, key := s.limits[worst], s.out[worst], s.reqs[worst].Key
	f := refusal{reason: l.denyReason, zone: l.zone, limit: l, retryAfter: -1, key: key, violated: violated, wait: time.Duration(res.RetryAfter)}
	if res.RetryAfter != algorithms.Never {
		if h.Jitter > 0 {
			random := h.jitterFn
			if random == nil {
				random = rand.Float64
			}
			f.wait += time.Duration(min(random()*h.Jitter*float64(f.wait), float64(algorithms.MaxSpan)))
		}
		f.retryAfter = retryAfterSeconds(f.wait)
	}
	if h.headers {
		f.limits, f.reqs, f.out = s.limits, s.reqs, s.out
	}
	f.quota, f.remaining, f.reset = res.Limit, res.Remaining, secondsUp(res.ResetAfter)
	l.metrics.declined()
	if h.events.ShouldEmit("rate_limit_exceeded") {
		h.events.Emit(h.ctx, "rate_limit_exceeded", map[string]any{
			"zone":      l.zone.name,
			"scope":     l.scope,
			"wait":      f.wait,
			"remote_ip": remoteIP(r),
		})
	}
	return s.refuse(f)
}

// provisionContract checks and prepares what the handler's answers carry:
// the rate limit fields each zone sends, the status it denies with, the
// built-in body, and the refusal counters.
func (h *plan) provisionContract() error {
	switch h.Respond {
	case "", RespondJSON, RespondProblem, RespondText:
	default:
		return fmt.Errorf("respond must be json, problem or text, got %q", h.Respond)
	}
	base, err := parseHeaders(h.Headers)
	if err != nil {
		return err
	}
	for _, z := range h.zones {
		send := base
		if z.Headers != "" {
			if send, err = parseHeaders(z.Headers); err != nil {
				return fmt.Errorf("zone %q: %v", z.name, err)
			}
		}
		if err := checkStatus(z.Status); err != nil {
			return fmt.Errorf("zone %q: %v", z.name, err)
		}
		z.status = cmp.Or(z.Status, http.StatusTooManyRequests)
		z.nameValue = z.name
		for rs := range numReasons {
			z.errs[rs] = caddyhttp.HandlerError{StatusCode: z.refusalStatus(rs), Err: reasonInfo[rs].err}
		}
		for _, l := range z.limits {
			if err := l.provisionHeaders(send); err != nil {
				return fmt.Errorf("zone %q: %v", z.name, err)
			}
			if err := l.provisionStatus(z.status); err != nil {
				return fmt.Errorf("zone %q: %v", z.name, l.scoped(err))
			}
			h.headers = h.headers || send != 0
		}
		if h.metrics {
			for rs := range numReasons {
				z.refused[rs] = metrics.refused.WithLabelValues(z.name, reasonInfo[rs].name)
			}
		}
	}
	return nil
}

// provisionStatus prepares the answer of a denial by l: its own status (a
// scope's), else its zone's.
func (l *limit) provisionStatus(zoneStatus int) error {
	if err := checkStatus(l.Status); err != nil {
		return err
	}
	status := cmp.Or(l.Status, zoneStatus)
	l.denyReason = denialReason(status)
	if l.ChargeWhen != nil {
		status, l.denyReason = l.budgetDenial()
	}
	l.denyStatus = status
	// Made once, boxed: a flood of denials allocates nothing for it.
	l.denyErr = caddyhttp.HandlerError{StatusCode: status, Err: reasonInfo[l.denyReason].err}
	return nil
}

// checkStatus validates a zone's denial status: a client or server error.
func checkStatus(s int) error {
	if s != 0 && (s < 400 || s > 599) {
		return fmt.Errorf("status must be from 400 to 599, got %d", s)
	}
	return nil
}
