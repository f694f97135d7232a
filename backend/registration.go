package backend

import (
	"fmt"

	"github.com/sluicehq/sluice/algorithms"
)

// A Registration is one config's use of a limit's state, as a store keeps
// it: the config it belongs to (LimitConfig.Owner) and its policy.
type Registration interface {
	RegisteredBy() any
	RegisteredPolicy() algorithms.Policy
}

// CheckRates refuses r when its config already uses the same state, among
// regs, with another policy: two zones of one name in one config with
// different rates would write one state under two rates, and which one
// applied would depend on the order of provisioning. A registration
// without an owner is never refused.
func CheckRates[R Registration](regs []R, r R) error {
	if r.RegisteredBy() == nil {
		return nil
	}
	for _, o := range regs {
		if o.RegisteredBy() == r.RegisteredBy() && o.RegisteredPolicy() != r.RegisteredPolicy() {
			return fmt.Errorf("defined twice in this config with different rates (%v and %v): zones of one name share one state, so give them different names or the same rate", o.RegisteredPolicy(), r.RegisteredPolicy())
		}
	}
	return nil
}

// A LockoutRegistration is a Registration that also says its lock-out.
type LockoutRegistration interface {
	Registration
	RegisteredLockout() Lockout
}

// CheckLockouts refuses r when its config already uses the same state,
// among regs, with other lock-out steps: one key's level would escalate
// through whichever steps registered last.
func CheckLockouts[R LockoutRegistration](regs []R, r R) error {
	if r.RegisteredBy() == nil {
		return nil
	}
	for _, o := range regs {
		if o.RegisteredBy() == r.RegisteredBy() && !o.RegisteredLockout().Equal(r.RegisteredLockout()) {
			return fmt.Errorf("defined twice in this config with different lockout steps: zones of one name share one state, so give them different names or the same lockout")
		}
	}
	return nil
}
