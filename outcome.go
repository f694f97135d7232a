package sluice

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
)

// outcomeWriter hands the response on as it is written, never buffering
// it (a streamed answer stays streamed), and notes its status: the limits
// that count or reset by the response settle once it is known. It holds
// copies of those limits' requests and decisions, because the request's
// scratch goes back to the pool before the request is handed on.
type outcomeWriter struct {
	caddyhttp.ResponseWriterWrapper
	// status is an int32 so that left and the masks fit beside it: the
	// writer stays in its allocation size class.
	status int32
	left   bool // the client had gone when the status was written
	// counted and reset hold, for the first maskLimits limits, whether
	// count_when and reset_when matched when the status was written: the
	// header fields as the application wrote them, before a handler
	// around this one removes some on their way out (header -Field).
	counted, reset uint8
	charged        uint8         // the same for charge_when (budget.go)
	store          backend.Store // the store that decided
	settle         *settleNotes  // nil unless a limit settles its cost
	// holdUntil, on the handler's clock, is when the first of the
	// request's spend budget reservations expires; 0 without one. hold
	// keeps such a request's call going once its client left (budget.go).
	holdUntil int64
	hold      *budgetHold
	limits    []*Limit
	reqs      []backend.Request
	out       []algorithms.Result
	// Room for the usual one or two such limits, in the same allocation
	// as the writer.
	limitBuf [2]*Limit
	reqBuf   [2]backend.Request
	outBuf   [2]algorithms.Result
	detached detachedContext
}

// detachedContext is context.WithoutCancel's behaviour, kept inside the
// writer: the refund and reset run after the response whether the client
// stayed or not, and WithoutCancel would allocate its context on every
// settled request.
type detachedContext struct{ parent context.Context }

func (detachedContext) Deadline() (time.Time, bool) { return time.Time{}, false }
func (detachedContext) Done() <-chan struct{}       { return nil }
func (detachedContext) Err() error                  { return nil }
func (c *detachedContext) Value(key any) any        { return c.parent.Value(key) }

// watchOutcome returns a writer that settles s's limits that count or
// reset by the response, or nil when the request matched none.
func watchOutcome(w http.ResponseWriter, s *scratch) *outcomeWriter {
	var o *outcomeWriter
	for i, l := range s.limits {
		if l.CountWhen == nil && l.ResetWhen == nil && l.ChargeWhen == nil && l.settle == nil {
			continue
		}
		if o == nil {
			o = newOutcomeWriter(w, s)
			o.limits, o.reqs, o.out = o.limitBuf[:0], o.reqBuf[:0], o.outBuf[:0]
		}
		o.limits = append(o.limits, l)
		o.reqs = append(o.reqs, s.reqs[i])
		o.out = append(o.out, s.out[i])
		// A shadow zone's budget observes: it does not change how the
		// request is handed on.
		if l.ChargeWhen != nil && s.reqs[i].Reserve > 0 && !l.zone.Shadow {
			if until := s.at + s.reqs[i].Reserve; o.holdUntil == 0 || until < o.holdUntil {
				o.holdUntil = until
			}
		}
	}
	return o
}

// WriteHeader notes the first final status: informational answers (103
// Early Hints) come before the real one, while 101 ends the exchange.
func (o *outcomeWriter) WriteHeader(code int) {
	first := o.status == 0 && (code >= 200 || code == http.StatusSwitchingProtocols)
	if first {
		o.note(code)
	}
	o.ResponseWriter.WriteHeader(code)
	if first {
		o.settleChargesEarly()
	}
}

// A body written without WriteHeader goes out as 200.
func (o *outcomeWriter) Write(b []byte) (int, error) {
	o.wrote()
	return o.ResponseWriter.Write(b)
}

func (o *outcomeWriter) ReadFrom(r io.Reader) (int64, error) {
	o.wrote()
	return o.ResponseWriterWrapper.ReadFrom(r)
}

