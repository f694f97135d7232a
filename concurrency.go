package sluice

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/sluicehq/sluice/backend"
)

// ErrConcurrency is the error behind a 503 answer to a request refused
// because its key already has as many requests in flight as the limit's
// concurrency allows (after waiting in its queue, when it has one).
var ErrConcurrency = errors.New("too many requests in flight")

// MaxConcurrency is the largest concurrency a limit accepts.
const MaxConcurrency = 1 << 30

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
		return fmt.Errorf("concurrency must be from 1 to %d, got %d", MaxConcurrency, l.Concurrency)
	case l.Queue < 0 || l.Queue > MaxQueue:
		return fmt.Errorf("queue must be from 0 to 1h, got %s", time.Duration(l.Queue))
	case l.Queue != 0 && l.Concurrency == 0:
		return fmt.Errorf("queue would do nothing without concurrency: set concurrency, or use max_delay to queue for a rate")
	}
	if !l.concOnly() {
		return nil
	}
	if unused := setOptions(
		option{l.Burst != 0, "burst"}, option{l.Algorithm != "", "algorithm"}, option{l.MaxDelay != 0, "max_delay"},
		option{l.Cost != nil, "cost"}, option{l.MaxKeys != 0, "max_keys"}, option{l.Lease != 0, "lease"},
		option{l.CountWhen != nil, "count_when"}, option{l.ResetWhen != nil, "reset_when"},
	); len(unused) > 0 {
		return fmt.Errorf("%s would do nothing on a limit of concurrency alone: add a rate (max_events and window), or remove %s", strings.Join(unused, ", "), itOrThem(unused))
	}
	return nil
}

// provisionConc makes l's slots. The memory backend alone is accepted:
// slots held in one process cannot be shared by a fleet, and a shared
// version must expire the slots of an instance that dies mid-request.
func (l *Limit) provisionConc(store backend.Store) error {
	if l.Concurrency == 0 {
		return nil
	}
	if m, ok := store.(caddy.Module); !ok || m.CaddyModule().ID != backend.Namespace+".memory" {
		return fmt.Errorf("concurrency: only the memory backend counts requests in flight (per instance); slots shared through Redis, with a slot_ttl for instances that die, are not built yet")
	}
	if l.zone.Shadow {
		return fmt.Errorf("concurrency: a shadow zone never refuses a request, and cannot hold one back: remove concurrency or shadow")
	}
	l.conc = newConcLimiter(l.Concurrency, time.Duration(l.Queue), inFlight.WithLabelValues(l.zone.name, l.scope))
	return nil
}

// concLimiter caps the requests of each key in flight at once. A key's
// entry lives only while it has a request in flight, so a flood of new
// keys costs memory only for the requests actually being served.
type concLimiter struct {
	max   int64
	queue time.Duration
	gauge prometheus.Gauge

	mu   sync.Mutex
	keys map[string]*concKey
}

// concKey is one key's requests in flight and its line of waiters. A
// waiter is in line only while every slot is taken: a freed slot goes to
// the first waiter, in order of arrival, never back to the pool.
type concKey struct {
	key      string
	inFlight int64
	waiters  list.List // of *concWaiter
}

type concWaiter struct {
	ready   chan struct{} // closed when a slot is handed to the waiter
	elem    *list.Element
	granted bool // under the limiter's lock
}

func newConcLimiter(limit int64, queue time.Duration, gauge prometheus.Gauge) *concLimiter {
	return &concLimiter{max: limit, queue: queue, gauge: gauge, keys: make(map[string]*concKey)}
}

// take takes a slot of key: it returns the key's entry holding the slot,
// or the entry and a waiter in its line (await the slot), or nothing when
// every slot is taken and the limit has no queue.
func (c *concLimiter) take(key string) (*concKey, *concWaiter) {
	c.mu.Lock()
	k := c.keys[key]
	if k == nil {
		k = &concKey{key: key}
		c.keys[key] = k
	}
	if k.inFlight < c.max {
		k.inFlight++
		c.mu.Unlock()
		c.gauge.Inc()
		return k, nil
	}
	if c.queue <= 0 {
		c.mu.Unlock()
		return nil, nil
	}
	w := &concWaiter{ready: make(chan struct{})}
	w.elem = k.waiters.PushBack(w)
	c.mu.Unlock()
	return k, w
}

