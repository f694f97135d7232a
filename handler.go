package sluice

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/keys"
)

// ErrRateLimited is the error behind every 429 answer; {http.error.message}
// shows its text.
var ErrRateLimited = errors.New("rate limit exceeded")

// Placeholders set on every decided request; the exceeded.* ones only on a
// denied request.
const (
	phZone       = "http.rate_limit.zone"
	phLimit      = "http.rate_limit.limit"
	phRemaining  = "http.rate_limit.remaining"
	phReset      = "http.rate_limit.reset"
	phName       = "http.rate_limit.exceeded.name"
	phScope      = "http.rate_limit.exceeded.scope"
	phDenylisted = "http.rate_limit.denylisted.name"
	phKey        = "http.rate_limit.exceeded.key"
	phRetryAfter = "http.rate_limit.exceeded.retry_after"
)

// maxInline is how many matching zones a request can have before the
// handler allocates for them.
const maxInline = 8

// ServeHTTP decides the request against every zone it matches, once and all
// or nothing, then answers 429 or passes it on.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	repl := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)

	var (
		reqBuf   [maxInline]backend.Request
		limitBuf [maxInline]*Limit
		outBuf   [maxInline]algorithms.Result
		body     *keys.Body
	)
	reqs, limits := reqBuf[:0], limitBuf[:0]
	for _, z := range h.zones {
		if len(z.matchers) > 0 {
			ok, err := z.matchers.AnyMatchWithError(r)
			if err != nil {
				return err
			}
			if !ok {
				continue
			}
		}
		// A shadow zone only reports what it would do: its deny list, its
		// missing-key denials and its bad costs are logged, never applied.
		switch listed, err := z.listed(r); {
		case err != nil:
			return err
		case listed == listDeny && z.Shadow:
			// Counted and logged, and limited like any other request.
			if z.denyC != nil {
				z.denyC.Inc()
			}
			h.denyLog.Info("request would be refused by deny list (shadow zone)", zap.String("zone", z.name), zap.String("client_ip", clientIP(r)))
		case listed == listDeny:
			return h.refuse(r, repl, z)
		case listed == listAllow:
			continue
		}
		for _, l := range z.limits {
			if body == nil && (l.keyer.NeedsBody() || l.Cost.needsBody()) {
				body = keys.ReadBody(r, h.BodyLimit, h.bodyFields)
			}
			key, err := l.keyer.Key(r, repl, body)
			l.warnUnset(h.logger, repl, err != nil)
			if err != nil {
				l.metrics.missing(l.Missing)
				switch {
				case l.Missing == MissingSkip && errors.Is(err, keys.ErrAbsent):
					continue
				case l.Missing == MissingSkip:
					// Only an absent value is skipped. A value given twice,
					// a body that cannot be read or a value a normalizer
					// refuses may still name someone to the application:
					// skipping them would let a client step around the
					// limit. They share one quota instead.
				case l.Missing == MissingDeny && z.Shadow:
					h.denyLog.Info("request would be refused for a missing key (shadow zone)", zap.String("zone", z.name), zap.String("scope", l.scope), zap.Error(err))
				case l.Missing == MissingDeny:
					return h.badKey(w, l, err)
				}
			}
			cost, err := l.Cost.eval(r, repl, body)
			if err != nil {
				if z.Shadow {
					h.denyLog.Info("request would be refused for its cost (shadow zone)", zap.String("zone", z.name), zap.String("scope", l.scope), zap.Error(err))
					continue
				}
				return caddyhttp.Error(http.StatusBadRequest, fmt.Errorf("rate_limit zone %q: %w", z.name, err))
			}
			reqs = append(reqs, backend.Request{Limit: l.handle, Key: key, Cost: cost, Shadow: z.Shadow})
			limits = append(limits, l)
		}
	}
	if len(reqs) == 0 {
		return next.ServeHTTP(w, r)
	}
	out := outBuf[:]
	if len(reqs) > len(out) {
		out = make([]algorithms.Result, len(reqs))
	}
	out = out[:len(reqs)]

	var start int64
	if !h.DisableMetrics {
		start = h.now()
	}
	store := h.store
	allowed, err := store.Decide(r.Context(), reqs, out)
	if err != nil {
		if reqs, limits, out, allowed, err = h.failover(w, r, reqs, limits, out, fmt.Errorf("rate_limit: %w", err)); err != nil {
			return err
		}
		if len(reqs) == 0 {
			return next.ServeHTTP(w, r)
		}
		store = h.local
	}
	if !h.DisableMetrics {
		elapsed := float64(h.now()-start) / 1e9
		for _, l := range limits {
			l.metrics.observe(elapsed)
		}
	}

	for i, l := range limits {
		if l.zone.Shadow && !out[i].Allowed {
			l.metrics.shadowDeny()
			h.denyLog.Info("rate limit would be exceeded (shadow zone)", h.logFields(r, l, reqs[i].Key, out[i].RetryAfter)...)
		}
	}

	if !allowed {
		return h.deny(w, r, repl, limits, reqs, out)
	}
	if i := tightest(limits, out); i >= 0 {
		setPlaceholders(repl, limits[i], out[i])
	}
	if err := h.wait(r, store, limits, reqs, out); err != nil {
		return err
	}
	return next.ServeHTTP(w, r)
}

