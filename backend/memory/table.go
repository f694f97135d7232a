package memory

import (
	"hash/maphash"
	"math/bits"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
)

// hkey is a key as the table stores it: a 64-bit hash with a random seed.
// Storing the hash instead of the string keeps each slot at 16 bytes with no
// pointer: no allocation per key, nothing for the garbage collector to scan,
// and a million keys fit in a CPU's last-level cache. Without the seed an
// attacker cannot aim for a collision; by chance, two of a million keys
// share a hash with probability 3·10⁻⁸ (they would then share one quota).
type hkey = uint64

// seed is the process's hash seed, shared by every table, so that a table
// of a new kind of state finds each key of the table it takes over from
// under the same hash.
var seed = maphash.MakeSeed()

// maxShards bounds lock striping; small tables use fewer shards so that the
// key cap stays exact.
const maxShards = 64

// Pauses between full sweeps of one shard triggered by inserts into a full
// table, so a flood of new keys costs a sampled eviction, not a scan, each.
const fullSweepGap = int64(time.Second)

// sampleSize is how many entries an eviction compares when no key is idle.
const sampleSize = 8

// denyLogGap is the least time between two log lines about denying keys
// evicted from one table.
const denyLogGap = 10 * int64(time.Second)

type shardBase struct {
	mu sync.Mutex
	id uint64 // global lock order for requests that touch several shards
}

type shard[S any] struct {
	shardBase
	slots[S]
	lastSweep int64  // time of the last full sweep, clock of the store
	allDenied int64  // time of the last scan that found every key denying
	rng       uint64 // picks where eviction samples start
	gen       int    // the policy generation the entries are written in
	// recent are keys inserted while the table was full, looked at when a
	// sample finds only denying keys: they are the likeliest to have room.
	recent [4]hkey
	// lockouts are the lock-out records of the shard's keys (lockout.go);
	// nil until one is written.
	lockouts map[hkey]backend.LockoutState
}

var shardIDs atomic.Uint64

// table holds the state of one limit: sharded maps from key hash to S. It
// outlives config reloads in the package UsagePool.
//
// Every config that uses the table registers its algorithm; the newest
// live registration's decides, for every config, so that two configs never
// write one state under two rates. When that changes the policy (a reload
// with a new rate, or a failed reload undone), the switch is recorded with
// its time, and each shard rebases its entries through the switches it has
// not seen the next time it is locked: each period drains at the rate that
// was in force during it.
type table[S any] struct {
	id     poolKey
	shards []shard[S]
	mask   uint64

	conf     atomic.Pointer[tableConf[S]]
	maxKeys  atomic.Int64
	interval atomic.Int64 // sweep interval, ns

	mu      sync.Mutex // guards regs, history, seen and the confs' prev
	regs    []*registration[S]
	history []policySwitch[S] // history[g] takes generation g to g+1
	seen    int               // the newest generation a shard was rebased to

	count     atomic.Int64
	evictions atomic.Uint64
	denying   atomic.Uint64 // evicted while denying: they got a fresh quota
	lastWarn  atomic.Int64  // time of the last log line about those
	allDenied atomic.Int64  // time every shard was last found all denying
	now       func() int64

	// peers are the live tables of the same limit with another kind of
	// state (a reload that changed the algorithm, while the old config
	// still serves): a request is decided by all of them (peers.go).
	peers atomic.Pointer[[]peerLink]
	// dead is set when no config holds the table any more; requests the
	// old config still has in flight then decide by the tables in force.
	dead atomic.Bool

	stop chan struct{}
	wake chan struct{} // the sweep interval changed
	once sync.Once
}

// tableConf is what the table decides with: the algorithm of the newest
// live registration, and the policy generation it belongs to.
type tableConf[S any] struct {
	alg     algorithms.Algorithm[S]
	lockout backend.Lockout
	gen     int
	logger  *zap.Logger
	// reg applied this conf; prev is the conf before it, so that a config
	// that fails after registering can be undone exactly (restore).
	reg  *registration[S]
	prev *tableConf[S]
}

type policySwitch[S any] struct {
	at   int64
	from algorithms.Policy
	to   algorithms.Algorithm[S]
}

// registration is one config's use of the table.
type registration[S any] struct {
	alg     algorithms.Algorithm[S]
	lockout backend.Lockout
	maxKeys int
	sweep   time.Duration
	owner   any
	logger  *zap.Logger
}

