// Package redis is the Redis Store: the state of every key lives in Redis,
// shared by every Caddy instance that uses the same Redis, and each request
// is decided by one Lua script call that runs the algorithms' math on the
// Redis server's clock. docs/redis.md describes the key layout, the hash
// tags and why the script's numbers are exact.
package redis

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/bits"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	goredis "github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
)

// DefaultTimeout bounds each call to Redis when Options.Timeout is zero.
const DefaultTimeout = 100 * time.Millisecond

// Options configures a Store.
type Options struct {
	// KeyPrefix starts every key the store writes; default "sluice:". A
	// prefix holding a hash tag ("sluice{1}:") puts every key in one Redis
	// Cluster slot.
	KeyPrefix string
	// Timeout bounds each Decide and Refund (all their calls to Redis);
	// default 100ms.
	Timeout time.Duration
	// NoCache turns off the over-limit cache: every request is decided
	// by Redis, even for keys Redis just declared over their limit.
	NoCache bool
	// NoBatch sends each decision in a script call of its own, on a
	// connection of its own, instead of deciding concurrent decisions
	// together in one script call.
	NoBatch bool
	// CacheSize is the most keys the over-limit cache remembers, each a
	// few hundred bytes; the oldest makes room. Default: DefaultCacheSize.
	CacheSize int

	// Tests only: now, when set, is the clock the script decides with
	// (instead of the Redis server's TIME) and that policy changes are
	// recorded with; ttlExtra is added to every expiry, in milliseconds, so
	// that keys outlive real time while the injected clock stands still;
	// split groups keys by hash slot even on a standalone server;
	// pipeline batches with go-redis automatic pipelining (one script
	// call per decision) instead of one script call per batch, for the
	// benchmarks that compare the two.
	now      func() int64
	ttlExtra int64
	split    bool
	pipeline bool
}

// Store is the Redis backend of one handler instance. The policy history of
// its zones is shared, through a caddy.UsagePool, with every other Store of
// the process that names the same zones under the same key prefix.
type Store struct {
	client  goredis.UniversalClient
	cluster bool
	prefix  string
	timeout time.Duration
	opts    Options
	cache   *overCache             // nil when off
	batch   *goredis.AutoPipeliner // only with Options.pipeline; closed with the client
	// noFunctions is set once the server refused Functions: the script
	// runs by EVALSHA (script.go).
	noFunctions atomic.Bool
	// batchers gathers concurrent decisions into script calls: one per
	// hash slot on a cluster, else one (slot 0). Empty with NoBatch.
	batchers sync.Map // uint16 → *batcher
	// holdFor bounds a held call's wait for its round (batcher.hold):
	// holdFor, at most a tenth of the timeout.
	holdFor time.Duration

	mu   sync.Mutex
	held []held

	slots slotHolder // concurrency slots held, renewed until released (slots.go)
	drops giveBacks  // give-backs Redis did not take (giveback.go)
}

type held struct {
	key poolKey
	z   *zoneState
	reg *registration
}

