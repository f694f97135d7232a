// Package admintest checks a store's operator operations (backend.Admin)
// the same way for every store.
package admintest

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
)

// Run checks, for every algorithm, that Inspect does not consume, that
// Reset gives a denied key its full quota at once, and that Grant gives
// back exactly the units asked (never more than the quota). register makes
// a fresh limit of the algorithm and policy in store.
func Run(t *testing.T, store backend.Store, register func(t *testing.T, alg string, p algorithms.Policy) backend.Limit) {
	adm, ok := store.(backend.Admin)
	if !ok {
		t.Fatalf("%T does not implement backend.Admin", store)
	}
	ctx := context.Background()
	p := algorithms.Policy{Limit: 5, Window: int64(time.Hour)}
	for _, alg := range algorithms.Names() {
		t.Run(alg, func(t *testing.T) {
			l := register(t, alg, p)
			take := func(cost int64) bool {
				t.Helper()
				out := make([]algorithms.Result, 1)
				ok, err := store.Decide(ctx, []backend.Request{{Limit: l, Key: "k", Cost: cost}}, out)
				if err != nil {
					t.Fatal(err)
				}
				return ok
			}
			inspect := func() algorithms.Usage {
				t.Helper()
				u, err := adm.Inspect(ctx, l, "k")
				if err != nil {
					t.Fatal(err)
				}
				return u
			}
			if u := inspect(); u.Remaining != 5 || u.Limit != 5 || u.RetryAfter != 0 {
				t.Fatalf("fresh key: %+v, want 5 of 5 remaining", u)
			}
			if !take(2) {
				t.Fatal("first request denied")
			}
			for range 10 {
				if u := inspect(); u.Remaining != 3 || u.ResetAfter <= 0 {
					t.Fatalf("after taking 2: %+v, want 3 remaining and a reset", u)
				}
			}
			if !take(3) || take(1) {
				t.Fatal("inspecting consumed: the 3 units left were not all there")
			}
			if u := inspect(); u.Remaining != 0 || u.RetryAfter <= 0 {
				t.Fatalf("spent key: %+v, want 0 remaining and a retry-after", u)
			}

			u, err := adm.Grant(ctx, l, "k", 2)
			if err != nil {
				t.Fatal(err)
			}
			if u.Remaining != 2 {
				t.Fatalf("granted 2 to a spent key: %+v, want 2 remaining", u)
			}
			if !take(2) || take(1) {
				t.Fatal("grant of 2 did not give exactly 2")
			}
			if u, err = adm.Grant(ctx, l, "k", 1_000_000); err != nil || u.Remaining != 5 {
				t.Fatalf("granting more than the quota: %+v, %v; want 5 remaining, no more", u, err)
			}
			if !take(5) || take(1) {
				t.Fatal("a large grant gave more than the quota")
			}

			if err := adm.Reset(ctx, l, "k"); err != nil {
				t.Fatal(err)
			}
			if u := inspect(); u.Remaining != 5 || u.RetryAfter != 0 || u.ResetAfter != 0 {
				t.Fatalf("after reset: %+v, want a fresh key", u)
			}
			if !take(5) || take(1) {
				t.Fatal("reset did not give exactly the full quota")
			}
			if u, err := adm.Inspect(ctx, l, "other"); err != nil || u.Remaining != 5 {
				t.Fatalf("another key: %+v, %v; want untouched", u, err)
			}
			if _, err := adm.Grant(ctx, l, "never-seen", 3); err != nil {
				t.Fatal(err)
			}
			if u := inspect(); u.Remaining != 0 {
				t.Fatalf("a grant to another key changed this one: %+v", u)
			}
		})
	}
}