func (r *registration[S]) RegisteredBy() any                   { return r.owner }
func (r *registration[S]) RegisteredPolicy() algorithms.Policy { return r.alg.Policy() }
func (r *registration[S]) RegisteredLockout() backend.Lockout  { return r.lockout }

func newTable[S any](id poolKey, maxKeys int, now func() int64) *table[S] {
	n := 1
	for n < maxShards && n*4096 < maxKeys {
		n *= 2
	}
	t := &table[S]{
		id:     id,
		shards: make([]shard[S], n),
		mask:   uint64(n - 1),
		now:    now,
		stop:   make(chan struct{}),
		wake:   make(chan struct{}, 1),
	}
	for i := range t.shards {
		t.shards[i].id = shardIDs.Add(1)
		t.shards[i].rng = t.shards[i].id * 0x9E3779B97F4A7C15
	}
	return t
}

// hash returns the key's hash; never 0, which marks an empty slot.
func (t *table[S]) hash(key string) hkey {
	if h := maphash.String(seed, key); h != 0 {
		return h
	}
	return 1
}

func (t *table[S]) shard(h hkey) *shard[S] {
	return &t.shards[h&t.mask]
}

// register adds a config's use of the table and makes it the one that
// decides. A config that already uses the table with another policy (two
// zones of one name with different rates) is refused.
func (t *table[S]) register(r *registration[S], now int64) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := backend.CheckRates(t.regs, r); err != nil {
		return err
	}
	if err := backend.CheckLockouts(t.regs, r); err != nil {
		return err
	}
	t.regs = append(t.regs, r)
	t.apply(r, now)
	return nil
}

// unregister removes a config's use; if it was deciding, the newest
// remaining registration decides again (a failed reload is undone).
func (t *table[S]) unregister(r *registration[S], now int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	i := slices.Index(t.regs, r)
	if i < 0 {
		return
	}
	t.regs = slices.Delete(t.regs, i, i+1)
	newest := i == len(t.regs)
	if newest && len(t.regs) > 0 {
		if n := t.regs[len(t.regs)-1]; !t.restore(n) {
			t.apply(n, now)
		}
	}
	// Whoever decides now is in force for good (the oldest config left) or
	// again (the newest was undone): a cap it set lower applies at once.
	// One in the middle leaving (a handler of a config that is failing,
	// cleaned up before the one registered after it) changes neither: a
	// trim then would rebase keys under rates about to be undone, and
	// evict for a cap that may never apply.
	if (i == 0 || newest) && t.count.Load() > t.maxKeys.Load() {
		go t.trim()
	}
}

// restore makes the newest remaining registration n decide again with the
// conf it last applied, and forgets the policy switches recorded since,
// when no shard has been rebased through them: then no key was written
// under the rates of the configs that registered after n (all of them
// gone, since n is the newest left), and putting n's conf back is exact.
// Rebasing there and back instead would round twice and, for the sliding
// window counter, fold the previous window into the current one. The
// caller holds t.mu.
func (t *table[S]) restore(n *registration[S]) bool {
	d := t.conf.Load()
	for d != nil && d.reg != n {
		d = d.prev
	}
	if d == nil || t.seen > d.gen {
		return false
	}
	t.history = t.history[:d.gen]
	t.maxKeys.Store(int64(n.maxKeys))
	t.setSweep(n.sweep)
	t.conf.Store(d)
	return true
}

// apply makes r decide. The caller holds t.mu. A lowered cap is not
// trimmed here: until r's config is in force (unregister), it may still
// fail and be undone, and evicted keys cannot be put back.
func (t *table[S]) apply(r *registration[S], now int64) {
	t.maxKeys.Store(int64(r.maxKeys))
	t.setSweep(r.sweep)
	cur := t.conf.Load()
	next := &tableConf[S]{alg: r.alg, lockout: r.lockout, logger: r.logger, reg: r, prev: t.live(cur)}
	if cur != nil {
		next.gen = cur.gen
		if from := cur.alg.Policy(); from != r.alg.Policy() {
			t.history = append(t.history, policySwitch[S]{at: now, from: from, to: r.alg})
			next.gen = len(t.history)
		}
	}
	t.conf.Store(next)
}

