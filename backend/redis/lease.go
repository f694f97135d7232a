package redis

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
)

// A lease: for a hot key of a loose limit, an instance takes N units from
// Redis in one call and spends them locally, so that the key costs one call
// per N units instead of one per request. What each algorithm's units mean
// once held (docs/redis.md, "Leases"):
//   - token_bucket, gcra: N tokens taken now and spent later. A spent token
//     was counted when it was taken, so the bucket may meanwhile refill and
//     grant its full burst to others: the fleet may admit up to N more per
//     instance than the bucket's burst.
//   - sliding_window: an event of N units logged now. A unit spent later
//     counts as if it had been spent when logged, and leaves the window
//     earlier: up to N more per instance in a window.
//   - fixed_window, sliding_window_counter: N units added to the current
//     window, spent only until that window ends: never more than the limit
//     (the counter's estimate) admits.
//   - leaky_bucket: refused. It lets requests out one interval apart (or
//     queues them to that pace); units spent locally all at once would not.
// Held units are spent for at most one window after they were taken (and
// only in the window they were counted in, for the window algorithms);
// units still held then are dropped: counted, never used.

// maxLeasedKeys bounds the keys one limit holds leases for in this process:
// beyond it, new keys are decided by Redis, one call each, until an expired
// lease makes room.
const maxLeasedKeys = 10_000

// decider is what a lease falls back to: Redis through the circuit breaker.
type decider interface {
	Decide(ctx context.Context, reqs []backend.Request, out []algorithms.Result) (bool, error)
	Refund(ctx context.Context, reqs []backend.Request, granted []algorithms.Result) error
}

// leasePools are the units held, per limit and lease, shared by the
// handlers and configs of this process that use the same Redis, limit and
// lease: a reload that keeps them keeps the units held.
var leasePools = caddy.NewUsagePool()

// leasePool holds the leases of one limit, by key.
type leasePool struct {
	n      int64
	alg    string
	window int64

	mu    sync.Mutex
	keys  map[string]*lease
	swept int64 // when a full pool was last swept
}

func (*leasePool) Destruct() error { return nil }

// lease is what this process holds of one key.
type lease struct {
	units   int64         // taken from Redis, not yet spent
	expires int64         // monotonic time at which units are dropped
	taking  chan struct{} // closed when the take in flight (if any) ends
	// Until noTake, Redis would refuse a take (it said when N units come
	// back): requests go to Redis as asked, where the over-limit cache can
	// answer them, instead of a take and then the request each time.
	noTake int64
	// The take's answer, which local decisions report from.
	limit, remaining, reset int64
	at, mono                int64 // the take's Redis time and monotonic time
}

// leasedLimit is the handle of a limit with a lease: the store's own
// handle and the units this process holds.
type leasedLimit struct {
	backend.Limit
	pool *leasePool
}

// leaser spends leased units; nil when no limit of the store leases.
type leaser struct {
	now   func() int64 // monotonic ns
	mu    sync.Mutex
	held  []heldLease
	drops *giveBacks // reports the unused units Redis did not take back
}

type heldLease struct {
	key    string
	pool   *leasePool
	handle backend.Limit
}

// leaseable refuses what a lease cannot do exactly enough, with the reason.
func leaseable(cfg backend.LimitConfig) error {
	alg, err := algorithms.Check(cfg.Algorithm, cfg.Policy)
	if err != nil {
		return err
	}
	switch {
	case alg == algorithms.NameLeakyBucket:
		return errors.New("lease: a leaky_bucket lets requests out one interval apart, which units spent locally from a lease would not: use token_bucket or gcra")
	case cfg.Lease < 2:
		return fmt.Errorf("lease must be at least 2, got %d", cfg.Lease)
	case cfg.Lease > algorithms.MaxCost(alg, cfg.Policy):
		return fmt.Errorf("lease %d is more than the limit holds (%d)", cfg.Lease, algorithms.MaxCost(alg, cfg.Policy))
	}
	return nil
}

