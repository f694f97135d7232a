package sluice

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/keys"
)

// Values of the respond option: who writes the body of a refusal.
const (
	RespondJSON    = "json"
	RespondProblem = "problem"
	RespondText    = "text"
)

// ErrMissingKey is the error behind a 400 answer of a "missing deny" limit
// whose key the request does not give in a usable form. Its text, shown by
// {http.error.message}, says nothing of how the key is configured.
var ErrMissingKey = errors.New("the request lacks a value it is rate limited by, or gives it in a form that cannot be used")

// ErrBadCost is the error behind a 400 answer to a request whose cost is
// not a whole number ≥ 0, or cannot be read.
var ErrBadCost = errors.New("the request's cost is not a whole number of at least 0, or cannot be read")

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
	numReasons
)

var reasonInfo = [numReasons]struct {
	name string // metric label, {http.rate_limit.reason}, the JSON body's code
	err  error  // behind the caddyhttp.Error; {http.error.message}
	log  string
	lvl  zapcore.Level
}{
	reasonRateLimited: {"rate_limit_exceeded", ErrRateLimited, "rate limit exceeded", zapcore.InfoLevel},
	reasonUnavailable: {"backend_unavailable", ErrBackendUnavailable, "rate limit backend unavailable: refusing the request of a zone that fails closed", zapcore.WarnLevel},
	reasonMissingKey:  {"missing_key", ErrMissingKey, "request refused: its rate limit key is missing", zapcore.InfoLevel},
	reasonBadCost:     {"bad_cost", ErrBadCost, "request refused: its cost cannot be used", zapcore.InfoLevel},
	reasonDenylisted:  {"denylisted", ErrDenylisted, "request refused by deny list", zapcore.InfoLevel},
}

// phReason names why a request was refused, on every refusal.
const phReason = "http.rate_limit.reason"

// refusal is one refused request: what the client is told, and what the
// operator's log and metrics get.
type refusal struct {
	reason reason
	status int
	zone   *Zone
	scope  string // the scope that refused; "" for the zone's own limit
	// retryAfter is the Retry-After header's seconds, or -1 when waiting
	// cannot help and none is sent.
	retryAfter int64
	wait       time.Duration // logged: the wait with jitter
	key        string        // logged with log_key
	detail     error         // logged: what exactly was wrong
	violated   []*Limit      // the limits that denied, for problem bodies
}

// refusalCounters are a zone's series of refused requests, one per reason,
// looked up at provision so that a refusal does no label hashing.
type refusalCounters [numReasons]prometheus.Counter

// refuse answers a request Sluice will not pass on, the one way every
// refusal is answered: Cache-Control no-store, the placeholders error
// pages read always set, a sampled log line, a count by zone and reason,
// then either a caddyhttp.Error (handle_errors shapes the page) or, with
// the respond option, the built-in body, written without Caddy's error
// path. Nothing the client sees tells how the limit is configured.
func (h *Handler) refuse(w http.ResponseWriter, r *http.Request, f refusal) error {
	info := &reasonInfo[f.reason]
	z := f.zone
	hdr := w.Header()
	hdr.Set("Cache-Control", "no-store")
	if f.retryAfter >= 0 {
		hdr.Set("Retry-After", strconv.FormatInt(f.retryAfter, 10))
	}
	repl, _ := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	if repl != nil {
		repl.Set(phReason, info.name)
		repl.Set(phName, z.name)
		repl.Set(phScope, f.scope)
		repl.Set(phRetryAfter, f.retryAfter)
		if f.reason != reasonRateLimited {
			repl.Set(phKey, "")
		}
		if f.reason == reasonDenylisted {
			repl.Set(phDenylisted, z.name)
		}
	}
	if c := z.refused[f.reason]; c != nil {
		c.Inc()
	}
	if ce := h.denyLog.Check(info.lvl, info.log); ce != nil {
		fields := []zap.Field{
			zap.String("zone", z.name),
			zap.String("reason", info.name),
			zap.Int("status", f.status),
			zap.String("remote_ip", remoteIP(r)),
			zap.String("client_ip", clientIP(r)),
		}
		if f.scope != "" {
			fields = append(fields, zap.String("scope", f.scope))
		}
		if f.wait > 0 {
			fields = append(fields, zap.Duration("wait", f.wait))
		}
		if h.LogKey && f.key != "" {
			fields = append(fields, zap.String("key", f.key))
		}
		if f.detail != nil {
			fields = append(fields, zap.Error(f.detail))
		}
		ce.Write(fields...)
	}
	if h.Respond == "" {
		return caddyhttp.Error(f.status, info.err)
	}
	body, ctype := h.refusalBody(f)
	hdr.Set("Content-Type", ctype)
	hdr.Set("Content-Length", strconv.Itoa(len(body)))
	hdr.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(f.status)
	if r.Method == http.MethodHead {
		return nil
	}
	_, err := w.Write(body)
	return err
}

