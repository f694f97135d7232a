package sluice

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/internal/conc"
)

// ErrConcurrency is the error behind a 503 answer to a request refused
// because its key already has as many requests in flight as the limit's
// concurrency allows (after waiting in its queue, when it has one).
var ErrConcurrency = errors.New("too many requests in flight")

// MaxConcurrency is the largest concurrency a limit accepts.
const MaxConcurrency = 1 << 30

// Bounds and default of slot_ttl: renewed every third of it, a TTL under a
// second would cost Redis a call per held key several times a second; one
// over an hour would keep a dead instance's slots longer than any request.
const (
	MinSlotTTL     = caddy.Duration(time.Second)
	MaxSlotTTL     = caddy.Duration(time.Hour)
	DefaultSlotTTL = caddy.Duration(30 * time.Second)
)

// MaxQueue is the longest a request may wait for a slot: longer than any
// client or proxy waits for an answer.
const MaxQueue = caddy.Duration(time.Hour)

// inFlight is the number of requests holding a slot, per zone and scope.
var inFlight = prometheus.NewGaugeVec(prometheus.GaugeOpts{
	Namespace: "caddy", Subsystem: "rate_limit", Name: "in_flight_requests",
	Help: "Requests holding a concurrency slot, by the zone and scope of the limit (not counting those waiting in its queue).",
}, []string{"zone", "scope"})

// concOnly tells whether l limits concurrency alone, with no rate.
func (l *Limit) concOnly() bool {
	return l.Concurrency != 0 && l.MaxEvents == 0 && l.Window == 0
}

// checkConc validates concurrency and queue; on a limit without a rate it
// also rejects the options only a rate reads.
func (l *Limit) checkConc() error {
	switch {
	case l.Concurrency < 0 || l.Concurrency > MaxConcurrency:
		return optionErrorf("concurrency", "concurrency must be from 1 to %d, got %d", MaxConcurrency, l.Concurrency)
	case l.Queue < 0 || l.Queue > MaxQueue:
		return optionErrorf("queue", "queue must be from 0 to 1h, got %s", time.Duration(l.Queue))
	case l.Queue != 0 && l.Concurrency == 0:
		return optionErrorf("queue", "queue would do nothing without concurrency: set concurrency, or use max_delay to queue for a rate")
	case l.QueueMax < 0 || l.QueueMax > MaxConcurrency:
		return optionErrorf("queue_max", "queue_max must be from 1 to %d, got %d", MaxConcurrency, l.QueueMax)
	case l.QueueMax != 0 && l.Queue == 0:
		return optionErrorf("queue_max", "queue_max would do nothing without queue: a request beyond the concurrency is refused at once already")
	case l.SlotTTL != 0 && l.Concurrency == 0:
		return optionErrorf("slot_ttl", "slot_ttl would do nothing without concurrency")
	case l.SlotTTL != 0 && (l.SlotTTL < MinSlotTTL || l.SlotTTL > MaxSlotTTL):
		return optionErrorf("slot_ttl", "slot_ttl must be from 1s to 1h, got %s", time.Duration(l.SlotTTL))
	}
	if !l.concOnly() {
		return nil
	}
	if unused := setOptions(
		option{l.Burst != 0, "burst"}, option{l.Algorithm != "", "algorithm"}, option{l.MaxDelay != 0, "max_delay"},
		option{l.Cost != nil, "cost"}, option{l.MaxKeys != 0, "max_keys"}, option{l.Lease != 0, "lease"},
		option{l.CountWhen != nil, "count_when"}, option{l.ResetWhen != nil, "reset_when"},
	); len(unused) > 0 {
		return optionErrorf(unused[0], "%s would do nothing on a limit of concurrency alone: add a rate (max_events and window), or remove %s", strings.Join(unused, ", "), itOrThem(unused))
	}
	return nil
}

// provisionConc makes l's slots: in this process on the memory backend,
// shared by the fleet on a store that shares them (Redis), which must also
// expire the slots of an instance that dies mid-request (slot_ttl).
func (l *limit) provisionConc(store backend.Store, logger *zap.Logger) error {
	if l.Concurrency == 0 {
		return nil
	}
	if l.zone.Shadow {
		return fmt.Errorf("concurrency: a shadow zone never refuses a request, and cannot hold one back: remove concurrency or shadow")
	}
	gauge := inFlight.WithLabelValues(l.zone.name, l.scope)
	if m, ok := store.(caddy.Module); ok && m.CaddyModule().ID == backend.Namespace+".memory" {
		if l.SlotTTL != 0 {
			return fmt.Errorf("slot_ttl: on the memory backend a slot is held in this process and freed by its own request, it never needs to expire: remove slot_ttl")
		}
		l.conc = conc.NewLocal(l.Concurrency, time.Duration(l.Queue), l.QueueMax, gauge)
		return nil
	}
	ss, ok := store.(backend.SlotStore)
	if !ok {
		return fmt.Errorf("concurrency: backend %T cannot share slots between instances", store)
	}
	ttl := time.Duration(cmp.Or(l.SlotTTL, DefaultSlotTTL))
	slots, err := ss.RegisterSlots(backend.SlotConfig{Name: l.zone.name, Scope: l.scope, Limit: l.Concurrency, TTL: ttl})
	if err != nil {
		return fmt.Errorf("concurrency: %w", err)
	}
	l.shared = conc.NewShared(slots, time.Duration(l.Queue), l.QueueMax, gauge, logger)
	if l.fail == FailLocal {
		// While Redis is away, each instance caps its own requests.
		l.conc = conc.NewLocal(l.Concurrency, time.Duration(l.Queue), l.QueueMax, gauge)
	}
	return nil
}

