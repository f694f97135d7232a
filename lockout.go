package sluice

import (
	"context"
	"fmt"

	"github.com/sluicehq/sluice/backend"
)

// lockoutSteps is the limit's lock-out as the stores take it (nil: none).
func (l *Limit) lockoutSteps() backend.Lockout {
	if len(l.Lockout) == 0 {
		return nil
	}
	lo := make(backend.Lockout, len(l.Lockout))
	for i, d := range l.Lockout {
		lo[i] = int64(d)
	}
	return lo
}

// checkLockout refuses lockout where it cannot mean what it says.
func (l *Limit) checkLockout() error {
	if l.Lockout == nil {
		return nil
	}
	switch {
	case len(l.Lockout) == 0:
		return optionErrorf("lockout", "lockout: give at least one step, such as lockout 1m 5m 24h")
	case l.concOnly():
		return optionErrorf("lockout", "lockout needs a rate to be denied by: a concurrency cap alone refuses requests for being in flight, not for being too many")
	case l.MaxDelay > 0:
		return optionErrorf("lockout", "lockout cannot be used with max_delay: a queue makes requests wait for their turn instead of denying them, and a lock-out would punish a client for the queue being full")
	case l.Lease > 0:
		return optionErrorf("lockout", "lockout cannot be used with lease: units spent locally from a lease are denied by one instance alone, which would lock the key out on that instance only")
	}
	return optionErr("lockout", l.lockoutSteps().Check())
}

// checkLockoutShadow refuses lockout in a shadow zone: a shadow zone never
// denies, so no key would ever be locked out, and the operator trying the
// limit would see nothing of what lockout does.
func (z *zone) checkLockoutShadow(l *limit) error {
	if z.Shadow && len(l.Lockout) > 0 {
		return fmt.Errorf("lockout: a shadow zone never denies, so it never locks a key out: remove lockout while the zone is in shadow")
	}
	return nil
}

// lockoutState fills in st the key's lock-out in l, when l has lockout.
func lockoutState(ctx context.Context, store backend.Store, l *limit, key string, st *keyState) error {
	li, ok := store.(backend.LockoutInspector)
	if len(l.Lockout) == 0 || !ok {
		return nil
	}
	lo, wait, err := li.InspectLockout(ctx, l.handle, key)
	if err != nil {
		return err
	}
	st.LockoutLevel, st.LockedOut = lo.Level, seconds(wait)
	return nil
}
