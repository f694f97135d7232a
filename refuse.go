package sluice

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
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

// ErrQuotaExceeded is the error behind a denial by a limit whose status is
// 402 or 403: a quota (per day, per month) that waiting a little will not
// bring back, told apart from the 429 of a rate so that clients stop
// retrying.
var ErrQuotaExceeded = errors.New("quota exceeded")

// errAnswered is what a step returns when it has written the answer
// itself (a built-in refusal body): the request is over, and no error is
// left for Caddy to handle.
var errAnswered = errors.New("answered")

func unlessAnswered(err error) error {
	if err == errAnswered {
		return nil
	}
	return err
}

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
func (z *Zone) refusalStatus(rs reason) int {
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
func (z *Zone) refusalError(rs reason) error {
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
	zone   *Zone
	limit  *Limit // the limit that refused; nil when the zone did (a deny list)
	// retryAfter is the Retry-After header's seconds, or -1 when waiting
	// cannot help and none is sent.
	retryAfter int64
	wait       time.Duration // logged: the wait with jitter
	key        string        // logged with log_key
	detail     error         // logged: what exactly was wrong
	violated   []*Limit      // the limits that denied, for problem bodies
	// The denying limit's numbers for placeholders: its quota, what
	// remains and the seconds until it is full again.
	quota, remaining, reset int64
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
//
// A flood is mostly refusals, so this is written to cost little: header
// values share one array, names are boxed once at provision, the Caddy
// errors are made then too, and the body is appended into a pooled buffer.
func (h *Handler) refuse(w http.ResponseWriter, r *http.Request, f refusal) error {
	info := &reasonInfo[f.reason]
	z := f.zone
	// One array holds every header value: the slices must be this
	// response's own, since Caddy's header replacements edit values in
	// place.
	vals := make([]string, 4)
	hdr := w.Header() // once: each call goes through Caddy's writer wrappers
	set := func(name, v string) {
		vals[0] = v
		hdr[name] = vals[:1:1]
		vals = vals[1:]
	}
	set(hdrCacheControl, "no-store")
	if f.retryAfter >= 0 {
		set(hdrRetryAfter, intText(f.retryAfter))
	}
	if waitsForContinue(r) {
		set(hdrConnection, "close")
	}
	if repl, _ := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer); repl != nil {
		refusalValues{
			zone: z, limit: f.limit, key: f.key, reason: f.reason, retryAfter: f.retryAfter,
			quota: f.quota, remaining: f.remaining, reset: f.reset,
		}.provide(repl)
	}
	if c := z.refused[f.reason]; c != nil {
		c.Inc()
	}
	untime(r)
	if ce := h.denyLog.Check(info.lvl, info.log); ce != nil {
		ce.Write(h.refusalFields(r, f)...)
	}
	if h.Respond == "" {
		return f.err()
	}
	// No Content-Length: net/http sets it for a body this small.
	set(hdrContentType, contentTypes[h.Respond])
	w.WriteHeader(f.status())
	if r.Method == http.MethodHead {
		return nil
	}
	buf := bodyPool.Get().(*[]byte)
	*buf = h.appendBody((*buf)[:0], f)
	_, err := w.Write(*buf) // a Writer keeps nothing of what it is given
	bodyPool.Put(buf)
	return err
}

// waitsForContinue reports whether r's client holds its body back until
// the server asks for it (Expect: 100-continue) over HTTP/1.x, and nothing
// has asked yet. A refusal must then close the connection: otherwise Go's
// server, finding the body wrapped (Caddy counts the bytes read), reads
// up to 256 KiB of it before it sends the answer, without asking for it,
// and the client's answer waits until it gives up waiting and sends the
// body anyway (curl: 1 s by default; many clients longer). HTTP/2 sends
// the answer at once, and a Connection field there would end every stream
// of the connection.
func waitsForContinue(r *http.Request) bool {
	if r.ProtoMajor != 1 || r.ContentLength == 0 || r.Body == nil || r.Body == http.NoBody {
		return false
	}
	for _, v := range r.Header["Expect"] {
		if strings.EqualFold(strings.TrimSpace(v), "100-continue") {
			return true
		}
	}
	return false
}

// bodyPool holds the buffers built-in bodies are written from. Bodies are
// a few hundred bytes at most (a zone name is as long as the operator
// makes it), so a buffer never holds much.
var bodyPool = sync.Pool{New: func() any { b := make([]byte, 0, 256); return &b }}

// Header names, in canonical form, and the built-in bodies' types.
const (
	hdrCacheControl = "Cache-Control"
	hdrRetryAfter   = "Retry-After"
	hdrContentType  = "Content-Type"
	hdrConnection   = "Connection"
)

var contentTypes = map[string]string{
	RespondJSON:    "application/json",
	RespondProblem: "application/problem+json",
	RespondText:    "text/plain; charset=utf-8",
}

// refusalValues are the placeholders of one refusal. A replacer provider
// answers them when a page or a log reads one: setting them would cost a
// lock and a map write each (ten per refusal, a third of a flood's deny
// path), mostly for placeholders nothing reads.
type refusalValues struct {
	zone  *Zone
	limit *Limit // nil when the zone refused (deny list)
	key   string
	// The decision's numbers (a denial) and the Retry-After seconds (-1:
	// none is sent).
	quota, remaining, reset, retryAfter int64
	reason                              reason
}

// refusalPlaceholders are the names refusalValues answers.
var refusalPlaceholders = [...]string{phReason, phName, phScope, phRetryAfter, phDenylisted, phKey, phZone, phLimit, phRemaining, phReset}

// lookup is the provider. Caddy leaves a placeholder that is not known as
// it is written, so a JSON page would break: a refusal that decided
// nothing reports its zone with no quota and an empty key.
func (v refusalValues) lookup(name string) (any, bool) {
	if len(name) < len(phPrefix) || name[:len(phPrefix)] != phPrefix {
		return nil, false
	}
	decided := v.reason == reasonRateLimited || v.reason == reasonQuota || v.reason == reasonBudget
	switch name {
	case phReason:
		return reasonInfo[v.reason].value, true
	case phName:
		return v.zone.boxedName(), true
	case phScope:
		f := refusal{limit: v.limit}
		return f.scopeValue(), true
	case phRetryAfter:
		if v.retryAfter < 0 {
			return minusOne, true
		}
		return intValue(v.retryAfter), true
	case phDenylisted:
		if v.reason == reasonDenylisted {
			return v.zone.boxedName(), true
		}
		return "", true
	case phKey:
		if decided {
			return v.key, true
		}
		return "", true
	case phZone:
		if decided && v.limit != nil {
			return v.limit.zoneName, true
		}
		return v.zone.boxedName(), true
	case phLimit:
		return intValue(v.quota), true
	case phRemaining:
		return intValue(v.remaining), true
	case phReset:
		return intValue(v.reset), true
	}
	return nil, false
}

// provide makes v's placeholders known to repl. Values Set on the
// replacer come before any provider, so when an earlier handler of this
// request has set some (an allowed decision sets the zone and its
// numbers), every one is set instead: the refusal's must win.
func (v refusalValues) provide(repl *caddy.Replacer) {
	if _, earlier := repl.Get(phZone); earlier {
		for _, name := range refusalPlaceholders {
			val, _ := v.lookup(name)
			repl.Set(name, val)
		}
		return
	}
	repl.Map(v.lookup)
}

func (h *Handler) refusalFields(r *http.Request, f refusal) []zap.Field {
	fields := []zap.Field{
		zap.String("zone", f.zone.name),
		zap.String("reason", reasonInfo[f.reason].name),
		zap.Int("status", f.status()),
		zap.String("remote_ip", remoteIP(r)),
		zap.String("client_ip", clientIP(r)),
	}
	if f.scope() != "" {
		fields = append(fields, zap.String("scope", f.scope()))
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
	return fields
}

// The problem types of the RateLimit header fields draft for a quota
// exceeded and for a server that cannot serve now.
const (
	problemQuotaExceeded   = "https://iana.org/assignments/http-problem-types#quota-exceeded"
	problemReducedCapacity = "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity"
)

// appendBody appends the built-in body of a refusal in the handler's
// format:
//
//	json:    {"error":{"code":…,"message":…,"retry_after":…,"zone":…,"scope":…}}
//	problem: {"type":…,"title":…,"status":…,"detail":…,"retry_after":…,"violated-policies":[…]}
//	text:    the message and a newline
//
// retry_after is there only when Retry-After is sent, scope only for a
// scope.
func (h *Handler) appendBody(b []byte, f refusal) []byte {
	switch h.Respond {
	case RespondText:
		return append(appendMessage(b, f), '\n')
	case RespondProblem:
		status := f.status()
		typ, title := "about:blank", http.StatusText(status)
		switch f.reason {
		case reasonRateLimited, reasonQuota:
			typ, title = problemQuotaExceeded, "Quota Exceeded"
		case reasonUnavailable, reasonConcurrency, reasonShed, reasonBudget:
			typ, title = problemReducedCapacity, "Temporary Reduced Capacity"
		}
		b = append(b, `{"type":`...)
		b = appendJSONString(b, typ)
		b = append(b, `,"title":`...)
		b = appendJSONString(b, title)
		b = append(b, `,"status":`...)
		b = strconv.AppendInt(b, int64(status), 10)
		b = append(b, `,"detail":"`...)
		b = appendMessage(b, f)
		b = append(b, '"')
		b = appendRetryAfter(b, f)
		if len(f.violated) > 0 {
			b = append(b, `,"violated-policies":[`...)
			for i, l := range f.violated {
				if i > 0 {
					b = append(b, ',')
				}
				b = appendJSONString(b, l.policyName())
			}
			b = append(b, ']')
		}
		return append(b, '}')
	}
	b = append(b, `{"error":{"code":"`...)
	b = append(b, reasonInfo[f.reason].name...)
	b = append(b, `","message":"`...)
	b = appendMessage(b, f)
	b = append(b, '"')
	b = appendRetryAfter(b, f)
	b = append(b, `,"zone":`...)
	b = appendJSONString(b, f.zone.name)
	if f.limit != nil && f.limit.shownScope() != "" {
		// As configured: a tier's version is the operator's business.
		b = append(b, `,"scope":`...)
		b = appendJSONString(b, f.limit.shownScope())
	}
	return append(b, "}}"...)
}

func appendRetryAfter(b []byte, f refusal) []byte {
	if f.retryAfter < 0 {
		return b
	}
	b = append(b, `,"retry_after":`...)
	return strconv.AppendInt(b, f.retryAfter, 10)
}

// appendJSONString appends s as a JSON string. Names are usually plain
// ASCII, appended as they are; others go through encoding/json.
func appendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(s)
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// appendMessage appends what the client can do about the refusal, and
// nothing of the config. It is plain ASCII without quotes, so it can stand
// inside a JSON string as it is.
func appendMessage(b []byte, f refusal) []byte {
	switch f.reason {
	case reasonRateLimited, reasonQuota:
		limit, head, tail := "the rate limit", "Too many requests. Retry in ", "."
		if f.reason == reasonQuota {
			limit, head, tail = "the quota", "The quota for this period is used up. Retry in ", ", or upgrade the plan."
		}
		if f.retryAfter < 0 {
			b = append(b, "This request asks for more than "...)
			return append(append(b, limit...), " can ever allow."...)
		}
		b = appendSeconds(append(b, head...), f.retryAfter)
		return append(b, tail...)
	case reasonUnavailable:
		b = append(b, "The rate limiter cannot decide this request now. Retry in "...)
		return append(appendSeconds(b, f.retryAfter), '.')
	case reasonMissingKey:
		b = append(b, "The request lacks a value this endpoint is rate limited by: "...)
		return append(append(b, missingClass(f.detail)...), '.')
	case reasonBudget:
		return appendBudgetMessage(b, f)
	case reasonConcurrency, reasonShed:
		b = append(b, "The server is busy. Retry in "...)
		return append(appendSeconds(b, f.retryAfter), '.')
	case reasonBadCost:
		return append(b, "The request's cost is not a whole number of at least 0, or cannot be read."...)
	}
	return append(b, "This client may not use this endpoint."...)
}

// appendSeconds appends n seconds, in words a client reads: "1 second".
func appendSeconds(b []byte, n int64) []byte {
	b = strconv.AppendInt(b, n, 10)
	if n == 1 {
		return append(b, " second"...)
	}
	return append(b, " seconds"...)
}

// boxedName is the zone's name as the replacer holds it, boxed once at
// provision so that a refusal does not allocate for it.
func (z *Zone) boxedName() any {
	if z.nameValue != nil {
		return z.nameValue
	}
	return z.name
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
	if l.shownScope() == "" {
		return l.zone.name
	}
	return l.zone.name + "." + l.shownScope()
}

// deny answers a request that an enforcing limit denied. The limit
// reported is the one that makes the client wait longest, since the request
// can pass only once every limit allows it.
func (h *Handler) deny(w http.ResponseWriter, r *http.Request, repl *caddy.Replacer, s *scratch) error {
	// Before anything is written or counted: the tarpit delays the whole
	// answer, whose waits then count from when it is sent, and a denial
	// is counted when it is given.
	if held := h.hold(r); held > 0 {
		elapse(s.out, held)
	}
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
		writeHeaders(w, s.limits, s.reqs, s.out)
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
		if !h.DisableMetrics {
			for rs := range numReasons {
				z.refused[rs] = metrics.refused.WithLabelValues(z.name, reasonInfo[rs].name)
			}
		}
	}
	return nil
}

// provisionStatus prepares the answer of a denial by l: its own status (a
// scope's), else its zone's.
func (l *Limit) provisionStatus(zoneStatus int) error {
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