// New returns a Store over client: a *goredis.Client (standalone or
// Sentinel) or a *goredis.ClusterClient, as goredis.NewUniversalClient
// makes them. The client must have ContextTimeoutEnabled so that the
// per-call deadline reaches the socket. Retries need no setting: the
// store's calls are marked never to be retried (at most once), whatever
// MaxRetries says.
func New(client goredis.UniversalClient, opts Options) (*Store, error) {
	if client == nil {
		return nil, errors.New("redis backend: no client")
	}
	if _, ok := client.(*goredis.Ring); ok {
		// A Ring spreads keys over servers that know nothing of each
		// other: one script could not see all the keys of a request.
		return nil, errors.New("redis backend: a Ring client cannot decide a request's keys together; use a Redis Cluster")
	}
	if !contextTimeouts(client) {
		return nil, errors.New("redis backend: the client must be made with ContextTimeoutEnabled: true, or a slow Redis would hold requests past the timeout")
	}
	if opts.Timeout < 0 {
		return nil, fmt.Errorf("redis backend: timeout must be positive, got %v", opts.Timeout)
	}
	if err := checkKeyPrefix(opts.KeyPrefix); err != nil {
		return nil, fmt.Errorf("redis backend: %w", err)
	}
	s := &Store{client: client, prefix: opts.KeyPrefix, timeout: opts.Timeout, opts: opts}
	if s.prefix == "" {
		s.prefix = DefaultKeyPrefix
	}
	if s.timeout == 0 {
		s.timeout = DefaultTimeout
	}
	s.holdFor = min(holdFor, s.timeout/10)
	_, s.cluster = client.(*goredis.ClusterClient)
	if !opts.NoBatch && opts.pipeline {
		var err error
		switch c := client.(type) {
		case *goredis.Client:
			s.batch, err = c.AsyncAutoPipeline()
		case *goredis.ClusterClient:
			s.batch, err = c.AsyncAutoPipeline()
		}
		if err != nil {
			return nil, fmt.Errorf("redis backend: pipelining: %w", err)
		}
	}
	if opts.CacheSize < 0 {
		return nil, fmt.Errorf("redis backend: cache size must be positive, got %d", opts.CacheSize)
	}
	if !opts.NoCache {
		size := opts.CacheSize
		if size == 0 {
			size = DefaultCacheSize
		}
		now := monotonic
		if opts.now != nil {
			now = opts.now
		}
		s.cache = newOverCache(size, now)
	}
	return s, nil
}

var started = time.Now()

// monotonic reads the monotonic clock, so that a step of the wall clock
// does not stretch what the over-limit cache remembers.
func monotonic() int64 { return int64(time.Since(started)) }

func contextTimeouts(c goredis.UniversalClient) bool {
	switch c := c.(type) {
	case *goredis.Client:
		return c.Options().ContextTimeoutEnabled
	case *goredis.ClusterClient:
		return c.Options().ContextTimeoutEnabled
	}
	return true
}

func (s *Store) now() int64 {
	if s.opts.now != nil {
		return s.opts.now()
	}
	return time.Now().UnixNano()
}

// zone is the store's handle on one (zone, scope, kind of state).
type zone struct {
	name       string
	prefix     string
	lockPrefix string // of the key's lock-out record (lockout.go)
	st         *zoneState
	adj        atomic.Pointer[adjusted] // a max_events set while it runs (adjust.go)
}

func (z *zone) Name() string { return z.name }

// Register registers cfg and returns its handle. Besides the checks every
// store makes, it refuses policies whose spans the script cannot compute
// exactly (MaxSpan). MaxKeys does not apply: Redis keys expire when idle
// and Redis's own maxmemory bounds the rest.
func (s *Store) Register(cfg backend.LimitConfig) (backend.Limit, error) {
	alg, err := algorithms.Check(cfg.Algorithm, cfg.Policy)
	if err != nil {
		return nil, err
	}
	if err := checkExact(alg, cfg.Policy); err != nil {
		return nil, err
	}
	if cfg.MaxKeys < 0 {
		return nil, fmt.Errorf("max_keys must be at least 1, got %d", cfg.MaxKeys)
	}
	kind := stateKind(alg)
	key := poolKey{s.prefix, cfg.Name, cfg.Scope, kind}
	prefix := zonePrefix(s.prefix, cfg.Name, cfg.Scope, kind)
	v, loaded, err := zoneStates.LoadOrNew(key, func() (caddy.Destructor, error) { return newZoneState(), nil })
	if err != nil {
		return nil, err
	}
	st := v.(*zoneState)
	if !loaded {
		st.from = carryFrom(key, len(prefix)-1, s.now())
	}
	if err := cfg.Lockout.Check(); err != nil {
		return nil, err
	}
	if len(cfg.Lockout) > 0 && cfg.Lease > 0 {
		// Leased units are spent and denied locally, out of the script
		// that writes lock-outs.
		return nil, fmt.Errorf("lockout cannot be used with lease: a denial from leased units would lock the key out on one instance only")
	}
	reg := &registration{alg: alg, policy: cfg.Policy, lockout: cfg.Lockout, lk: lockoutArg(len(prefix)-1, cfg.Lockout), owner: cfg.Owner, cal: cfg.Calendar}
	if err := st.register(reg, s.now()); err != nil {
		_, _ = zoneStates.Delete(key)
		return nil, err
	}
	s.mu.Lock()
	s.held = append(s.held, held{key: key, z: st, reg: reg})
	s.mu.Unlock()
	return &zone{name: cfg.Name, prefix: prefix, lockPrefix: zonePrefix(s.prefix, cfg.Name, cfg.Scope, kindLockout), st: st}, nil
}