// setSweep sets the sweep interval. The caller holds t.mu.
func (t *table[S]) setSweep(d time.Duration) {
	if old := t.interval.Swap(int64(d)); old != int64(d) {
		select { // the sweeper re-arms with the new interval
		case t.wake <- struct{}{}:
		default:
		}
	}
}

// live returns the chain of confs from c on without those of registrations
// that are gone or applied again later, which restore never goes back to:
// the chain stays as short as the list of registrations. The caller holds
// t.mu.
func (t *table[S]) live(c *tableConf[S]) *tableConf[S] {
	var head, tail *tableConf[S]
	var kept []*registration[S]
	for ; c != nil; c = c.prev {
		if !slices.Contains(t.regs, c.reg) || slices.Contains(kept, c.reg) {
			continue
		}
		kept = append(kept, c.reg)
		if tail == nil {
			head = c
		} else {
			tail.prev = c
		}
		tail = c
	}
	if tail != nil {
		tail.prev = nil
	}
	return head
}

// current returns what to decide with in sh, first rebasing sh's entries
// through the policy switches it has not seen. The caller holds sh.mu.
func (t *table[S]) current(sh *shard[S]) *tableConf[S] {
	c := t.conf.Load()
	if sh.gen == c.gen {
		return c
	}
	t.mu.Lock()
	// Read again under t.mu: restore may have put an older conf back, and
	// it must know that this shard moves on (seen).
	c = t.conf.Load()
	pending := t.history[sh.gen:c.gen]
	t.seen = max(t.seen, c.gen)
	t.mu.Unlock()
	for _, sw := range pending {
		for i := range sh.e {
			if sh.e[i].h != 0 {
				sh.e[i].s = sw.to.Rebase(sh.e[i].s, sw.at, sw.from)
			}
		}
	}
	sh.gen = c.gen
	return c
}

// insert adds a new key h with state s to sh, making room first if the
// table is at its cap. The caller holds sh.mu.
func (t *table[S]) insert(sh *shard[S], h hkey, s S, now int64) {
	if t.count.Load() >= t.maxKeys.Load() {
		t.makeRoom(sh, now)
		copy(sh.recent[:], sh.recent[1:])
		sh.recent[len(sh.recent)-1] = h
		if t.allDenied.Load() != 0 && t.current(sh).alg.Available(s, now) > 0 {
			t.allDenied.Store(0) // another search for room may find this one
		}
	}
	sh.slots.insert(h, s)
	t.count.Add(1)
}

// makeRoom evicts until the table is under its cap: idle keys of sh first
// (a full sweep of the shard, at most once per fullSweepGap), then the keys
// whose loss admits the least (evictOne). The caller holds sh.mu.
func (t *table[S]) makeRoom(sh *shard[S], now int64) {
	alg := t.current(sh).alg
	if sh.lastSweep == 0 || now-sh.lastSweep >= fullSweepGap {
		sh.lastSweep = now
		t.sweepShard(sh, alg, now)
	}
	for t.count.Load() >= t.maxKeys.Load() && t.evictOne(sh, alg, now) {
	}
}

// trim evicts until the table is within its cap, one shard at a time.
func (t *table[S]) trim() {
	for i := range t.shards {
		if t.count.Load() <= t.maxKeys.Load() {
			return
		}
		sh := &t.shards[i]
		sh.mu.Lock()
		now := t.now()
		alg := t.current(sh).alg
		t.sweepShard(sh, alg, now)
		// Leave each shard its share of the cap.
		share := int(t.maxKeys.Load()) / len(t.shards)
		for t.count.Load() > t.maxKeys.Load() && sh.n > share && t.evictOne(sh, alg, now) {
		}
		sh.mu.Unlock()
	}
}

// evictOne removes the key whose loss admits the least: the one with the
// most units available among a sample of sh, or failing that (every key of
// the sample is denying) any key with room in sh or in another shard. A key
// that is denying, whose next request would be refused, would get a fresh
// quota from its eviction: one is evicted only when no other key is left,
// and that is counted and logged: not while another shard, which may hold
// keys with room, is busy. It reports false when it evicted nothing. The
// caller holds sh.mu.
func (t *table[S]) evictOne(sh *shard[S], alg algorithms.Algorithm[S], now int64) bool {
	room, nearest := sh.spare(alg, now)
	if room >= 0 {
		t.drop(sh, alg, room, now, false)
		return true
	}
	if found, complete := t.evictElsewhere(sh, now, false); found {
		return true
	} else if !complete {
		// A shard that was busy may hold keys with room: going over the
		// cap by a key until the next insert finds room costs less than a
		// fresh quota for a client being denied.
		return false
	}
	if nearest >= 0 {
		t.drop(sh, alg, nearest, now, true)
		return true
	}
	found, _ := t.evictElsewhere(sh, now, true)
	return found
}