// FlushError lets http.ResponseController flush a streamed response.
func (o *outcomeWriter) FlushError() error {
	o.wrote()
	return http.NewResponseController(o.ResponseWriter).Flush()
}

// Hijack is for the handlers that still assert http.Hijacker.
func (o *outcomeWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	return http.NewResponseController(o.ResponseWriter).Hijack()
}

func (o *outcomeWriter) wrote() {
	if o.status == 0 {
		o.note(http.StatusOK)
		o.settleChargesEarly()
	}
}

// maskLimits is how many limits' matches the writer notes when the status
// is written; the matchers of any further ones see the fields as they are
// once the response is over.
const maskLimits = 8

// note records the final status, whether the client had left, and which
// matchers match the response as it is about to go out.
func (o *outcomeWriter) note(code int) {
	o.status = int32(code) // WriteHeader panics on codes past 999
	o.left = o.detached.parent != nil && o.detached.parent.Err() != nil
	hdr := o.Header()
	o.noteSettle(hdr)
	for i, l := range o.limits[:min(len(o.limits), maskLimits)] {
		if l.CountWhen != nil && l.CountWhen.Match(code, hdr) {
			o.counted |= 1 << i
		}
		if l.ResetWhen != nil && l.ResetWhen.Match(code, hdr) {
			o.reset |= 1 << i
		}
		if l.ChargeWhen != nil && l.ChargeWhen.Match(code, hdr) {
			o.charged |= 1 << i
		}
	}
}

// matches reports whether m of the i-th limit matches the response:
// as noted when the status was written, else now.
func (o *outcomeWriter) matches(m *caddyhttp.ResponseMatcher, noted uint8, i, status int) bool {
	if m == nil {
		return false
	}
	if o.status != 0 && i < maskLimits {
		return noted&(1<<i) != 0
	}
	return m.Match(status, o.Header())
}

// finalStatus is the status the client gets: the one written, else the
// status of the error the handlers after this one returned (the error
// routes answer with it, as a reverse proxy's 502), else 200.
func (o *outcomeWriter) finalStatus(err error) int {
	if o.status != 0 {
		return int(o.status)
	}
	if err == nil {
		return http.StatusOK
	}
	var he caddyhttp.HandlerError
	if errors.As(err, &he) && he.StatusCode != 0 {
		return he.StatusCode
	}
	return http.StatusInternalServerError
}

// serveOutcome hands the request on through o, then settles its limits.
func (h *Handler) serveOutcome(o *outcomeWriter, r *http.Request, next caddyhttp.Handler) error {
	o.detached.parent = r.Context()
	var err error
	if o.holdUntil != 0 {
		err = h.serveHeld(o, r, next)
	} else {
		err = next.ServeHTTP(o, r)
	}
	if o.left || (o.status == 0 && r.Context().Err() != nil) {
		// The client left before the status was written: the
		// application may have done the work all the same (sent the
		// message, checked the password), so the unit stays taken and
		// nothing is cleared. The 499 the proxy writes for the cancelled
		// request is not an outcome. A spend budget's call went on
		// without the client: its status settles the reservation, and
		// without one the reservation is kept until it expires
		// (budget.go).
		h.settleLeftCharges(o)
		return err
	}
	h.settle(o, r, o.finalStatus(err))
	return err
}

// settle gives back the units of the limits whose count_when the response
// does not match, and clears the keys of those whose reset_when it does.
// It runs after the response, so a client that left does not stop it.
func (h *Handler) settle(o *outcomeWriter, r *http.Request, status int) {
	h.settleCharges(o, status)
	ctx := &o.detached
	n := 0
	for i, l := range o.limits {
		switch {
		case o.matches(l.ResetWhen, o.reset, i, status):
			if err := h.resetKey(ctx, o.store, l, o.reqs[i].Key); err != nil {
				h.logger.Error("clearing a key after a response that resets it", zap.String("zone", l.zone.name), zap.String("scope", l.scope), zap.Error(err))
			}
		case l.CountWhen != nil && !o.matches(l.CountWhen, o.counted, i, status):
			o.reqs[n], o.out[n] = o.reqs[i], o.out[i]
			n++
		case l.settle != nil:
			h.settleCost(o, r, i, status)
		}
	}
	if n == 0 {
		return
	}
	if err := o.store.Refund(ctx, o.reqs[:n], o.out[:n]); err != nil {
		h.logger.Error("giving back the units of a response that does not count", zap.Error(err))
	}
}

