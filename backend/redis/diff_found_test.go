package redis

import (
	"context"
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
	tw.clock++
	// A rate a nanosecond per slot slower: the debt is rebased.
	q := zoneSpec{name: "q", alg: algorithms.NameLeakyBucket, policy: p}
	q.policy.Window += 4
	q.policy.MaxDelay = 3 * q.policy.Interval()
	tw.reloadTo(false, q)
	_, r := tw.do(ask{0, "k", 1, false})
	if want := 7*q.policy.Interval() - 1 - q.policy.MaxDelay; r[0].RetryAfter != want {
		t.Errorf("retry after %d, want %d: the slots given out are kept at the new rate", r[0].RetryAfter, want)
	}
	tw.clock += day
	tw.do(ask{0, "k", 1, false})
	// Then a token bucket of 6 a minute: the debt past 2^52 is scaled to
	// the new interval as it is (70 s), not cut to 2^52 first.
	tb := zoneSpec{name: "q", alg: algorithms.NameTokenBucket, policy: policy(6, time.Minute)}
	tw.reloadTo(false, tb)
	tw.do(ask{0, "k", 0, false})
	tw.do(ask{0, "k", 1, false})
}

// A refund after some of a log's events have left its window, then a
// longer window: the events that left are gone in both stores. Redis let
// the key the refund wrote expire when its newest event had left the
// window an hour before (the test's expiry margin), and kept those events
// when a newer one was live; the memory store kept them in both cases, and
// counted them again.
func TestDifferentialLogRefundAfterWindow(t *testing.T) {
	client := standaloneClient(t)
	for _, live := range []bool{false, true} {
		spec := zoneSpec{name: "l", alg: algorithms.NameSlidingWindow, policy: policy(5, time.Hour)}
		tw := newTwinWith(t, client, false, t0, spec)
		tw.do(ask{0, "k", 1, false})
		if live {
			tw.clock += int64(59 * time.Minute)
			tw.do(ask{0, "k", 2, false})
			tw.do(ask{0, "k", 1, false})
			tw.clock += int64(11 * time.Minute) // the first event has left
			tw.giveBack(1)                      // of two live events, one goes
		} else {
			tw.do(ask{0, "k", 2, false})
			tw.clock += int64(3 * time.Hour)
			tw.giveBack(0) // an event that left the window two hours ago
			waitExpired(t, tw, 0, "k")
		}
		spec.policy = policy(5, 4*time.Hour)
		tw.reloadTo(false, spec)
		tw.do(ask{0, "k", 1, false})
	}
}

// waitExpired waits, at most a second, until Redis has expired key's
// state in zone z: an expiry set in the past of the test's clock is a
// millisecond of Redis's own.
func waitExpired(t *testing.T, tw *twin, z int, key string) {
	t.Helper()
	rz := tw.cur.redZ[z].(*zone)
	k := rz.stateKey(key)
	for stop := time.Now().Add(time.Second); time.Now().Before(stop); time.Sleep(time.Millisecond) {
		if n, err := tw.client.Exists(context.Background(), k).Result(); err != nil || n == 0 {
			return
		}
	}
}
