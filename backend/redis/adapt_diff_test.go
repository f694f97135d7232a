package redis

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
)

// adjust moves one zone's max_events in both stores, as an adaptive limit
// does every interval: anywhere from 1 to three times the registered
// limit, the registered one included. A value one store refuses (the Redis
// store computes exactly within 2^52 ns) is taken back in the other, so
// both keep deciding alike.
func (tw *twin) adjust() {
	tw.t.Helper()
	i := tw.c.intn(len(tw.zones))
	limit := tw.zones[i].policy.Limit
	var n int64
	switch tw.c.intn(4) {
	case 0:
		n = limit
	case 1:
		n = 1
	default:
		n = 1 + int64(tw.c.intn(int(min(3*limit, 1<<20))))
	}
	mem, red := tw.cur.memZ[i].(backend.Adjustable), tw.cur.redZ[i].(backend.Adjustable)
	if !mem.CanAdjust() || !red.CanAdjust() {
		tw.fail("zone %d (%s) cannot adjust: memory %v, redis %v", i, tw.zones[i].alg, mem.CanAdjust(), red.CanAdjust())
	}
	memErr, redErr := mem.SetMaxEvents(n), red.SetMaxEvents(n)
	tw.log = append(tw.log, fmt.Sprintf("t=%d adjust %s to %d: memory %v, redis %v", tw.clock, tw.cur.memZ[i].Name(), n, memErr, redErr))
	if memErr != nil && redErr == nil {
		tw.fail("memory refused max_events %d (%v), redis took it", n, memErr)
	}
	if redErr != nil && memErr == nil {
		prev := tw.adjusted[i]
		if prev == 0 {
			prev = limit
		}
		if err := mem.SetMaxEvents(prev); err != nil {
			tw.fail("memory: back to %d: %v", prev, err)
		}
		return
	}
	if memErr == nil {
		if tw.adjusted == nil {
			tw.adjusted = map[int]int64{}
		}
		tw.adjusted[i] = n
	}
}

// The differential test with adaptive limits: between the requests,
// refunds, batches and reloads of the random runs, max_events moves in
// both stores; every answer must be the same, field by field. The bucket
// states stay as they are in both (a time), the window states are counts
// compared with the new limit.
func TestDifferentialAdaptive(t *testing.T) {
	client := standaloneClient(t)
	runs, steps := diffRuns(200), 150
	for run := range runs {
		tw := newTwin(t, prng{rand.New(rand.NewPCG(uint64(run), 83))}, client, run%4 == 3)
		for range steps {
			if tw.c.intn(6) == 0 {
				tw.adjust()
			} else {
				tw.step()
			}
		}
	}
}

// A key emptied at one rate, then decided alternately by two instances
// whose adaptive limits disagree (one backed off, one not): the state in
// Redis is never rewritten to either instance's rate, and each decides on
// it as the memory store does at that instance's rate.
func TestDifferentialAdaptiveFleetDisagrees(t *testing.T) {
	client := standaloneClient(t)
	for _, alg := range []string{algorithms.NameTokenBucket, algorithms.NameGCRA, algorithms.NameLeakyBucket} {
		p := algorithms.Policy{Limit: 10, Window: int64(1e9), Burst: 4}
		if alg == algorithms.NameLeakyBucket {
			p = algorithms.Policy{Limit: 10, Window: int64(1e9), MaxDelay: int64(5e8)}
		}
		tw := newTwinWith(t, client, false, t0, zoneSpec{name: "fleet", alg: alg, policy: p})
		// The second instance: its own stores over the same Redis keys
		// and the same memory table (one process standing in for two).
		a, b := tw.cur, tw.load(tw.zones)
		// Each instance's over-limit cache answers a denial it saw until
		// the retry time Redis gave, even after the other instance (at a
		// higher limit) granted in between: still denied, with an earlier
		// retry than the state holds. Off here, to compare every answer
		// with the memory store's.
		a.red.cache, b.red.cache = nil, nil
		for _, c := range []struct {
			cfg *config
			n   int64
		}{{a, 3}, {b, 25}} {
			if err := c.cfg.redZ[0].(backend.Adjustable).SetMaxEvents(c.n); err != nil {
				t.Fatal(err)
			}
			if err := c.cfg.memZ[0].(backend.Adjustable).SetMaxEvents(c.n); err != nil {
				t.Fatal(err)
			}
		}
		for step := range 200 {
			tw.cur = a
			if step%3 == 0 {
				tw.cur = b
			}
			tw.log = append(tw.log, fmt.Sprintf("instance %v", tw.cur == a))
			tw.do(ask{0, "k", 1, false})
			tw.clock += int64(7e6) * int64(1+step%5)
		}
	}
}
