package backend

import (
	"context"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/algorithms"
)

// Lockout is a limit's progressive lock-out: the lengths, in nanoseconds,
// of the lock-outs a key serves one after the other each time its limit
// denies it. A key its limit denies is locked out for the first step:
// every request of the key is denied until the lock-out ends, whatever the
// algorithm's state says. Denied again by its limit after a lock-out ended,
// it is locked out for the next step; the last step repeats. The key's
// level is forgotten once it has gone its longest step past the end of its
// last lock-out (LockoutState.Forgotten). Nil means no lock-out.
type Lockout []int64

// Lockout bounds: a step is at most MaxLockoutStep, so that the end of a
// lock-out plus the decay (another step) stays within the exact span of
// every store (the Redis script's doubles), and there are at most
// MaxLockoutSteps steps.
const (
	MaxLockoutStep  = 30 * 24 * int64(time.Hour)
	MaxLockoutSteps = 16
)

// Check refuses steps that are not lock-out lengths: each positive, at
// most MaxLockoutStep, and at least as long as the one before (a client
// that persists after a lock-out is never let back sooner), and at most
// MaxLockoutSteps of them.
func (lo Lockout) Check() error {
	if len(lo) > MaxLockoutSteps {
		return fmt.Errorf("lockout: at most %d steps, got %d", MaxLockoutSteps, len(lo))
	}
	for i, d := range lo {
		switch {
		case d <= 0:
			return fmt.Errorf("lockout: step %d must be positive, got %s", i+1, algorithms.FormatSpan(d))
		case d > MaxLockoutStep:
			return fmt.Errorf("lockout: step %d must be at most 720h (30 days), got %s", i+1, algorithms.FormatSpan(d))
		case i > 0 && d < lo[i-1]:
			return fmt.Errorf("lockout: each step must be at least as long as the one before: step %d is %s after %s", i+1, algorithms.FormatSpan(d), algorithms.FormatSpan(lo[i-1]))
		}
	}
	return nil
}

// Longest is the longest step: how long a key must go past the end of its
// last lock-out for its level to be forgotten.
func (lo Lockout) Longest() int64 {
	if len(lo) == 0 {
		return 0
	}
	return lo[len(lo)-1]
}

// Equal reports whether lo and o are the same steps.
func (lo Lockout) Equal(o Lockout) bool {
	if len(lo) != len(o) {
		return false
	}
	for i := range lo {
		if lo[i] != o[i] {
			return false
		}
	}
	return true
}

// LockoutState is one key's lock-out record.
type LockoutState struct {
	// Until is when the key's current or last lock-out ends, Unix ns.
	Until int64
	// Level is the step of that lock-out, from 1 (0: none). It never goes
	// past the number of steps: the last step repeats.
	Level int32
}

// Locked returns how long the key stays locked out at now, 0 when it is
// not.
func (st LockoutState) Locked(now int64) int64 {
	if st.Level > 0 && st.Until > now {
		return st.Until - now
	}
	return 0
}

// Forgotten reports whether the record no longer counts at now: none, or
// the key has gone a full longest step past the end of its last lock-out
// without being denied. Forgetting after the longest step (rather than
// the step served, or a fixed time) means a key whose lock-outs have
// reached the top must stay quiet as long as its harshest lock-out to be
// treated as new, and one that was locked once for a minute by a typo is
// forgiven within the longest step, not kept forever.
func (lo Lockout) Forgotten(st LockoutState, now int64) bool {
	return st.Level == 0 || now-st.Until >= lo.Longest()
}

// Escalate is the record of a key its limit denies at now while it is not
// locked out: the first step, or the step after its last one when that is
// not forgotten.
func (lo Lockout) Escalate(st LockoutState, now int64) LockoutState {
	level := int32(1)
	if !lo.Forgotten(st, now) {
		level = min(st.Level+1, int32(len(lo)))
	}
	return LockoutState{Until: now + lo[level-1], Level: level}
}

// LockedOut turns r, the algorithm's answer to a request of a key locked
// out for wait more nanoseconds, into a denial until then: nothing
// remains, and both the retry and the reset are the end of the lock-out.
// What the algorithm would say then is not part of the answer: the key's
// next request after the lock-out is decided afresh (and locked out
// again if its limit still denies it). Answers that move with the clock
// alone, as this one does, are what a store that remembers denials (the
// Redis store's cache) can repeat exactly.
func LockedOut(r algorithms.Result, wait int64) algorithms.Result {
	r.Allowed = false
	r.Remaining = 0
	r.RetryAfter = wait
	r.ResetAfter = wait
	r.Delay = 0
	return r
}

// Locks reports whether a denial r locks a key out: a request that can
// never pass (its cost above what the limit holds) is the client's
// mistake, not a try at the quota, and does not.
func Locks(r algorithms.Result) bool {
	return !r.Allowed && r.RetryAfter != algorithms.Never
}

// LockoutInspector is implemented by stores that keep lock-outs: the admin
// API shows a key's lock-out. Admin.Reset clears it with the key's usage.
type LockoutInspector interface {
	// InspectLockout returns the key's record and how long it stays
	// locked out from now (0: not locked out). A record that is
	// forgotten reads as none.
	InspectLockout(ctx context.Context, l Limit, key string) (st LockoutState, wait int64, err error)
}
