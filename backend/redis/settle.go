package redis

import (
	"context"
	"fmt"
	"slices"
	"strconv"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
)

// Settle settles each request at its real cost (backend.Settler): one
// script call (modeSettle) per slot, each key settled in turn, as in the
// memory store.
func (s *Store) Settle(ctx context.Context, reqs []backend.Request, granted []algorithms.Result, actual []int64) error {
	items := make([]item, 0, len(reqs))
	xs := make([][2]string, 0, len(reqs))
	for i, r := range reqs {
		z, ok := r.Limit.(*zone)
		if !ok {
			return fmt.Errorf("zone %q was not registered with the redis backend", r.Limit.Name())
		}
		cost := min(max(r.Cost, 0), maxCost)
		act := min(max(actual[i], 0), algorithms.MaxSettle)
		if !granted[i].Allowed || act == cost {
			continue
		}
		conf := z.conf()
		z.st.use(conf)
		items = append(items, item{key: z.stateKey(r.Key), conf: conf, cost: cost})
		s.budgetItem(&items[len(items)-1], backend.Request{})
		xs = append(xs, [2]string{refundAt(items[len(items)-1], granted[i]), strconv.FormatInt(act, 10)})
	}
	if len(items) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	return s.runEach(ctx, modeSettle, "settle", items, func(i int) (string, string) { return xs[i][0], xs[i][1] })
}

// Settle settles through the breaker (backend.Settler), in Redis itself
// for a leased limit too: a bucket's tokens and a window's units are
// alike, so a real cost settled in Redis's state is exact whether the
// estimate was spent from a lease or not (the handler refuses a leased
// sliding_window, whose request has no event of its own in Redis).
func (m *Module) Settle(ctx context.Context, reqs []backend.Request, granted []algorithms.Result, actual []int64) error {
	inner, cloned := reqs, false
	for i, r := range reqs {
		if l := unlease(r.Limit); l != r.Limit {
			if !cloned {
				inner, cloned = slices.Clone(reqs), true
			}
			inner[i].Limit = l
		}
	}
	_, err := m.breaker.do(ctx, func() (bool, error) { return true, m.Store.Settle(ctx, inner, granted, actual) })
	return err
}

var (
	_ backend.Settler = (*Store)(nil)
	_ backend.Settler = (*Module)(nil)
)