// refusalBody is the built-in body of a refusal and its Content-Type.
func (h *Handler) refusalBody(f refusal) ([]byte, string) {
	info := &reasonInfo[f.reason]
	msg := refusalMessage(f)
	switch h.Respond {
	case RespondText:
		return append([]byte(msg), '\n'), "text/plain; charset=utf-8"
	case RespondProblem:
		p := problem{Type: "about:blank", Title: http.StatusText(f.status), Status: f.status, Detail: msg}
		switch f.reason {
		case reasonRateLimited:
			p.Type, p.Title = problemQuotaExceeded, "Quota Exceeded"
		case reasonUnavailable:
			p.Type, p.Title = problemReducedCapacity, "Temporary Reduced Capacity"
		}
		if f.retryAfter >= 0 {
			p.RetryAfter = &f.retryAfter
		}
		for _, l := range f.violated {
			p.Violated = append(p.Violated, l.policyName())
		}
		b, _ := json.Marshal(p)
		return b, "application/problem+json"
	}
	e := jsonError{Code: info.name, Message: msg, Zone: f.zone.name, Scope: f.scope}
	if f.retryAfter >= 0 {
		e.RetryAfter = &f.retryAfter
	}
	b, _ := json.Marshal(struct {
		Error jsonError `json:"error"`
	}{e})
	return b, "application/json"
}

// The problem types of the RateLimit header fields draft for a quota
// exceeded and for a server that cannot serve now.
const (
	problemQuotaExceeded   = "https://iana.org/assignments/http-problem-types#quota-exceeded"
	problemReducedCapacity = "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity"
)

type problem struct {
	Type       string   `json:"type"`
	Title      string   `json:"title"`
	Status     int      `json:"status"`
	Detail     string   `json:"detail"`
	RetryAfter *int64   `json:"retry_after,omitempty"`
	Violated   []string `json:"violated-policies,omitempty"`
}

type jsonError struct {
	Code       string `json:"code"`
	Message    string `json:"message"`
	RetryAfter *int64 `json:"retry_after,omitempty"`
	Zone       string `json:"zone"`
	Scope      string `json:"scope,omitempty"`
}

// refusalMessage says what the client can do, and nothing of the config.
func refusalMessage(f refusal) string {
	switch f.reason {
	case reasonRateLimited:
		if f.retryAfter < 0 {
			return "This request asks for more than the rate limit can ever allow."
		}
		return "Too many requests. Retry in " + strconv.FormatInt(f.retryAfter, 10) + " seconds."
	case reasonUnavailable:
		return "The rate limiter cannot decide this request now. Retry in " + strconv.FormatInt(f.retryAfter, 10) + " seconds."
	case reasonMissingKey:
		return "The request lacks a value this endpoint is rate limited by: " + missingClass(f.detail) + "."
	case reasonBadCost:
		return "The request's cost is not a whole number of at least 0, or cannot be read."
	}
	return "This client may not use this endpoint."
}

