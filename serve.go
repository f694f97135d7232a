package sluice

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/internal/keys"
	"github.com/sluicehq/sluice/internal/tarpit"
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

// ServeHTTP decides the request against every zone it matches, once and all
// or nothing, then answers 429 or passes it on. It walks the request's
// phases in order, each returning the request's refusal (nil to go on) or
// an error for Caddy:
//
//   - gate: load shedding, before anything is counted;
//   - decide: each zone's allow and deny lists and keys, in the zones'
//     order, then one store decision for every limit;
//   - hold: a denial in the tarpit, an admitted request in its leaky_bucket
//     queues;
//   - slots: the concurrency slots, taken once the rates admit the request;
//   - observe: the admitted request is counted in its shedding group and
//     handed on, through the response watcher when a feature needs it.
//
// A refusal from any phase is written by respond, the one writer.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	return h.plan.serve(w, r, next)
}

// serve is ServeHTTP on the compiled config.
func (h *plan) serve(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	var vars map[string]any
	var counted bool
	if h.shed != nil {
		var f *refusal
		if vars, counted, f = h.gate(r); f != nil {
			return h.respond(w, r, f)
		}
	}
	s := getRequestState()
	f, err := h.decide(w, r, s)
	// An admitted request is held only by queues.
	if f == nil && err == nil && s.decided && (!s.allowed || h.queues) {
		f, err = h.hold(r, s)
	}
	if f == nil && err == nil && len(s.conc) > 0 {
		var held *heldSlots
		held, f, err = h.acquire(r, s)
		// Deferred, so a panic, an error or a hijacked connection frees
		// the slots too, once the handlers after this one return.
		defer held.release()
	}
	if f != nil {
		err = h.respond(w, r, f)
	}
	if len(s.shadow) > 0 {
		// A request refused before its decision has its shadow zones'
		// notes reported after its refusal.
		h.reportShadow(r, s, false)
	}
	pass := f == nil && err == nil
	var x *watcher
	if pass && h.watching {
		x = newWatcher(h, w, s, h.timedGroup(counted))
	}
	// The request state goes back before next runs: a slow upstream must
	// not hold one per request in flight.
	s.release()
	switch {
	case !pass:
		return err
	case x == nil && h.shed == nil: // nothing observes the request
		return next.ServeHTTP(w, r)
	}
	return h.observe(w, r, next, x, vars, counted)
}

// gate returns the refusal of a request shed for load: a shed request
// takes no unit from any rate limit. It runs only with shed, and returns
// r's vars and whether a handler r passed through before counts it in
// the group already.
func (h *plan) gate(r *http.Request) (vars map[string]any, counted bool, f *refusal) {
	vars, counted = h.shedCounted(r)
	if h.shedding(counted) {
		return vars, counted, h.shedRefusal
	}
	return vars, counted, nil
}

// decide decides r: a store request per limit of each zone it matches
// (collect), one decision for all of them, and, when it is admitted, the
// placeholders and rate limit fields of the decision. It returns the
// refusal of a zone that refuses r before anything is counted, or of a
// limit that fails closed; a denial is refused once held (hold).
func (h *plan) decide(w http.ResponseWriter, r *http.Request, s *requestState) (*refusal, error) {
	repl := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	if f, err := h.collect(r, repl, s); f != nil || err != nil {
		return f, err
	}
	if len(s.reqs) == 0 {
		if h.shadows {
			h.reportShadow(r, s, false)
		}
		return nil, nil
	}
	admitted, f, err := h.decideStore(r, s)
	if !admitted {
		return f, err
	}
	if len(s.limits) > 1 || h.shadows {
		if i := tightest(s.limits, s.out); i >= 0 {
			setPlaceholders(repl, s.limits[i], s.out[i])
		}
	} else { // the one limit, enforcing
		setPlaceholders(repl, s.limits[0], s.out[0])
	}
	for _, step := range h.admitted {
		step(w, s)
	}
	return nil, nil
}

// countNear counts the limits that admitted s near their limit: a step
// of an admitted request with metrics.
func countNear(_ http.ResponseWriter, s *requestState) {
	for i, l := range s.limits {
		if s.out[i].Allowed {
			l.metrics.near(s.out[i])
		}
	}
}

// sendHeaders sets the rate limit fields of an admitted request: a step
// when some zone sends them.
func sendHeaders(w http.ResponseWriter, s *requestState) {
	writeHeaders(w, s.limits, s.reqs, s.out)
}

