package redis

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
)

// One call reads and writes more distinct numbers than the script
// remembers (MEMO_MOST, 4096), so its memo starts afresh in the middle
// of the call, at a different place in each call: every request's costs
// and every answer stay exact. Each request takes a cost of its own from
// a key of its own, in a bucket and in a fixed window zone.
func TestPlainMemoResetWithinCall(t *testing.T) {
	c := standaloneClient(t)
	s := newStillStore(t, c)
	const limit = 1_000_000_000
	zb := mustZone(t, s, "bucket", algorithms.NameTokenBucket, policy(limit, time.Hour))
	zw := mustZone(t, s, "window", algorithms.NameFixedWindow, policy(limit, time.Hour))
	ctx := context.Background()
	const n = 3000
	for round := range 3 {
		ps := make([]*pending, n)
		costs := make([]int64, n)
		for i := range ps {
			costs[i] = int64(1000 + round*n + i)
			items, _, err := s.resolve([]backend.Request{
				{Limit: zb, Key: fmt.Sprint(round, "-", i), Cost: costs[i]},
				{Limit: zw, Key: fmt.Sprint(round, "-", i), Cost: costs[i] + 7},
			})
			if err != nil {
				t.Fatal(err)
			}
			ps[i] = &pending{ctx: ctx, deadline: time.Now().Add(time.Minute), items: items,
				results: make([]algorithms.Result, 2), done: make(chan struct{}, 1)}
		}
		s.batcherFor(ps[0].items).send(ps)
		for i, p := range ps {
			if p.err != nil || !p.allowed {
				t.Fatalf("round %d request %d: err %v allowed %v", round, i, p.err, p.allowed)
			}
			if r := p.results; r[0].Remaining != limit-costs[i] || r[1].Remaining != limit-costs[i]-7 {
				t.Fatalf("round %d request %d of cost %d: %+v", round, i, costs[i], r)
			}
		}
		// What was stored reads back the same.
		for _, i := range []int{0, n / 2, n - 1} {
			out := make([]algorithms.Result, 2)
			if _, err := s.Decide(ctx, []backend.Request{
				{Limit: zb, Key: fmt.Sprint(round, "-", i), Cost: 0},
				{Limit: zw, Key: fmt.Sprint(round, "-", i), Cost: 0},
			}, out); err != nil {
				t.Fatal(err)
			}
			if out[0].Remaining != limit-costs[i] || out[1].Remaining != limit-costs[i]-7 {
				t.Fatalf("round %d key %d of cost %d reads back %+v", round, i, costs[i], out)
			}
		}
	}
}
