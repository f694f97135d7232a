package memory

import (
	"context"
	"fmt"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
)

// Lock-outs live beside the keys' states, in a map per shard made on the
// first lock-out: a limit without lockout, or whose keys are never denied,
// pays one nil check. They are read and written under the key's shard
// lock, in the same critical section that decides, so that of concurrent
// requests the first denial locks the key out and every later one sees
// it. A lock-out is kept apart from the algorithm's state because it must
// outlive it: a key idle for the algorithm (swept) may still be locked out
// or remember its level.

// lockoutCap is how many keys a shard remembers lock-outs of: its share of
// the limit's max_keys, so that a flood of denied keys cannot grow the
// map past the memory the limit was sized for.
func (t *table[S]) lockoutCap() int {
	return max(int(t.maxKeys.Load())/len(t.shards), 1)
}

// lockWait is how long h stays locked out from now (0: it is not). The
// caller holds sh.mu.
func (sh *shard[S]) lockWait(h hkey, now int64) int64 {
	if sh.lockouts == nil {
		return 0
	}
	return sh.lockouts[h].Locked(now)
}

// lockedOut applies h's lock-out to r, the algorithm's answer at now. The
// caller holds sh.mu.
func (sh *shard[S]) lockedOut(h hkey, r algorithms.Result, now int64) algorithms.Result {
	if wait := sh.lockWait(h, now); wait > 0 {
		return backend.LockedOut(r, wait)
	}
	return r
}

// lockOut locks h out after its limit denied it r at now (unless it was
// locked out already, or r can never pass), and returns the answer the
// client gets. The caller holds sh.mu.
func (t *table[S]) lockOut(sh *shard[S], lo backend.Lockout, h hkey, r algorithms.Result, now int64) algorithms.Result {
	if len(lo) == 0 || !backend.Locks(r) {
		return r
	}
	st, found := sh.lockouts[h]
	if st.Locked(now) > 0 {
		return r // decided with the lock-out already (the multi-limit path)
	}
	if !found && len(sh.lockouts) >= t.lockoutCap() {
		t.makeLockoutRoom(sh, lo, now)
	}
	if sh.lockouts == nil {
		sh.lockouts = make(map[hkey]backend.LockoutState)
	}
	st = lo.Escalate(st, now)
	sh.lockouts[h] = st
	return backend.LockedOut(r, st.Until-now)
}

// makeLockoutRoom drops the forgotten records of sh, and if none was,
// the record of a sample whose lock-out ends first: that key gets its
// level back to nothing, which is counted with the denying evictions. The
// caller holds sh.mu.
func (t *table[S]) makeLockoutRoom(sh *shard[S], lo backend.Lockout, now int64) {
	if sh.sweepLockouts(lo, now) > 0 {
		return
	}
	var victim hkey
	soonest, seen := int64(1<<63-1), 0
	for h, st := range sh.lockouts { // map order is random: a sample
		if st.Until < soonest {
			victim, soonest = h, st.Until
		}
		if seen++; seen == sampleSize {
			break
		}
	}
	if seen > 0 {
		delete(sh.lockouts, victim)
		t.denying.Add(1)
	}
}

// sweepLockouts drops the records of sh that lo no longer counts and
// returns how many; a limit without lockout drops them all. The caller
// holds sh.mu.
func (sh *shard[S]) sweepLockouts(lo backend.Lockout, now int64) int {
	n := 0
	for h, st := range sh.lockouts {
		if len(lo) == 0 || lo.Forgotten(st, now) {
			delete(sh.lockouts, h)
			n++
		}
	}
	if len(sh.lockouts) == 0 {
		sh.lockouts = nil // gives the map's memory back
	}
	return n
}

// adoptLockout is peer.adoptLockout: a record translated from a table of
// another kind of state. A request decided by both tables since they were
// linked may have written a later one here.
func (t *table[S]) adoptLockout(h hkey, st backend.LockoutState) {
	sh := t.shard(h)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if cur, ok := sh.lockouts[h]; ok && cur.Until >= st.Until {
		return
	}
	if sh.lockouts == nil {
		sh.lockouts = make(map[hkey]backend.LockoutState)
	}
	sh.lockouts[h] = st
}

// lockOut is zoneOps.lockOut: the caller holds h's shard lock.
func (z *zone[S]) lockOut(h hkey, now int64, r algorithms.Result) algorithms.Result {
	sh := z.t.shard(h)
	return z.t.lockOut(sh, z.t.current(sh).lockout, h, r, now)
}

// lockout returns h's record, forgotten ones reading as none.
func (z *zone[S]) lockoutOf(h hkey, now int64) backend.LockoutState {
	sh := z.t.shard(h)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	lo := z.t.current(sh).lockout
	if st := sh.lockouts[h]; lo != nil && !lo.Forgotten(st, now) {
		return st
	}
	return backend.LockoutState{}
}

// InspectLockout returns the key's lock-out (backend.LockoutInspector).
func (s *Store) InspectLockout(_ context.Context, l backend.Limit, key string) (backend.LockoutState, int64, error) {
	z, ok := l.(interface {
		zoneOps
		lockoutOf(h hkey, now int64) backend.LockoutState
	})
	if !ok {
		return backend.LockoutState{}, 0, fmt.Errorf("zone %q was not registered with the memory backend", l.Name())
	}
	now := s.now()
	st := z.lockoutOf(z.hash(key), now)
	return st, st.Locked(now), nil
}

var _ backend.LockoutInspector = (*Store)(nil)
