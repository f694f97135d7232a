// Package memory is the in-process Store: for each limit, a table of
// fixed-size slots holding a 64-bit hash of the key and its compact state
// (no Go map, no string per key), split over up to 64 locks, kept across
// config reloads in a caddy.UsagePool, with idle keys swept and a cap on
// keys per limit.
package memory

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"go.uber.org/zap"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
)

// tables keeps each zone's state alive across config reloads: a reload
// provisions the new config (which loads the same table) before the old one
// is cleaned up, so nobody's usage is reset and nothing leaks.
var tables = caddy.NewUsagePool()

// Zones whose algorithms share a kind of state (algorithms.KindOf) share
// it across reloads even if the algorithm name changes (token_bucket ⇄
// gcra).

// Heap per tracked key, used to size the default cap: a slot of the
// hash table (key hash and state) at its lowest load of 1/2, and for the
// sliding log its 80-byte header; the log's ring of events comes on top
// (defaultMaxKeys). BENCHMARKS.md has the measured numbers.
const (
	bytesPerBucketKey  = 32
	bytesPerWindowKey  = 48
	bytesPerCounterKey = 64
	bytesPerLogKey     = 112
)

// DefaultSweepInterval is how often idle keys are dropped when the handler
// does not say (mholt/caddy-ratelimit's default too).
const DefaultSweepInterval = time.Minute

// Options configures a Store.
type Options struct {
	// Now returns the current Unix time in nanoseconds; nil means the
	// system clock. Tests inject a fake clock here.
	Now func() int64
	// SweepInterval is how often idle keys are dropped; 0 means one minute.
	SweepInterval time.Duration
	// Logger receives the (rate-limited) warnings of a table that had to
	// evict a denying key; nil logs nothing.
	Logger *zap.Logger
}

// Store is the memory backend of one handler instance. Its zones' state
// lives in the package pool, shared with every other instance that names
// the same zone.
type Store struct {
	now    func() int64
	sweep  time.Duration
	logger *zap.Logger

	mu   sync.Mutex
	held []held
	resv reservations // spend budgets' reservations (budget.go)
}

// held is a table this store registered with, and how to let go of it.
type held struct {
	key     poolKey
	release func(now int64)
}

type poolKey struct {
	name, scope string
	kind        algorithms.Kind
}

func init() {
	caddy.RegisterModule(new(Store))
}

// CaddyModule returns the Caddy module information: the store a handler
// uses when its "backend" is {"name": "memory"} or absent.
func (*Store) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  backend.Namespace + ".memory",
		New: func() caddy.Module { return New(Options{}) },
	}
}

// UnmarshalCaddyfile reads `backend memory`, which takes no options: the
// handler's sweep_interval and each zone's max_keys configure it.
func (s *Store) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // the module name
	if d.NextArg() {
		return d.ArgErr()
	}
	if d.NextBlock(0) {
		return d.Errf("backend memory takes no options (sweep_interval and max_keys are set on the handler and the zones)")
	}
	return nil
}

// Configure takes the handler's clock, sweep interval and logger.
func (s *Store) Configure(st backend.Setup) {
	if st.Now != nil {
		s.now = st.Now
	}
	if st.SweepInterval > 0 {
		s.sweep = st.SweepInterval
	}
	if st.Logger != nil {
		s.logger = st.Logger
	}
}

// New returns a memory store.
func New(opts Options) *Store {
	s := &Store{now: opts.Now, sweep: opts.SweepInterval, logger: opts.Logger}
	if s.now == nil {
		s.now = backend.SystemNow
	}
	if s.sweep <= 0 {
		s.sweep = DefaultSweepInterval
	}
	return s
}

// zoneOps is what Decide needs from a zone, whatever its kind of state.
type zoneOps interface {
	backend.Limit
	hash(key string) hkey
	lock(h hkey) *shardBase
	// decide and take run with the key's shard locked.
	decide(h hkey, now, cost int64) algorithms.Result
	take(h hkey, now, cost int64)
	// lockOut locks h out after its limit denied it r, and returns the
	// answer the client gets; with the key's shard locked.
	lockOut(h hkey, now int64, r algorithms.Result) algorithms.Result
	// decideOne locks, decides and takes when allowed (or shadow-allowed);
	// a shadow request never locks the key out.
	decideOne(h hkey, now, cost int64, shadow bool) (algorithms.Result, bool)
	// refund locks and gives back what granted took from the key.
	refund(h hkey, now int64, granted algorithms.Result, cost int64)
	// peers are the tables of the same limit with another kind of state,
	// while a reload that changed the algorithm is under way.
	peers() []peerLink
}

