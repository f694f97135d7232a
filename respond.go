package sluice

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"sync"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/sluicehq/sluice/internal/keys"
)

// Values of the respond option: who writes the body of a refusal.
const (
	RespondJSON    = "json"
	RespondProblem = "problem"
	RespondText    = "text"
)

// respond answers a request Sluice will not pass on: the one writer of
// every refusal, whichever phase made it. A denial's rate limit fields,
// Cache-Control no-store, the placeholders error pages read always set, a
// sampled log line, a count by zone and reason, then either a
// caddyhttp.Error (handle_errors shapes the page) or, with the respond
// option, the built-in body, written without Caddy's error path. Nothing
// the client sees tells how the limit is configured.
//
// A flood is mostly refusals, so this is written to cost little: header
// values share one array, names are boxed once at provision, the Caddy
// errors are made then too, and the body is appended into a pooled buffer.
func (h *plan) respond(w http.ResponseWriter, r *http.Request, f *refusal) error {
	info := &reasonInfo[f.reason]
	z := f.zone
	if f.limits != nil {
		writeHeaders(w, f.limits, f.reqs, f.out)
	}
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
	zone  *zone
	limit *limit // nil when the zone refused (deny list)
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

func (h *plan) refusalFields(r *http.Request, f *refusal) []zap.Field {
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
func (h *plan) appendBody(b []byte, f *refusal) []byte {
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

func appendRetryAfter(b []byte, f *refusal) []byte {
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
func appendMessage(b []byte, f *refusal) []byte {
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
func (z *zone) boxedName() any {
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
