package backend

import (
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/algorithms"
)

func TestLockoutCheck(t *testing.T) {
	m, h := int64(time.Minute), int64(time.Hour)
	for _, tc := range []struct {
		name string
		lo   Lockout
		err  string
	}{
		{"none", nil, ""},
		{"login", Lockout{m, 5 * m, 24 * h}, ""},
		{"equal steps", Lockout{m, m, h}, ""},
		{"longest", Lockout{MaxLockoutStep}, ""},
		{"zero", Lockout{0}, "step 1 must be positive"},
		{"negative", Lockout{m, -m}, "step 2 must be positive"},
		{"decreasing", Lockout{5 * m, m}, "at least as long as the one before: step 2 is 1m after 5m"},
		{"too long", Lockout{MaxLockoutStep + 1}, "at most 720h"},
		{"too many", make(Lockout, MaxLockoutSteps+1), "at most 16 steps"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.lo.Check()
			if (err == nil) != (tc.err == "") || err != nil && !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("Check(%v) = %v, want %q", tc.lo, err, tc.err)
			}
		})
	}
}

// Escalation with a fake clock: 1m → 5m → 24h → 24h, each from the denial
// after the lock-out before ended; forgotten a longest step after the end.
func TestLockoutEscalate(t *testing.T) {
	m, h := int64(time.Minute), int64(time.Hour)
	lo := Lockout{m, 5 * m, 24 * h}
	now := int64(1_767_225_600e9)
	var st LockoutState
	for i, want := range []int64{m, 5 * m, 24 * h, 24 * h} {
		if st.Locked(now) != 0 {
			t.Fatalf("step %d: still locked at its end", i)
		}
		st = lo.Escalate(st, now)
		if st.Locked(now) != want || st.Level != int32(min(i+1, 3)) {
			t.Fatalf("step %d: %+v locked %s, want %s", i, st, algorithms.FormatSpan(st.Locked(now)), algorithms.FormatSpan(want))
		}
		now = st.Until
	}
	if lo.Forgotten(st, st.Until+24*h-1) || !lo.Forgotten(st, st.Until+24*h) {
		t.Fatal("the level must be forgotten exactly a longest step after the end")
	}
	if got := lo.Escalate(st, st.Until+24*h); got.Level != 1 || got.Until != st.Until+24*h+m {
		t.Fatalf("after the decay: %+v, want level 1 for 1m", got)
	}
}

func TestLockedOut(t *testing.T) {
	r := LockedOut(algorithms.Result{Allowed: true, Limit: 5, Remaining: 4, ResetAfter: 9, Delay: 3, At: 7}, 42)
	if want := (algorithms.Result{Limit: 5, RetryAfter: 42, ResetAfter: 42, At: 7}); r != want {
		t.Fatalf("%+v, want %+v", r, want)
	}
	if Locks(algorithms.Result{RetryAfter: algorithms.Never}) || !Locks(algorithms.Result{RetryAfter: 1}) || Locks(algorithms.Result{Allowed: true}) {
		t.Fatal("Locks: a denial that can pass later locks, one that never can does not")
	}
}
