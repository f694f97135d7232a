package redis

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
)

// On a cluster, concurrent requests naming a bucket, a fixed window and
// a sliding log of one key (one slot: batched, decided by decidePlain),
// some also a key of another slot (a call per slot, given back when one
// denies), admit exactly as many as the tightest limit allows, and leave
// each key charged once per admitted request.
func TestPlainClusterExactCount(t *testing.T) {
	c := clusterClient(t)
	s := newStillStore(t, c)
	const limit = 20
	zs := []backend.Limit{
		mustZone(t, s, "bucket", algorithms.NameTokenBucket, policy(limit, time.Hour)),
		mustZone(t, s, "window", algorithms.NameFixedWindow, policy(limit+5, time.Hour)),
		mustZone(t, s, "log", algorithms.NameSlidingWindow, policy(limit+10, time.Hour)),
	}
	ctx := context.Background()
	var admitted, across atomic.Int64
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 8 {
				var reqs []backend.Request
				for _, z := range zs {
					reqs = append(reqs, backend.Request{Limit: z, Key: "k", Cost: 1})
				}
				other := (g+i)%3 == 0
				if other {
					reqs = append(reqs, backend.Request{Limit: zs[2], Key: fmt.Sprint("other", g), Cost: 1})
				}
				ok, err := s.Decide(ctx, reqs, make([]algorithms.Result, len(reqs)))
				if err != nil {
					t.Error(err)
					return
				}
				if ok {
					admitted.Add(1)
					if other {
						across.Add(1)
					}
				}
			}
		}()
	}
	wg.Wait()
	if n := admitted.Load(); n != limit {
		t.Fatalf("admitted %d of limit %d", n, limit)
	}
	out := make([]algorithms.Result, len(zs))
	var peek []backend.Request
	for _, z := range zs {
		peek = append(peek, backend.Request{Limit: z, Key: "k", Cost: 0})
	}
	if _, err := s.Decide(ctx, peek, out); err != nil {
		t.Fatal(err)
	}
	for i, want := range []int64{0, 5, 10} {
		if out[i].Remaining != want {
			t.Fatalf("zone %d: %d left, want %d: %+v", i, out[i].Remaining, want, out)
		}
	}
	var total int64
	for g := range 16 {
		var r [1]algorithms.Result
		if _, err := s.Decide(ctx, []backend.Request{{Limit: zs[2], Key: fmt.Sprint("other", g), Cost: 0}}, r[:]); err != nil {
			t.Fatal(err)
		}
		total += limit + 10 - r[0].Remaining
	}
	if total != across.Load() {
		t.Fatalf("the keys of other slots hold %d events, %d requests naming them were admitted", total, across.Load())
	}
}
