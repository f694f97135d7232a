package redis

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice/algorithms"
)

// refund gives back g through Store.Refund on both stores, as the handler
// does for a request another limit refused after the decision.
func (tw *budgetTwin) refund(g budgetGrant) {
	tw.t.Helper()
	if err := tw.mem.Refund(context.Background(), g.mem, g.out); err != nil {
		tw.t.Fatal(err)
	}
	if err := tw.red.Refund(context.Background(), g.red, g.out); err != nil {
		tw.t.Fatal(err)
	}
}

// Refunding a reserving request releases its reservation: the units come
// back once, and neither its expiry nor a later release nor a commit
// gives them back again.
func TestBudgetRefundReleasesReservation(t *testing.T) {
	for _, alg := range []string{algorithms.NameFixedWindow, algorithms.NameSlidingWindow, algorithms.NameSlidingCounter, algorithms.NameTokenBucket, algorithms.NameGCRA} {
		t.Run(alg, func(t *testing.T) {
			tw := newBudgetTwin(t, time.Date(2026, 3, 15, 9, 0, 0, 0, time.UTC), time.Minute,
				budgetZone{alg: alg, p: algorithms.Policy{Limit: 2, Window: int64(24 * time.Hour)}})
			a := tw.must(true, "k")
			tw.settle(a, true) // one unit committed
			b := tw.must(true, "k")
			tw.refund(b) // refused after the decision: back once
			tw.refund(b)
			tw.settle(b, false)
			tw.clock += tw.ttl + int64(time.Second) // b's deadline passed
			tw.must(true, "k")
			tw.must(false, "k")
		})
	}
}

// A reset drops the key's open reservations with its state: releasing
// one afterwards gives back nothing of the fresh quota.
func TestBudgetResetDropsReservations(t *testing.T) {
	for _, alg := range []string{algorithms.NameFixedWindow, algorithms.NameSlidingWindow, algorithms.NameTokenBucket} {
		t.Run(alg, func(t *testing.T) {
			tw := newBudgetTwin(t, time.Date(2026, 3, 15, 9, 0, 0, 0, time.UTC), time.Minute,
				budgetZone{alg: alg, p: algorithms.Policy{Limit: 2, Window: int64(24 * time.Hour)}})
			a := tw.must(true, "k")
			if err := tw.mem.Reset(context.Background(), tw.memZ[0], "k"); err != nil {
				t.Fatal(err)
			}
			if err := tw.red.Reset(context.Background(), tw.redZ[0], "k"); err != nil {
				t.Fatal(err)
			}
			tw.settle(tw.must(true, "k"), true)
			tw.settle(tw.must(true, "k"), true)
			tw.settle(a, false)
			tw.clock += 2 * tw.ttl
			tw.must(false, "k")
		})
	}
}