// hold holds a decided request (s.decided) as its decision says. A denial
// waits in the tarpit first, then its refusal is made: the tarpit delays
// the whole answer, whose waits then count from when it is sent, and a
// denial is counted when it is given. An admitted request, held only when
// some limit queues (h.queues), waits for its slot in every leaky_bucket
// queue that gave it one.
func (h *plan) hold(r *http.Request, s *requestState) (*refusal, error) {
	if !s.allowed {
		if held := h.holdInTarpit(r); held > 0 {
			tarpit.Elapse(s.out, held)
		}
		return h.deny(r, s), nil
	}
	return nil, h.wait(r, s.store, s.limits, s.reqs, s.out)
}

// observe hands an admitted request on, counted in its shedding group
// while it is served, through the watcher x when some feature needs its
// response (nil when none does).
func (h *plan) observe(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, x *watcher, vars map[string]any, counted bool) error {
	if g := h.shed; g != nil && !counted {
		// Counted only once admitted: a request refused or held in a
		// tarpit loads nothing behind this handler.
		// The request's var marks it counted (groupMark).
		m := enterGroup(g, vars, x)
		defer m.exit()
	}
	if x != nil {
		return x.serve(r, next)
	}
	return next.ServeHTTP(w, r)
}

// collect appends to s a store request for each limit of each zone r
// matches. It returns the refusal of an enforcing zone that refuses the
// request before anything is counted: its deny list, a key that "missing
// deny" requires, or a cost that cannot be read; and the error of a
// matcher that fails. A shadow zone's refusals are noted in s instead.
func (h *plan) collect(r *http.Request, repl *caddy.Replacer, s *requestState) (*refusal, error) {
	for _, z := range h.zones {
		if z.screened {
			skip, f, err := z.screen(r, s)
			if f != nil || err != nil {
				return f, err
			}
			if skip {
				continue
			}
		}
		for _, l := range z.keyed {
			if f := h.collectLimit(r, repl, s, l); f != nil {
				return f, nil
			}
		}
	}
	return nil, nil
}

// screen tells whether zone z skips r: r matches none of its matchers, or
// is on its allow list. It returns the refusal of r on the deny list of
// an enforcing zone (a shadow zone's is noted in s) and the error of a
// matcher that fails.
func (z *zone) screen(r *http.Request, s *requestState) (skip bool, f *refusal, err error) {
	if len(z.matchers) > 0 {
		ok, err := z.matchers.AnyMatchWithError(r)
		if err != nil || !ok {
			return true, nil, err
		}
	}
	switch listed, err := z.listed(r); {
	case err != nil:
		return true, nil, err
	case listed == listDeny && z.Shadow:
		// Noted, and limited like any other request.
		s.note(shadowListed, z, nil, nil)
	case listed == listDeny:
		return true, s.refuse(refusal{reason: reasonDenylisted, zone: z, retryAfter: -1}), nil
	case listed == listAllow:
		return true, nil, nil
	}
	return false, nil, nil
}

// collectLimit appends the store request of limit l, unless l skips r or
// refuses it. A limit without extras (compile) only builds its key.
func (h *plan) collectLimit(r *http.Request, repl *caddy.Replacer, s *requestState, l *limit) *refusal {
	if l.extras {
		return h.collectExtras(r, repl, s, l)
	}
	key, err := l.keyer.Key(r, repl, s.body)
	if err != nil {
		if skip, f := h.missingKey(repl, s, l, err); skip || f != nil {
			return f
		}
	}
	s.reqs = append(s.reqs, backend.Request{Limit: l.handle, Key: key, Cost: l.cost, Shadow: l.zone.Shadow})
	s.limits = append(s.limits, l)
	return nil
}

// missingKey handles a key of l that err says cannot be built: it tells
// whether l skips the request, or returns its refusal. Otherwise the
// request goes on under the shared key.
func (h *plan) missingKey(repl *caddy.Replacer, s *requestState, l *limit, err error) (skip bool, f *refusal) {
	// The key's placeholders are looked at only here, so a working config
	// pays nothing for them.
	l.warnEmpty(h.logger, repl, l.keyByHandler, "key")
	l.warnEmpty(h.logger, repl, l.costByHandler, "cost")
	l.metrics.missing(l.missing)
	z := l.zone
	switch {
	case l.missing == MissingSkip && errors.Is(err, keys.ErrAbsent):
		return true, nil
	case l.missing == MissingSkip:
		// Only an absent value is skipped. A value given twice, a body
		// that cannot be read or a value a normalizer refuses may still
		// name someone to the application: skipping them would let a
		// client step around the limit. They share one quota instead.
	case l.missing == MissingDeny && z.Shadow:
		s.note(shadowMissingKey, z, l, err)
	case l.missing == MissingDeny:
		return false, s.refuse(refusal{reason: reasonMissingKey, zone: z, limit: l, retryAfter: -1, detail: err})
	}
	return false, nil
}