// missingClass tells the client which way its value was unusable, without
// naming where the limit looks for it.
func missingClass(err error) string {
	switch {
	case errors.Is(err, keys.ErrAmbiguous):
		return "it is given more than once"
	case errors.Is(err, keys.ErrUnreadable):
		return "the body cannot be read as the endpoint expects"
	case errors.Is(err, keys.ErrInvalid):
		return "it is not valid"
	}
	return "it is missing"
}

// policyName is the limit's name in rate limit fields and problem bodies:
// the zone, or "zone.scope".
func (l *Limit) policyName() string {
	if l.scope == "" {
		return l.zone.name
	}
	return l.zone.name + "." + l.scope
}

// deny answers a request that an enforcing limit denied. The limit
// reported is the one that makes the client wait longest, since the request
// can pass only once every limit allows it.
func (h *Handler) deny(w http.ResponseWriter, r *http.Request, repl *caddy.Replacer, s *scratch) error {
	worst := -1
	var violated []*Limit
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
	f := refusal{reason: reasonRateLimited, status: l.zone.status, zone: l.zone, scope: l.scope, retryAfter: -1, key: key, violated: violated, wait: time.Duration(res.RetryAfter)}
	if res.RetryAfter != algorithms.Never {
		if h.Jitter > 0 {
			f.wait += time.Duration(min(rand.Float64()*h.Jitter*float64(f.wait), float64(algorithms.MaxSpan)))
		}
		f.retryAfter = retryAfterSeconds(f.wait)
	}
	if h.headers {
		writeHeaders(w, s.limits, s.reqs, s.out)
	}
	setPlaceholders(repl, l, res)
	repl.Set(phKey, key)
	l.metrics.declined()
	if h.events.ShouldEmit("rate_limit_exceeded") {
		h.events.Emit(h.ctx, "rate_limit_exceeded", map[string]any{
			"zone":      l.zone.name,
			"scope":     l.scope,
			"wait":      f.wait,
			"remote_ip": remoteIP(r),
		})
	}
	return h.refuse(w, r, f)
}

// provisionContract checks and prepares what the handler's answers carry:
// the rate limit fields each zone sends, the status it denies with, the
// built-in body, and the refusal counters.
func (h *Handler) provisionContract() error {
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
		for _, l := range z.limits {
			if err := l.provisionHeaders(send); err != nil {
				return fmt.Errorf("zone %q: %v", z.name, err)
			}
			h.headers = h.headers || send != 0
		}
		if !h.DisableMetrics {
			for rs := range numReasons {
				z.refused[rs] = metrics.refused.WithLabelValues(z.name, reasonInfo[rs].name)
			}
		}
	}
	return nil
}

// checkStatus validates a zone's denial status: a client or server error.
func checkStatus(s int) error {
	if s != 0 && (s < 400 || s > 599) {
		return fmt.Errorf("status must be from 400 to 599, got %d", s)
	}
	return nil
}

// unmarshalContract reads the handler's `headers <mode>` and
// `respond <format>` Caddyfile options.
func (h *Handler) unmarshalContract(d *caddyfile.Dispenser, opt string) error {
	v, err := oneArg(d)
	if err != nil {
		return err
	}
	if opt == "headers" {
		if _, err := parseHeaders(v); err != nil {
			return d.Err(err.Error())
		}
		h.Headers = v
		return nil
	}
	h.Respond = v
	switch v {
	case RespondJSON, RespondProblem, RespondText:
		return nil
	}
	return d.Errf("respond must be json, problem or text, got %q", v)
}

// unmarshalContract reads a zone's `headers <mode>` and `status <code>`.
func (z *Zone) unmarshalContract(d *caddyfile.Dispenser, name, opt string) error {
	v, err := oneArg(d)
	if err != nil {
		return err
	}
	if opt == "headers" {
		if _, err := parseHeaders(v); err != nil {
			return d.Errf("zone %q: %v", name, err)
		}
		z.Headers = v
		return nil
	}
	if z.Status, err = strconv.Atoi(v); err != nil || checkStatus(z.Status) != nil || z.Status == 0 {
		return d.Errf("zone %q: status must be from 400 to 599, got %q", name, v)
	}
	return nil
}
