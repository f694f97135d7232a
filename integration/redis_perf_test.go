package integration

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"testing"

	goredis "github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redistest"
)

// perfRedis starts a server of the test's own and returns its address
// and a client to it.
func perfRedis(t *testing.T) (string, *goredis.Client) {
	t.Helper()
	addr := redistest.Standalone(t, "").Addr
	c := goredis.NewClient(&goredis.Options{Addr: addr})
	t.Cleanup(func() { c.Close() })
	return addr, c
}

// scriptCalls is how many times Redis ran the decision script.
func scriptCalls(t *testing.T, c *goredis.Client) int {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, m := range regexp.MustCompile(`cmdstat_eval(?:sha)?:calls=(\d+)`).FindAllStringSubmatch(info, -1) {
		v, _ := strconv.Atoi(m[1])
		n += v
	}
	return n
}

// A flood on one key over its limit reaches Redis about once per retry
// time, not once per request; with local_cache off, every request does.
func TestRedisOverLimitCacheFlood(t *testing.T) {
	addr, c := perfRedis(t)
	for _, tt := range []struct {
		cache    string
		maxCalls int
		minCalls int
	}{
		{"on", 10, 6},
		{"off", 200, 200},
	} {
		t.Run("local_cache_"+tt.cache, func(t *testing.T) {
			tester := newTester(t, caddyfileServerWith(fmt.Sprintf(`	rate_limit {
		backend redis {
			address %s
			local_cache %s
		}
	}`, addr, tt.cache), `	rate_limit {
		zone perf_flood_`+tt.cache+` {
			by header X-Key
			rate 5/1h
		}
	}
	respond "ok"`), "caddyfile")
			before := scriptCalls(t, c)
			expectN(t, tester, 5, 200, "GET", "/", "X-Key", "flood")
			for range 195 {
				expect429(t, tester, 3000, 3600, "GET", "/", "X-Key", "flood")
			}
			calls := scriptCalls(t, c) - before
			if calls > tt.maxCalls || calls < tt.minCalls {
				t.Fatalf("local_cache %s: %d script calls for 200 requests, want %d to %d", tt.cache, calls, tt.minCalls, tt.maxCalls)
			}
			// Another key is not held back by the flooded one.
			expectN(t, tester, 5, 200, "GET", "/", "X-Key", "other")
		})
	}
}
