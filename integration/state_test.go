package integration

import (
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// untilMidnightUTC waits out the end of the UTC day when it is less than
// margin away, so that a test of day-long fixed windows runs inside one
// window, and returns the seconds left in the day.
func untilMidnightUTC(margin time.Duration) time.Duration {
	now := time.Now().UTC()
	left := now.Truncate(24 * time.Hour).Add(24 * time.Hour).Sub(now)
	if left < margin {
		time.Sleep(left + 100*time.Millisecond)
		left = 24*time.Hour - 100*time.Millisecond
	}
	return left
}

// flood sends perKey requests of the given cost (header X-Cost) for each of
// n keys (prefix + index, header X-Key), from workers goroutines over
// kept-alive connections; every request must pass.
func flood(t *testing.T, path, prefix string, n, perKey int, cost string, workers int) {
	t.Helper()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: workers}, Timeout: 10 * time.Second}
	var next atomic.Int64
	var failed atomic.Value
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1)
				if i > int64(n) {
					return
				}
				for j := 0; j < perKey; j++ {
					req, _ := http.NewRequest("GET", httpBase+path, nil)
					req.Header.Set("X-Key", fmt.Sprint(prefix, i))
					req.Header.Set("X-Cost", cost)
					resp, err := client.Do(req)
					if err != nil {
						failed.Store(err.Error())
						return
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != http.StatusOK {
						failed.Store(fmt.Sprintf("%s %s%d #%d: status %d", path, prefix, i, j+1, resp.StatusCode))
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	if msg := failed.Load(); msg != nil {
		t.Fatal(msg)
	}
}

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

// metricValue reads the value of name{scope="",zone=zone} from a /metrics
// page; -1 when it is absent.
func metricValue(page, name, zone string) float64 {
	prefix := fmt.Sprintf(`%s{scope="",zone=%q} `, name, zone)
	for _, line := range strings.Split(page, "\n") {
		if v, ok := strings.CutPrefix(line, prefix); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err == nil {
				return f
			}
		}
	}
	return -1
}

// Twenty reloads that switch the algorithm under steady traffic: usage is
// carried from each kind of state to the next, so one client gets the
// limit of 100 in all, not 100 per reload.
func TestReloadSwitchingAlgorithmKeepsUsage(t *testing.T) {
	untilMidnightUTC(2 * time.Minute) // the day-long fixed windows
	cfg := func(alg string) string {
		return jsonServer(`{"handler": "rate_limit", "rate_limits": {
			"reload_kinds": {"key": "static", "window": "24h", "max_events": 100, "algorithm": "`+alg+`"}
		}}, `+okHandler, "")
	}
	newTester(t, cfg(switchingAlgs[0]), "json")
	reloadsKeepTheLimit(t, "application/json", cfg, switchingAlgs)
}
