package memory

import (
	"fmt"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
)

// evictionCases are a zone of each algorithm (the leaky bucket as a meter
// and as a queue) of 5 units per hour, and how the victim spends it: the
// queue holds two units, which the victim takes in one request.
var evictionCases = []struct {
	name, alg string
	p         algorithms.Policy
	spend     []int64 // costs of the requests that leave a key denying
}{
	{"sliding_window", algorithms.NameSlidingWindow, algorithms.Policy{Limit: 5, Window: 3600 * sec}, []int64{1, 1, 1, 1, 1}},
	{"sliding_window_counter", algorithms.NameSlidingCounter, algorithms.Policy{Limit: 5, Window: 3600 * sec}, []int64{1, 1, 1, 1, 1}},
	{"fixed_window", algorithms.NameFixedWindow, algorithms.Policy{Limit: 5, Window: 3600 * sec}, []int64{1, 1, 1, 1, 1}},
	{"token_bucket", algorithms.NameTokenBucket, algorithms.Policy{Limit: 5, Window: 3600 * sec}, []int64{1, 1, 1, 1, 1}},
	{"gcra", algorithms.NameGCRA, algorithms.Policy{Limit: 5, Window: 3600 * sec}, []int64{1, 1, 1, 1, 1}},
	{"leaky_bucket", algorithms.NameLeakyBucket, algorithms.Policy{Limit: 5, Window: 3600 * sec}, []int64{1, 1, 1, 1, 1}},
	{"leaky_queue", algorithms.NameLeakyBucket, algorithms.Policy{Limit: 5, Window: 3600 * sec, MaxDelay: 720 * sec}, []int64{2}},
}

func spend(t *testing.T, s *Store, z backend.Limit, key string, costs []int64) {
	t.Helper()
	for i, c := range costs {
		if ok, _ := decide(t, s, backend.Request{Limit: z, Key: key, Cost: c}); !ok {
			t.Fatalf("%s: request %d of %v denied", key, i+1, costs)
		}
	}
}

// A blocked key outlives 100 × max_keys junk keys, with nine in ten keys of
// the table spent: it is still denied with the same wait, no denying key
// was evicted, and the junk keys were.
func TestEvictionNeverUnblocks(t *testing.T) {
	const maxKeys = 100
	for _, tc := range evictionCases {
		t.Run(tc.name, func(t *testing.T) {
			c := newFakeClock()
			s := newStore(t, c)
			z := testZone(t, s, tc.alg, tc.p, maxKeys)
			tbl := tableStats(z)
			spend(t, s, z, "victim", tc.spend)
			ok, before := decide(t, s, backend.Request{Limit: z, Key: "victim", Cost: 1})
			if ok {
				t.Fatal("the victim is not blocked")
			}
			for i := 0; i < 90; i++ {
				spend(t, s, z, fmt.Sprint("spent", i), tc.spend)
			}
			for i := 0; i < 100*maxKeys; i++ {
				if ok, _ := decide(t, s, backend.Request{Limit: z, Key: fmt.Sprint("junk", i), Cost: 1}); !ok {
					t.Fatalf("junk key %d denied", i)
				}
				if i%1000 == 0 {
					c.advance(time.Millisecond)
				}
			}
			ok, after := decide(t, s, backend.Request{Limit: z, Key: "victim", Cost: 1})
			if ok {
				t.Fatal("the victim was let through after the flood: its state was evicted")
			}
			if drift := before[0].RetryAfter - after[0].RetryAfter; drift < 0 || drift > int64(10*time.Millisecond) {
				t.Fatalf("retry after %v before the flood, %v after", time.Duration(before[0].RetryAfter), time.Duration(after[0].RetryAfter))
			}
			if keys, ev, den := tbl.Keys(), tbl.Evictions(), tbl.DenyingEvictions(); keys > maxKeys || ev < 99*maxKeys || den != 0 {
				t.Fatalf("%d keys, %d evictions, %d of them denying", keys, ev, den)
			}
		})
	}
}

