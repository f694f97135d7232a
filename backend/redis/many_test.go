package redis

import (
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/algorithms"
)

// A request goes as one head when it is of one key without a
// reservation, of a zone among the first of the call's table and of a
// small cost, and as its key count and keys' arguments otherwise.
func TestCompactHead(t *testing.T) {
	var confs [len(compactHeads) + 1]zoneConf
	var zones []manyZone
	for i := range confs {
		zones = append(zones, manyZone{conf: &confs[i]})
	}
	one := func(zone int, cost int64, shadow bool, resv string) []item {
		return []item{{conf: &confs[zone], cost: cost, shadow: shadow, resv: resv}}
	}
	for _, c := range []struct {
		items []item
		want  string // "": no head
	}{
		{one(0, 1, false, ""), "1c1"},
		{one(0, 0, false, ""), "1c0"},
		{one(2, compactCosts-1, true, ""), fmt.Sprintf("3s%d", compactCosts-1)},
		{one(len(compactHeads)-1, 1, false, ""), fmt.Sprintf("%dc1", len(compactHeads))},
		{one(len(compactHeads), 1, false, ""), ""},
		{one(0, compactCosts, false, ""), ""},
		{one(0, maxCost, false, ""), ""},
		{one(0, 1, false, "60000:t1"), ""},
		{append(one(0, 1, false, ""), one(1, 1, false, "")...), ""},
	} {
		h := compactHead(zones, c.items)
		if got := ""; h != nil && *h != c.want || h == nil && c.want != "" {
			if h != nil {
				got = *h
			}
			t.Errorf("%+v: head %q, want %q", c.items, got, c.want)
		}
	}
}

// One call decides requests of one key in each of 18 zones (so of
// places past compactHeads's), of costs from 0 to past compactCosts,
// counted and shadow, and of two keys, each as the memory store decides
// it alone, in turn: heads that stand for a request and key counts with
// arguments, side by side, read alike.
func TestManyHeadsAsMemory(t *testing.T) {
	algs := []string{algorithms.NameTokenBucket, algorithms.NameFixedWindow, algorithms.NameSlidingWindow,
		algorithms.NameGCRA, algorithms.NameSlidingCounter, algorithms.NameLeakyBucket}
	var zones []zoneSpec
	for i := range len(compactHeads) + 2 {
		zones = append(zones, zoneSpec{name: fmt.Sprint("z", i), alg: algs[i%len(algs)], policy: policy(100, time.Minute)})
	}
	tw := newTwinWith(t, standaloneClient(t), false, 1_764_460_000_123_456_789, zones...)
	costs := []int64{1, 0, 1, 2, compactCosts - 1, compactCosts, 1, 7, 1 << 60}
	for round := range 40 {
		var reqs [][]ask
		for z := range zones {
			reqs = append(reqs, []ask{{zone: z, key: keyNames[(round+z)%3], cost: costs[(round+z)%len(costs)], shadow: (round+z)%5 == 0}})
		}
		reqs = append(reqs, []ask{{zone: round % len(zones), key: "k", cost: 1}, {zone: (round + 1) % len(zones), key: "k", cost: costs[round%len(costs)]}})
		tw.doBatch(reqs)
		tw.clock += int64(round%4) * int64(time.Second)
	}
}
