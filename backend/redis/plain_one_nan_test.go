package redis

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
)

// A log of single units whose header matches its events but one of whose
// events is not a number (a value no version writes, put there by hand):
// logPlainOne must decide it as decideKeys does, which reads its events
// one by one (logEvent) once the log is past the first read, and counts
// such an event as live and then pruned. The reply, the value and the
// expiry are decideKeys's alone, first read or in parts, the event oldest
// or newest.
func TestPlainOneLogNaNEvent(t *testing.T) {
	ctx := context.Background()
	c := standaloneClient(t)
	generic := loadGeneric(t)
	const W = int64(time.Minute)
	clock := int64(1_764_460_000_000_000_000)
	s, err := New(c, Options{KeyPrefix: uniquePrefix(t), Timeout: 10 * time.Second, now: func() int64 { return clock }, NoCache: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	z := mustZone(t, s, "l", algorithms.NameSlidingWindow, algorithms.Policy{Limit: 128, Window: W})
	conn := c.Conn()
	t.Cleanup(func() { conn.Close() })
	for _, n := range []int{100, 200} {
		for _, at := range []int{0, 5, n - 1} {
			name := fmt.Sprintf("n%d-nan%d", n, at)
			times := make([]int64, n)
			units := make([]uint32, n)
			for i := range times {
				times[i] = clock - W/2 + int64(i)
				units[i] = 1
			}
			b := []byte(logValue(times, units, 0, 0, 0))
			binary.LittleEndian.PutUint64(b[26+8*at:], math.Float64bits(math.NaN()))
			items, _, err := s.resolve([]backend.Request{{Limit: z, Key: name, Cost: 1}})
			if err != nil {
				t.Fatal(err)
			}
			cmd, _ := s.manyCmd(ctx, []*pending{{ctx: ctx, items: items}}, nil)
			var got [2]string
			var expiry [2]time.Duration
			for db, fn := range []string{functionName, generic} {
				if err := conn.Do(ctx, "select", db).Err(); err != nil {
					t.Fatal(err)
				}
				if err := conn.Do(ctx, "set", items[0].key, b, "px", 600_000).Err(); err != nil {
					t.Fatal(err)
				}
				args := slices.Clone(cmd.Args())
				args[0], args[1] = "fcall", fn
				reply, err := conn.Do(ctx, args...).Result()
				if err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				got[db] = fmt.Sprintf("reply %x value %x", reply, conn.Get(ctx, items[0].key).Val())
				expiry[db] = conn.PTTL(ctx, items[0].key).Val()
			}
			if got[0] != got[1] || (expiry[0]-expiry[1]).Abs() > 100*time.Millisecond {
				t.Errorf("%s: logPlainOne %.200s... expiry %v, decideKeys %.200s... expiry %v", name, got[0], expiry[0], got[1], expiry[1])
			}
		}
	}
}
