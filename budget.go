package sluice

import (
	"cmp"
	"context"
	"errors"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
)

// ErrBudgetExhausted is the error behind the 503 answer of a spend budget
// (charge_when) that is spent: the server's limit, not the client's.
var ErrBudgetExhausted = errors.New("the service's budget for this is spent")

// DefaultReservationTTL is how long a charge_when reservation lasts when
// nothing settles it.
const DefaultReservationTTL = time.Minute

// Bounds of reservation_ttl: long enough for an upstream call, short
// enough that a dead Caddy's units come back the same day.
const (
	minReservationTTL = time.Second
	maxReservationTTL = 24 * time.Hour
)

// limitBudget is what a spend budget and a calendar window add to a limit.
type limitBudget struct {
	cal     *algorithms.Calendar // nil: epoch-aligned windows
	reserve int64                // the reservation's life, ns; 0: not a budget
}

// defaultFail is a limit's fail policy when it names none: a spend
// budget guards money, so it refuses rather than spend blind.
func (l *Limit) defaultFail() string {
	if l.ChargeWhen != nil {
		return FailClosed
	}
	return FailOpen
}

// checkBudget validates charge_when, reservation_ttl, align and timezone.
func (l *Limit) checkBudget(alg string) error {
	if l.Align != "" || l.Timezone != "" {
		if l.concOnly() {
			return optionErrorf("align", "align and timezone need a rate with algorithm fixed_window")
		}
		if err := algorithms.CheckAlign(l.Align, l.Timezone, alg, l.policy()); err != nil {
			return err
		}
	}
	if l.ChargeWhen == nil {
		if l.ReservationTTL != 0 {
			return optionErrorf("reservation_ttl", "reservation_ttl applies only with charge_when")
		}
		return nil
	}
	switch ttl := time.Duration(l.ReservationTTL); {
	case l.concOnly():
		return optionErrorf("charge_when", "charge_when needs a rate (rate <n>/<window>)")
	case l.CountWhen != nil || l.ResetWhen != nil:
		return optionErrorf("charge_when", "charge_when cannot be used with count_when or reset_when on one limit: a spend budget commits or releases each unit by the response itself")
	case l.Settle != "":
		return optionErrorf("charge_when", "charge_when cannot be used with settle yet: a reservation is committed or released whole, and settling a part of it is not built")
	case l.Lease > 0:
		return optionErrorf("charge_when", "charge_when cannot be used with lease: units spent locally from a lease are not reservations the store can release")
	case l.MaxDelay > 0:
		return optionErrorf("charge_when", "charge_when cannot be used with max_delay: a queued request's slot is spent once it leaves the queue")
	case ttl != 0 && (ttl < minReservationTTL || ttl > maxReservationTTL):
		return optionErrorf("reservation_ttl", "reservation_ttl must be from %v to %v, got %v", minReservationTTL, maxReservationTTL, ttl)
	}
	return nil
}

// provisionBudget makes the limit's calendar and reservation life.
func (l *limit) provisionBudget() error {
	if l.Align != "" {
		cal, err := algorithms.NewCalendar(l.Align, l.Timezone)
		if err != nil {
			return err
		}
		l.budget.cal = cal
	}
	if l.ChargeWhen != nil {
		l.budget.reserve = int64(DefaultReservationTTL)
		if l.ReservationTTL != 0 {
			l.budget.reserve = int64(l.ReservationTTL)
		}
	}
	return nil
}

// budgetDenial is the status and reason of a denial by a spend budget:
// its own status, else its zone's, else 503 (the server's limit, not the
// client's).
func (l *limit) budgetDenial() (int, reason) {
	return cmp.Or(l.Status, l.zone.Status, http.StatusServiceUnavailable), reasonBudget
}

func appendBudgetMessage(b []byte, f *refusal) []byte {
	b = append(b, "The service's budget for this is spent; this is not a limit on you."...)
	if f.retryAfter < 0 {
		return b
	}
	b = append(b, " Retry in "...)
	return append(appendSeconds(b, f.retryAfter), '.')
}

// budgetHold keeps the call of a request holding spend budget
// reservations going once its client has left. A client that hangs up
// while the upstream works must not have its reservation released: the
// upstream may complete the work (send the message) all the same, and
// hanging up would be a free send. So the request is handed on with a
// context that the client's departure does not cancel, and its status
// settles the reservation whether anyone reads it or not. Once the client
// is gone, the call lasts until its status is written, or until the first
// of its reservations expires (until): then it is given up, and its
// reservations are left to expire rather than released, so their units
// come back no earlier than reservation_ttl.
type budgetHold struct {
	h        *plan
	ctx      context.Context // handed on
	cancel   context.CancelFunc
	until    int64       // on h's clock
	answered atomic.Bool // the status was written
	expired  atomic.Bool // given up at until: nothing settles
}

// serveHeld hands r on with a context that outlives its client (see
// budgetHold). Only a request with a reservation pays for it (the context,
// the request copy and the watch on the client's context).
func (o *watcher) serveHeld(r *http.Request, next caddyhttp.Handler) error {
	// Its parent is never done, so no goroutine watches it, and is its own:
	// the call may keep the context after the watcher goes back to the pool.
	ctx, cancel := context.WithCancel(&detachedContext{parent: r.Context()})
	hold := &budgetHold{h: o.h, ctx: ctx, cancel: cancel, until: o.holdUntil}
	o.hold = hold
	stop := context.AfterFunc(r.Context(), hold.clientLeft)
	defer cancel()
	defer stop()
	return next.ServeHTTP(o, r.WithContext(ctx))
}