// Close lets go of this store's zones; a zone's history is dropped when no
// running config uses it. It does not close the client, which its owner
// may share.
func (s *Store) Close() error {
	s.slots.close()
	s.mu.Lock()
	held := s.held
	s.held = nil
	s.mu.Unlock()
	now := s.now()
	for _, h := range held {
		h.z.unregister(h.reg, now)
		if _, err := zoneStates.Delete(h.key); err != nil {
			return err
		}
	}
	return nil
}

// item is one distinct key of a request.
type item struct {
	key    string
	conf   *zoneConf
	cost   int64
	shadow bool
	logged int64 // when a sliding log logged the event (a clock that stepped back logs it later)
	// For an undo: the value before the decision, its expiry, and the
	// value the decision wrote.
	before, after string
	ttl           int64
	// Spend budgets (budget.go): p1 is a calendar window's p1 argument
	// (nil: the conf's), resv a decision's reservation argument and
	// token the reservation a settle or an undo names.
	p1          any
	resv, token string
}

// group is the items of one script call: all of them, or those of one
// Redis Cluster slot.
type group struct {
	items []int // indexes into the request's items
	cmd   *goredis.Cmd
	took  bool
}

// resolve turns reqs into distinct keys: the same key twice in one request
// is decided once, for the sum of the costs, as the memory store does.
func (s *Store) resolve(reqs []backend.Request) ([]item, []int, error) {
	return s.resolveInto(make([]item, 0, len(reqs)), reqs)
}

// resolveInto is resolve appending the items to items, which has room
// for len(reqs).
func (s *Store) resolveInto(items []item, reqs []backend.Request) ([]item, []int, error) {
	of := oneItem // request → item; read only
	if len(reqs) > 1 {
		of = make([]int, len(reqs))
	}
	for i, r := range reqs {
		z, ok := r.Limit.(*zone)
		if !ok {
			return nil, nil, fmt.Errorf("zone %q was not registered with the redis backend", r.Limit.Name())
		}
		conf := z.conf()
		key := z.stateKey(r.Key)
		cost := min(max(r.Cost, 0), maxCost)
		at := -1
		for j := range items {
			if items[j].key == key {
				items[j].cost = min(items[j].cost+cost, maxCost)
				at = j
				break
			}
		}
		if at < 0 {
			at = len(items)
			z.st.use(conf)
			items = append(items, item{key: key, conf: conf, cost: cost, shadow: r.Shadow})
			s.budgetItem(&items[len(items)-1], r)
		}
		if len(reqs) > 1 {
			of[i] = at
		}
	}
	return items, of, nil
}

// oneItem is resolve's map of a single request: shared, never written.
var oneItem = []int{0}

// single holds the item and the result of a request of one key: one
// allocation for both, given back to singles unless they outlive Decide
// (its batch still out, or its call abandoned).
type single struct {
	items   [1]item
	results [1]algorithms.Result
}

var singles = sync.Pool{New: func() any { return new(single) }}

// groups splits items by hash slot on a cluster, where one script may only
// touch keys of one slot.
func (s *Store) groups(items []item) []group {
	if !s.cluster && !s.opts.split {
		all := make([]int, len(items))
		for i := range all {
			all[i] = i
		}
		return []group{{items: all}}
	}
	var gs []group
	slots := make(map[uint16]int)
	for i := range items {
		sl := slotOf(items[i].key)
		g, ok := slots[sl]
		if !ok {
			g = len(gs)
			slots[sl] = g
			gs = append(gs, group{})
		}
		gs[g].items = append(gs[g].items, i)
	}
	return gs
}

