package redis

import (
	"fmt"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
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
	kindChanges(t, standaloneClient(t))
}

// On a cluster the old kind's key is read in the slot of the new one.
func TestDifferentialKindChangesCluster(t *testing.T) {
	kindChanges(t, clusterClient(t))
}

func kindChanges(t *testing.T, client goredis.UniversalClient) {
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
				tw.do(ask{0, "part", 4, false}, ask{0, "user{7}", 5, false})
				// Keys that would have an empty hash tag (clientKey) are
				// carried too: each kind's key is in the slot of the others.
				tw.do(ask{0, "}x{", 3, false})
				tw.do(ask{0, "", 6, false})
				for range 12 {
					tw.do(ask{0, "spent", 1, false})
				}
				tw.clock += 1234567
				tw.reloadTo(false, to)
				for range 3 {
					for _, k := range []string{"part", "spent", "old", "fresh", "user{7}", "}x{", ""} {
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
	// Back to a kind the zone had: its key was left marked as moved.
	tw.reloadTo(false, specs[3])
	for range 4 {
		tw.do(ask{0, "a", 1, false})
		tw.clock += sec / 3
	}
}

// A request of the old config decided after the first decision under the
// new kind carried the key's usage over is decided by the new state: both
// configs together admit the limit once.
func TestKindChangeStragglerDecidesByTheNewState(t *testing.T) {
	client := standaloneClient(t)
	prefix := uniquePrefix(t)
	open := func(alg string) (*Store, backend.Limit) {
		s, err := New(client, Options{KeyPrefix: prefix, Timeout: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		z, err := s.Register(backend.LimitConfig{Name: "z", Algorithm: alg, Policy: policy(10, time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
		return s, z
	}
	admitted := func(s *Store, z backend.Limit, n int) int {
		got := 0
		out := make([]algorithms.Result, 1)
		for range n {
			ok, err := s.Decide(t.Context(), []backend.Request{{Limit: z, Key: "k", Cost: 1}}, out)
			if err != nil {
				t.Fatal(err)
			}
			if ok {
				got++
			}
		}
		return got
	}
	old, oz := open(algorithms.NameSlidingWindow)
	if got := admitted(old, oz, 4); got != 4 {
		t.Fatalf("%d of 4 admitted before the reload", got)
	}
	cur, nz := open(algorithms.NameFixedWindow)
	defer cur.Close()
	if got := admitted(cur, nz, 1); got != 1 {
		t.Fatal("the first request under the new kind was denied")
	}
	if got := admitted(old, oz, 2); got != 2 {
		t.Fatalf("%d of 2 stragglers admitted", got)
	}
	old.Close()
	if got := admitted(cur, nz, 5); got != 3 {
		t.Fatalf("%d admitted after 7 of 10 were used through both configs, want 3", got)
	}
}