// clientLeft runs once the client has gone: the call goes on until its
// status, or is given up when the first reservation expires.
func (b *budgetHold) clientLeft() {
	if !b.answered.Load() {
		if wait := b.until - b.h.now(); wait > 0 {
			newTimer := b.h.newTimer
			if newTimer == nil {
				newTimer = systemTimer
			}
			fired, stop := newTimer(time.Duration(wait))
			select {
			case <-fired:
			case <-b.ctx.Done(): // answered, or the request is over
				stop()
				return
			}
		}
		b.expired.Store(true)
	}
	// Answered to nobody: there is no one to stream the rest to.
	b.cancel()
}

// settleChargesEarly settles the spend budgets once the status is written:
// the outcome is known then, and a body streamed for longer than
// reservation_ttl (a long answer, a client that reads slowly) must not
// see its reservation expire, and its unit come back, before the commit.
// What fails to settle here is settled, and logged, when the request ends.
func (o *watcher) settleChargesEarly() {
	b := o.hold
	if b != nil {
		b.answered.Store(true)
		// Read after answered is set: either this sees the client gone,
		// or clientLeft sees the answer, and one of them ends the call.
		if o.detached.parent.Err() != nil {
			defer b.cancel()
		}
	}
	if o.keepCharges() {
		return
	}
	_ = o.settleReservations(int(o.status))
}

// keepCharges reports whether the spend budgets' reservations are to be
// left to expire rather than settled: the call was given up when they
// expired, or the status is the proxy's 499 for a client that left (no
// answer of the upstream's), or no status was written at all.
func (o *watcher) keepCharges() bool {
	if o.hold != nil && o.hold.expired.Load() {
		return true
	}
	return o.status == 0 || o.left && o.status == statusClientClosed
}

// settleCharges commits or releases the reservations of o's spend budgets
// by status (settleReservations), logging what fails.
func (o *watcher) settleCharges(status int) {
	for _, e := range o.settleReservations(status) {
		o.h.logger.Error("settling a spend budget's reservation (it expires by itself after reservation_ttl)", zap.Bool("commit", e.commit), zap.Error(e.err))
	}
}

// settleLeftCharges settles the spend budgets of a request whose client
// left before its status was written: by the status the call got without
// the client, when it got one; otherwise they are kept until they expire.
// A handler's error without a status (the proxy could not finish sending
// a body the client stopped sending) is no answer of the upstream's: it
// may have the request, and do the work, all the same.
func (o *watcher) settleLeftCharges() {
	if !o.keepCharges() {
		o.settleCharges(int(o.status))
	}
}

type settleError struct {
	commit bool
	err    error
}

// settleReservations commits the reservations of the spend budgets among o's
// limits whose charge_when the response (of status) matches, and releases
// the others. A reservation settled is marked so (its Reserve zeroed), so
// that the request's end does not settle it again.
func (o *watcher) settleReservations(status int) []settleError {
	res, ok := o.store.(backend.Reserver)
	if !ok {
		return nil
	}
	var buf [2][4]int
	commit, release := buf[0][:0], buf[1][:0]
	all := true // every limit is a budget
	for i, l := range o.limits {
		if l.ChargeWhen == nil || o.reqs[i].Reserve <= 0 {
			all = false
			continue
		}
		if o.matches(l.ChargeWhen, o.charged, i, status) {
			commit = append(commit, i)
		} else {
			release = append(release, i)
		}
	}
	var errs []settleError
	settle := func(reqs []backend.Request, out []algorithms.Result, which []int, commit bool) {
		if err := res.SettleReservations(&o.detached, reqs, out, commit); err != nil {
			errs = append(errs, settleError{commit, err})
			return
		}
		for _, i := range which {
			o.reqs[i].Reserve = 0
		}
	}
	if all && (len(commit) == 0 || len(release) == 0) {
		// The usual case, settled without copying the requests.
		settle(o.reqs, o.out, append(commit, release...), len(release) == 0)
		return errs
	}
	for k, which := range [2][]int{commit, release} {
		if len(which) == 0 {
			continue
		}
		reqs := make([]backend.Request, len(which))
		out := make([]algorithms.Result, len(which))
		for j, i := range which {
			reqs[j], out[j] = o.reqs[i], o.out[i]
		}
		settle(reqs, out, which, k == 0)
	}
	return errs
}

// budgetOption reads charge_when, reservation_ttl, align and timezone.
func (p *limitParser) budgetOption(opt string) error {
	d, l := p.d, p.l
	var err error
	switch opt {
	case "charge_when":
		l.ChargeWhen, err = parseResponseMatcher(d, p.where, opt)
	case "reservation_ttl":
		var dur time.Duration
		dur, err = durationArg(d, p.where, opt)
		l.ReservationTTL = caddy.Duration(dur)
	case "align":
		l.Align, err = oneArg(d)
	case "timezone":
		l.Timezone, err = oneArg(d)
	}
	return err
}