// Register registers cfg and returns its handle.
func (s *Store) Register(cfg backend.LimitConfig) (backend.Limit, error) {
	name, err := algorithms.Check(cfg.Algorithm, cfg.Policy)
	if err != nil {
		return nil, err
	}
	if cfg.MaxKeys < 0 {
		return nil, fmt.Errorf("max_keys must be at least 1, got %d", cfg.MaxKeys)
	}
	if err := cfg.Lockout.Check(); err != nil {
		return nil, err
	}
	if cfg.Lease > 0 {
		// Every decision is already local: a lease would only hide units.
		return nil, fmt.Errorf("lease %d does nothing on the memory backend, which decides every request in this process: remove lease, or use backend redis", cfg.Lease)
	}
	p := cfg.Policy
	cfg.Algorithm = name
	switch kind := algorithms.KindOf(name); kind {
	case algorithms.KindBucket:
		return register(s, cfg, kind, algorithms.NewBucketAlgorithm(name, p), func(p algorithms.Policy) algorithms.Algorithm[algorithms.Bucket] {
			return algorithms.NewBucketAlgorithm(name, p)
		})
	case algorithms.KindLog:
		return register(s, cfg, kind, algorithms.Algorithm[*algorithms.Log](algorithms.NewSlidingLog(p)), newLog)
	case algorithms.KindWindow:
		cal := cfg.Calendar
		return register(s, cfg, kind, algorithms.Algorithm[algorithms.Window](algorithms.NewCalendarWindow(p, cal)), func(p algorithms.Policy) algorithms.Algorithm[algorithms.Window] {
			return algorithms.NewCalendarWindow(p, cal)
		})
	case algorithms.KindCounter:
		return register(s, cfg, kind, algorithms.Algorithm[algorithms.Counter](algorithms.NewSlidingCounter(p)), newCounter)
	}
	return nil, fmt.Errorf("algorithm %s is not available in the memory backend", name)
}

// register binds cfg to its table, creating the table on first use. mk
// makes the algorithm for another max_events (SetMaxEvents).
func register[S any](s *Store, cfg backend.LimitConfig, kind algorithms.Kind, alg algorithms.Algorithm[S], mk func(algorithms.Policy) algorithms.Algorithm[S]) (backend.Limit, error) {
	maxKeys := cfg.MaxKeys
	if maxKeys == 0 {
		sized := cfg.Policy
		sized.Limit = max(sized.Limit, cfg.MostEvents)
		maxKeys = defaultMaxKeys(kind, sized, cfg.Cost)
		if worst := int64(maxKeys) * bytesPerKey(kind, sized, cfg.Cost); worst > defaultTargetBytes && s.logger != nil {
			s.logger.Warn("this limit's default max_keys can hold more than 100 MB: each key's log holds up to max_events events; set max_keys, or use sliding_window_counter, whose keys take 24 bytes",
				zap.String("zone", cfg.Name), zap.String("scope", cfg.Scope), zap.Int("max_keys", maxKeys), zap.Int64("worst_case_bytes", worst))
		}
	}
	key := poolKey{cfg.Name, cfg.Scope, kind}
	v, loaded, err := tables.LoadOrNew(key, func() (caddy.Destructor, error) {
		return newTable[S](key, maxKeys, s.now), nil
	})
	if err != nil {
		return nil, err
	}
	t, ok := v.(*table[S])
	if !ok {
		// Cannot happen: the kind in the pool key fixes S.
		_, _ = tables.Delete(key)
		return nil, fmt.Errorf("zone %q: state of an unexpected type %T", cfg.Name, v)
	}
	reg := &registration[S]{alg: alg, lockout: cfg.Lockout, maxKeys: maxKeys, sweep: s.sweep, owner: cfg.Owner, logger: s.logger}
	if err := t.register(reg, s.now()); err != nil {
		_, _ = tables.Delete(key)
		return nil, err
	}
	if !loaded {
		takeOver(t)
		go t.run()
	}
	s.mu.Lock()
	s.held = append(s.held, held{key: key, release: func(now int64) { t.unregister(reg, now) }})
	s.mu.Unlock()
	return &zone[S]{name: cfg.Name, t: t, mk: mk, algName: cfg.Algorithm}, nil
}

