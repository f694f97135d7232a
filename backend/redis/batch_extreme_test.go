package redis

import (
	"fmt"
	"math/rand/v2"

	goredis "github.com/redis/go-redis/v9"
	"math"
	"testing"
	"time"

	"github.com/sluicehq/sluice/algorithms"
)

// A batch answered packed reads as the memory store's answers at the edges
// of a double: limits past 2^53, costs near the largest int64, windows of
// years, requests that can never pass.
func TestBatchPackedExtremeNumbers(t *testing.T) {
	client := standaloneClient(t)
	year := int64(365 * 24 * time.Hour)
	for _, c := range []struct {
		name   string
		policy algorithms.Policy
		costs  []int64
	}{
		{"limit at the bound", algorithms.Policy{Limit: algorithms.MaxEvents, Window: MaxSpan / 2}, []int64{1, 2, algorithms.MaxEvents - 1, 3, 1 << 53, 1<<53 + 1}},
		{"limit and window at the bound", algorithms.Policy{Limit: algorithms.MaxEvents, Window: MaxSpan}, []int64{1, algorithms.MaxEvents / 2, algorithms.MaxEvents/2 + 1, 7}},
		{"cost max int64", algorithms.Policy{Limit: 1000, Window: MaxSpan}, []int64{math.MaxInt64, math.MaxInt64 - 1, 1, 1 << 53, 1<<53 + 1, 1<<63 - 1024}},
		{"small limit long window", algorithms.Policy{Limit: 3, Window: MaxSpan}, []int64{1, 1, 1, 1, 5, 0}},
		{"queue", algorithms.Policy{Limit: 3, Window: MaxSpan / 4, MaxDelay: MaxSpan / 2}, []int64{1, 1, 1, 1, 3, 0}},
	} {
		for _, alg := range []string{algorithms.NameTokenBucket, algorithms.NameGCRA, algorithms.NameFixedWindow, algorithms.NameSlidingCounter, algorithms.NameSlidingWindow, algorithms.NameLeakyBucket} {
			t.Run(c.name+"/"+alg, func(t *testing.T) {
				tw := twinOrSkip(t, client, zoneSpec{name: "x", alg: alg, policy: c.policy})
				var reqs [][]ask
				for i, cost := range c.costs {
					reqs = append(reqs, []ask{{0, "k", cost, false}}, []ask{{0, "j" + string(rune('a'+i)), cost, false}})
				}
				tw.doBatch(reqs)
				tw.clock += year / 8
				tw.doBatch(reqs)
				for _, cost := range c.costs {
					tw.do(ask{0, "k", cost, false})
				}
			})
		}
	}
}

// twinOrSkip is newTwinWith for a zone either store may refuse: the test
// is then skipped.
func twinOrSkip(t *testing.T, client goredis.UniversalClient, z zoneSpec) *twin {
	if err := z.policy.Validate(); err != nil {
		t.Skip(err)
	}
	twinSeq++
	z.name = fmt.Sprintf("ext%d-%s", twinSeq, z.name)
	tw := &twin{t: t, c: prng{rand.New(rand.NewPCG(1, 2))}, lc: prng{rand.New(rand.NewPCG(3, 4))}, client: client, prefix: uniquePrefix(t), clock: t0}
	tw.zones = []zoneSpec{z}
	if tw.cur = tw.load(tw.zones); tw.cur == nil {
		t.Skip("refused by the redis backend")
	}
	t.Cleanup(func() {
		tw.cur.mem.Close()
		tw.cur.red.Close()
	})
	return tw
}