// evictElsewhere evicts a key of a shard other than sh: one with room, or
// when denying is set and a shard has none, its key nearest to idle. Shards are tried from a random one, and busy ones skipped, never
// waited for, so that two requests making room cannot deadlock. A search
// for room that saw every shard and found none is not repeated for a
// fullSweepGap, unless a key with room is inserted meanwhile. complete
// reports whether nothing was evicted because no shard has a key to give
// (rather than because some were busy). The caller holds sh.mu.
func (t *table[S]) evictElsewhere(sh *shard[S], now int64, denying bool) (found, complete bool) {
	if at := t.allDenied.Load(); !denying && at != 0 && now-at < fullSweepGap {
		return false, true
	}
	complete = true
	start := int(sh.rng & t.mask)
	for k := range t.shards {
		o := &t.shards[(start+k)&int(t.mask)]
		if o == sh {
			continue
		}
		if !o.mu.TryLock() {
			complete = false
			continue
		}
		oalg := t.current(o).alg
		room, nearest := o.spare(oalg, now)
		i, spent := room, false
		if i < 0 && denying {
			i, spent = nearest, true
		}
		if i >= 0 {
			t.drop(o, oalg, i, now, spent)
		}
		o.mu.Unlock()
		if i >= 0 {
			return true, true
		}
	}
	if !denying && complete {
		t.allDenied.Store(now)
	}
	return false, complete
}

// drop evicts the key at i of sh. The caller holds sh.mu.
func (t *table[S]) drop(sh *shard[S], alg algorithms.Algorithm[S], i int, now int64, denying bool) {
	if alg.IdleAt(sh.e[i].s) > now {
		t.evictions.Add(1)
	}
	sh.remove(i)
	t.count.Add(-1)
	if !denying {
		return
	}
	n := t.denying.Add(1)
	if last := t.lastWarn.Load(); now-last >= denyLogGap && t.lastWarn.CompareAndSwap(last, now) {
		if l := t.conf.Load().logger; l != nil {
			l.Warn("max_keys reached with every key tracked denying: evicted a denying key, which gets a fresh quota; raise max_keys",
				zap.String("zone", t.id.name), zap.String("scope", t.id.scope),
				zap.Int64("max_keys", t.maxKeys.Load()), zap.Uint64("denying_evictions", n))
		}
	}
}

// spare returns the index of the key of sh that can best be spared: the
// one with the most units available among a sample from a random place;
// if all of those are denying, a recently inserted key with room, or the
// first key with room in a scan of the whole shard (skipped for a
// fullSweepGap after a scan found none); room is -1 when every key is
// denying. nearest is, when room is -1, the key of the sample nearest to
// idle: of denying keys, the one whose fresh quota would come soonest
// anyway (-1 when sh is empty). The caller holds sh.mu.
func (sh *shard[S]) spare(alg algorithms.Algorithm[S], now int64) (room, nearest int) {
	if sh.n == 0 {
		return -1, -1
	}
	sh.rng ^= sh.rng << 13
	sh.rng ^= sh.rng >> 7
	sh.rng ^= sh.rng << 17
	i := int(sh.rng % uint64(len(sh.e)))
	room, nearest = -1, -1
	most, soonest := int64(0), int64(1<<63-1)
	for seen := 0; seen < sampleSize && seen < sh.n; i = sh.next(i) {
		if sh.e[i].h == 0 {
			continue
		}
		seen++
		if a := alg.Available(sh.e[i].s, now); a > most {
			room, most = i, a
		} else if a == 0 && room < 0 {
			if at := alg.IdleAt(sh.e[i].s); at < soonest {
				nearest, soonest = i, at
			}
		}
	}
	if room >= 0 {
		return room, nearest
	}
	for _, h := range sh.recent {
		if h == 0 {
			continue
		}
		if j, ok := sh.find(h); ok && alg.Available(sh.e[j].s, now) > 0 {
			return j, nearest
		}
	}
	if sh.allDenied != 0 && now-sh.allDenied < fullSweepGap {
		return -1, nearest
	}
	for k := 0; k < len(sh.e); k, i = k+1, sh.next(i) {
		if sh.e[i].h != 0 && alg.Available(sh.e[i].s, now) > 0 {
			return i, nearest
		}
	}
	sh.allDenied = now
	return -1, nearest
}

