package memory

import (
	"context"
	"fmt"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
)

// adminOps are the operator's operations on one key of a zone; each locks
// the key's shard.
type adminOps interface {
	inspect(h hkey, now int64) algorithms.Usage
	reset(h hkey)
	grant(h hkey, now, units int64) algorithms.Usage
}

func (z *zone[S]) inspect(h hkey, now int64) algorithms.Usage {
	sh := z.t.shard(h)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	conf := z.t.current(sh) // first: it rebases the shard's states
	alg := z.algFor(conf)
	s := sh.get(h)
	if l, ok := any(s).(*algorithms.Log); ok {
		// Reading a log prunes it: read a copy, so inspecting changes
		// nothing, as in the Redis store.
		s = any(l.Clone()).(S)
	}
	return sh.lockedUsage(conf, h, alg.Usage(s, now), now)
}

// lockedUsage is u, or nothing left until the end of h's lock-out (as
// backend.LockedOut answers). The caller holds sh.mu.
func (sh *shard[S]) lockedUsage(conf *tableConf[S], h hkey, u algorithms.Usage, now int64) algorithms.Usage {
	if wait := sh.lockouts[h].Locked(now); wait > 0 && conf.lockout != nil {
		u.Remaining, u.RetryAfter, u.ResetAfter = 0, wait, wait
	}
	return u
}

func (z *zone[S]) reset(h hkey) {
	sh := z.t.shard(h)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	delete(sh.lockouts, h)
	if sh.n == 0 {
		return
	}
	if i, ok := sh.find(h); ok {
		sh.remove(i)
		z.t.count.Add(-1)
	}
}

func (z *zone[S]) grant(h hkey, now, units int64) algorithms.Usage {
	sh := z.t.shard(h)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	// A grant gives units back, not a lock-out's end: a reset lifts that.
	conf := z.t.current(sh)
	alg := z.algFor(conf)
	if sh.n == 0 {
		return sh.lockedUsage(conf, h, alg.Usage(*new(S), now), now)
	}
	i, ok := sh.find(h)
	if !ok {
		return sh.lockedUsage(conf, h, alg.Usage(*new(S), now), now) // a fresh key has its full quota
	}
	// Every algorithm of the package grants (algorithms' interface guards).
	sh.e[i].s = alg.(algorithms.Granter[S]).Grant(sh.e[i].s, now, units)
	return sh.lockedUsage(conf, h, alg.Usage(sh.e[i].s, now), now)
}

// admin returns l's operations, and those of the tables of the same limit
// with another kind of state while a reload that changed the algorithm is
// under way: those decide the key's requests too.
func admin(l backend.Limit) (own adminOps, peers []adminOps, err error) {
	z, ok := l.(zoneOps)
	if !ok {
		return nil, nil, fmt.Errorf("zone %q was not registered with the memory backend", l.Name())
	}
	for _, p := range z.peers() {
		peers = append(peers, p.z.(adminOps))
	}
	return z.(adminOps), peers, nil
}

// Inspect returns the key's state without consuming (backend.Admin).
func (s *Store) Inspect(_ context.Context, l backend.Limit, key string) (algorithms.Usage, error) {
	own, _, err := admin(l)
	if err != nil {
		return algorithms.Usage{}, err
	}
	return own.inspect(l.(zoneOps).hash(key), s.now()), nil
}

// Reset forgets the key in every table of its limit (backend.Admin).
func (s *Store) Reset(_ context.Context, l backend.Limit, key string) error {
	own, peers, err := admin(l)
	if err != nil {
		return err
	}
	z := l.(zoneOps)
	h := z.hash(key)
	// The key's open reservations go with it: released later, they would
	// give back units of the fresh state.
	s.resv.mu.Lock()
	if live, ok := s.resv.keys[resvKey{z, key}]; ok {
		s.resv.put(resvKey{z, key}, live[:0])
	}
	s.resv.mu.Unlock()
	own.reset(h)
	for _, p := range peers {
		p.reset(h)
	}
	return nil
}

// Grant gives units back to the key in every table of its limit
// (backend.Admin).
func (s *Store) Grant(_ context.Context, l backend.Limit, key string, units int64) (algorithms.Usage, error) {
	own, peers, err := admin(l)
	if err != nil {
		return algorithms.Usage{}, err
	}
	h, now := l.(zoneOps).hash(key), s.now()
	for _, p := range peers {
		p.grant(h, now, units)
	}
	return own.grant(h, now, units), nil
}

var _ backend.Admin = (*Store)(nil)
