package redis

import (
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
)

// Hand-written sequences at the edges, each step compared field by field
// between the memory store and the Redis store (twin.do fails on any
// difference).

const (
	sec = int64(time.Second)
	// t0 is a realistic Unix time one nanosecond before a second, a minute
	// and an hour turn.
	t0 = int64(1_764_460_799_999_999_999)
)

func policy(limit int64, window time.Duration) algorithms.Policy {
	return algorithms.Policy{Limit: limit, Window: int64(window)}
}

func TestAdversarialWindowEdges(t *testing.T) {
	client := standaloneClient(t)
	for _, alg := range []string{algorithms.NameSlidingWindow, algorithms.NameSlidingCounter, algorithms.NameFixedWindow} {
		t.Run(alg, func(t *testing.T) {
			tw := newTwinWith(t, client, false, t0, zoneSpec{name: "w", alg: alg, policy: policy(3, time.Second)})
			tw.do(ask{0, "k", 3, false})                        // the whole limit, a ns before the turn
			tw.do(ask{0, "k", 1, false})                        // denied: retry at the turn
			tw.do(ask{0, "k", 4, false})                        // above the limit: never
			tw.do(ask{0, "k", 0, false})                        // free, over the limit
			tw.clock++                                          // the turn
			tw.do(ask{0, "k", 1, false})                        // fixed window: new; others: still full
			tw.clock += sec - 2                                 // a ns before the events leave
			tw.do(ask{0, "k", 1, false})                        //
			tw.clock++                                          // they leave now
			tw.do(ask{0, "k", 2, false})                        //
			tw.do(ask{0, "k", 1, true})                         // shadow
			tw.giveBackLast()                                   // the shadow's unit back
			tw.do(ask{0, "k", 1, false}, ask{0, "k", 1, false}) // same key twice: summed
			tw.clock += 10 * sec
			tw.do(ask{0, "k", 1 << 62, false}, ask{0, "j", 1, false})
		})
	}
}

func TestAdversarialBuckets(t *testing.T) {
	client := standaloneClient(t)
	tw := newTwinWith(t, client, false, t0,
		zoneSpec{name: "tb", alg: algorithms.NameTokenBucket, policy: algorithms.Policy{Limit: 10, Window: int64(time.Second), Burst: 5}},
		zoneSpec{name: "gcra", alg: algorithms.NameGCRA, policy: policy(3, time.Minute)},
		zoneSpec{name: "meter", alg: algorithms.NameLeakyBucket, policy: algorithms.Policy{Limit: 7, Window: int64(time.Second), Burst: 2}},
		zoneSpec{name: "queue", alg: algorithms.NameLeakyBucket, policy: algorithms.Policy{Limit: 7, Window: int64(time.Second), MaxDelay: int64(500 * time.Millisecond)}},
	)
	for z := range 4 {
		tw.do(ask{z, "k", 5, false})
		tw.do(ask{z, "k", 1, false})
		tw.do(ask{z, "k", 6, false})
		tw.do(ask{z, "k", 0, false})
		tw.clock += 1
		tw.do(ask{z, "k", 1, false})
		tw.clock += 142_857_143 // one interval of 7/s
		tw.do(ask{z, "k", 1, false})
		tw.do(ask{z, "k", 1, false})
		tw.giveBackLast() // the last slot or token
		tw.do(ask{z, "k", 1, false})
	}
	// The queue: fill it, give back a slot in the middle (stays empty) and
	// the last one (reused).
	for range 3 {
		tw.do(ask{3, "q", 1, false})
	}
	_, mid := tw.do(ask{3, "q", 1, false})
	tw.do(ask{3, "q", 1, false})
	tw.granted = append(tw.granted[:len(tw.granted)-2], tw.granted[len(tw.granted)-1], tw.granted[len(tw.granted)-2])
	tw.giveBackLast() // the middle one: nothing comes back
	tw.giveBackLast() // the last one: its slot is free again
	tw.do(ask{3, "q", 1, false})
	if mid[0].Delay == 0 {
		t.Fatal("the queue should have delayed the fourth request")
	}
	// All four zones in one request, one of them denying: nothing taken.
	tw.do(ask{0, "all", 1, false}, ask{1, "all", 1, false}, ask{2, "all", 1, false}, ask{3, "all", 9, false})
	tw.do(ask{0, "all", 5, false}, ask{1, "all", 3, false}, ask{2, "all", 2, false}, ask{3, "all", 4, false})
}