// oneSlot reports whether items make one group, without making it.
func (s *Store) oneSlot(items []item) bool {
	if !s.cluster && !s.opts.split {
		return true
	}
	sl := slotOf(items[0].key)
	for i := 1; i < len(items); i++ {
		if slotOf(items[i].key) != sl {
			return false
		}
	}
	return true
}

// header is the script's first arguments (headerArgs): the mode, the
// clock (clockServer for the server's TIME) and the expiry extension.
func (s *Store) header(mode string) []any {
	h := make([]any, headerArgs)
	h[argMode-1] = mode
	if s.opts.now == nil {
		h[argNowSeconds-1], h[argNowNanos-1], h[argExpiryExtra-1] = clockServer, clockServer, "0"
		return h
	}
	now := s.now()
	h[argNowSeconds-1] = strconv.FormatInt(now/1e9, 10)
	h[argNowNanos-1] = strconv.FormatInt(now%1e9, 10)
	h[argExpiryExtra-1] = strconv.FormatInt(s.opts.ttlExtra, 10)
	return h
}

// prepare makes each group's script call in mode: the header, then each
// item's arguments, with the two that depend on the mode from xs; an undo
// (modeUndo) adds what each item's decision wrote.
func (s *Store) prepare(ctx context.Context, mode string, gs []group, items []item, xs func(i int) (string, string)) {
	hdr := s.header(mode)
	for g := range gs {
		keys := make([]string, len(gs[g].items))
		args := append(make([]any, 0, len(hdr)+(keyArgs+undoValues)*len(keys)), hdr...)
		for k, i := range gs[g].items {
			keys[k] = items[i].key
			x1, x2 := xs(i)
			args = itemArgs(args, &items[i], x1, x2)
		}
		if mode == modeUndo {
			for _, i := range gs[g].items {
				var u [undoValues]any
				u[undoBefore-1] = items[i].before
				u[undoExpiry-1] = strconv.FormatInt(items[i].ttl, 10)
				u[undoAfter-1] = items[i].after
				args = append(args, u[:]...)
			}
		}
		gs[g].cmd = s.scriptCmd(ctx, keys, args)
	}
}

// itemArgs appends one item's script arguments (keyArgs): the zone's,
// boxed once, and the request's. The cost goes as an int64, which go-redis
// writes as the same decimal bulk string without the allocation of
// formatting and boxing a string.
func itemArgs(args []any, it *item, x1, x2 any) []any {
	a := it.conf.boxed
	if it.p1 != nil {
		a[keyArgP1-1] = it.p1
	}
	a[keyArgCost-1] = it.cost
	a[keyArgX1-1], a[keyArgX2-1] = x1, x2
	return append(args, a[:]...)
}