// collectExtras is collectLimit for a limit with extras: tiers, a body to
// read, a cost to evaluate, adaptive, concurrency or a budget.
func (h *plan) collectExtras(r *http.Request, repl *caddy.Replacer, s *requestState, l *limit) *refusal {
	if l.tiers != nil {
		tier, empty := l.tiers.pick(r, repl)
		if empty {
			l.warnEmpty(h.logger, repl, l.tiers.byHandler, "tier")
		}
		l = tier
	}
	z := l.zone
	if s.body == nil && (l.keyer.NeedsBody() || l.Cost.needsBody()) {
		s.body = keys.ReadBody(r, h.bodyLimit, h.bodyFields)
	}
	key, err := l.keyer.Key(r, repl, s.body)
	if err != nil {
		if skip, f := h.missingKey(repl, s, l, err); skip || f != nil {
			return f
		}
	} else {
		l.warnEmpty(h.logger, repl, l.costByHandler, "cost")
	}
	if l.adapt != nil {
		s.adapt = append(s.adapt, l.adapt)
	}
	if l.conc != nil || l.shared != nil {
		s.conc = append(s.conc, concReq{l, key})
		if l.concOnly() {
			return nil
		}
	}
	cost, err := l.Cost.eval(r, repl, s.body)
	if err != nil {
		if z.Shadow {
			// Nothing can be counted for the request: it is noted and
			// this limit is left out of the decision.
			s.note(shadowBadCost, z, l, err)
			return nil
		}
		return s.refuse(refusal{reason: reasonBadCost, zone: z, limit: l, retryAfter: -1, detail: err})
	}
	// An estimate below the floor takes the floor (cost_min).
	cost = max(cost, l.CostMin)
	s.reqs = append(s.reqs, l.request(key, cost))
	s.limits = append(s.limits, l)
	return nil
}

// decideStore asks the store for one decision on every request in s, filling
// s.out, s.allowed and s.store (the store that decided); when the backend
// is unavailable, the limits' fail policies decide instead (and s keeps
// only the limits the local store decided). Once every limit's decision
// is in s.out (s.limits[i] got s.out[i]) it sets s.decided, and reports
// the shadow zones. It tells whether the request is admitted, or returns
// the refusal of a limit that fails closed.
func (h *plan) decideStore(r *http.Request, s *requestState) (admitted bool, f *refusal, err error) {
	s.out = slices.Grow(s.out[:0], len(s.reqs))[:len(s.reqs)]
	var start int64
	if h.metrics || h.budgets {
		start = h.now()
	}
	s.at = start
	allowed, err := h.store.Decide(r.Context(), s.reqs, s.out)
	if h.fleet != nil && err == nil && allowed {
		allowed = h.fleet.check(r.Context(), h.store, s.limits, s.reqs, s.out, h.now())
	}
	s.allowed, s.store = allowed, h.store
	if err != nil {
		f, err := h.failover(r, s, fmt.Errorf("rate_limit: %w", err))
		switch {
		case f != nil:
			s.store = nil
			return false, f, nil
		case err != nil:
			s.store = nil
			h.reportShadow(r, s, false)
			return false, nil, err
		case len(s.reqs) == 0: // no limit decides locally
			if h.shadows {
				h.reportShadow(r, s, true)
			}
			return false, nil, nil
		}
	}
	if h.metrics {
		elapsed := float64(h.now()-start) / 1e9
		for _, l := range s.limits {
			l.metrics.observe(elapsed)
		}
	}
	if h.shadows {
		h.reportShadow(r, s, true)
	}
	s.decided = true
	return s.allowed, nil, nil
}

// What a shadow zone would have refused a request for.
type shadowKind uint8

const (
	shadowListed shadowKind = iota
	shadowMissingKey
	shadowBadCost
)

// shadowNote is one refusal of a shadow zone, noted while the request's
// limits are collected.
type shadowNote struct {
	kind shadowKind
	zone *zone
	l    *limit // nil for the deny list, which is the zone's
	err  error
}

func (s *requestState) note(kind shadowKind, z *zone, l *limit, err error) {
	s.shadow = append(s.shadow, shadowNote{kind: kind, zone: z, l: l, err: err})
}

