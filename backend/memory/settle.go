package memory

import (
	"context"
	"fmt"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
)

// settleOps settles one key's request; it locks the key's shard.
type settleOps interface {
	settle(h hkey, now int64, granted algorithms.Result, estimate, actual int64)
}

// settle rewrites the key's state for the request's real cost. A key that
// is gone (reset, or evicted while idle) is settled from a fresh state: a
// refund then has nothing to give back, and an extra is still owed.
func (z *zone[S]) settle(h hkey, now int64, granted algorithms.Result, estimate, actual int64) {
	sh := z.t.shard(h)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	// Every algorithm of the package settles (algorithms' interface guards).
	alg := z.alg(sh)
	st := alg.(algorithms.Settler[S])
	if sh.n > 0 {
		if i, ok := sh.find(h); ok {
			sh.e[i].s = st.Settle(sh.e[i].s, now, granted, estimate, actual)
			return
		}
	}
	if actual > estimate {
		var zero S
		z.t.insert(sh, h, st.Settle(zero, now, granted, estimate, actual), now)
	}
}

// Settle settles each request at its real cost (backend.Settler).
func (s *Store) Settle(_ context.Context, reqs []backend.Request, granted []algorithms.Result, actual []int64) error {
	now := s.now()
	for i, r := range reqs {
		z, ok := r.Limit.(settleOps)
		if !ok {
			return fmt.Errorf("zone %q was not registered with the memory backend", r.Limit.Name())
		}
		if granted[i].Allowed && actual[i] != r.Cost {
			z.settle(r.Limit.(zoneOps).hash(r.Key), now, granted[i], r.Cost, min(max(actual[i], 0), algorithms.MaxSettle))
		}
	}
	return nil
}

var _ backend.Settler = (*Store)(nil)
