package redis

import (
	"fmt"
	"math"
	"strconv"

	"github.com/sluicehq/sluice/backend"
)

// adjusted is a limit's script arguments for a max_events set while it
// runs, made from the zone's conf base. The script is passed the policy
// with every call, so another max_events is other arguments, and the keys
// of a window kind hold counts that the new limit is compared with as
// they are: nothing in Redis changes. A reload that changes the zone's
// conf makes it again from the new one.
type adjusted struct {
	limit int64
	base  *zoneConf
	conf  *zoneConf
}

// CanAdjust reports whether the zone's kind of state takes a new
// max_events as a mere argument: the window kinds, whose state is counts.
func (z *zone) CanAdjust() bool { return countsEvents(z.st.conf.Load()) }

func countsEvents(c *zoneConf) bool {
	switch c.kind[0] {
	case kindLog, kindWindow, kindCounter:
		return true
	}
	return false
}

// SetMaxEvents makes this handle's calls decide with n events per window.
// Every instance of a fleet adjusts its own handle: they share the counts
// in Redis, and each compares them with the limit it has come to.
func (z *zone) SetMaxEvents(n int64) error {
	c := z.st.conf.Load()
	switch {
	case !countsEvents(c):
		return fmt.Errorf("zone %q: max_events of a bucket algorithm cannot change while it runs", z.name)
	case n < 1 || n > MaxSpan:
		return fmt.Errorf("max_events must be from 1 to %d, got %d", MaxSpan, n)
	case c.kind[0] == kindLog && n > math.MaxUint32:
		return fmt.Errorf("max_events must be at most %d for sliding_window, got %d", uint32(math.MaxUint32), n)
	}
	z.adj.Store(&adjusted{limit: n, base: c, conf: withLimit(c, n)})
	return nil
}

// withLimit is c deciding with n events per window.
func withLimit(c *zoneConf, n int64) *zoneConf {
	a := *c
	a.policy.Limit = n
	a.p2 = strconv.FormatInt(n, 10)
	a.boxed[2] = a.p2
	return &a
}

// conf is what this handle's calls decide with.
func (z *zone) conf() *zoneConf {
	c := z.st.conf.Load()
	a := z.adj.Load()
	switch {
	case a == nil:
		return c
	case a.base != c:
		// A reload changed the zone's conf: keep the adjusted max_events
		// with the new window. A SetMaxEvents in between wins.
		next := &adjusted{limit: a.limit, base: c, conf: withLimit(c, a.limit)}
		z.adj.CompareAndSwap(a, next)
		return next.conf
	}
	return a.conf
}

var _ backend.Adjustable = (*zone)(nil)
