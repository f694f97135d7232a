package integration

import (
	"fmt"
	"strconv"
	"testing"
)

// A sliding_window whose cost a placeholder sets loads on the redis backend
// as on the memory one, and both answer a client that chooses its costs
// alike: the retry time of a denied cost is when enough units leave.
func TestRedisSlidingWindowVariableCost(t *testing.T) {
	addr, _ := perfRedis(t)
	for _, b := range []struct{ name, block string }{
		{"memory", ""},
		{"redis", fmt.Sprintf("backend redis {\n\t\t\taddress %s\n\t\t}", addr)},
	} {
		t.Run(b.name, func(t *testing.T) {
			tester := newTester(t, caddyfileServer(`	rate_limit {
		`+b.block+`
		zone lease_varcost_`+b.name+` {
			by header X-Key
			rate 1000/1h
			algorithm sliding_window
			cost {http.request.header.X-Cost}
		}
	}
	respond "ok"`), "caddyfile")
			cost := func(n int) []string { return []string{"X-Key", "c", "X-Cost", strconv.Itoa(n)} }
			// Many tiny events, then costs that need nearly all of them.
			for range 300 {
				expectN(t, tester, 1, 200, "GET", "/", cost(1)...)
			}
			expectN(t, tester, 1, 200, "GET", "/", cost(650)...)
			for c := 700; c < 1000; c += 37 {
				expect429(t, tester, 3590, 3600, "GET", "/", cost(c)...)
			}
			if code, ra, _ := do(t, tester, "GET", "/", cost(1001)...); code != 429 || ra != "" {
				t.Fatalf("a cost above the limit: %d, Retry-After %q; want 429 without one (no wait helps)", code, ra)
			}
			expectN(t, tester, 1, 200, "GET", "/", cost(50)...)
			expect429(t, tester, 3590, 3600, "GET", "/", cost(1)...)
		})
	}
}
