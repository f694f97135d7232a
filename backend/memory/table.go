package memory

import (
	"fmt"
	"hash/maphash"
	"math/bits"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/algorithms"
)

// hkey is a key as the table stores it: a 64-bit hash with a random seed
// per table. Storing the hash instead of the string keeps each slot at 16
// bytes with no pointer: no allocation per key, nothing for the garbage
// collector to scan, and a million keys fit in a CPU's last-level cache.
// Without the seed an attacker cannot aim for a collision; by chance, two of
// a million keys share a hash with probability 3·10⁻⁸ (they would then share
// one quota).
type hkey = uint64

// maxShards bounds lock striping; small tables use fewer shards so that the
// key cap stays exact.
const maxShards = 64

// Pauses between full sweeps of one shard triggered by inserts into a full
// table, so a flood of new keys costs a sampled eviction, not a scan, each.
const fullSweepGap = int64(time.Second)

// sampleSize is how many entries an eviction compares when no key is idle.
const sampleSize = 8

type shardBase struct {
	mu sync.Mutex
	id uint64 // global lock order for requests that touch several shards
}

type shard[S any] struct {
	shardBase
	slots[S]
	lastSweep int64  // time of the last full sweep, clock of the store
	rng       uint64 // picks where eviction samples start
	gen       int    // the policy generation the entries are written in
	_         [8]byte
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
	seed   maphash.Seed
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
	now       func() int64

	stop chan struct{}
	wake chan struct{} // the sweep interval changed
	once sync.Once
}

// tableConf is what the table decides with: the algorithm of the newest
// live registration, and the policy generation it belongs to.
type tableConf[S any] struct {
	alg algorithms.Algorithm[S]
	gen int
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
	maxKeys int
	sweep   time.Duration
	owner   any
}

func newTable[S any](maxKeys int, now func() int64) *table[S] {
	n := 1
	for n < maxShards && n*4096 < maxKeys {
		n *= 2
	}
	t := &table[S]{
		seed:   maphash.MakeSeed(),
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
	if h := maphash.String(t.seed, key); h != 0 {
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
	if r.owner != nil {
		for _, o := range t.regs {
			if o.owner == r.owner && o.alg.Policy() != r.alg.Policy() {
				return fmt.Errorf("defined twice in this config with different rates (%v and %v): zones of one name share one state, so give them different names or the same rate", o.alg.Policy(), r.alg.Policy())
			}
		}
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
	if i == len(t.regs) && len(t.regs) > 0 {
		if n := t.regs[len(t.regs)-1]; !t.restore(n) {
			t.apply(n, now)
		}
	}
	// Whoever decides now is in force for good (an older config left) or
	// again (a newer one was undone): a cap it set lower applies at once.
	if t.count.Load() > t.maxKeys.Load() {
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
	next := &tableConf[S]{alg: r.alg, reg: r, prev: t.live(cur)}
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
	}
	sh.slots.insert(h, s)
	t.count.Add(1)
}

// makeRoom evicts from sh until the table is under its cap: idle keys first
// (a full sweep of the shard, at most once per fullSweepGap), then the key
// nearest to idle among a sample of sampleSize keys from a random place.
// The caller holds sh.mu.
func (t *table[S]) makeRoom(sh *shard[S], now int64) {
	alg := t.current(sh).alg
	if sh.lastSweep == 0 || now-sh.lastSweep >= fullSweepGap {
		sh.lastSweep = now
		t.sweepShard(sh, alg, now)
	}
	t.evict(sh, alg, now)
	if t.count.Load() >= t.maxKeys.Load() {
		// This shard is empty or nearly: take from the others, without
		// waiting on a lock another request holds (that could deadlock).
		for i := range t.shards {
			o := &t.shards[i]
			if o == sh || !o.mu.TryLock() {
				continue
			}
			t.evict(o, t.current(o).alg, now)
			o.mu.Unlock()
			if t.count.Load() < t.maxKeys.Load() {
				break
			}
		}
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
		for t.count.Load() > t.maxKeys.Load() && sh.n > share {
			t.evictOne(sh, alg, now)
		}
		sh.mu.Unlock()
	}
}

// evict removes keys from sh, nearest to idle first, while the table is at
// or over its cap. The caller holds sh.mu.
func (t *table[S]) evict(sh *shard[S], alg algorithms.Algorithm[S], now int64) {
	for t.count.Load() >= t.maxKeys.Load() && sh.n > 0 {
		t.evictOne(sh, alg, now)
	}
}

// evictOne removes the key nearest to idle among a sample of sh. The
// caller holds sh.mu and sh is not empty.
func (t *table[S]) evictOne(sh *shard[S], alg algorithms.Algorithm[S], now int64) {
	sh.rng ^= sh.rng << 13
	sh.rng ^= sh.rng >> 7
	sh.rng ^= sh.rng << 17
	i := int(sh.rng % uint64(len(sh.e)))
	victim, best := -1, int64(1<<63-1)
	for seen := 0; seen < sampleSize && seen < sh.n; i = (i + 1) % len(sh.e) {
		if sh.e[i].h == 0 {
			continue
		}
		if at := alg.IdleAt(sh.e[i].s); at < best {
			victim, best = i, at
		}
		seen++
	}
	sh.remove(victim)
	t.count.Add(-1)
	if best > now {
		t.evictions.Add(1)
	}
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
	t.once.Do(func() { close(t.stop) })
	return nil
}

// Keys returns the number of keys the table tracks.
func (t *table[S]) Keys() int64 { return t.count.Load() }

// Evictions returns how many keys that were not idle were dropped to keep
// the table under its cap.
func (t *table[S]) Evictions() uint64 { return t.evictions.Load() }

// defaultMaxKeys sizes a zone for about targetBytes of heap, from the
// measured cost of a key (BENCHMARKS.md) and, for the sliding log, the
// events a full window holds.
func defaultMaxKeys(kind string, p algorithms.Policy) int {
	const targetBytes = 100 << 20
	var per int64
	switch kind {
	case kindLog:
		// Slot, Log header, and a ring rounded up to a power of two.
		per = bytesPerLogKey + 8*nextPow2(p.Limit)
	case kindWindow:
		per = bytesPerWindowKey
	case kindCounter:
		per = bytesPerCounterKey
	default:
		per = bytesPerBucketKey
	}
	return int(max(targetBytes/per, 1024))
}

func nextPow2(n int64) int64 {
	if n <= 1 {
		return 1
	}
	return 1 << (64 - bits.LeadingZeros64(uint64(n-1)))
}
