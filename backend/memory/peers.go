package memory

import (
	"slices"

	"github.com/sluicehq/sluice/algorithms"
)

// A limit keeps one table per kind of state (bucket, log, window, counter).
// A reload that changes the kind provisions a table of the new kind while
// the old config still serves from the old one. So that the change gives
// nobody a fresh quota, the new table starts from every key of the old one
// translated to the new kind (algorithms.Usage, FromUsage), and while both
// are live each takes what the other admits: a request the old config
// admits after the translation counts in the new table too, and the other
// way round.

// peer is a table as a table of another kind of state sees it.
type peer interface {
	// mirror takes cost units of h at now: a request the other table
	// admitted.
	mirror(h hkey, now, cost int64)
	// adopt writes u, a key's usage under the other table's algorithm, as
	// h's state, unless h already has less room.
	adopt(h hkey, u algorithms.Usage, now int64)
	// translateInto adopts every key of this table into dst.
	translateInto(dst peer, now int64)
	link(p peer)
	unlink(p peer)
}

// takeOver makes t, a table just created, the peer of every live table of
// the same limit with another kind of state, and translates their keys.
// Mirroring starts before the translation, so a request the other table
// admits while its keys are read is in t either way: the translation of a
// key replaces what a mirror wrote before it, since it was read after.
func takeOver[S any](t *table[S]) {
	var others []peer
	tables.Range(func(k, v any) bool {
		pk := k.(poolKey)
		if p, ok := v.(peer); ok && pk.name == t.id.name && pk.scope == t.id.scope && pk.kind != t.id.kind {
			others = append(others, p)
		}
		return true
	})
	for _, p := range others {
		p.link(t)
		t.link(p)
	}
	for _, p := range others {
		p.translateInto(t, t.now())
	}
}

func (t *table[S]) mirror(h hkey, now, cost int64) {
	sh := t.shard(h)
	sh.mu.Lock()
	alg := t.current(sh).alg
	if sh.n > 0 {
		if i, ok := sh.find(h); ok {
			sh.e[i].s = alg.Take(sh.e[i].s, now, cost)
			sh.mu.Unlock()
			return
		}
	}
	var zero S
	t.insert(sh, h, alg.Take(zero, now, cost), now)
	sh.mu.Unlock()
}

func (t *table[S]) adopt(h hkey, u algorithms.Usage, now int64) {
	sh := t.shard(h)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	alg := t.current(sh).alg
	s := alg.FromUsage(u, now)
	if sh.n > 0 {
		if i, ok := sh.find(h); ok {
			// Only a mirror wrote here, of a request this usage counts:
			// keep whichever leaves less room.
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

// translateInto reads each shard under its lock, so a request admitted
// here after a key was read is mirrored into dst after it was adopted.
// Nesting dst's shard lock inside this one's cannot deadlock: dst is new,
// so no request holds one of its shards and waits for one of this table.
func (t *table[S]) translateInto(dst peer, now int64) {
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		alg := t.current(sh).alg
		for j := range sh.e {
			if e := &sh.e[j]; e.h != 0 && alg.IdleAt(e.s) > now {
				dst.adopt(e.h, alg.Usage(e.s, now), now)
			}
		}
		sh.mu.Unlock()
	}
}

func (t *table[S]) link(p peer) {
	t.mu.Lock()
	defer t.mu.Unlock()
	var ps []peer
	if cur := t.peers.Load(); cur != nil {
		ps = slices.Clone(*cur)
	}
	ps = append(ps, p)
	t.peers.Store(&ps)
}

func (t *table[S]) unlink(p peer) {
	t.mu.Lock()
	defer t.mu.Unlock()
	cur := t.peers.Load()
	if cur == nil {
		return
	}
	ps := slices.DeleteFunc(slices.Clone(*cur), func(q peer) bool { return q == p })
	if len(ps) == 0 {
		t.peers.Store(nil)
		return
	}
	t.peers.Store(&ps)
}

// mirrorPeers has every peer of t take what t just admitted for h. The
// caller holds no shard lock.
func (t *table[S]) mirrorPeers(h hkey, now, cost int64) {
	if ps := t.peers.Load(); ps != nil {
		for _, p := range *ps {
			p.mirror(h, now, cost)
		}
	}
}

// Interface guard.
var _ peer = (*table[algorithms.Bucket])(nil)