// collectBodyFields gathers the body fields that the zones' keys and costs
// read, so that a body is parsed once per request for all of them.
func collectBodyFields(zones []*Zone) *keys.BodyFields {
	f := new(keys.BodyFields)
	for _, z := range zones {
		for _, l := range z.limits {
			f.Add(l.keyer.Template())
			if l.Cost != nil {
				f.Add(l.Cost.tmpl)
			}
		}
	}
	return f
}

// badKey answers a request whose key a "missing deny" limit could not
// build: a client error, with a body that says what was wrong.
func (h *Handler) badKey(w http.ResponseWriter, l *Limit, err error) error {
	detail := fmt.Sprintf("rate limit %s needs %s: %v", l.displayName(), l.keyer.Template(), err)
	body, _ := json.Marshal(map[string]any{
		"type":   "about:blank",
		"title":  http.StatusText(http.StatusBadRequest),
		"status": http.StatusBadRequest,
		"detail": detail,
	})
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusBadRequest)
	_, werr := w.Write(body)
	return werr
}

// ErrDenylisted is the error behind a 403 answer to a request on a zone's
// deny list.
var ErrDenylisted = errors.New("refused by a rate_limit deny list")

// refuse answers a request on a zone's deny list.
func (h *Handler) refuse(r *http.Request, repl *caddy.Replacer, z *Zone) error {
	repl.Set(phDenylisted, z.name)
	if z.denyC != nil {
		z.denyC.Inc()
	}
	h.denyLog.Info("request refused by deny list", zap.String("zone", z.name), zap.String("remote_ip", remoteIP(r)), zap.String("client_ip", clientIP(r)))
	return caddyhttp.Error(http.StatusForbidden, ErrDenylisted)
}

// statusClientClosed is the status logged for a client that left while its
// request waited in a queue (nginx's convention; nobody receives it).
const statusClientClosed = 499

// wait holds an admitted request until its slot in every leaky_bucket
// queue it was given one in. A client that leaves first gives back what
// the request took, so its slot goes to the next in line.
func (h *Handler) wait(r *http.Request, store backend.Store, limits []*Limit, reqs []backend.Request, out []algorithms.Result) error {
	var delay int64
	for i, l := range limits {
		if !l.zone.Shadow {
			delay = max(delay, out[i].Delay)
		}
	}
	if delay <= 0 {
		return nil
	}
	timer := time.NewTimer(time.Duration(delay))
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-r.Context().Done():
	}
	if err := store.Refund(context.WithoutCancel(r.Context()), reqs, out); err != nil {
		h.logger.Error("giving back the slot of a request whose client left", zap.Error(err))
	}
	return caddyhttp.Error(statusClientClosed, r.Context().Err())
}