// sweepShard drops the idle keys of sh and gives memory back once the
// table is mostly empty. The caller holds sh.mu.
func (t *table[S]) sweepShard(sh *shard[S], alg algorithms.Algorithm[S], now int64) {
	removed := 0
	for i := 0; i < len(sh.e); {
		// remove shifts a later entry into i, so i is looked at again.
		if sh.e[i].h != 0 && alg.IdleAt(sh.e[i].s) <= now {
			sh.remove(i)
			removed++
			continue
		}
		i++
	}
	t.count.Add(int64(-removed))
	sh.shrink()
	if sh.lockouts != nil {
		sh.sweepLockouts(t.conf.Load().lockout, now)
	}
}

// sweep drops the idle keys of every shard, one shard lock at a time.
func (t *table[S]) sweep() {
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		now := t.now()
		sh.lastSweep = now
		t.sweepShard(sh, t.current(sh).alg, now)
		sh.mu.Unlock()
	}
}

// run sweeps at the configured interval until Destruct.
func (t *table[S]) run() {
	for {
		timer := time.NewTimer(time.Duration(t.interval.Load()))
		select {
		case <-timer.C:
			t.sweep()
		case <-t.wake:
			timer.Stop()
		case <-t.stop:
			timer.Stop()
			return
		}
	}
}

// Destruct stops the sweeper when the last config using the table is gone.
func (t *table[S]) Destruct() error {
	t.once.Do(func() {
		t.dead.Store(true)
		close(t.stop)
		if ps := t.peers.Load(); ps != nil {
			for _, l := range *ps {
				l.t.unlink(t)
			}
		}
		t.peers.Store(nil)
	})
	return nil
}

// Keys returns the number of keys the table tracks.
func (t *table[S]) Keys() int64 { return t.count.Load() }

// Evictions returns how many keys that were not idle were dropped to keep
// the table under its cap.
func (t *table[S]) Evictions() uint64 { return t.evictions.Load() }

// DenyingEvictions returns how many of those were denying: each got a
// fresh quota from its eviction.
func (t *table[S]) DenyingEvictions() uint64 { return t.denying.Load() }

// defaultMaxKeys sizes a zone for about targetBytes of heap, from the
// measured cost of a key (BENCHMARKS.md) and, for the sliding log, the
// events a full window holds: max_events ÷ cost of them for a constant
// cost, at 8 bytes each; max_events for a cost that varies (0), at 12 bytes
// each, since each event then records its own units.
func defaultMaxKeys(kind algorithms.Kind, p algorithms.Policy, cost int64) int {
	return int(max(defaultTargetBytes/bytesPerKey(kind, p, cost), minDefaultKeys))
}

// defaultTargetBytes is the heap a zone's default key cap is sized for.
const defaultTargetBytes = 100 << 20

// minDefaultKeys is the smallest default key cap: below it, a zone of
// long exact logs would track too few clients to be useful, so it may use
// more than defaultTargetBytes (the handler warns).
const minDefaultKeys = 1024

// bytesPerKey is the heap one key of a full window takes at most.
func bytesPerKey(kind algorithms.Kind, p algorithms.Policy, cost int64) int64 {
	var per int64
	switch kind {
	case algorithms.KindLog:
		// Slot, Log header, and a ring rounded up to a power of two.
		events, perEvent := p.Limit, int64(12)
		if cost > 0 {
			events, perEvent = max(p.Limit/cost, 1), 8
		}
		per = bytesPerLogKey + perEvent*nextPow2(events)
	case algorithms.KindWindow:
		per = bytesPerWindowKey
	case algorithms.KindCounter:
		per = bytesPerCounterKey
	default:
		per = bytesPerBucketKey
	}
	return per
}

func nextPow2(n int64) int64 {
	if n <= 1 {
		return 1
	}
	return 1 << (64 - bits.LeadingZeros64(uint64(n-1)))
}