func TestAdversarialReloads(t *testing.T) {
	client := standaloneClient(t)
	bucket := func(limit int64, w time.Duration) zoneSpec {
		return zoneSpec{alg: algorithms.NameTokenBucket, policy: policy(limit, w)}
	}
	counter := func(limit int64, w time.Duration) zoneSpec {
		return zoneSpec{alg: algorithms.NameSlidingCounter, policy: policy(limit, w)}
	}
	window := func(limit int64, w time.Duration) zoneSpec {
		return zoneSpec{alg: algorithms.NameFixedWindow, policy: policy(limit, w)}
	}
	tw := newTwinWith(t, client, false, t0, bucket(10, time.Second), counter(10, time.Minute), window(10, time.Minute))
	all := func(cost int64) { tw.do(ask{0, "k", cost, false}, ask{1, "k", cost, false}, ask{2, "k", cost, false}) }
	all(6)
	tw.clock += 300 * int64(time.Millisecond)
	// Slower, at the same instant as a decision, then faster.
	tw.reloadTo(false, bucket(1, time.Second), counter(10, time.Hour), window(10, 7*time.Minute))
	all(1)
	tw.clock += 2 * sec
	all(1)
	tw.reloadTo(false, bucket(100, time.Second), counter(5, time.Second), window(3, time.Second))
	all(1)
	// A reload that fails and is undone at the same instant: two changes.
	tw.reloadTo(true, bucket(2, time.Minute), counter(7, 3*time.Second), window(3, time.Hour))
	all(1)
	tw.clock += 1
	all(0)
	// Back and forth without touching the keys, then touch them.
	for i := range 5 {
		tw.clock += 100 * int64(time.Millisecond)
		tw.reloadTo(false, bucket(int64(1+i), time.Second), counter(int64(3+i), time.Duration(i+1)*time.Second), window(int64(2+i), time.Duration(i+1)*time.Second))
	}
	all(1)
	tw.clock += sec
	all(1)
}

// The largest numbers the Redis store accepts are computed exactly too.
func TestAdversarialBounds(t *testing.T) {
	client := standaloneClient(t)
	tw := newTwinWith(t, client, false, t0,
		zoneSpec{name: "counter", alg: algorithms.NameSlidingCounter, policy: algorithms.Policy{Limit: algorithms.MaxEvents, Window: MaxSpan}},
		zoneSpec{name: "window", alg: algorithms.NameFixedWindow, policy: algorithms.Policy{Limit: algorithms.MaxEvents, Window: MaxSpan}},
		zoneSpec{name: "bucket", alg: algorithms.NameTokenBucket, policy: algorithms.Policy{Limit: 3, Window: MaxSpan - MaxSpan%3, Burst: 3}},
		zoneSpec{name: "queue", alg: algorithms.NameLeakyBucket, policy: algorithms.Policy{Limit: 1 << 20, Window: 1 << 40, MaxDelay: MaxSpan - 1<<20}},
		zoneSpec{name: "log", alg: algorithms.NameSlidingWindow, policy: algorithms.Policy{Limit: 4_000_000_000, Window: MaxSpan}},
	)
	for z := range 5 {
		tw.do(ask{z, "k", MaxSpan / 3, false})
		tw.clock += MaxSpan / 5
		tw.do(ask{z, "k", 1, false})
		tw.do(ask{z, "k", MaxSpan, false})
		tw.clock += MaxSpan - 12345
		tw.do(ask{z, "k", MaxSpan/2 + 7, false})
		tw.clock += MaxSpan / 7
		tw.do(ask{z, "k", 3, false})
	}
}