// resetKey clears key in l, then has the other sites of the zone forget
// any denial of it they remember, as a reset through the admin API does.
func (h *Handler) resetKey(ctx context.Context, store backend.Store, l *Limit, key string) error {
	admin, ok := store.(backend.Admin)
	if !ok {
		return fmt.Errorf("the %T backend cannot clear keys", store)
	}
	if err := admin.Reset(ctx, l.handle, key); err != nil {
		return err
	}
	othersForget(zoneUse{z: l.zone, h: h}, l.scope, key)
	return nil
}

// provisionOutcome notes whether l settles by the response, and checks
// that the store can clear a key for reset_when.
func (h *Handler) provisionOutcome(l *Limit) error {
	if l.CountWhen == nil && l.ResetWhen == nil && l.ChargeWhen == nil && l.settle == nil {
		return nil
	}
	h.outcomes = true
	h.budgets = h.budgets || l.ChargeWhen != nil
	if _, ok := h.store.(backend.Reserver); l.ChargeWhen != nil && !ok {
		return fmt.Errorf("zone %q: charge_when: the %T backend cannot hold reservations", l.zone.name, h.store)
	}
	if err := h.provisionSettle(l); err != nil {
		return err
	}
	if _, ok := h.store.(backend.Admin); l.ResetWhen != nil && !ok {
		return fmt.Errorf("zone %q: reset_when: the %T backend cannot clear keys", l.zone.name, h.store)
	}
	return nil
}

// checkOutcome validates count_when and reset_when.
func (l *Limit) checkOutcome() error {
	for _, m := range []struct {
		opt string
		rm  *caddyhttp.ResponseMatcher
	}{{"count_when", l.CountWhen}, {"reset_when", l.ResetWhen}, {"charge_when", l.ChargeWhen}} {
		switch {
		case m.rm == nil:
			continue
		case m.rm.StatusCode == nil && len(m.rm.Headers) == 0:
			return fmt.Errorf("%s: give a status or a header to match, or every response would match", m.opt)
		case m.rm.StatusCode != nil && len(m.rm.StatusCode) == 0:
			return fmt.Errorf("%s: status needs at least one code", m.opt)
		}
		for _, c := range m.rm.StatusCode {
			if (c < 1 || c > 5) && (c < 100 || c > 599) {
				return fmt.Errorf("%s: status %d is neither a code from 100 to 599 nor a class from 1xx to 5xx", m.opt, c)
			}
		}
	}
	if l.Lease > 0 && (l.CountWhen != nil || l.ResetWhen != nil) {
		return fmt.Errorf("count_when and reset_when cannot be used with lease: units spent locally from a lease are not the shared state the response would give back or clear")
	}
	if l.CountWhen != nil && l.MaxDelay > 0 {
		return fmt.Errorf("count_when cannot be used with max_delay: a queued request's slot is spent once it leaves the queue, and cannot be given back")
	}
	return nil
}

// parseResponseMatcher reads `count_when` or `reset_when` in Caddy's
// response matcher syntax, on one line or as a block:
//
//	count_when status 401 403
//	reset_when {
//	    status 2xx
//	    header X-Login ok
//	}
func parseResponseMatcher(d *caddyfile.Dispenser, where, opt string) (*caddyhttp.ResponseMatcher, error) {
	m := map[string]caddyhttp.ResponseMatcher{}
	if err := caddyhttp.ParseNamedResponseMatcher(d.NewFromNextSegment(), m); err != nil {
		return nil, fmt.Errorf("%s: %s: %w", where, opt, err)
	}
	rm := m[opt]
	return &rm, nil
}
