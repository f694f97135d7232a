package memory

import (
	"slices"
	"sync/atomic"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
)

// A limit keeps one table per kind of state (bucket, log, window, counter).
// A reload that changes the kind provisions a table of the new kind while
// the old config still serves from the old one. So that the change gives
// nobody a fresh quota, the new table starts from every key of the old one
// translated to the new kind (algorithms.Usage, FromUsage), and while both
// are live they are peers: Decide decides a request of either config by
// both tables at once, all or nothing, so neither admits what the other
// has taken.

// links counts the takeovers whose tables are linked. A decision that
// found a key's tables before a takeover and locked them after it may
// have missed a table that was already reading them: it reads links before
// looking for peers, and starts over if it changed by the time it holds
// its locks. Takeovers come with reloads, so starting over is rare.
var links atomic.Uint64

// peer is a table as a table of another kind of state sees it.
type peer interface {
	// adopt writes u, a key's usage under the other table's algorithm, as
	// h's state, unless h already has less room.
	adopt(h hkey, u algorithms.Usage, now int64)
	// adoptLockout writes h's lock-out record, unless h has a later one.
	adoptLockout(h hkey, st backend.LockoutState)
	// translateInto adopts every key of this table into dst.
	translateInto(dst peer, now int64)
	link(p peer)
	unlink(p peer)
	// zone is the table as Decide uses a zone.
	zone() zoneOps
	Keys() int64
}

// peerLink is one peer of a table, with its zone handle made once.
type peerLink struct {
	t peer
	z zoneOps
}

// takeOver makes t, a table just created, the peer of every live table of
// the same limit with another kind of state, and translates their keys.
// The tables are linked first, so a request decided while the keys are
// read is taken in t either way: the translation of a key, read after it,
// then replaces that state only if it leaves less room.
func takeOver[S any](t *table[S]) {
	var others []peer
	tables.Range(func(k, v any) bool {
		pk := k.(poolKey)
		if p, ok := v.(peer); ok && pk.name == t.id.name && pk.scope == t.id.scope && pk.kind != t.id.kind {
			others = append(others, p)
		}
		return true
	})
	var keys int64
	for _, p := range others {
		p.link(t)
		t.link(p)
		keys += p.Keys()
	}
	links.Add(1)
	t.reserve(keys)
	for _, p := range others {
		p.translateInto(t, t.now())
	}
}

// reserve sizes each shard for its share of keys more keys (within the
// cap) at once, sparing the resizes of a translation.
func (t *table[S]) reserve(keys int64) {
	per := int(min(keys, t.maxKeys.Load())) / len(t.shards)
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		if want := (sh.n + per) * 4 / 3; len(sh.e) < want {
			sh.resize(want + 1)
		}
		sh.mu.Unlock()
	}
}

func (t *table[S]) adopt(h hkey, u algorithms.Usage, now int64) {
	sh := t.shard(h)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	alg := t.current(sh).alg
	s := alg.FromUsage(u, now)
	if sh.n > 0 {
		if i, ok := sh.find(h); ok {
			// A request decided by both tables wrote here, and this
			// usage counts it: keep whichever leaves less room.
			old := sh.e[i].s
			if a, b := alg.Available(s, now), alg.Available(old, now); a < b || (a == b && alg.IdleAt(s) > alg.IdleAt(old)) {
				sh.e[i].s = s
			}
			return
		}
	}
	if alg.IdleAt(s) > now {
		t.insert(sh, h, s, now)
	}
}

// translateInto reads each shard under its lock, so a request decided by
// both tables waits until its key is adopted in dst. Nesting dst's shard
// lock inside this one's keeps the global lock order of Decide (shards are
// locked by increasing id), since dst, made later, has the higher ids.
//
// The slots are read in a scrambled order: in slot order the keys come in
// the order of their hashes, and under the shared seed a table filled in
// that order piles them up where their homes are, so that every probe
// crosses the pile (a million keys into a table of 20,000 took 1.2 µs a
// key in slot order).
func (t *table[S]) translateInto(dst peer, now int64) {
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		alg := t.current(sh).alg
		n := len(sh.e)
		step := coprimeStep(n)
		for k, j := 0, 0; k < n; k, j = k+1, (j+step)%n {
			if e := &sh.e[j]; e.h != 0 && alg.IdleAt(e.s) > now {
				dst.adopt(e.h, alg.Usage(e.s, now), now)
			}
		}
		// Lock-outs are kept whatever the kind of state, as in Redis.
		for h, st := range sh.lockouts {
			dst.adoptLockout(h, st)
		}
		sh.mu.Unlock()
	}
}

// coprimeStep returns a step near n·0.618 with no factor in common with n,
// so that stepping by it visits each of n places once.
func coprimeStep(n int) int {
	s := max(n*618/1000, 1)
	for gcd(s, n) != 1 {
		s++
	}
	return s
}

func gcd(a, b int) int {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

func (t *table[S]) zone() zoneOps { return &zone[S]{name: t.id.name, t: t} }

func (t *table[S]) link(p peer) {
	t.mu.Lock()
	defer t.mu.Unlock()
	var ps []peerLink
	if cur := t.peers.Load(); cur != nil {
		ps = slices.Clone(*cur)
	}
	ps = append(ps, peerLink{t: p, z: p.zone()})
	t.peers.Store(&ps)
}

func (t *table[S]) unlink(p peer) {
	t.mu.Lock()
	defer t.mu.Unlock()
	cur := t.peers.Load()
	if cur == nil {
		return
	}
	ps := slices.DeleteFunc(slices.Clone(*cur), func(l peerLink) bool { return l.t == p })
	if len(ps) == 0 {
		t.peers.Store(nil)
		return
	}
	t.peers.Store(&ps)
}

// linked returns the peers of t, in the order they were linked. Once no
// config holds t, they are every table of its limit still in force:
// Caddy cleans an old config up without waiting for its requests, and one
// still in flight, perhaps across later reloads, must be counted by the
// tables its keys were translated into.
func (t *table[S]) linked() []peerLink {
	if t.dead.Load() {
		var ps []peerLink
		tables.Range(func(k, v any) bool {
			if pk := k.(poolKey); pk.name == t.id.name && pk.scope == t.id.scope && v != any(t) {
				if p, ok := v.(peer); ok {
					ps = append(ps, peerLink{t: p, z: p.zone()})
				}
			}
			return true
		})
		return ps
	}
	if ps := t.peers.Load(); ps != nil {
		return *ps
	}
	return nil
}

// Interface guard.
var _ peer = (*table[algorithms.Bucket])(nil)