// At the cap the key with the most units left goes first.
func TestEvictionTakesMostRemaining(t *testing.T) {
	c := newFakeClock()
	s := newStore(t, c)
	z := testZone(t, s, algorithms.NameSlidingWindow, algorithms.Policy{Limit: 10, Window: 3600 * sec}, 8)
	tbl := z.(*zone[*algorithms.Log]).t
	for i := 1; i <= 8; i++ { // key i has used i units
		spend(t, s, z, fmt.Sprint("k", i), []int64{int64(i)})
	}
	for i := 1; i <= 7; i++ {
		decide(t, s, backend.Request{Limit: z, Key: fmt.Sprint("new", i), Cost: 9})
		// The new keys have 1 left, k8 has 2: k1 … k7 go in order.
		for j := 1; j <= 8; j++ {
			h := tbl.hash(fmt.Sprint("k", j))
			_, kept := tbl.shard(h).find(h)
			if want := j > i; kept != want {
				t.Fatalf("after %d new keys: k%d kept=%v", i, j, kept)
			}
		}
	}
}

// A sample that finds only denying keys looks further: the one key with
// room, neither in the sample nor recently inserted, is found by a scan of
// the shard, or of the other shards when the new key's shard has none.
func TestEvictionLooksPastDenyingKeys(t *testing.T) {
	for _, tc := range []struct {
		name    string
		maxKeys int
	}{
		{"one shard", 1000},
		{"another shard", 10_000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newFakeClock()
			s := newStore(t, c)
			z := testZone(t, s, algorithms.NameFixedWindow, algorithms.Policy{Limit: 2, Window: 3600 * sec}, tc.maxKeys)
			tbl := z.(*zone[algorithms.Window]).t
			shardOf := func(key string) uint64 { return tbl.hash(key) & tbl.mask }
			room := "room"
			for i := 0; len(tbl.shards) > 1 && shardOf(room) == shardOf("new"); i++ {
				room = fmt.Sprint("room", i)
			}
			spend(t, s, z, room, []int64{1})
			for i := 0; i < tc.maxKeys-1; i++ {
				spend(t, s, z, fmt.Sprint("spent", i), []int64{2})
			}
			decide(t, s, backend.Request{Limit: z, Key: "new", Cost: 1})
			h := tbl.hash(room)
			if _, kept := tbl.shard(h).find(h); kept {
				t.Fatal("the only key with room was kept")
			}
			if d := tbl.DenyingEvictions(); d != 0 {
				t.Fatalf("%d denying keys evicted", d)
			}
			// Now "new" is the one with room, as a recent insert.
			decide(t, s, backend.Request{Limit: z, Key: "newer", Cost: 1})
			if d := tbl.DenyingEvictions(); d != 0 || tbl.Keys() != int64(tc.maxKeys) {
				t.Fatalf("%d denying keys evicted, %d keys", d, tbl.Keys())
			}
		})
	}
}

// When every key left is denying, one of them must go: the one nearest to
// idle; it is counted, and logged once per denyLogGap.
func TestEvictionOfDenyingKeyIsCountedAndLogged(t *testing.T) {
	c := newFakeClock()
	core, logs := observer.New(zap.WarnLevel)
	s := New(Options{Now: c.now, Logger: zap.New(core)})
	t.Cleanup(func() { _ = s.Close() })
	z := testZone(t, s, algorithms.NameSlidingWindow, algorithms.Policy{Limit: 1, Window: 3600 * sec}, 10)
	tbl := z.(*zone[*algorithms.Log]).t
	for i := 0; i < 10; i++ {
		spend(t, s, z, fmt.Sprint("k", i), []int64{1})
		c.advance(time.Second)
	}
	for i := 0; i < 50; i++ {
		spend(t, s, z, fmt.Sprint("new", i), []int64{1})
	}
	if d := tbl.DenyingEvictions(); d != 50 || tbl.Keys() != 10 {
		t.Fatalf("%d denying evictions, %d keys; want 50 and 10", d, tbl.Keys())
	}
	if n := logs.Len(); n != 1 {
		t.Fatalf("%d log lines for 50 denying evictions in one instant, want 1", n)
	}
	e := logs.All()[0]
	if f := e.ContextMap(); f["zone"] != z.Name() || f["denying_evictions"] != uint64(1) {
		t.Fatalf("log line %q %v", e.Message, f)
	}
	c.advance(time.Duration(denyLogGap))
	spend(t, s, z, "later", []int64{1})
	if n := logs.Len(); n != 2 {
		t.Fatalf("%d log lines after %v, want 2", n, time.Duration(denyLogGap))
	}
}

