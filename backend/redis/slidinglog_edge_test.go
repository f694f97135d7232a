package redis

import (
	"testing"

	"github.com/sluicehq/sluice/algorithms"
)

// A log of single units around the 4 KB a small log is written whole up
// to (512 events), stepping the clock forward and back, given back, a
// cost of 2 that switches its format, and a window changed by a reload:
// each answer is the memory store's.
func TestDifferentialSmallLogEdges(t *testing.T) {
	client := standaloneClient(t)
	const W = 1_000_000
	for _, c := range []struct {
		name string
		live int // events logged before the edge steps
	}{{"127", 127}, {"128", 128}, {"129", 129}, {"511", 511}, {"512", 512}, {"513", 513}} {
		t.Run(c.name, func(t *testing.T) {
			z := zoneSpec{name: "log", alg: algorithms.NameSlidingWindow, policy: algorithms.Policy{Limit: 600, Window: W}}
			tw := twinOrSkip(t, client, z)
			for i := range c.live {
				tw.do(ask{0, "k", 1, false})
				if i%3 == 0 {
					tw.clock++
				}
			}
			tw.do(ask{0, "k", 1, false}) // past the edge
			tw.clock -= 50               // the clock steps back
			tw.do(ask{0, "k", 1, false})
			tw.giveBackLast()
			tw.do(ask{0, "k", 1, false})
			tw.clock += W / 2
			tw.do(ask{0, "k", 1, false})
			tw.clock += W/2 - 100 // the first events leave
			tw.do(ask{0, "k", 1, false})
			tw.do(ask{0, "k", 2, false}) // another format
			tw.do(ask{0, "k", 1, false})
			tw.giveBack(len(tw.granted) - 2)
			tw.do(ask{0, "k", 700, false})
			longer := z
			longer.policy.Window = 3 * W
			tw.reloadTo(false, longer)
			tw.do(ask{0, "k", 1, false})
			tw.clock += W
			tw.do(ask{0, "k", 1, false})
			shorter := z
			shorter.policy.Window = W / 4
			tw.reloadTo(false, shorter)
			tw.do(ask{0, "k", 1, false})
			tw.clock -= 10
			tw.do(ask{0, "k", 1, false})
		})
	}
	// A fresh log of single units then a window change with no event
	// between: the small write after the reload expires with the new window.
	t.Run("reload between small writes", func(t *testing.T) {
		z := zoneSpec{name: "log", alg: algorithms.NameSlidingWindow, policy: algorithms.Policy{Limit: 5, Window: W}}
		tw := twinOrSkip(t, client, z)
		for range 5 {
			tw.do(ask{0, "k", 1, false})
			tw.clock += W / 10
		}
		short := z
		short.policy.Window = W / 5
		tw.reloadTo(false, short)
		tw.do(ask{0, "k", 1, false})
		tw.do(ask{0, "k", 1, false})
		tw.clock += W / 5
		tw.do(ask{0, "k", 1, false})
	})
}
