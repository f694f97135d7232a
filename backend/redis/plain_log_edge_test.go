package redis

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
)

// Logs of about 128 events (where a log is read whole or in parts), with
// a base second recent or far back, each format, decided with costs 0,
// 1 and 2 under limits around their size and a clock at a second's
// start, its end, or the instant an event leaves the window: decidePlain
// replies and stores what decideKeys does.
func TestPlainLogNear128(t *testing.T) {
	ctx := context.Background()
	c := goredis.NewClient(&goredis.Options{Addr: standalone(t), ContextTimeoutEnabled: true, PoolSize: 1})
	t.Cleanup(func() { c.Close() })
	conn := c.Conn()
	t.Cleanup(func() { conn.Close() })
	generic := genericScript(t, scriptSource)
	const window = int64(time.Hour)
	base := int64(1_764_460_800_000_000_000) // a second's start
	for _, shift := range []int64{0, 1} {    // the oldest event leaving the window now, or not yet
		for _, size := range []int{126, 127, 128, 129, 255, 256, 257} {
			for _, limit := range []int64{int64(size) - 1, int64(size), int64(size) + 1, 1000} {
				for _, far := range []bool{false, true} {
					for _, wide := range []byte{0, 2} {
						for _, clock := range []int64{base, base + 999_999_999, base + 1, base - 1} {
							for _, cost := range []int64{0, 1, 2} {
								name := fmt.Sprintf("shift=%d/size=%d/limit=%d/far=%v/wide=%d/clock=%d/cost=%d", shift, size, limit, far, wide, clock-base, cost)
								s, err := New(c, Options{KeyPrefix: uniquePrefix(t), Timeout: 10 * time.Second, NoCache: true,
									now: func() int64 { return clock }, ttlExtra: 3_600_000})
								if err != nil {
									t.Fatal(err)
								}
								z, err := s.Register(backend.LimitConfig{Name: "l", Algorithm: algorithms.NameSlidingWindow,
									Policy: algorithms.Policy{Limit: limit, Window: window}})
								if err != nil {
									t.Fatal(err)
								}
								items, _, err := s.resolve([]backend.Request{{Limit: z, Key: "k", Cost: cost}})
								if err != nil {
									t.Fatal(err)
								}
								key := items[0].key
								times := make([]int64, size)
								units := make([]uint32, size)
								for i := range times {
									times[i] = clock - window + shift + int64(i)*(window/int64(size))
									units[i] = 1
								}
								if far {
									times[0] = clock - 60*24*int64(time.Hour)
								}
								slices.Sort(times)
								value := logValue(times, units, wide, 0, 0)
								cmd, _ := s.manyCmd(ctx, []*pending{{ctx: ctx, items: items}}, nil)
								var got [2]any
								var stored [2]string
								var errs [2]string
								for db, src := range []string{scriptSource, generic} {
									args := slices.Clone(cmd.Args())
									args[0], args[1] = "eval", src
									if err := conn.Do(ctx, "select", db).Err(); err != nil {
										t.Fatal(err)
									}
									if err := conn.Set(ctx, key, value, time.Hour).Err(); err != nil {
										t.Fatal(err)
									}
									call := conn.Do(ctx, args...)
									got[db] = call.Val()
									if call.Err() != nil {
										errs[db] = call.Err().Error()
									}
									stored[db] = conn.Get(ctx, key).Val()
									conn.Del(ctx, key)
								}
								s.Close()
								if fmt.Sprint(got[0]) != fmt.Sprint(got[1]) || errs[0] != errs[1] {
									t.Fatalf("%s: decidePlain replied %v %q, decideKeys %v %q", name, got[0], errs[0], got[1], errs[1])
								}
								if stored[0] != stored[1] {
									t.Fatalf("%s: decidePlain stored %x, decideKeys %x", name, stored[0], stored[1])
								}
							}
						}
					}
				}
			}
		}
	}
}