// concReq is one concurrency limit a request must get a slot of.
type concReq struct {
	l   *limit
	key string
}

// heldSlots are the slots a request holds while the handlers after this
// one run; release frees them all. A nil *heldSlots holds nothing.
type heldSlots struct {
	slots []heldSlot
}

type heldSlot struct {
	c *conc.Local
	k *conc.Key
	// A slot shared through the backend: its limit, key and id.
	sh      *conc.Shared
	key, id string
}

func (h *heldSlots) release() {
	if h == nil {
		return
	}
	for _, s := range h.slots {
		if s.sh != nil {
			s.sh.Release(s.key, s.id)
		} else {
			s.c.Release(s.k)
		}
	}
}

// acquire takes a slot of every concurrency limit the request matched, in
// the zones' order (so two requests never hold slots the other waits for).
// When one cannot be had, the slots taken are freed, the rate units the
// request was given go back, and the request is refused with 503, or with
// 499 when its client left while it waited: it returns the slots held, or
// the request's refusal, or that error.
func (h *plan) acquire(r *http.Request, s *requestState) (*heldSlots, *refusal, error) {
	held := &heldSlots{slots: make([]heldSlot, 0, len(s.conc))}
	newTimer := h.newTimer
	if newTimer == nil {
		newTimer = systemTimer
	}
	for _, cr := range s.conc {
		slot, err := h.takeSlot(r, cr, newTimer)
		if err == nil {
			if slot.c != nil || slot.sh != nil {
				held.slots = append(held.slots, slot)
			}
			continue
		}
		held.release()
		h.refundRate(r, s)
		l := cr.l
		switch {
		case err == conc.ErrQueueTimeout:
			wait := max(time.Duration(l.Queue), time.Second)
			return nil, s.refuse(refusal{
				reason: reasonConcurrency, zone: l.zone, limit: l, key: cr.key,
				retryAfter: retryAfterSeconds(wait), wait: wait,
			}), nil
		case r.Context().Err() != nil:
			return nil, nil, caddyhttp.Error(statusClientClosed, r.Context().Err())
		case errors.Is(err, backend.ErrUnavailable): // a limit that fails closed
			var wait time.Duration
			if ue, ok := errors.AsType[*backend.UnavailableError](err); ok {
				wait = ue.RetryAfter
			}
			return nil, s.refuse(refusal{
				reason: reasonUnavailable, zone: l.zone, limit: l, key: cr.key,
				retryAfter: retryAfterSeconds(wait), wait: wait, detail: err,
			}), nil
		}
		return nil, nil, caddyhttp.Error(http.StatusInternalServerError, err)
	}
	return held, nil, nil
}

// takeSlot takes a slot of cr's limit, waiting in its queue. When the
// backend that shares the slots is unavailable, the limit's fail policy
// decides: open admits holding no slot (a zero heldSlot), local takes a
// slot of this instance's own, closed returns the error.
func (h *plan) takeSlot(r *http.Request, cr concReq, newTimer func(time.Duration) (<-chan time.Time, func() bool)) (heldSlot, error) {
	l := cr.l
	if sh := l.shared; sh != nil {
		var id string
		var err error
		take := func() { id, err = sh.Take(r.Context(), cr.key, newTimer) }
		if sh.Queue() > 0 {
			outsideGroups(r, take) // it may wait in line: not in flight meanwhile
		} else {
			take()
		}
		switch {
		case err == nil:
			return heldSlot{sh: sh, key: cr.key, id: id}, nil
		case !errors.Is(err, backend.ErrUnavailable):
			return heldSlot{}, err
		}
		if l.failC != nil && l.concOnly() {
			// A limit with a rate counted the request when its decision
			// failed.
			l.failC.Inc()
		}
		switch {
		case l.fail == FailClosed:
			return heldSlot{}, err
		case l.fail != FailLocal || l.conc == nil:
			h.warnFailure("rate limit backend unavailable: a concurrency limit that fails open admits without a slot", r, []*limit{l}, err)
			return heldSlot{}, nil
		}
		h.warnFailure("rate limit backend unavailable: a concurrency limit that fails local counts this instance's own slots", r, []*limit{l}, err)
	}
	c := l.conc
	k, wt := c.Take(cr.key)
	switch {
	case k == nil:
		return heldSlot{}, conc.ErrQueueTimeout
	case wt != nil:
		// A request waiting for its slot is not in flight: it must not
		// load the shedding groups it is counted in meanwhile.
		var err error
		outsideGroups(r, func() { err = c.Await(r.Context(), k, wt, newTimer) })
		if err != nil {
			return heldSlot{}, err
		}
	}
	return heldSlot{c: c, k: k}, nil
}

// refundRate gives back the rate units a request was given, when a
// concurrency limit refuses it after its rates allowed it.
func (h *plan) refundRate(r *http.Request, s *requestState) {
	if len(s.reqs) == 0 || s.store == nil {
		return
	}
	if err := s.store.Refund(context.WithoutCancel(r.Context()), s.reqs, s.out); err != nil {
		h.logger.Error("giving back the rate units of a request refused for concurrency", zap.Error(err))
	}
}