// register wraps the store's handle h of cfg in the pool of its lease.
func (l *leaser) register(cfg backend.LimitConfig, h backend.Limit, redisID string) (backend.Limit, error) {
	alg, _ := algorithms.Check(cfg.Algorithm, cfg.Policy)
	p := cfg.Policy
	key := fmt.Sprintf("%s\x00%s\x00%s\x00%s\x00%d/%d/%d\x00%d", redisID, cfg.Name, cfg.Scope, alg, p.Limit, p.Window, p.Burst, cfg.Lease)
	v, _, err := leasePools.LoadOrNew(key, func() (caddy.Destructor, error) {
		return &leasePool{n: cfg.Lease, alg: alg, window: p.Window, keys: map[string]*lease{}}, nil
	})
	if err != nil {
		return nil, err
	}
	pool := v.(*leasePool)
	l.mu.Lock()
	l.held = append(l.held, heldLease{key: key, pool: pool, handle: h})
	l.mu.Unlock()
	return &leasedLimit{Limit: h, pool: pool}, nil
}

// stepKind is how a step is served.
type stepKind uint8

const (
	stepAsked stepKind = iota + 1 // by Redis, as asked
	stepHeld                      // from units held
	stepTake                      // by a take: units held, and more asked of Redis
)

// step is how one request of a decision is served.
type step struct {
	kind  stepKind
	e     *lease
	pool  *leasePool
	had   int64 // units held that a take spends first
	take  int64 // units a take asks Redis for
	inner backend.Limit
}

// decide serves what it can from units held and asks next, in one call,
// for the rest: the requests of limits without a lease, and a take of
// units for each leased key that holds too few. All or nothing: units
// reserved locally go back when the call denies or fails. A take Redis
// cannot grant (the key is near its limit) is not the request's answer:
// the request is then decided by Redis as asked, exactly.
func (l *leaser) decide(ctx context.Context, reqs []backend.Request, out []algorithms.Result, next decider) (bool, error) {
	if l == nil || !anyLeased(reqs) {
		return next.Decide(ctx, reqs, out)
	}
	steps := make([]step, len(reqs))
	for {
		wait := l.reserve(reqs, steps)
		if wait == nil {
			break
		}
		select {
		case <-wait:
		case <-ctx.Done():
			return false, fmt.Errorf("redis backend: waiting for a lease: %w", ctx.Err())
		}
	}
	sub := make([]backend.Request, 0, len(reqs))
	idx := make([]int, len(reqs))
	for i, r := range reqs {
		idx[i] = -1
		switch steps[i].kind {
		case stepAsked:
			idx[i] = len(sub)
			sub = append(sub, backend.Request{Limit: steps[i].inner, Key: r.Key, Cost: r.Cost, Shadow: r.Shadow})
		case stepTake:
			idx[i] = len(sub)
			sub = append(sub, backend.Request{Limit: steps[i].inner, Key: r.Key, Cost: steps[i].take})
		}
	}
	if len(sub) == 0 {
		l.commit(reqs, steps, out, nil, idx, l.now())
		return true, nil
	}
	subOut := make([]algorithms.Result, len(sub))
	// A take's units are counted from when it was sent, not answered: in a
	// window algorithm they then expire no later than Redis's window ends.
	sent := l.now()
	ok, err := next.Decide(ctx, sub, subOut)
	if err == nil && ok {
		l.commit(reqs, steps, out, subOut, idx, sent)
		return true, nil
	}
	l.release(reqs, steps)
	if err != nil {
		return false, err
	}
	takeDenied := false
	now := l.now()
	for i := range reqs {
		if s := steps[i]; s.kind == stepTake && !subOut[idx[i]].Allowed {
			takeDenied = true
			s.pool.mu.Lock()
			s.e.noTake = now + max(subOut[idx[i]].RetryAfter, 0)
			s.pool.mu.Unlock()
		}
	}
	if takeDenied {
		// Fewer than a lease is left: the request itself may still pass.
		direct := make([]backend.Request, len(reqs))
		for i, r := range reqs {
			direct[i] = backend.Request{Limit: steps[i].inner, Key: r.Key, Cost: r.Cost, Shadow: r.Shadow}
		}
		ok, err := next.Decide(ctx, direct, out)
		if err == nil {
			for i := range reqs {
				out[i] = steps[i].withHeld(out[i])
			}
		}
		return ok, err
	}
	for i := range reqs {
		if idx[i] >= 0 {
			out[i] = steps[i].withHeld(subOut[idx[i]])
		} else {
			s := steps[i]
			s.pool.mu.Lock()
			out[i] = l.report(s.e, now)
			s.pool.mu.Unlock()
		}
	}
	return false, nil
}

