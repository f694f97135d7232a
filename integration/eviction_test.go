package integration

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// A client blocked by a zone stays blocked while 100 × max_keys junk keys
// pour through it: eviction at the cap takes the keys with quota left, never
// the one that is denying. For every algorithm, the leaky bucket both as a
// meter and as a queue. Nine in ten keys of the table are spent, so that a
// sample of keys is often all denying and eviction must look further.
func TestEvictionNeverUnblocks(t *testing.T) {
	const maxKeys = 1000
	left := untilMidnightUTC(3 * time.Minute) // the day-long fixed windows
	dayEnd := int(left / time.Second)
	tests := []struct {
		name, alg, rate string
		cost            string // of the victim's and the spent keys' requests
		admits          int    // requests the victim gets before 429
		retry           [2]int // Retry-After bounds right after the victim is blocked
	}{
		{"sliding_window", "sliding_window", `"window": "1h", "max_events": 5`, "1", 5, [2]int{3599, 3600}},
		{"sliding_window_counter", "sliding_window_counter", `"window": "24h", "max_events": 5`, "1", 5, [2]int{dayEnd - 2, dayEnd + 1}},
		{"fixed_window", "fixed_window", `"window": "24h", "max_events": 5`, "1", 5, [2]int{dayEnd - 2, dayEnd + 1}},
		{"token_bucket", "token_bucket", `"window": "1h", "max_events": 5`, "1", 5, [2]int{719, 720}},
		{"gcra", "gcra", `"window": "1h", "max_events": 5`, "1", 5, [2]int{719, 720}},
		{"leaky_bucket", "leaky_bucket", `"window": "1h", "max_events": 5`, "1", 5, [2]int{719, 720}},
		// One slot every 12 minutes, waiting at most 12 minutes: the queue holds
		// two units. Junk keys take one and still have room; the victim
		// and the spent keys take both at once, so that nobody waits.
		{"leaky_queue", "leaky_bucket", `"window": "1h", "max_events": 5, "max_delay": "12m", "cost": "{http.request.header.X-Cost}"`, "2", 1, [2]int{719, 720}},
	}
	zones := make([]string, len(tests))
	for i, tt := range tests {
		zones[i] = fmt.Sprintf(`"evict_%s": {"match": [{"path": ["/victim/%s", "/flood"]}], "key": "{http.request.header.X-Key}", "algorithm": %q, "max_keys": %d, %s}`,
			tt.name, tt.name, tt.alg, maxKeys, tt.rate)
	}
	tester := newTester(t, jsonServer(`{"handler": "rate_limit", "rate_limits": {`+strings.Join(zones, ",")+`}}, `+okHandler, ""), "json")

	for _, tt := range tests {
		expectN(t, tester, tt.admits, http.StatusOK, "GET", "/victim/"+tt.name, "X-Key", "victim", "X-Cost", tt.cost)
		expect429(t, tester, tt.retry[0], tt.retry[1], "GET", "/victim/"+tt.name, "X-Key", "victim", "X-Cost", "1")
	}
	began := time.Now()
	for _, tt := range tests {
		flood(t, "/victim/"+tt.name, "spent-", 9*maxKeys/10, tt.admits, tt.cost, 4)
	}
	flooded := time.Now()
	flood(t, "/flood", "junk-", 100*maxKeys, 1, "1", 8)
	took := int(time.Since(began)/time.Second) + 1
	t.Logf("100,000 junk keys through %d zones in %v", len(tests), time.Since(flooded))

	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			expect429(t, tester, tt.retry[0]-took-1, tt.retry[1], "GET", "/victim/"+tt.name, "X-Key", "victim", "X-Cost", "1")
		})
	}

	metrics := adminRequest(t, "GET", "/metrics", "", "")
	for _, tt := range tests {
		zone := "evict_" + tt.name
		if n := metricValue(metrics, "caddy_rate_limit_keys_total", zone); n > maxKeys {
			t.Errorf("%s tracks %v keys, over max_keys %d", zone, n, maxKeys)
		}
		if n := metricValue(metrics, "caddy_rate_limit_evictions_total", zone); n < 90*maxKeys {
			t.Errorf("%s: %v evictions counted for a flood of %d keys", zone, n, 100*maxKeys)
		}
		if n := metricValue(metrics, "caddy_rate_limit_denying_evictions_total", zone); n != 0 {
			t.Errorf("%s: %v denying keys evicted; junk keys with quota left were there to take", zone, n)
		}
	}
}

// A reload that lowers max_keys under a flood of new keys: the inserts and
// the trim to the new cap contend for the shards, and a shard that is busy
// may be the one holding the keys with room. Fewer keys are denying than
// the new cap holds, so none of them may be evicted. The contention is
// rare, hence 9 rounds: a trim that takes whatever shard is free evicts
// denying keys in some of them (3 to 265 in 4 of 9), and can let the
// victim through.
func TestLoweredCapUnderFloodNeverUnblocks(t *testing.T) {
	cfg := func(zone, alg string, maxKeys int) string {
		return jsonServer(fmt.Sprintf(`{"handler": "rate_limit", "rate_limits": {
			%q: {"key": "{http.request.header.X-Key}", "max_events": 5, "window": "1h", "algorithm": %q,
				"max_keys": %d, "cost": "{http.request.header.X-Cost}"}
		}}, `+okHandler, zone, alg, maxKeys), "")
	}
	tester := newTester(t, cfg("atk_lower_init", "gcra", 1000), "json")
	for _, alg := range []string{"gcra", "sliding_window", "token_bucket"} {
		for round := 0; round < 3; round++ {
			zone := fmt.Sprintf("atk_lower_%s_%d", alg, round)
			// 200,000 keys spread the table over 64 shards; 400 leaves
			// each a handful, most of them denying.
			adminRequest(t, "POST", "/load", "application/json", cfg(zone, alg, 200_000))
			expectN(t, tester, 1, http.StatusOK, "GET", "/", "X-Key", "victim", "X-Cost", "5")
			expect429(t, tester, 1, 3600, "GET", "/", "X-Key", "victim", "X-Cost", "1")
			flood(t, "/", "spent-", 300, 1, "5", 8)
			flood(t, "/", "pre-", 20_000, 1, "1", 16)
			stop := make(chan struct{})
			var wg sync.WaitGroup
			var sent atomic.Int64
			for w := 0; w < 64; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}, Timeout: 10 * time.Second}
					for {
						select {
						case <-stop:
							return
						default:
						}
						req, _ := http.NewRequest("GET", httpBase+"/", nil)
						req.Header.Set("X-Key", fmt.Sprint("junk-", sent.Add(1)))
						req.Header.Set("X-Cost", "1")
						if resp, err := client.Do(req); err == nil {
							_, _ = io.Copy(io.Discard, resp.Body)
							resp.Body.Close()
						}
					}
				}()
			}
			time.Sleep(300 * time.Millisecond)
			adminRequest(t, "POST", "/load", "application/json", cfg(zone, alg, 400))
			time.Sleep(time.Second)
			close(stop)
			wg.Wait()
			metrics := adminRequest(t, "GET", "/metrics", "", "")
			if n := metricValue(metrics, "caddy_rate_limit_denying_evictions_total", zone); n != 0 {
				t.Errorf("%s: %v denying keys evicted with 301 denying under a cap of 400 (%d junk requests)", zone, n, sent.Load())
			}
			if code, _, _ := do(t, tester, "GET", "/", "X-Key", "victim", "X-Cost", "1"); code != http.StatusTooManyRequests {
				t.Errorf("%s: the victim got %d after the cap was lowered under a flood", zone, code)
			}
		}
	}
}
