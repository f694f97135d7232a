package integration

import (
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// A reload that lowers max_keys under a flood of new keys: the inserts and
// the trim to the new cap contend for the shards, and a shard that is busy
// may be the one holding the keys with room. Fewer keys are denying than
// the new cap holds, so none of them may be evicted. Before the fix, 4 of
// these 9 rounds evicted 3 to 265 denying keys, and one let the victim
// through.
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