func TestZoneRefusesInexactPolicies(t *testing.T) {
	s, err := New(standaloneClient(t), Options{KeyPrefix: uniquePrefix(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, tc := range []struct {
		name string
		alg  string
		p    algorithms.Policy
		want string
	}{
		{"window", algorithms.NameSlidingWindow, algorithms.Policy{Limit: 1, Window: MaxSpan + 1}, "window"},
		{"60 days", algorithms.NameFixedWindow, policy(1, 60*24*time.Hour), "52 days"},
		{"events", algorithms.NameSlidingCounter, algorithms.Policy{Limit: MaxSpan + 1, Window: sec}, "max_events"},
		{"burst", algorithms.NameGCRA, algorithms.Policy{Limit: 1, Window: int64(24 * time.Hour), Burst: 60}, "burst 60"},
		{"max_delay", algorithms.NameLeakyBucket, algorithms.Policy{Limit: 1, Window: sec, MaxDelay: MaxSpan}, "max_delay"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := s.Register(backendZone(tc.name, tc.alg, tc.p))
			if err == nil || !contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error naming %q", err, tc.want)
			}
		})
	}
	// A reload that would carry a debt past the bound is refused; one in
	// range is not.
	if _, err := s.Register(backendZone("r", algorithms.NameTokenBucket, algorithms.Policy{Limit: 1000, Window: sec})); err != nil {
		t.Fatal(err)
	}
	s2, _ := New(standaloneClient(t), Options{KeyPrefix: s.prefix})
	defer s2.Close()
	if _, err := s2.Register(backendZone("r", algorithms.NameTokenBucket, policy(1, 24*time.Hour))); err == nil || !contains(err.Error(), "smaller steps") {
		t.Fatalf("1000/s → 1/day: got %v", err)
	}
	if _, err := s2.Register(backendZone("r", algorithms.NameTokenBucket, policy(1, time.Minute))); err != nil {
		t.Fatalf("1000/s → 1/min: %v", err)
	}
}

func backendZone(name, alg string, p algorithms.Policy) backend.LimitConfig {
	return backend.LimitConfig{Name: name, Algorithm: alg, Policy: p}
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }

// A long sliding log: thousands of events, most pruned, some given back
// (marked in place), units that make the log carry them, the clock
// stepping back, compactions of the string along the way.
func TestAdversarialLongLog(t *testing.T) {
	client := standaloneClient(t)
	tw := newTwinWith(t, client, false, t0, zoneSpec{name: "log", alg: algorithms.NameSlidingWindow, policy: policy(300, time.Second)})
	for i := range 3000 {
		cost := int64(1)
		switch {
		case i > 1500 && i%7 == 0:
			cost = 2
		case i%97 == 0:
			cost = 0
		}
		ok, _ := tw.do(ask{0, "k", cost, false})
		if ok && i%3 == 0 && cost > 0 {
			tw.giveBackLast()
		}
		switch {
		case i%501 == 500:
			tw.clock -= 3 * int64(time.Millisecond) // steps back
		case i%250 == 0:
			tw.clock += 2 * sec // everything leaves
		default:
			tw.clock += int64(time.Millisecond) + int64(i%5)
		}
	}
	n, err := client.StrLen(t.Context(), tw.cur.redZ[0].(*zone).prefix+"k}").Result()
	if err != nil {
		t.Fatal(err)
	}
	// At most 300 live events of 20 bytes, as many pruned ones, a header.
	if n > 26+2*300*20+256 {
		t.Fatalf("the log string is %d bytes: pruned events are not compacted", n)
	}
}

// An event given back at the head of the log: the next denial's retry
// time is the oldest event still held, not the one given back.
func TestAdversarialLogGivenBackAtHead(t *testing.T) {
	client := standaloneClient(t)
	tw := newTwinWith(t, client, false, t0, zoneSpec{name: "log", alg: algorithms.NameSlidingWindow, policy: policy(3, time.Second)})
	tw.do(ask{0, "k", 1, false})
	tw.clock++
	tw.do(ask{0, "k", 1, false})
	tw.giveBack(0) // the oldest event
	for range 3 {
		tw.clock++
		tw.do(ask{0, "k", 1, false})
	}
	tw.clock += sec - 3
	tw.do(ask{0, "k", 2, false})
	tw.clock++
	tw.do(ask{0, "k", 1, false})
}

// An event taken back after another slot denied is newer than an event
// that a clock stepping back logs after it: pruning must not stop at it.
func TestAdversarialUndoneEventOutOfOrder(t *testing.T) {
	client := standaloneClient(t)
	tw := newTwinWith(t, client, true, t0,
		zoneSpec{name: "log", alg: algorithms.NameSlidingWindow, policy: policy(100, 24*time.Hour)},
		zoneSpec{name: "tight", alg: algorithms.NameTokenBucket, policy: policy(1, time.Hour)},
	)
	if slotOf(tw.cur.redZ[0].(*zone).prefix+"k}") == slotOf(tw.cur.redZ[1].(*zone).prefix+"x}") {
		t.Fatal("the test needs keys in two slots")
	}
	tw.do(ask{0, "k", 1, false})
	tw.clock += 1000
	tw.do(ask{0, "k", 1, false}, ask{1, "x", 5, false}) // denied by the other slot: undone
	tw.clock -= 500
	tw.do(ask{0, "k", 1, false})
	tw.clock += int64(24 * time.Hour)
	tw.do(ask{0, "k", 1, false})
}
