package sluice

import (
	"errors"
	"net/http"
	"slices"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/sluicehq/sluice/backend"
)

// Fail policies: what a limit does when its backend cannot decide.
const (
	FailOpen   = "open"
	FailClosed = "closed"
	FailLocal  = "local"
)

// ErrBackendUnavailable is the error behind a 503 answer of a zone that
// fails closed while its backend is unavailable.
var ErrBackendUnavailable = errors.New("rate limit backend unavailable")

func validFail(p string) bool {
	return p == "" || p == FailOpen || p == FailClosed || p == FailLocal
}

// provisionFailover logs each limit's fail policy when the backend can
// fail (a memory store decides in-process and cannot), and registers the
// limits that fail "local" with an in-process memory store, so they limit
// on their own while the backend is away.
func (h *plan) provisionFailover(ctx caddy.Context) error {
	if m, ok := h.store.(caddy.Module); ok && m.CaddyModule().ID == backend.Namespace+".memory" {
		return nil
	}
	for _, z := range h.zones {
		for _, l := range z.keyed {
			// A limit of shared concurrency slots alone fails over in
			// takeSlot, with the slots of this instance as its local store.
			if l.concOnly() && l.shared != nil {
				h.logger.Info("rate limit zone's policy when its backend fails", zap.String("zone", z.name), zap.String("scope", l.scope), zap.String("fail", l.fail))
				if h.metrics {
					l.failC = metrics.failures.WithLabelValues(z.name, l.scope, l.fail)
				}
			}
		}
		for _, l := range z.limits {
			h.logger.Info("rate limit zone's policy when its backend fails", zap.String("zone", z.name), zap.String("scope", l.scope), zap.String("fail", l.fail))
			if h.metrics {
				l.failC = metrics.failures.WithLabelValues(z.name, l.scope, l.fail)
			}
			if l.fail != FailLocal {
				continue
			}
			if h.local == nil {
				mod, err := ctx.LoadModuleByID(backend.Namespace+".memory", nil)
				if err != nil {
					return err
				}
				h.local = mod.(backend.Store)
				h.local.(backend.Configurable).Configure(h.setup())
			}
			// The fallback's counts are this instance's alone: a scope
			// name no config can spell (scopes hold no "/") keeps them
			// apart from a memory-backed zone of the same name.
			cfg := l.cfg
			cfg.Scope = "/fallback/" + cfg.Scope
			cfg.Lease = 0 // its decisions are local already
			var err error
			if l.local, err = h.local.Register(cfg); err != nil {
				return err
			}
			if err := l.adapt.applyLocal(); err != nil {
				return err
			}
		}
	}
	return nil
}

// failover decides the request of s, whose backend failed with err, by
// the fail policies of the limits it matched. One closed limit makes the
// whole request 503: that zone promised never to admit unchecked; its
// refusal is returned. Otherwise the local limits decide (all or nothing,
// on the in-process store) and the open ones admit. Shadow limits never
// deny, whatever their policy. s keeps the requests and limits that the
// local store decided (possibly none), compacted in place, with its
// decision.
func (h *plan) failover(r *http.Request, s *requestState, err error) (*refusal, error) {
	if !errors.Is(err, backend.ErrUnavailable) {
		return nil, caddyhttp.Error(http.StatusInternalServerError, err)
	}
	closed := false
	for _, l := range s.limits {
		if l.failC != nil {
			l.failC.Inc()
		}
		closed = closed || l.fail == FailClosed && !l.zone.Shadow
	}
	if closed {
		var wait time.Duration
		if ue, ok := errors.AsType[*backend.UnavailableError](err); ok {
			wait = ue.RetryAfter
		}
		l := s.limits[slices.IndexFunc(s.limits, func(l *limit) bool { return l.fail == FailClosed && !l.zone.Shadow })]
		return s.refuse(refusal{reason: reasonUnavailable, zone: l.zone, limit: l, retryAfter: retryAfterSeconds(wait), wait: wait, detail: err}), nil
	}
	h.warnFailure("rate limit backend unavailable: applying the zones' fail policy", r, s.limits, err)
	n := 0
	for i, l := range s.limits {
		if l.fail == FailLocal && l.local != nil {
			s.reqs[n], s.limits[n] = s.reqs[i], l
			s.reqs[n].Limit = l.local
			n++
		}
	}
	s.reqs, s.limits, s.out = s.reqs[:n], s.limits[:n], s.out[:n]
	s.allowed, s.store = true, h.local
	if n == 0 {
		return nil, nil
	}
	allowed, err := h.local.Decide(r.Context(), s.reqs, s.out)
	if err != nil {
		return nil, caddyhttp.Error(http.StatusInternalServerError, err)
	}
	s.allowed = allowed
	return nil, nil
}

// warnFailure logs a request decided by the fail policies. Its fields are
// built only when the sampler keeps the line: while a backend is down,
// every request comes here.
func (h *plan) warnFailure(msg string, r *http.Request, limits []*limit, err error) {
	ce := h.denyLog.Check(zapcore.WarnLevel, msg)
	if ce == nil {
		return
	}
	names := make([]string, len(limits))
	for i, l := range limits {
		names[i] = l.displayName() + ":" + l.fail
	}
	ce.Write(zap.Strings("limits", names), zap.String("client_ip", clientIP(r)), zap.Error(err))
}