// Decide answers reqs all or nothing (backend.Store). On a cluster, keys
// of different slots are decided by one script call per slot, sent in one
// pipeline; if any call denies (or fails), what the others took is given
// back. That never admits more than the limits; a request racing with
// such a give-back may be refused.
func (s *Store) Decide(ctx context.Context, reqs []backend.Request, out []algorithms.Result) (bool, error) {
	var items []item
	var of []int
	var results []algorithms.Result
	var err error
	held := false // items and results may outlive Decide
	if len(reqs) == 1 {
		one := singles.Get().(*single)
		defer func() {
			if !held {
				*one = single{}
				singles.Put(one)
			}
		}()
		items, of, err = s.resolveInto(one.items[:0], reqs)
		results = one.results[:]
	} else {
		items, of, err = s.resolve(reqs)
		results = make([]algorithms.Result, len(items))
	}
	if err != nil || len(items) == 0 {
		return err == nil, err
	}
	// The deadline covers waiting for another request's answer too. The
	// batched path checks it itself (before sending, and with one timer
	// for all its waiting requests): a context of its own per request
	// cost a timer, a channel and a registration with the parent's.
	deadline := time.Now().Add(s.timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	parent := ctx
	var cancel context.CancelFunc = func() {}
	defer func() { cancel() }()
	made := false
	bounded := func() context.Context { // made once, where needed
		if !made {
			made = true
			ctx, cancel = context.WithDeadline(parent, deadline)
		}
		return ctx
	}
	var sent int64
	var epoch uint64
	var probing []*overEntry
	if s.cache != nil {
		for {
			ok, wait, p := s.cache.answer(items, results)
			if ok {
				for i := range reqs {
					out[i] = results[of[i]]
				}
				return false, nil
			}
			if wait == nil {
				probing = p
				break
			}
			select {
			case <-wait:
			case <-bounded().Done():
				return false, fmt.Errorf("redis backend: %w", ctx.Err())
			}
		}
		// Released here unless learn got to it first (an error).
		defer s.cache.release(probing)
		sent, epoch = s.cache.mark()
	}

	var gs []group // nil when batched: one group
	allowed := true
	var failed error
	if !s.opts.NoBatch && !s.opts.pipeline && s.oneSlot(items) {
		allowed, failed, held = s.batcherFor(items).decide(parent, deadline, items, results)
	} else {
		// A call abandoned at its deadline may still be queued to be
		// written (automatic pipelining): left to the collector.
		held = true
		gs = s.groups(items)
		allowed, failed = s.decideGroups(bounded(), gs, items, results)
	}
	if failed != nil || !allowed {
		if len(gs) > 1 {
			s.giveBack(ctx, items, results, gs)
		}
		if failed != nil {
			if s.cache != nil && !failedAlone(failed) && ctx.Err() == nil {
				// Redis may have restarted empty, or failed over to a
				// replica that missed writes: what it denied may be gone.
				// A caller whose own context ended (its client left) says
				// nothing about Redis, and a client that keeps leaving
				// must not empty the cache for everyone.
				s.cache.clear()
			}
			return false, fmt.Errorf("redis backend: %w", failed)
		}
	}
	if s.cache != nil {
		s.cache.learn(items, results, allowed, sent, epoch, probing)
	}
	for i := range reqs {
		out[i] = results[of[i]]
	}
	return allowed, nil
}

// decideGroups decides items with one script call per group, in one
// pipeline when there are several.
func (s *Store) decideGroups(ctx context.Context, gs []group, items []item, results []algorithms.Result) (bool, error) {
	// Several calls may have to be taken back: ask for what that needs.
	mode := modeDecide
	if len(gs) > 1 {
		mode = modeDecideUndoable
	}
	s.prepare(ctx, mode, gs, items, func(i int) (string, string) {
		if items[i].shadow {
			return decideShadow, items[i].resv
		}
		return decideCounted, items[i].resv
	})
	runErr := s.run(ctx, gs)
	allowed := true
	var failed error
	for g := range gs {
		ok, err := parseDecision(gs[g].cmd, mode == modeDecideUndoable, gs[g].items, items, results)
		if err != nil {
			failed = err
			continue
		}
		gs[g].took = ok
		allowed = allowed && ok
	}
	if failed == nil {
		failed = runErr
	}
	return allowed, failed
}

// parseDecision reads one call's reply into the results of its items and
// reports whether the call allowed (and so took).
func parseDecision(cmd *goredis.Cmd, undo bool, which []int, items []item, results []algorithms.Result) (bool, error) {
	vals, err := cmd.Slice()
	if err != nil {
		return false, err
	}
	n := replyClockValues + decisionLen(len(which))
	want := n
	if undo {
		want += undoValues * len(which)
	}
	if len(vals) != want {
		return false, fmt.Errorf("script answered %d values for %d keys", len(vals), len(which))
	}
	num := make([]int64, n)
	for i := range num {
		v, ok := vals[i].(int64)
		if !ok {
			return false, fmt.Errorf("script answered %T where a number belongs", vals[i])
		}
		num[i] = v
	}
	at := replyClock(num)
	d := num[replyClockValues:]
	for k, i := range which {
		results[i], items[i].logged = keyResult(d, k, at)
		if undo {
			u := vals[n+undoValues*k:]
			items[i].before, _ = u[undoBefore-1].(string)
			items[i].ttl, _ = u[undoExpiry-1].(int64)
			items[i].after, _ = u[undoAfter-1].(string)
		}
	}
	return d[decisionAllowed-1] == 1, nil
}

// giveBack takes back what the groups that allowed took, when another
// group denied or failed: the request does not happen, so nothing is
// charged. A key nobody wrote since gets its old value back; any other is
// refunded.
func (s *Store) giveBack(ctx context.Context, items []item, results []algorithms.Result, gs []group) {
	var taken []int
	for g := range gs {
		if !gs[g].took {
			continue
		}
		for _, i := range gs[g].items {
			if results[i].Allowed && items[i].cost > 0 {
				taken = append(taken, i)
			}
		}
	}
	if len(taken) == 0 {
		return
	}
	// The give-back must happen even when the request's own deadline has
	// passed: it gets a deadline of its own.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.timeout)
	defer cancel()
	// A sliding log's event is found by the time it was logged at.
	granted := make([]algorithms.Result, len(results))
	copy(granted, results)
	for _, i := range taken {
		granted[i].At = items[i].logged
	}
	if err := s.refund(ctx, modeUndo, items, taken, granted); err != nil {
		s.drops.failed("undo", err)
	}
}

// Refund gives back what an allowed Decide of the same requests took
// (backend.Store). Each key is refunded in turn, as in the memory store; a
// reservation is released instead (modeRelease), so that its expiry does not
// give its units back a second time.
func (s *Store) Refund(ctx context.Context, reqs []backend.Request, granted []algorithms.Result) error {
	items := make([]item, 0, len(reqs))
	results := make([]algorithms.Result, 0, len(reqs))
	var plain, reserved []int
	for i, r := range reqs {
		z, ok := r.Limit.(*zone)
		if !ok {
			return fmt.Errorf("zone %q was not registered with the redis backend", r.Limit.Name())
		}
		if r.Cost <= 0 || !granted[i].Allowed {
			continue
		}
		if r.Reserve > 0 {
			reserved = append(reserved, len(items))
		} else {
			plain = append(plain, len(items))
		}
		conf := z.conf()
		z.st.use(conf)
		items = append(items, item{key: z.stateKey(r.Key), conf: conf, cost: min(r.Cost, maxCost)})
		s.budgetItem(&items[len(items)-1], r)
		results = append(results, granted[i])
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	var err error
	if len(reserved) > 0 {
		err = s.refund(ctx, modeRelease, items, reserved, results)
	}
	if len(plain) > 0 {
		err = cmp.Or(s.refund(ctx, modeRefund, items, plain, results), err)
	}
	return err
}

// refund runs the script in mode (modeRefund, modeUndo, modeCommit or
// modeRelease) for items[which], with the decisions that granted them.
func (s *Store) refund(ctx context.Context, mode string, items []item, which []int, granted []algorithms.Result) error {
	sub := make([]item, len(which))
	for k, i := range which {
		sub[k] = items[i]
	}
	return s.runEach(ctx, mode, "refund", sub, func(i int) (string, string) {
		r := granted[which[i]]
		if sub[i].token != "" {
			return strconv.FormatInt(r.At, 10), sub[i].token
		}
		if mode == modeRefund {
			return refundAt(sub[i], r), strconv.FormatInt(r.Delay, 10)
		}
		return strconv.FormatInt(r.At, 10), strconv.FormatInt(r.Delay, 10)
	})
}

// refundAt is the decision's time argument of a refund or a settle: for a
// bucket, with when the decision said it would be full again, past which
// the refill has paid the charge off and nothing is given back.
func refundAt(it item, r algorithms.Result) string {
	at := strconv.FormatInt(r.At, 10)
	if it.conf.kind != string(kindBucket) || r.At == 0 || r.ResetAfter <= 0 {
		return at
	}
	return at + ":" + strconv.FormatInt(r.At+r.ResetAfter, 10)
}

// runEach runs the script in mode for items, each key in turn (a refund,
// an undo, a settle), with the per-key arguments xs; what names the
// operation in errors.
func (s *Store) runEach(ctx context.Context, mode, what string, items []item, xs func(i int) (string, string)) error {
	if s.cache != nil {
		// Units come back: a denial remembered for these keys may no
		// longer hold, whatever the call's fate (again once it ran).
		s.cache.forget(items)
	}
	gs := s.groups(items)
	s.prepare(ctx, mode, gs, items, xs)
	err := s.run(ctx, gs)
	if s.cache != nil {
		s.cache.forget(items)
	}
	for g := range gs {
		if e := gs[g].cmd.Err(); e != nil {
			err = e
		}
	}
	if err != nil {
		return fmt.Errorf("redis backend: %s: %w", what, err)
	}
	return nil
}

// once marks a command that must not be sent again after it may have run:
// go-redis retries a command whose connection failed (MaxRetries, 3 by
// default), and a script that already charged a request would charge it
// twice. A command that never reached the server (dial errors, a MOVED
// redirect) is still sent, once.
type once struct{ *goredis.Cmd }

func (once) NoRetry() bool { return true }

// scriptCmd is the script call of keys and args.
func (s *Store) scriptCmd(ctx context.Context, keys []string, args []any) *goredis.Cmd {
	a := make([]any, 0, 3+len(keys)+len(args))
	verb, id := s.callHead()
	a = append(a, verb, id, len(keys))
	for _, k := range keys {
		a = append(a, k)
	}
	a = append(a, args...)
	return goredis.NewCmd(ctx, a...)
}

// run sends the groups' script calls: one call alone, several in one
// pipeline. A call that did not run for want of the function or the
// script is sent again (again), each time for another reason: at most
// FCALL, then EVALSHA, then EVAL.
func (s *Store) run(ctx context.Context, gs []group) error {
	if len(gs) == 1 && s.batch != nil {
		// The call rides the next batch written to the connection;
		// waiting for it ends at the call's deadline, and a call
		// abandoned there is not read, since its reply may still come.
		if err := s.batch.Submit(ctx, once{gs[0].cmd}).WaitContext(ctx); err != nil && ctx.Err() != nil {
			gs[0].cmd = goredis.NewCmd(ctx)
			gs[0].cmd.SetErr(err)
			return err
		}
	} else {
		s.send(ctx, gs, nil)
	}
	for range 3 {
		var again []int
		for g := range gs {
			ok, err := s.again(ctx, gs[g].cmd)
			if err != nil {
				gs[g].cmd.SetErr(err)
			}
			if ok {
				gs[g].cmd = goredis.NewCmd(ctx, gs[g].cmd.Args()...)
				again = append(again, g)
			}
		}
		if len(again) == 0 {
			break
		}
		s.send(ctx, gs, again)
	}
	return nil
}

// send sends the calls of gs (those of which, when not nil), one alone
// or several in a pipeline; each call holds its reply or error.
func (s *Store) send(ctx context.Context, gs []group, which []int) {
	if which == nil && len(gs) == 1 || len(which) == 1 {
		g := 0
		if which != nil {
			g = which[0]
		}
		_ = s.client.Process(ctx, once{gs[g].cmd})
		return
	}
	pipe := s.client.Pipeline()
	if which == nil {
		for g := range gs {
			_ = pipe.Process(ctx, once{gs[g].cmd})
		}
	} else {
		for _, g := range which {
			_ = pipe.Process(ctx, once{gs[g].cmd})
		}
	}
	_, _ = pipe.Exec(ctx)
}

func mulU(a, b int64) (hi, lo uint64) { return bits.Mul64(uint64(a), uint64(b)) }

// Interface guard.
var _ backend.Store = (*Store)(nil)
