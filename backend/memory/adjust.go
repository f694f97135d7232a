package memory

import (
	"fmt"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
)

// adjusted is a limit's algorithm for a max_events set while it runs, made
// from the table's conf base: a reload that changes the window makes it
// again, from the new conf, with the same max_events.
type adjusted[S any] struct {
	limit int64
	base  *tableConf[S]
	alg   algorithms.Algorithm[S]
}

func newLog(p algorithms.Policy) algorithms.Algorithm[*algorithms.Log] {
	return algorithms.NewSlidingLog(p)
}

func newCounter(p algorithms.Policy) algorithms.Algorithm[algorithms.Counter] {
	return algorithms.NewSlidingCounter(p)
}

// CanAdjust reports whether the limit's kind of state takes a new
// max_events without a rewrite: every kind does (algorithms.Adapted).
func (z *zone[S]) CanAdjust() bool { return z.mk != nil }

// SetMaxEvents makes this handle decide with n events per window (and a
// bucket's burst in proportion). Only this handle: another config's
// handle on the same table keeps its own. No key's state changes.
func (z *zone[S]) SetMaxEvents(n int64) error {
	if z.mk == nil {
		return fmt.Errorf("zone %q: max_events cannot change while it runs", z.name)
	}
	c := z.t.conf.Load()
	p := algorithms.Adapted(z.algName, c.alg.Policy(), n)
	if _, err := algorithms.Check(z.algName, p); err != nil {
		return err
	}
	z.adj.Store(&adjusted[S]{limit: n, base: c, alg: z.mk(p)})
	return nil
}

// alg is what decides in sh: the table's algorithm (after rebasing sh
// through the reloads it has not seen), or the adjusted one. The caller
// holds sh.mu.
func (z *zone[S]) alg(sh *shard[S]) algorithms.Algorithm[S] {
	return z.algFor(z.t.current(sh))
}

// algFor is alg for the conf that z.t.current returned for the shard.
func (z *zone[S]) algFor(c *tableConf[S]) algorithms.Algorithm[S] {
	a := z.adj.Load()
	if a == nil {
		return c.alg
	}
	if a.base != c {
		// A reload changed the table's conf: keep the adjusted max_events
		// over the new window. Made once per reload; a SetMaxEvents in
		// between wins (the swap fails and this call uses its own).
		p := algorithms.Adapted(z.algName, c.alg.Policy(), a.limit)
		next := &adjusted[S]{limit: a.limit, base: c, alg: z.mk(p)}
		z.adj.CompareAndSwap(a, next)
		return next.alg
	}
	return a.alg
}

var _ backend.Adjustable = (*zone[algorithms.Window])(nil)