func anyLeased(reqs []backend.Request) bool {
	for _, r := range reqs {
		if _, ok := r.Limit.(*leasedLimit); ok {
			return true
		}
	}
	return false
}

// reserve plans every request: the units of those served locally are set
// aside, and a key that needs a take is marked as taking. It returns a
// channel to wait on, with nothing reserved, when a key is being taken by
// another request: one take in flight per key keeps this process's share
// at one lease.
func (l *leaser) reserve(reqs []backend.Request, steps []step) <-chan struct{} {
	now := l.now()
	for i, r := range reqs {
		ll, ok := r.Limit.(*leasedLimit)
		if !ok {
			steps[i] = step{kind: stepAsked, inner: r.Limit}
			continue
		}
		steps[i] = step{kind: stepAsked, inner: ll.Limit}
		p := ll.pool
		if r.Shadow || r.Cost < 0 || r.Cost > p.n || sameKeyBefore(reqs, i) {
			continue // decided by Redis as asked
		}
		p.mu.Lock()
		e := p.keys[r.Key]
		if e != nil && e.taking != nil {
			wait := e.taking
			p.mu.Unlock()
			l.release(reqs[:i], steps[:i])
			return wait
		}
		if e != nil && now >= e.expires {
			e.units = 0
		}
		switch {
		case e != nil && r.Cost == 0 && now < e.expires:
			steps[i] = step{kind: stepHeld, e: e, pool: p, inner: ll.Limit}
		case r.Cost == 0:
		case e != nil && e.units >= r.Cost:
			e.units -= r.Cost
			steps[i] = step{kind: stepHeld, e: e, pool: p, inner: ll.Limit}
		case e != nil && now < e.noTake:
			steps[i].e, steps[i].pool = e, p // decided by Redis; reports the units held
		default:
			if e == nil {
				if len(p.keys) >= maxLeasedKeys {
					p.sweep(now)
				}
				if len(p.keys) >= maxLeasedKeys {
					break
				}
				e = &lease{}
				p.keys[r.Key] = e
			}
			steps[i] = step{kind: stepTake, e: e, pool: p, had: e.units, take: p.n - e.units, inner: ll.Limit}
			e.units = 0
			e.taking = make(chan struct{})
		}
		p.mu.Unlock()
	}
	return nil
}

// sameKeyBefore reports whether an earlier request of reqs names the same
// limit and key: Redis sums the costs of one key, and so does a lease by
// leaving the later ones to Redis.
func sameKeyBefore(reqs []backend.Request, i int) bool {
	for _, r := range reqs[:i] {
		if r.Limit == reqs[i].Limit && r.Key == reqs[i].Key {
			return true
		}
	}
	return false
}

// release gives back what reserve set aside.
func (l *leaser) release(reqs []backend.Request, steps []step) {
	for i := range steps {
		s := &steps[i]
		switch s.kind {
		case stepHeld:
			s.pool.mu.Lock()
			s.e.units += max(reqs[i].Cost, 0)
			s.pool.mu.Unlock()
		case stepTake:
			s.pool.mu.Lock()
			s.e.units = s.had
			close(s.e.taking)
			s.e.taking = nil
			s.pool.mu.Unlock()
		}
	}
}

