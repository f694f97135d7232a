package redis

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/algorithms"
)

// Sequences the random differential hunt found where the two stores
// disagreed, kept as they were reduced.

// A key the over-limit cache remembers as denied, then granted, must be
// asked of Redis again even when the clock then reads earlier than the
// grant: only a clock that never steps back kept the entry from answering.
func TestDifferentialCacheAfterGrantClockBack(t *testing.T) {
	client := standaloneClient(t)
	for _, alg := range []string{algorithms.NameTokenBucket, algorithms.NameSlidingCounter} {
		t.Run(alg, func(t *testing.T) {
			tw := newTwinWith(t, client, false, t0, zoneSpec{name: "c", alg: alg, policy: algorithms.Policy{Limit: 1, Window: 1000}})
			tw.do(ask{0, "k", 1, false}) // granted
			tw.do(ask{0, "k", 1, false}) // denied: the cache remembers it
			tw.clock += 1000
			tw.do(ask{0, "k", 1, false}) // granted at the retry time
			tw.clock -= 400              // the clock steps back
			tw.do(ask{0, "k", 1, false})
		})
	}
}

// A queue whose slots are given out up to max_delay ahead, to a request of
// the whole queue, owes max_delay + queue × interval: past 2^52 ns for a
// 30-day window.
func TestDifferentialLongQueueDebt(t *testing.T) {
	client := standaloneClient(t)
	day := int64(24 * time.Hour)
	p := algorithms.Policy{Limit: 4, Window: 30 * day, MaxDelay: 30 * day / 4 * 3}
	tw := newTwinWith(t, client, false, t0, zoneSpec{name: "q", alg: algorithms.NameLeakyBucket, policy: p})
	for range 3 {
		tw.do(ask{0, "k", 1, false})
	}
	tw.do(ask{0, "k", 4, false}) // its slots start max_delay away
	tw.do(ask{0, "k", 1, false})
	tw.clock += day
	tw.do(ask{0, "k", 1, false})
}
