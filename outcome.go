package sluice

import (
	"context"
	"fmt"
	"net/http"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/sluicehq/sluice/backend"
)

// serveOutcome hands the request on through o, then settles its limits.
func (o *watcher) serveOutcome(r *http.Request, next caddyhttp.Handler) error {
	o.detached.parent = r.Context()
	var err error
	if o.holdUntil != 0 {
		err = o.serveHeld(r, next)
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
		o.settleLeftCharges()
		return err
	}
	o.settleOutcome(r, o.finalStatus(err))
	return err
}

// settleOutcome gives back the units of the limits whose count_when the
// response does not match, and clears the keys of those whose reset_when
// it does. It runs after the response, so a client that left does not
// stop it.
func (o *watcher) settleOutcome(r *http.Request, status int) {
	h := o.h
	o.settleCharges(status)
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
			o.settleCost(r, i, status)
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
func (h *plan) resetKey(ctx context.Context, store backend.Store, l *limit, key string) error {
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
func (h *plan) provisionOutcome(l *limit) error {
	if !l.byResponse() {
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
			return optionErrorf(m.opt, "%s: give a status or a header to match, or every response would match", m.opt)
		case m.rm.StatusCode != nil && len(m.rm.StatusCode) == 0:
			return optionErrorf(m.opt, "%s: status needs at least one code", m.opt)
		}
		for _, c := range m.rm.StatusCode {
			if (c < 1 || c > 5) && (c < 100 || c > 599) {
				return optionErrorf(m.opt, "%s: status %d is neither a code from 100 to 599 nor a class from 1xx to 5xx", m.opt, c)
			}
		}
	}
	if l.Lease > 0 && (l.CountWhen != nil || l.ResetWhen != nil) {
		return optionErrorf("count_when", "count_when and reset_when cannot be used with lease: units spent locally from a lease are not the shared state the response would give back or clear")
	}
	if l.CountWhen != nil && l.MaxDelay > 0 {
		return optionErrorf("count_when", "count_when cannot be used with max_delay: a queued request's slot is spent once it leaves the queue, and cannot be given back")
	}
	return nil
}