// withHeld adds the units this process holds of a leased key to what
// Redis said is left of it: they are left too.
func (s step) withHeld(r algorithms.Result) algorithms.Result {
	if s.e == nil {
		return r
	}
	s.pool.mu.Lock()
	r.Remaining = min(r.Remaining+s.e.units, r.Limit)
	s.pool.mu.Unlock()
	return r
}

// commit records the takes Redis granted, sent at the monotonic time sent,
// and writes every answer.
func (l *leaser) commit(reqs []backend.Request, steps []step, out, subOut []algorithms.Result, idx []int, sent int64) {
	now := l.now()
	for i := range reqs {
		s := &steps[i]
		switch s.kind {
		case stepAsked:
			out[i] = s.withHeld(subOut[idx[i]])
		case stepHeld:
			s.pool.mu.Lock()
			out[i] = l.report(s.e, now)
			s.pool.mu.Unlock()
		case stepTake:
			r := subOut[idx[i]]
			s.pool.mu.Lock()
			e := s.e
			e.units = s.had + s.take - reqs[i].Cost
			e.limit, e.remaining, e.reset, e.at, e.mono = r.Limit, r.Remaining, r.ResetAfter, r.At, sent
			e.expires = sent + s.pool.validity(r.At)
			close(e.taking)
			e.taking = nil
			out[i] = l.report(e, now)
			s.pool.mu.Unlock()
		}
	}
}

// report is a local decision's answer: allowed; remaining is what Redis
// had left at the take plus the units still held here, and reset and the
// decision's time move on from the take's.
func (l *leaser) report(e *lease, now int64) algorithms.Result {
	since := max(now-e.mono, 0)
	return algorithms.Result{
		Allowed:    true,
		Limit:      e.limit,
		Remaining:  min(e.remaining+e.units, e.limit),
		ResetAfter: max(e.reset-since, 0),
		At:         e.at + since,
	}
}

// validity is how long units taken at Redis time at may be spent: one
// window, and for the window algorithms only until the window they were
// counted in ends.
func (p *leasePool) validity(at int64) int64 {
	switch p.alg {
	case algorithms.NameFixedWindow, algorithms.NameSlidingCounter:
		off := at % p.window
		if off < 0 {
			off += p.window
		}
		return p.window - off
	}
	return p.window
}

// sweep drops the keys whose units expired (p.mu held), at most once a
// second: a flood of new keys into a full pool must not walk it each time.
func (p *leasePool) sweep(now int64) {
	if p.swept != 0 && now-p.swept < int64(time.Second) {
		return
	}
	p.swept = now
	for k, e := range p.keys {
		if e.taking == nil && now >= e.expires {
			delete(p.keys, k)
		}
	}
}

// refund gives the units of a request that did not happen after all back
// to the lease they came from (at most a lease's worth is held); the
// others, and units whose lease expired, go back to Redis.
func (l *leaser) refund(ctx context.Context, reqs []backend.Request, granted []algorithms.Result, next decider) error {
	if l == nil || !anyLeased(reqs) {
		return next.Refund(ctx, reqs, granted)
	}
	now := l.now()
	rest := make([]backend.Request, 0, len(reqs))
	restGranted := make([]algorithms.Result, 0, len(reqs))
	for i, r := range reqs {
		ll, ok := r.Limit.(*leasedLimit)
		if !ok {
			rest = append(rest, r)
			restGranted = append(restGranted, granted[i])
			continue
		}
		if r.Cost > 0 && granted[i].Allowed && !r.Shadow && r.Cost <= ll.pool.n {
			p := ll.pool
			p.mu.Lock()
			e := p.keys[r.Key]
			kept := e != nil && e.taking == nil && now < e.expires
			if kept {
				e.units = min(e.units+r.Cost, p.n)
			}
			p.mu.Unlock()
			if kept {
				continue
			}
		}
		rest = append(rest, backend.Request{Limit: ll.Limit, Key: r.Key, Cost: r.Cost, Shadow: r.Shadow})
		restGranted = append(restGranted, granted[i])
	}
	if len(rest) == 0 {
		return nil
	}
	return next.Refund(ctx, rest, restGranted)
}

