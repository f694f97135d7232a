package redis

import (
	"errors"
	"fmt"
	"math"
	"strconv"

	"github.com/sluicehq/sluice/algorithms"
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
// max_events as mere arguments: every kind. A window's state is counts,
// compared with the new limit as they are; a bucket's and a queue's is a
// time, kept as it is, with the burst in proportion (algorithms.Adapted).
func (z *zone) CanAdjust() bool { return true }

// SetMaxEvents makes this handle's calls decide with n events per window.
// Every instance of a fleet adjusts its own handle: they share the state
// in Redis, and each decides on it with the limit it has come to.
func (z *zone) SetMaxEvents(n int64) error {
	c := z.st.conf.Load()
	switch {
	case n < 1 || n > MaxSpan:
		return fmt.Errorf("max_events must be from 1 to %d, got %d", MaxSpan, n)
	case c.kind[0] == kindLog && n > math.MaxUint32:
		return fmt.Errorf("max_events must be at most %d for sliding_window, got %d", uint32(math.MaxUint32), n)
	}
	a, err := withLimit(c, n)
	if err != nil {
		return err
	}
	z.adj.Store(&adjusted{limit: n, base: c, conf: a})
	return nil
}

// withLimit is c deciding with n events per window. A bucket or a queue
// decides with the new interval and burst, and keeps writing its states
// with the registered interval (c.param): the script rebases a state
// written under another interval, as a reload does, and a change of
// max_events must rewrite none. It passes both as "interval/registered".
func withLimit(c *zoneConf, n int64) (*zoneConf, error) {
	a := *c
	switch c.kind[0] {
	case kindBucket, kindQueue:
		// Any bucket algorithm adapts alike; the leaky bucket's name makes
		// checkExact see a queue as one.
		alg := algorithms.NameLeakyBucket
		a.policy = algorithms.Adapted(alg, c.policy, n)
		if err := errors.Join(a.policy.Validate(), checkExact(alg, a.policy)); err != nil {
			return nil, err
		}
		if t := a.policy.Interval(); t != c.param {
			a.p1 = strconv.FormatInt(t, 10) + "/" + c.p1
		}
		if c.kind[0] == kindBucket {
			a.p2 = strconv.FormatInt(burstOf(a.policy), 10)
		}
	default:
		a.policy.Limit = n
		a.p2 = strconv.FormatInt(n, 10)
	}
	a.boxed[keyArgP1-1], a.boxed[keyArgP2-1] = a.p1, a.p2
	return &a, nil
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
		conf, err := withLimit(c, a.limit)
		if err != nil {
			// The new rate cannot take the limit in force (SetMaxEvents
			// checked it against the old one): decide as registered.
			return c
		}
		next := &adjusted{limit: a.limit, base: c, conf: conf}
		z.adj.CompareAndSwap(a, next)
		return next.conf
	}
	return a.conf
}

var _ backend.Adjustable = (*zone)(nil)
