package sluice

import (
	"fmt"
	"net/http"
	"net/textproto"
	"strings"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/internal/keys"
)

// settler reads a limit's real cost from the response: a response header
// field, a trailer, or any other placeholder once the response is over.
type settler struct {
	expr string // as configured, for messages
	// field is the canonical name of a response field read by Sluice
	// itself, "" for another placeholder (name).
	field       string
	trailer     string // http.TrailerPrefix + field, where a proxy puts trailers
	trailerOnly bool
	name        string
	// warnAt is when a missing or unreadable value was last logged;
	// ignored counts those since.
	warnAt  atomic.Int64
	ignored atomic.Int64
}

// Response placeholders Sluice reads itself: the header placeholder of
// Caddy's replacer reads the outermost writer's fields, which a handler
// around this one may have changed since (a deferred `header -Field`
// removes the field as the status is written), and it never sees a
// trailer.
const (
	phRespHeader  = "http.response.header."
	phRespTrailer = "http.response.trailer."
)

// settleWarnGap is the least time between two log lines about one limit's
// unreadable settle values: a misconfigured upstream must not write a line
// per request.
const settleWarnGap = time.Minute

// parseSettle reads the settle option: one placeholder.
func parseSettle(expr string) (*settler, error) {
	name, open := strings.CutPrefix(expr, "{")
	name, closed := strings.CutSuffix(name, "}")
	if !open || !closed || name == "" || strings.ContainsAny(name, "{} ") {
		return nil, fmt.Errorf("settle must be one placeholder such as {http.response.header.X-Tokens-Used}, got %q", expr)
	}
	s := &settler{expr: expr, name: name}
	for _, p := range []string{phRespHeader, phRespTrailer} {
		if f, ok := strings.CutPrefix(name, p); ok {
			if f == "" || strings.ContainsAny(f, " :\t") {
				return nil, fmt.Errorf("settle: %q names no field", expr)
			}
			s.field = textproto.CanonicalMIMEHeaderKey(f)
			s.trailer = http.TrailerPrefix + s.field
			s.trailerOnly = p == phRespTrailer
		}
	}
	if strings.HasPrefix(name, "http.request.") {
		return nil, fmt.Errorf("settle: %q reads the request, which the cost already does: settle reads the response", expr)
	}
	if err := keys.CheckPlaceholder(name); err != nil {
		return nil, fmt.Errorf("settle: %v", err)
	}
	return s, nil
}

// checkSettle validates settle with the options it cannot go with, for
// the limit's canonical algorithm alg.
func (l *Limit) checkSettle(alg string) error {
	if l.Settle == "" {
		return nil
	}
	if _, err := parseSettle(l.Settle); err != nil {
		return optionErr("settle", err)
	}
	switch {
	case l.concOnly():
		return optionErrorf("settle", "settle needs a rate (max_events and window): a limit of concurrency alone has no cost to settle")
	case l.Lease > 0 && alg == algorithms.NameSlidingWindow:
		return optionErrorf("settle", "settle cannot be used with lease on a sliding_window: a request spent from a lease has no event of its own in the shared log to settle (use token_bucket, gcra or a window counter, or remove lease)")
	case l.MaxDelay > 0:
		return optionErrorf("settle", "settle cannot be used with max_delay: a queued request's slot is spent once it leaves the queue")
	}
	return nil
}

// provisionSettle checks that the store can settle.
func (h *plan) provisionSettle(l *limit) error {
	if l.settle == nil {
		return nil
	}
	if _, ok := h.store.(backend.Settler); !ok {
		return fmt.Errorf("zone %q: settle: the %T backend cannot settle a cost after the response", l.zone.name, h.store)
	}
	return nil
}

// parseSettleValue reads a whole number of ASCII digits (spaces around it
// allowed), at most algorithms.MaxSettle: a sign, a fraction, an exponent,
// a list or a number beyond any limit is not a count a limit can trust.
func parseSettleValue(v string) (int64, bool) {
	v = strings.Trim(v, " \t")
	if v == "" || len(v) > 16 {
		return 0, false
	}
	var n int64
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	return n, n <= algorithms.MaxSettle
}

// settleCost settles the i-th limit of o at the real cost the response
// gives, or keeps the estimate (and says so in the log, at most once a
// minute per limit) when a successful response gives none it can trust.
func (o *watcher) settleCost(r *http.Request, i, status int) {
	h := o.h
	l := o.limits[i]
	if !o.out[i].Allowed {
		return // a shadow request that was not taken
	}
	n, why, ok := o.actual(r, l, i)
	if !ok {
		if status >= 200 && status < 300 {
			h.warnSettle(l, why)
		}
		return
	}
	if n == o.reqs[i].Cost {
		return
	}
	// The store was checked at provision; the in-process store that
	// decides "local" limits while Redis is away settles too.
	st, ok := o.store.(backend.Settler)
	if !ok {
		return
	}
	o.settle.actual[0] = n
	if err := st.Settle(&o.detached, o.reqs[i:i+1], o.out[i:i+1], o.settle.actual[:]); err != nil {
		h.logger.Error("settling a cost after the response", zap.String("zone", l.zone.name), zap.String("scope", l.scope), zap.Error(err))
	}
}

// warnSettle logs that a response gave no usable real cost, at most once
// per settleWarnGap per limit, with how many responses were kept at their
// estimate since the last line.
func (h *plan) warnSettle(l *limit, why string) {
	s := l.settle
	s.ignored.Add(1)
	now := h.now()
	last := s.warnAt.Load()
	if last != 0 && now-last < int64(settleWarnGap) || !s.warnAt.CompareAndSwap(last, now) {
		return
	}
	h.logger.Warn("a response gave no real cost to settle: the estimate stays charged",
		zap.String("zone", l.zone.name), zap.String("scope", l.scope), zap.String("settle", s.expr),
		zap.String("value", why), zap.Int64("responses", s.ignored.Swap(0)))
}
