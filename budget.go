package sluice

import (
	"cmp"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2"
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
			return fmt.Errorf("align and timezone need a rate with algorithm fixed_window")
		}
		if err := algorithms.CheckAlign(l.Align, l.Timezone, alg, l.policy()); err != nil {
			return err
		}
	}
	if l.ChargeWhen == nil {
		if l.ReservationTTL != 0 {
			return fmt.Errorf("reservation_ttl applies only with charge_when")
		}
		return nil
	}
	switch ttl := time.Duration(l.ReservationTTL); {
	case l.concOnly():
		return fmt.Errorf("charge_when needs a rate (rate <n>/<window>)")
	case l.CountWhen != nil || l.ResetWhen != nil:
		return fmt.Errorf("charge_when cannot be used with count_when or reset_when on one limit: a spend budget commits or releases each unit by the response itself")
	case l.Settle != "":
		return fmt.Errorf("charge_when cannot be used with settle yet: a reservation is committed or released whole, and settling a part of it is not built")
	case l.Lease > 0:
		return fmt.Errorf("charge_when cannot be used with lease: units spent locally from a lease are not reservations the store can release")
	case l.MaxDelay > 0:
		return fmt.Errorf("charge_when cannot be used with max_delay: a queued request's slot is spent once it leaves the queue")
	case ttl != 0 && (ttl < minReservationTTL || ttl > maxReservationTTL):
		return fmt.Errorf("reservation_ttl must be from %v to %v, got %v", minReservationTTL, maxReservationTTL, ttl)
	}
	return nil
}

// provisionBudget makes the limit's calendar and reservation life.
func (l *Limit) provisionBudget() error {
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

// request is the store request of key at cost: with a reservation for a
// spend budget, whose token is drawn at random so that no two requests
// (of any Caddy sharing the store) name one reservation.
func (l *Limit) request(key string, cost int64) backend.Request {
	r := backend.Request{Limit: l.handle, Key: key, Cost: cost, Shadow: l.zone.Shadow}
	if l.budget.reserve > 0 {
		r.Reserve, r.Token = l.budget.reserve, rand.Uint64()
	}
	return r
}

// budgetDenial is the status and reason of a denial by a spend budget:
// its own status, else its zone's, else 503 (the server's limit, not the
// client's).
func (l *Limit) budgetDenial() (int, reason) {
	return cmp.Or(l.Status, l.zone.Status, http.StatusServiceUnavailable), reasonBudget
}

func appendBudgetMessage(b []byte, f refusal) []byte {
	b = append(b, "The service's budget for this is spent; this is not a limit on you."...)
	if f.retryAfter < 0 {
		return b
	}
	b = append(b, " Retry in "...)
	return append(appendSeconds(b, f.retryAfter), '.')
}

// settleChargesEarly settles the spend budgets once the status is written:
// the outcome is known then, and a body streamed for longer than
// reservation_ttl (a long answer, a client that reads slowly) must not
// see its reservation expire, and its unit come back, before the commit.
// What fails to settle here is settled, and logged, when the request ends.
func (o *outcomeWriter) settleChargesEarly() {
	_ = o.settleCharges(!o.left, int(o.status))
}

// settleCharges commits or releases the reservations of o's spend budgets
// (outcomeWriter.settleCharges), logging what fails.
func (h *Handler) settleCharges(o *outcomeWriter, answered bool, status int) {
	for _, e := range o.settleCharges(answered, status) {
		h.logger.Error("settling a spend budget's reservation (it expires by itself after reservation_ttl)", zap.Bool("commit", e.commit), zap.Error(e.err))
	}
}

type settleError struct {
	commit bool
	err    error
}

// settleCharges commits the reservations of the spend budgets among o's
// limits whose charge_when the response matches, and releases the others
// (all of them when the request has no outcome: answered false). A
// reservation settled is marked so (its Reserve zeroed), so that the
// request's end does not settle it again.
func (o *outcomeWriter) settleCharges(answered bool, status int) []settleError {
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
		if answered && o.matches(l.ChargeWhen, o.charged, i, status) {
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