// close lets go of this store's pools; a pool no config uses any more
// gives its unused units back to Redis, where the algorithm can take them
// back exactly (not a sliding_window's: its event holds spent units too).
func (l *leaser) close(ctx context.Context, next decider) {
	if l == nil {
		return
	}
	l.mu.Lock()
	held := l.held
	l.held = nil
	l.mu.Unlock()
	now := l.now()
	for _, h := range held {
		gone, _ := leasePools.Delete(h.key)
		if !gone || h.pool.alg == algorithms.NameSlidingWindow {
			continue
		}
		var reqs []backend.Request
		var granted []algorithms.Result
		h.pool.mu.Lock()
		for k, e := range h.pool.keys {
			if e.units > 0 && e.taking == nil && now < e.expires {
				reqs = append(reqs, backend.Request{Limit: h.handle, Key: k, Cost: e.units})
				granted = append(granted, algorithms.Result{Allowed: true, At: e.at})
				e.units = 0
			}
		}
		h.pool.mu.Unlock()
		for len(reqs) > 0 {
			n := min(len(reqs), 256)
			if err := next.Refund(ctx, reqs[:n], granted[:n]); err != nil && l.drops != nil {
				l.drops.failed("lease", err)
			}
			reqs, granted = reqs[n:], granted[n:]
		}
	}
}

// redisID names the Redis and key space a module's leases come from.
func (m *Module) redisID() string { return m.poolKey + "\x00" + m.Store.prefix }

// Register registers a limit with the store; one with a lease gets a
// handle that spends leased units.
func (m *Module) Register(cfg backend.LimitConfig) (backend.Limit, error) {
	if cfg.Lease != 0 {
		if err := leaseable(cfg); err != nil {
			return nil, err
		}
	}
	h, err := m.Store.Register(cfg)
	if err != nil || cfg.Lease == 0 {
		return h, err
	}
	if m.leases == nil {
		m.leases = &leaser{now: monotonic, drops: &m.Store.drops}
	}
	return m.leases.register(cfg, h, m.redisID())
}

// unlease is the store's own handle of l.
func unlease(l backend.Limit) backend.Limit {
	if ll, ok := l.(*leasedLimit); ok {
		return ll.Limit
	}
	return l
}

// dropLease forgets the units this process holds of key: after an
// operator changed the key in Redis, they were charged to a state that is
// gone (a reset) or no longer tell what is left (a grant). Dropping them
// only ever admits less.
func dropLease(l backend.Limit, key string) {
	ll, ok := l.(*leasedLimit)
	if !ok {
		return
	}
	ll.pool.mu.Lock()
	if e := ll.pool.keys[key]; e != nil && e.taking == nil {
		delete(ll.pool.keys, key)
	}
	ll.pool.mu.Unlock()
}

// Inspect reads the key's state in Redis (backend.Admin): the units this
// process holds of a leased key count as taken.
func (m *Module) Inspect(ctx context.Context, l backend.Limit, key string) (algorithms.Usage, error) {
	return m.Store.Inspect(ctx, unlease(l), key)
}

// Reset deletes the key's state (backend.Admin) and the units held of it.
func (m *Module) Reset(ctx context.Context, l backend.Limit, key string) error {
	dropLease(l, key)
	return m.Store.Reset(ctx, unlease(l), key)
}

// Grant gives units back to the key (backend.Admin); the units held of it
// are dropped, and the next request asks Redis afresh.
func (m *Module) Grant(ctx context.Context, l backend.Limit, key string, units int64) (algorithms.Usage, error) {
	dropLease(l, key)
	return m.Store.Grant(ctx, unlease(l), key, units)
}

// Forget drops what this process remembers of the key (backend.Forgetter).
func (m *Module) Forget(l backend.Limit, key string) {
	dropLease(l, key)
	m.Store.Forget(unlease(l), key)
}

// Interface guards.
var (
	_ backend.Admin     = (*Module)(nil)
	_ backend.Forgetter = (*Module)(nil)
)