// reportShadow logs and counts, in one place, what the request's shadow
// zones would have refused: noted while collecting (a deny list, a missing
// key, a bad cost), then emptied, and, once the request is decided, a rate
// exceeded.
func (h *plan) reportShadow(r *http.Request, s *requestState, decided bool) {
	for _, n := range s.shadow {
		switch n.kind {
		case shadowListed:
			if n.zone.denyC != nil {
				n.zone.denyC.Inc()
			}
			if ce := h.denyLog.Check(zapcore.InfoLevel, "request would be refused by deny list (shadow zone)"); ce != nil {
				ce.Write(zap.String("zone", n.zone.name), zap.String("client_ip", clientIP(r)))
			}
		case shadowMissingKey:
			if ce := h.denyLog.Check(zapcore.InfoLevel, "request would be refused for a missing key (shadow zone)"); ce != nil {
				ce.Write(zap.String("zone", n.zone.name), zap.String("scope", n.l.scope), zap.Error(n.err))
			}
		case shadowBadCost:
			if ce := h.denyLog.Check(zapcore.InfoLevel, "request would be refused for its cost (shadow zone)"); ce != nil {
				ce.Write(zap.String("zone", n.zone.name), zap.String("scope", n.l.scope), zap.Error(n.err))
			}
		}
	}
	s.shadow = s.shadow[:0]
	if !decided {
		return
	}
	for i, l := range s.limits {
		if l.zone.Shadow && !s.out[i].Allowed {
			l.metrics.shadowDeny()
			if ce := h.denyLog.Check(zapcore.InfoLevel, "rate limit would be exceeded (shadow zone)"); ce != nil {
				ce.Write(h.logFields(r, l, s.reqs[i].Key, s.out[i].RetryAfter)...)
			}
		}
	}
}

// collectBodyFields gathers the body fields that the zones' keys and costs
// read, so that a body is parsed once per request for all of them.
func collectBodyFields(zones []*zone) *keys.BodyFields {
	f := new(keys.BodyFields)
	for _, z := range zones {
		for _, l := range z.keyed {
			f.Add(l.keyer.Template())
			if l.Cost != nil {
				f.Add(l.Cost.tmpl)
			}
		}
	}
	return f
}

// ErrDenylisted is the error behind a 403 answer to a request on a zone's
// deny list.
var ErrDenylisted = errors.New("refused by a rate_limit deny list")

// statusClientClosed is the status logged for a client that left while its
// request waited in a queue (nginx's convention; nobody receives it).
const statusClientClosed = 499

// wait holds an admitted request until its slot in every leaky_bucket
// queue it was given one in. A client that leaves first gives back what
// the request took, so its slot goes to the next in line.
func (h *plan) wait(r *http.Request, store backend.Store, limits []*limit, reqs []backend.Request, out []algorithms.Result) error {
	var delay int64
	for i, l := range limits {
		if !l.zone.Shadow {
			delay = max(delay, out[i].Delay)
		}
	}
	if delay <= 0 {
		return nil
	}
	newTimer := h.newTimer
	if newTimer == nil {
		newTimer = systemTimer
	}
	fired, stop := newTimer(time.Duration(delay))
	defer stop()
	var err error
	outsideGroups(r, func() {
		select {
		case <-fired:
			return
		case <-r.Context().Done():
		}
		if rerr := store.Refund(context.WithoutCancel(r.Context()), reqs, out); rerr != nil {
			h.logger.Error("giving back the slot of a request whose client left", zap.Error(rerr))
		}
		err = caddyhttp.Error(statusClientClosed, r.Context().Err())
	})
	return err
}

func systemTimer(d time.Duration) (<-chan time.Time, func() bool) {
	t := time.NewTimer(d)
	return t.C, t.Stop
}

// tightest is the index of the enforcing limit with the least room left,
// whose numbers a client should go by; -1 when every zone is in shadow.
func tightest(limits []*limit, out []algorithms.Result) int {
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

// setPlaceholders sets the numbers of l's decision res. The values come
// from tables made at provision (intValue, the limit's boxed names), so a
// decided request allocates nothing for them in the common case.
func setPlaceholders(repl *caddy.Replacer, l *limit, res algorithms.Result) {
	repl.Set(phZone, l.zoneName)
	repl.Set(phLimit, intValue(res.Limit))
	repl.Set(phRemaining, intValue(res.Remaining))
	repl.Set(phReset, intValue((res.ResetAfter+int64(time.Second)-1)/int64(time.Second)))
}

func (h *plan) logFields(r *http.Request, l *limit, key string, wait int64) []zap.Field {
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

// request is the store request of key at cost: with a reservation for a
// spend budget, whose token is drawn at random so that no two requests
// (of any Caddy sharing the store) name one reservation.
func (l *limit) request(key string, cost int64) backend.Request {
	r := backend.Request{Limit: l.handle, Key: key, Cost: cost, Shadow: l.zone.Shadow}
	if l.budget.reserve > 0 {
		r.Reserve, r.Token = l.budget.reserve, rand.Uint64()
	}
	return r
}
