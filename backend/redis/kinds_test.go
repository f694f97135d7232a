package redis

import (
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/algorithms"
)

// kindSpecs are the algorithms under every kind of state the script keeps,
// the leaky bucket both as a meter and as a queue.
func kindSpecs() []zoneSpec {
	p := policy(10, time.Minute)
	q := p
	q.MaxDelay = 4 * q.Interval()
	return []zoneSpec{
		{alg: algorithms.NameTokenBucket, policy: p},
		{alg: algorithms.NameGCRA, policy: p},
		{alg: algorithms.NameLeakyBucket, policy: q},
		{alg: algorithms.NameSlidingWindow, policy: p},
		{alg: algorithms.NameFixedWindow, policy: p},
		{alg: algorithms.NameSlidingCounter, policy: p},
	}
}

// A reload to another kind of state carries each key's usage, on Redis as
// in memory, decision for decision: a key part used, a spent key, a fresh
// key and a key last used long before, translated at the reload's instant
// and decided at later ones.
func TestDifferentialKindChanges(t *testing.T) {
	client := standaloneClient(t)
	specs := kindSpecs()
	for _, from := range specs {
		for _, to := range specs {
			if stateKind(from.alg) == stateKind(to.alg) {
				continue
			}
			t.Run(fmt.Sprintf("%s%d→%s%d", from.alg, from.policy.MaxDelay, to.alg, to.policy.MaxDelay), func(t *testing.T) {
				tw := newTwinWith(t, client, false, t0, from)
				tw.do(ask{0, "old", 3, false})
				tw.clock += 7 * sec
				tw.do(ask{0, "part", 4, false})
				for range 12 {
					tw.do(ask{0, "spent", 1, false})
				}
				tw.clock += 1234567
				tw.reloadTo(false, to)
				for range 3 {
					for _, k := range []string{"part", "spent", "old", "fresh"} {
						tw.do(ask{0, k, 1, false})
					}
					tw.clock += 5*sec + 1
				}
				tw.clock += 2 * int64(time.Minute)
				tw.do(ask{0, "part", 1, false}, ask{0, "spent", 1, false})
			})
		}
	}
}

// Through three kinds, with keys touched under each or only under some.
func TestDifferentialKindChain(t *testing.T) {
	client := standaloneClient(t)
	specs := kindSpecs()
	tw := newTwinWith(t, client, false, t0, specs[0])
	tw.do(ask{0, "a", 6, false})
	tw.do(ask{0, "b", 9, false})
	tw.clock += sec
	tw.reloadTo(false, specs[3])
	tw.do(ask{0, "a", 1, false})
	tw.clock += sec
	tw.reloadTo(false, specs[5])
	for range 6 {
		tw.do(ask{0, "a", 1, false}, ask{0, "b", 1, false})
		tw.clock += sec / 3
	}
}
