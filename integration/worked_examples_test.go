package integration

import (
	"strconv"
	"testing"
	"time"
)

// The worked examples' numbers as a client sees them through Caddy: how
// many of a burst pass, and the Retry-After and RateLimit fields of the
// first denial.
func TestWorkedExamplesOverHTTP(t *testing.T) {
	tests := []struct {
		name, opts string
		burst      int    // requests sent at once
		pass       int    // how many pass (more only by refill)
		perSecond  int    // refill per second, to bound the extra passes
		retryAfter int    // of the first denial
		policy     string // RateLimit-Policy of the first denial
	}{
		// Capacity 10 refilled at 5 a second: 10 of 12 pass, the 11th
		// waits 0.2 s (sent as 1).
		{"tb_10_at_5", "rate 5/1s\n\t\t\tburst 10\n\t\t\talgorithm token_bucket", 12, 10, 5, 1, `"seeds_we_tb_10_at_5";q=10;w=2`},
		// Capacity 20 at 2 a second: 20 of 25, the next waits 0.5 s.
		{"tb_20_at_2", "rate 2/1s\n\t\t\tburst 20\n\t\t\talgorithm token_bucket", 25, 20, 2, 1, `"seeds_we_tb_20_at_2";q=20;w=10`},
		// Capacity 50 at 10 a second: 50 of 60.
		{"tb_50_at_10", "rate 10/1s\n\t\t\tburst 50\n\t\t\talgorithm token_bucket", 60, 50, 10, 1, `"seeds_we_tb_50_at_10";q=50;w=5`},
		// GCRA 10 a minute, burst 3: T = 6 s, τ = 12 s; the 4th waits
		// TAT − τ − now = 18 − 12 − 0 = 6 s.
		{"gcra_10m_b3", "rate 10/1m\n\t\t\tburst 3\n\t\t\talgorithm gcra", 4, 3, 0, 6, `"seeds_we_gcra_10m_b3";q=3;w=18`},
		// GCRA 20 a minute, burst 4: T = 3 s, τ = 9 s; the 5th and 6th
		// wait 3 s.
		{"gcra_20m_b4", "rate 20/1m\n\t\t\tburst 4\n\t\t\talgorithm gcra", 6, 4, 0, 3, `"seeds_we_gcra_20m_b4";q=4;w=12`},
		// GCRA 30 a minute, burst 5: T = 2 s, τ = 8 s.
		{"gcra_30m_b5", "rate 30/1m\n\t\t\tburst 5\n\t\t\talgorithm gcra", 6, 5, 0, 2, `"seeds_we_gcra_30m_b5";q=5;w=10`},
		// The exact log, 100 a minute: the boundary attack's second 100
		// are all refused, for a minute.
		{"log_100m", "rate 100/1m", 200, 100, 0, 60, `"seeds_we_log_100m";q=100;w=60`},
	}
	zones := ""
	for _, tt := range tests {
		zones += "\n\t\tzone seeds_we_" + tt.name + " {\n\t\t\tmatch {\n\t\t\t\tpath /" + tt.name + "\n\t\t\t}\n\t\t\tkey static\n\t\t\t" + tt.opts + "\n\t\t}"
	}
	tester := newTester(t, caddyfileServer("\trate_limit {\n\t\theaders draft"+zones+"\n\t}\n\trespond \"ok\""), "caddyfile")
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			start := time.Now()
			passed, denials := 0, 0
			var first response
			for range tt.burst {
				r := fetch(t, tester, "GET", "/"+tt.name)
				switch r.code {
				case 200:
					passed++
				case 429:
					if denials == 0 {
						first = r
					}
					denials++
				default:
					t.Fatalf("status %d", r.code)
				}
			}
			extra := float64(tt.perSecond)*time.Since(start).Seconds() + 1
			if passed < tt.pass || float64(passed) > float64(tt.pass)+extra || denials == 0 {
				t.Fatalf("%d of %d passed, want %d (plus the refill)", passed, tt.burst, tt.pass)
			}
			// A whole second of wait may have passed by the first denial of
			// a minute-long one.
			if got := first.header.Get("Retry-After"); got != strconv.Itoa(tt.retryAfter) && (tt.retryAfter < 6 || got != strconv.Itoa(tt.retryAfter-1)) {
				t.Fatalf("first denial: Retry-After %q, want %d", got, tt.retryAfter)
			}
			if got := first.header.Get("RateLimit-Policy"); got != tt.policy {
				t.Fatalf("first denial: RateLimit-Policy %q, want %q", got, tt.policy)
			}
		})
	}
}