// tightest is the index of the enforcing limit with the least room left,
// whose numbers a client should go by; -1 when every zone is in shadow.
func tightest(limits []*Limit, out []algorithms.Result) int {
	best := -1
	for i, l := range limits {
		if l.zone.Shadow {
			continue
		}
		// Compare the fractions left, in floats: the products of two
		// int64 counts could overflow.
		if best < 0 || float64(out[i].Remaining)*float64(out[best].Limit) < float64(out[best].Remaining)*float64(out[i].Limit) {
			best = i
		}
	}
	return best
}

// deny answers a request that an enforcing zone denied. The zone reported
// is the one that makes the client wait longest, since the request can pass
// only once every zone allows it.
func (h *Handler) deny(w http.ResponseWriter, r *http.Request, repl *caddy.Replacer, limits []*Limit, reqs []backend.Request, out []algorithms.Result) error {
	worst := -1
	for i, l := range limits {
		if l.zone.Shadow || out[i].Allowed {
			continue
		}
		if worst < 0 || later(out[i].RetryAfter, out[worst].RetryAfter) {
			worst = i
		}
	}
	l, res := limits[worst], out[worst]
	wait := time.Duration(res.RetryAfter)
	if res.RetryAfter != algorithms.Never {
		if h.Jitter > 0 {
			wait += time.Duration(min(rand.Float64()*h.Jitter*float64(wait), float64(algorithms.MaxSpan)))
		}
		secs := retryAfterSeconds(wait)
		w.Header().Set("Retry-After", strconv.FormatInt(secs, 10))
		repl.Set(phRetryAfter, secs)
	}
	setPlaceholders(repl, l, res)
	repl.Set(phName, l.zone.name)
	repl.Set(phScope, l.scope)
	repl.Set(phKey, reqs[worst].Key)
	l.metrics.declined()

	h.denyLog.Info("rate limit exceeded", h.logFields(r, l, reqs[worst].Key, int64(wait))...)
	if h.events.ShouldEmit("rate_limit_exceeded") {
		h.events.Emit(h.ctx, "rate_limit_exceeded", map[string]any{
			"zone":      l.zone.name,
			"scope":     l.scope,
			"wait":      wait,
			"remote_ip": remoteIP(r),
		})
	}
	return caddyhttp.Error(http.StatusTooManyRequests, ErrRateLimited)
}

// later orders retry times, Never (cannot ever pass) being the latest.
func later(a, b int64) bool {
	if a == algorithms.Never {
		return b != algorithms.Never
	}
	return b != algorithms.Never && a > b
}

// retryAfterSeconds is the Retry-After value for wait: whole seconds,
// rounded up, at least 1.
func retryAfterSeconds(wait time.Duration) int64 {
	secs := int64((wait + time.Second - 1) / time.Second)
	return max(secs, 1)
}

func setPlaceholders(repl *caddy.Replacer, l *Limit, res algorithms.Result) {
	repl.Set(phZone, l.zone.name)
	repl.Set(phLimit, res.Limit)
	repl.Set(phRemaining, res.Remaining)
	repl.Set(phReset, (res.ResetAfter+int64(time.Second)-1)/int64(time.Second))
}

func (h *Handler) logFields(r *http.Request, l *Limit, key string, wait int64) []zap.Field {
	fields := []zap.Field{
		zap.String("zone", l.zone.name),
		zap.Duration("wait", time.Duration(wait)),
		zap.String("remote_ip", remoteIP(r)),
		zap.String("client_ip", clientIP(r)),
	}
	if l.scope != "" {
		fields = append(fields, zap.String("scope", l.scope))
	}
	if h.LogKey {
		fields = append(fields, zap.String("key", key))
	}
	return fields
}

// clientIP is Caddy's client address for r, which honours trusted_proxies.
func clientIP(r *http.Request) string {
	ip, _ := caddyhttp.GetVar(r.Context(), caddyhttp.ClientIPVarKey).(string)
	return ip
}

func remoteIP(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}