// Close releases this store's hold on its zones' tables, undoing the rates
// it put in force (a failed config leaves the running one's rates); a table
// is dropped when no running config uses it any more.
func (s *Store) Close() error {
	s.mu.Lock()
	held := s.held
	s.held = nil
	s.mu.Unlock()
	now := s.now()
	// Newest first, so that each table goes back through the confs in the
	// order they were put in force; and all of them, whatever fails.
	var errs []error
	for i := len(held) - 1; i >= 0; i-- {
		held[i].release(now)
		if _, err := tables.Delete(held[i].key); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

type zone[S any] struct {
	name string
	t    *table[S]
	// mk and adj change the limit's max_events while it runs (adjust.go).
	mk      func(algorithms.Policy) algorithms.Algorithm[S]
	adj     atomic.Pointer[adjusted[S]]
	algName string
}

func (z *zone[S]) Name() string { return z.name }

func (z *zone[S]) hash(key string) hkey { return z.t.hash(key) }

func (z *zone[S]) lock(h hkey) *shardBase { return &z.t.shard(h).shardBase }

func (z *zone[S]) decide(h hkey, now, cost int64) algorithms.Result {
	sh := z.t.shard(h)
	conf := z.t.current(sh)
	r := z.algFor(conf).Decide(sh.get(h), now, cost)
	if conf.lockout != nil {
		r = sh.lockedOut(h, r, now)
	}
	return r
}

func (z *zone[S]) take(h hkey, now, cost int64) {
	sh := z.t.shard(h)
	alg := z.alg(sh)
	if sh.n > 0 {
		if i, ok := sh.find(h); ok {
			sh.e[i].s = alg.Take(sh.e[i].s, now, cost)
			return
		}
	}
	var zero S
	z.t.insert(sh, h, alg.Take(zero, now, cost), now)
}

func (z *zone[S]) peers() []peerLink { return z.t.linked() }

func (z *zone[S]) refund(h hkey, now int64, granted algorithms.Result, cost int64) {
	sh := z.t.shard(h)
	sh.mu.Lock()
	alg := z.alg(sh)
	if sh.n > 0 {
		if i, ok := sh.find(h); ok {
			sh.e[i].s = alg.Refund(sh.e[i].s, now, granted, cost)
		}
	}
	sh.mu.Unlock()
}

// decideOne is the path of a request that matched one zone: one probe
// finds the key, and the new state is written in place. It returns false,
// deciding nothing, if a table of another kind was linked since the caller
// looked (its translation of this shard may already have been read, and a
// unit taken here alone would be lost to it once this table is gone), or
// if no config holds the table any more.
func (z *zone[S]) decideOne(h hkey, now, cost int64, shadow bool) (algorithms.Result, bool) {
	sh := z.t.shard(h)
	sh.mu.Lock()
	if z.t.peers.Load() != nil || z.t.dead.Load() {
		sh.mu.Unlock()
		return algorithms.Result{}, false
	}
	conf := z.t.current(sh)
	alg := z.algFor(conf)
	i, found := -1, false
	var s S
	if sh.n > 0 {
		if i, found = sh.find(h); found {
			s = sh.e[i].s
		}
	}
	r := alg.Decide(s, now, cost)
	if conf.lockout != nil {
		// One look at the record: locked out, or denied now and locked.
		if wait := sh.lockWait(h, now); wait > 0 {
			r = backend.LockedOut(r, wait)
		} else if !r.Allowed && !shadow {
			r = z.t.lockOut(sh, conf.lockout, h, r, now)
		}
	}
	if r.Allowed && cost > 0 {
		if found {
			sh.e[i].s = alg.Take(s, now, cost)
		} else {
			z.t.insert(sh, h, alg.Take(s, now, cost), now)
		}
	}
	sh.mu.Unlock()
	return r, true
}

// located is one request resolved to its zone, key hash and shard.
type located struct {
	z     zoneOps
	h     hkey
	sh    *shardBase
	cost  int64 // total cost of this (table, key) in the request
	alias int32 // index in the list of the first entry of the same table and key
	req   int32 // index of the request, or -1 - that index for a table of the
	// request's limit with another kind of state (a peer)
}

// locate appends the entry of key h in z for request req, or adds its cost
// to the entry of the same table and key: the same key of one limit twice
// in one request is decided once, for the sum of the costs.
func locate(loc []located, z zoneOps, h hkey, cost int64, req int32) []located {
	l := located{z: z, h: h, sh: z.lock(h), cost: cost, alias: int32(len(loc)), req: req}
	for j := range loc {
		if int(loc[j].alias) == j && loc[j].sh == l.sh && loc[j].h == h {
			l.alias = int32(j)
			loc[j].cost += cost
			break
		}
	}
	return append(loc, l)
}

// decide answers reqs all or nothing. The shards of every key involved are
// locked together, in one global order so that concurrent requests over
// overlapping zones cannot deadlock, and nothing is taken unless every
// non-shadow request is allowed. A limit whose algorithm a reload is
// changing to another kind of state has a table of each kind (peers.go):
// its request is decided by all of them, and answered by its own table
// unless another denies.
func (s *Store) decide(_ context.Context, reqs []backend.Request, out []algorithms.Result) (bool, error) {
	now := s.now()
	if len(reqs) == 1 {
		z, ok := reqs[0].Limit.(zoneOps)
		if !ok {
			return false, fmt.Errorf("zone %q was not registered with the memory backend", reqs[0].Limit.Name())
		}
		if len(z.peers()) == 0 {
			if r, ok := z.decideOne(z.hash(reqs[0].Key), now, max(reqs[0].Cost, 0), reqs[0].Shadow); ok {
				out[0] = r
				out[0].At = now
				return r.Allowed || reqs[0].Shadow, nil
			}
		}
	}
	for {
		if ok, again, err := decideLinked(reqs, out, now); !again {
			return ok, err
		}
	}
}

// decideLinked decides reqs by their tables and the tables' peers. It
// returns again, deciding nothing, if a takeover linked tables between the
// look at the peers and the locks (links).
func decideLinked(reqs []backend.Request, out []algorithms.Result, now int64) (ok, again bool, err error) {
	gen := links.Load()
	var buf [8]located
	loc := buf[:0]
	if len(reqs) > len(buf) {
		loc = make([]located, 0, len(reqs))
	}
	for i, r := range reqs {
		z, ok := r.Limit.(zoneOps)
		if !ok {
			return false, false, fmt.Errorf("zone %q was not registered with the memory backend", r.Limit.Name())
		}
		h, cost := z.hash(r.Key), max(r.Cost, 0)
		loc = locate(loc, z, h, cost, int32(i))
		for _, p := range z.peers() {
			loc = locate(loc, p.z, h, cost, -1-int32(i))
		}
	}

	var lockBuf [8]*shardBase
	locks := lockBuf[:0]
	for _, l := range loc {
		locks = insertLock(locks, l.sh)
	}
	for _, m := range locks {
		m.mu.Lock()
	}
	defer func() {
		for _, m := range locks {
			m.mu.Unlock()
		}
	}()
	if links.Load() != gen {
		return false, true, nil
	}

	// Without peers each request has one entry, at its own index.
	res := out[:len(reqs)]
	if len(loc) > len(reqs) {
		res = make([]algorithms.Result, len(loc))
	}
	allowed := true
	for i := range loc {
		l := &loc[i]
		if int(l.alias) != i {
			continue
		}
		res[i] = l.z.decide(l.h, now, l.cost)
		res[i].At = now
		if !res[i].Allowed && !reqs[max(l.req, -1-l.req)].Shadow {
			allowed = false
		}
	}
	if !allowed {
		// In the same critical section that denied: a concurrent request
		// of the key finds it locked out.
		for i := range loc {
			l := &loc[i]
			if int(l.alias) == i && !res[i].Allowed && !reqs[max(l.req, -1-l.req)].Shadow {
				res[i] = l.z.lockOut(l.h, now, res[i])
			}
		}
	}
	// A request's own entry comes before those of its peers.
	peers := len(loc) > len(reqs)
	for i := range loc {
		switch l := &loc[i]; {
		case l.req < 0:
			out[-1-l.req] = stricter(out[-1-l.req], res[l.alias])
		case peers || int(l.alias) != i:
			out[l.req] = res[l.alias]
		}
	}
	if !allowed {
		return false, false, nil
	}
	for i := range loc {
		l := &loc[i]
		if int(l.alias) == i && res[i].Allowed && l.cost > 0 {
			l.z.take(l.h, now, l.cost)
		}
	}
	return true, false, nil
}

// stricter is the answer to a request that its own table answered a and a
// table of another kind of state of the same limit answered b: b if it
// denies (and makes the client wait longer), else a with the room of both.
func stricter(a, b algorithms.Result) algorithms.Result {
	switch {
	case b.Allowed && a.Allowed:
		a.Remaining = min(a.Remaining, b.Remaining)
		a.ResetAfter = max(a.ResetAfter, b.ResetAfter)
		return a
	case b.Allowed, a.RetryAfter == algorithms.Never:
		return a
	case a.Allowed, b.RetryAfter == algorithms.Never, b.RetryAfter > a.RetryAfter:
		return b
	}
	return a
}

// Refund gives back the units reqs took, releasing the reservations among
// them. Each key is refunded under its own shard lock; a refund only ever
// makes room, so it needs no all-or-nothing.
func (s *Store) Refund(_ context.Context, reqs []backend.Request, granted []algorithms.Result) error {
	now := s.now()
	for i, r := range reqs {
		z, ok := r.Limit.(zoneOps)
		if !ok {
			return fmt.Errorf("zone %q was not registered with the memory backend", r.Limit.Name())
		}
		switch {
		case r.Reserve > 0:
			// A reservation's units come back once: its expiry must
			// not give them back again.
			s.settle(z, r, granted[i], false, now)
		case r.Cost > 0 && granted[i].Allowed:
			z.refund(z.hash(r.Key), now, granted[i], r.Cost)
		}
	}
	return nil
}

// insertLock adds m to the sorted, duplicate-free list of shards to lock.
func insertLock(locks []*shardBase, m *shardBase) []*shardBase {
	i := 0
	for i < len(locks) && locks[i].id < m.id {
		i++
	}
	if i < len(locks) && locks[i] == m {
		return locks
	}
	locks = append(locks, nil)
	copy(locks[i+1:], locks[i:])
	locks[i] = m
	return locks
}

// Interface guards.
var (
	_ backend.Store         = (*Store)(nil)
	_ backend.StatsReporter = (*Store)(nil)
	_ backend.Configurable  = (*Store)(nil)
	_ caddy.Module          = (*Store)(nil)
	_ caddyfile.Unmarshaler = (*Store)(nil)
)

// Stats returns the numbers of every memory table alive in this process,
// not only this store's: the tables are shared by every handler and config
// that names the same zones. They are summed by zone and scope (a limit
// whose algorithm changed kind of state has two tables while a reload is
// under way), in no particular order.
func (s *Store) Stats() []backend.LimitStats {
	type id struct{ zone, scope string }
	sums := make(map[id]*backend.LimitStats)
	var all []backend.LimitStats
	tables.Range(func(k, v any) bool {
		st, ok := v.(interface {
			Keys() int64
			Evictions() uint64
			DenyingEvictions() uint64
		})
		if !ok {
			return true
		}
		pk := k.(poolKey)
		sum := sums[id{pk.name, pk.scope}]
		if sum == nil {
			sum = &backend.LimitStats{Zone: pk.name, Scope: pk.scope}
			sums[id{pk.name, pk.scope}] = sum
		}
		sum.Keys += st.Keys()
		sum.Evictions += st.Evictions()
		sum.DenyingEvictions += st.DenyingEvictions()
		return true
	})
	for _, sum := range sums {
		all = append(all, *sum)
	}
	return all
}