// errQueueTimeout is await's answer when no slot came within the queue's
// timeout.
var errQueueTimeout = errors.New("no slot within the queue's timeout")

// await waits for the slot w is in line for, until the queue's timeout or
// ctx ends. It returns nil when w holds the slot; otherwise w has left the
// line, holding nothing.
func (c *concLimiter) await(ctx context.Context, k *concKey, w *concWaiter, newTimer func(time.Duration) (<-chan time.Time, func() bool)) error {
	fired, stop := newTimer(c.queue)
	defer stop()
	var err error
	select {
	case <-w.ready:
		return nil
	case <-fired:
		err = errQueueTimeout
	case <-ctx.Done():
		err = ctx.Err()
	}
	c.mu.Lock()
	if !w.granted {
		k.waiters.Remove(w.elem)
		c.mu.Unlock()
		return err
	}
	c.mu.Unlock()
	// The slot came as the wait ended: a request whose time ran out
	// takes it, one whose client left passes it on.
	if err == errQueueTimeout {
		return nil
	}
	c.release(k)
	return err
}

// release frees a slot of k: to the first waiter in line, or to the pool,
// dropping the key once nothing of it is in flight.
func (c *concLimiter) release(k *concKey) {
	c.mu.Lock()
	if e := k.waiters.Front(); e != nil {
		w := k.waiters.Remove(e).(*concWaiter)
		w.granted = true
		close(w.ready)
		c.mu.Unlock()
		return
	}
	k.inFlight--
	if k.inFlight == 0 {
		delete(c.keys, k.key)
	}
	c.mu.Unlock()
	c.gauge.Dec()
}

// size is the number of keys tracked.
func (c *concLimiter) size() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.keys)
}

// concReq is one concurrency limit a request must get a slot of.
type concReq struct {
	l   *Limit
	key string
}

// heldSlots are the slots a request holds while the handlers after this
// one run; release frees them all. A nil *heldSlots holds nothing.
type heldSlots struct {
	slots []heldSlot
}

type heldSlot struct {
	c *concLimiter
	k *concKey
}

func (h *heldSlots) release() {
	if h == nil {
		return
	}
	for _, s := range h.slots {
		s.c.release(s.k)
	}
}

// acquire takes a slot of every concurrency limit the request matched, in
// the zones' order (so two requests never hold slots the other waits for).
// When one cannot be had, the slots taken are freed, the rate units the
// request was given go back, and the request is refused with 503, or with
// 499 when its client left while it waited.
func (h *Handler) acquire(w http.ResponseWriter, r *http.Request, s *scratch) (*heldSlots, bool, error) {
	held := &heldSlots{slots: make([]heldSlot, 0, len(s.conc))}
	for _, cr := range s.conc {
		c := cr.l.conc
		k, wt := c.take(cr.key)
		var err error
		switch {
		case k == nil:
			err = errQueueTimeout
		case wt != nil:
			newTimer := h.newTimer
			if newTimer == nil {
				newTimer = systemTimer
			}
			vars := leaveGroups(r)
			err = c.await(r.Context(), k, wt, newTimer)
			rejoinGroups(vars)
		}
		if err == nil {
			held.slots = append(held.slots, heldSlot{c, k})
			continue
		}
		held.release()
		h.refundRate(r, s)
		if err != errQueueTimeout {
			return nil, false, caddyhttp.Error(statusClientClosed, err)
		}
		wait := max(c.queue, time.Second)
		return nil, false, unlessAnswered(h.refuse(w, r, refusal{
			reason: reasonConcurrency, zone: cr.l.zone, limit: cr.l, key: cr.key,
			retryAfter: retryAfterSeconds(wait), wait: wait,
		}))
	}
	return held, true, nil
}

// refundRate gives back the rate units a request was given, when a
// concurrency limit refuses it after its rates allowed it.
func (h *Handler) refundRate(r *http.Request, s *scratch) {
	if len(s.reqs) == 0 || s.store == nil {
		return
	}
	if err := s.store.Refund(context.WithoutCancel(r.Context()), s.reqs, s.out); err != nil {
		h.logger.Error("giving back the rate units of a request refused for concurrency", zap.Error(err))
	}
}
