package redis

import (
	"container/list"
	"math"
	"sync"

	"github.com/sluicehq/sluice/algorithms"
)

// DefaultCacheSize is how many over-limit keys the local cache remembers
// when Options.CacheSize is zero.
const DefaultCacheSize = 10_000

// overCache remembers keys Redis declared over their limit, until their
// retry time, so that a flood of requests bound to be denied is answered
// without a call. It answers only what is certain: a key denied a cost
// under a policy is denied any cost at least as large, under the same
// policy, until the retry time Redis gave, unless something gives units
// back (a refund, which drops the entry when it comes from this process).
// Its memory is bounded by its size: the oldest entry makes room.
type overCache struct {
	now  func() int64 // monotonic nanoseconds
	size int

	mu    sync.Mutex
	epoch uint64 // counts refunds: a denial sent before one may be stale
	byKey map[string]*list.Element
	order list.List // of *overEntry, oldest first
}

type overEntry struct {
	key   string
	conf  *zoneConf // the policy Redis decided with
	cost  int64     // the cost Redis denied
	local int64     // local clock when the call was sent
	until int64     // local clock before which the cost is denied
	// trust is the local clock before which the denial is answered
	// without Redis: until, or sooner for a lock-out (lockoutTrust).
	trust int64
	res   algorithms.Result
	probe chan struct{} // closed when the request asking Redis about the key has its answer
}

func newOverCache(size int, now func() int64) *overCache {
	return &overCache{now: now, size: size, byKey: make(map[string]*list.Element)}
}

// answer fills results when every item is certainly denied, and reports
// whether it did. Otherwise, when a key is remembered but its denial no
// longer certain (its retry time has come), one request at a time asks
// Redis about it: answer returns the channel to wait on while another
// request does, or the entries this request now probes for, which learn
// or release hand back. Without that, every request in flight on a
// flooded key would reach Redis each time its retry time comes.
func (c *overCache) answer(items []item, results []algorithms.Result) (ok bool, wait chan struct{}, probing []*overEntry) {
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	ok = true
	for i := range items {
		it := &items[i]
		el, found := c.byKey[it.key]
		if !found || it.shadow {
			ok = false
			continue
		}
		e := el.Value.(*overEntry)
		if e.conf != it.conf {
			c.remove(el)
			ok = false
			continue
		}
		if e.covers(it.cost, now) {
			// Times move on from the answer Redis gave; what it said of
			// the quota stands, since only a refund could raise it before
			// the retry time.
			r := e.res
			elapsed := now - e.local
			r.RetryAfter = e.until - now
			r.ResetAfter = max(r.ResetAfter-elapsed, 0)
			r.At += elapsed
			results[i] = r
			continue
		}
		ok = false
		if e.probe != nil {
			return false, e.probe, nil
		}
	}
	if ok {
		return true, nil, nil
	}
	for i := range items {
		if el, found := c.byKey[items[i].key]; found {
			e := el.Value.(*overEntry)
			if !e.covers(items[i].cost, now) {
				e.probe = make(chan struct{})
				probing = append(probing, e)
			}
		}
	}
	return false, nil, probing
}

// covers reports whether the remembered answer is Redis's answer to a
// request of cost at now. A larger cost is denied too, but with a later
// retry time that only Redis knows; and while a key is denied its
// remaining units may grow (a bucket refills, a sliding window slides)
// up to cost−1, so only an answer already there stays true.
func (e *overEntry) covers(cost, now int64) bool {
	return now < e.trust && cost == e.cost && e.res.Remaining == cost-1
}

// mark is read before a call: the clock, and the refunds so far.
func (c *overCache) mark() (now int64, epoch uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now(), c.epoch
}

// release lets the requests waiting on probing go.
func (c *overCache) release(probing []*overEntry) {
	if len(probing) == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.releaseLocked(probing)
}

func (c *overCache) releaseLocked(probing []*overEntry) {
	for _, e := range probing {
		if e.probe != nil {
			close(e.probe)
			e.probe = nil
		}
	}
}

func (c *overCache) remove(el *list.Element) {
	c.order.Remove(el)
	delete(c.byKey, el.Value.(*overEntry).key)
}

// learn records the items Redis denied and releases probing; took is
// whether the request was allowed (its keys charged); epoch is mark's at
// the call; sent is the
// local clock read before the call, so the remembered retry time is never
// later than the one Redis computed on its own clock.
func (c *overCache) learn(items []item, results []algorithms.Result, took bool, sent int64, epoch uint64, probing []*overEntry) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.releaseLocked(probing)
	// A refund that ran while the call was under way may have made
	// room after Redis denied: such a denial is not remembered.
	fresh := epoch == c.epoch
	for i := range items {
		it, r := &items[i], results[i]
		el, found := c.byKey[it.key]
		if r.Allowed {
			if !found || !took || it.cost == 0 {
				continue
			}
			e := el.Value.(*overEntry)
			if r.Remaining >= e.cost {
				// The key has room again: requests on it go to Redis
				// side by side.
				c.remove(el)
			} else {
				// Units were taken, so the retry time Redis gave is past
				// (or later than it said, after a smaller cost): the key
				// is still at its limit and its next request probes
				// alone. Never trusted again, rather than until sent: a
				// clock that reads earlier than sent (a test's clock that
				// steps back) would answer with the old denial.
				e.until = min(e.until, sent)
				e.trust = math.MinInt64
			}
			continue
		}
		if !fresh || it.shadow || it.cost <= 0 || r.RetryAfter <= 0 {
			continue
		}
		if found {
			c.remove(el)
		}
		e := &overEntry{key: it.key, conf: it.conf, cost: it.cost, local: sent, until: sent + r.RetryAfter, res: r}
		e.trust = e.until
		if it.conf.lk != "" {
			e.trust = min(e.until, sent+lockoutTrust)
		}
		c.byKey[it.key] = c.order.PushBack(e)
		for c.order.Len() > c.size {
			c.remove(c.order.Front())
		}
	}
}

// forget drops the entries of keys whose units are given back, and makes
// the denials of calls under way stale. It is called before the refund
// and again after it: a call sent before the refund ran may learn a
// denial that the refund has undone.
func (c *overCache) forget(items []item) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.epoch++
	for i := range items {
		if el, ok := c.byKey[items[i].key]; ok {
			c.remove(el)
		}
	}
}

// clear forgets everything, and makes the denials of calls under way
// stale: after a failed call, Redis may have lost its state.
func (c *overCache) clear() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.epoch++
	clear(c.byKey)
	c.order.Init()
}

func (c *overCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.order.Len()
}
