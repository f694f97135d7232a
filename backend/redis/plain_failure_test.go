package redis

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
)

// A batched request of plain keys (buckets, fixed windows, sliding logs)
// whose second key Redis cannot decide fails alone, and charges none of
// its keys: its first key, read before, is left as it was, and the
// requests before and after it in the batch are decided.
func TestPlainFailingKeyFailsItsRequestAlone(t *testing.T) {
	algs := []string{algorithms.NameTokenBucket, algorithms.NameFixedWindow, algorithms.NameSlidingWindow}
	for _, p := range poisons {
		for _, bad := range algs {
			if p.says != "WRONGTYPE" && bad != algorithms.NameTokenBucket {
				continue // the corrupt state is a bucket's
			}
			for _, first := range algs {
				t.Run(p.name+"/"+bad+"/after "+first, func(t *testing.T) {
					c := standaloneClient(t)
					s := newStore(t, c)
					zb := mustZone(t, s, "bad", bad, policy(5, time.Hour))
					zf := mustZone(t, s, "first", first, policy(5, time.Hour))
					ctx := context.Background()
					if err := p.plant(c, zb.(*zone).prefix+"bad}"); err != nil {
						t.Fatal(err)
					}
					var ps []*pending
					for _, reqs := range [][]backend.Request{
						{{Limit: zf, Key: "before", Cost: 1}},
						{{Limit: zf, Key: "untouched", Cost: 1}, {Limit: zb, Key: "bad", Cost: 1}},
						{{Limit: zb, Key: "after", Cost: 1}, {Limit: zf, Key: "after", Cost: 1}},
					} {
						items, _, err := s.resolve(reqs)
						if err != nil {
							t.Fatal(err)
						}
						ps = append(ps, &pending{ctx: ctx, deadline: time.Now().Add(time.Minute), items: items,
							results: make([]algorithms.Result, len(items)), done: make(chan struct{}, 1)})
					}
					s.batcherFor(ps[0].items).send(ps)
					if ps[1].err == nil || !strings.Contains(ps[1].err.Error(), p.says) {
						t.Fatalf("the request of the bad key: err %v, want %s", ps[1].err, p.says)
					}
					for _, i := range []int{0, 2} {
						if ps[i].err != nil || !ps[i].allowed || ps[i].results[0].Remaining != 4 {
							t.Fatalf("request %d: err %v allowed %v %+v", i, ps[i].err, ps[i].allowed, ps[i].results)
						}
					}
					out := make([]algorithms.Result, 1)
					if _, err := s.Decide(ctx, []backend.Request{{Limit: zf, Key: "untouched", Cost: 0}}, out); err != nil {
						t.Fatal(err)
					}
					if out[0].Remaining != 5 {
						t.Fatalf("the failed request charged its first key: %+v", out[0])
					}
				})
			}
		}
	}
}