// tableStats returns the counters of z's table, whatever its kind.
func tableStats(z backend.Limit) interface {
	Keys() int64
	Evictions() uint64
	DenyingEvictions() uint64
} {
	switch z := z.(type) {
	case *zone[algorithms.Bucket]:
		return z.t
	case *zone[*algorithms.Log]:
		return z.t
	case *zone[algorithms.Window]:
		return z.t
	case *zone[algorithms.Counter]:
		return z.t
	}
	panic(fmt.Sprintf("zone of type %T", z))
}

// A shard that is busy when a new key needs room may hold the keys with
// room: the search cannot tell that nothing else is left, so no denying key
// is evicted; the table goes over its cap by the new key until the next
// insert finds room.
func TestEvictionSkipsDenyingWhileShardBusy(t *testing.T) {
	const maxKeys = 10_000
	c := newFakeClock()
	s := newStore(t, c)
	z := testZone(t, s, algorithms.NameGCRA, algorithms.Policy{Limit: 2, Window: 3600 * sec}, maxKeys)
	tbl := z.(*zone[algorithms.Bucket]).t
	shardOf := func(key string) uint64 { return tbl.hash(key) & tbl.mask }
	room := "room"
	for i := 0; shardOf(room) == shardOf("new") || shardOf(room) == shardOf("newer"); i++ {
		room = fmt.Sprint("room", i)
	}
	spend(t, s, z, room, []int64{1})
	for i := 0; i < maxKeys-1; i++ {
		spend(t, s, z, fmt.Sprint("spent", i), []int64{2})
	}
	busy := tbl.shard(tbl.hash(room))
	busy.mu.Lock() // another request deciding a key of that shard
	spend(t, s, z, "new", []int64{1})
	busy.mu.Unlock()
	if d, n := tbl.DenyingEvictions(), tbl.Keys(); d != 0 || n != maxKeys+1 {
		t.Fatalf("%d denying keys evicted, %d keys; want 0 and %d", d, n, maxKeys+1)
	}
	spend(t, s, z, "newer", []int64{1})
	if d, n := tbl.DenyingEvictions(), tbl.Keys(); d != 0 || n != maxKeys {
		t.Fatalf("%d denying keys evicted, %d keys; want 0 and %d", d, n, maxKeys)
	}
}

// A zone whose logs are so long that the smallest default cap exceeds the
// memory the default is sized for says so when it is registered.
func TestDefaultCapOverBudgetWarns(t *testing.T) {
	core, logs := observer.New(zap.WarnLevel)
	s := New(Options{Logger: zap.New(core)})
	t.Cleanup(func() { _ = s.Close() })
	long := algorithms.Policy{Limit: 100_000, Window: 3600 * sec}
	if _, err := s.Register(backend.LimitConfig{Name: t.Name() + "/long", Algorithm: algorithms.NameSlidingWindow, Policy: long}); err != nil {
		t.Fatal(err)
	}
	if logs.Len() != 1 {
		t.Fatalf("%d warnings for a default cap of 1,024 keys of 100,000 events, want 1", logs.Len())
	}
	if worst := logs.All()[0].ContextMap()["worst_case_bytes"].(int64); worst < 1024*100_000*8 {
		t.Fatalf("worst case %d bytes, want at least 1,024 keys × 100,000 events × 8 bytes", worst)
	}
	short := algorithms.Policy{Limit: 1000, Window: 3600 * sec}
	if _, err := s.Register(backend.LimitConfig{Name: t.Name() + "/short", Algorithm: algorithms.NameSlidingWindow, Policy: short, Cost: 1}); err != nil {
		t.Fatal(err)
	}
	if logs.Len() != 1 {
		t.Fatalf("a zone within the budget warned: %v", logs.All()[1].Message)
	}
}
