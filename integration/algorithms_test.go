package integration

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"sync"
	"testing"
	"time"
)

// Every algorithm through a real Caddy: 3 per hour for one key, then 429
// with the Retry-After the algorithm defines.
func TestEachAlgorithmOverHTTP(t *testing.T) {
	untilHourEnds := func() (int, int) {
		now := time.Now()
		left := now.Truncate(time.Hour).Add(time.Hour).Sub(now)
		secs := int((left + time.Second - 1) / time.Second)
		return secs - 2, secs + 1
	}
	tests := []struct {
		alg    string
		retry  func() (int, int)
		remark string
	}{
		{"sliding_window", func() (int, int) { return 3599, 3600 }, "the oldest event leaves in an hour"},
		{"sliding_window_counter", untilHourEnds, "full current window: fits once the next window starts"},
		{"fixed_window", untilHourEnds, "the hour window ends"},
		{"token_bucket", func() (int, int) { return 1199, 1200 }, "one token per 20 minutes"},
		{"gcra", func() (int, int) { return 1199, 1200 }, "T = 20 minutes"},
		{"leaky_bucket", func() (int, int) { return 1199, 1200 }, "one unit leaks per 20 minutes"},
	}
	zones := ""
	for i, tt := range tests {
		if i > 0 {
			zones += ","
		}
		zones += fmt.Sprintf(`"http_%[1]s": {"match": [{"path": ["/%[1]s"]}], "key": "static", "window": "1h", "max_events": 3, "algorithm": %[1]q}`, tt.alg)
	}
	tester := newTester(t, jsonServer(`{"handler": "rate_limit", "rate_limits": {`+zones+`}}, `+okHandler, ""), "json")
	for _, tt := range tests {
		t.Run(tt.alg, func(t *testing.T) {
			path := "/" + tt.alg
			expectN(t, tester, 3, http.StatusOK, "GET", path)
			lo, hi := tt.retry()
			expect429(t, tester, max(lo, 1), hi, "GET", path)
		})
	}
}

// The leaky bucket as a queue: 10 per second, waiting up to 500 ms. Eight
// requests at once: six are admitted and released about 100 ms apart, two
// would wait longer and get 429 at once.
func TestLeakyQueueDelaysOverHTTP(t *testing.T) {
	tester := newTester(t, caddyfileServer(`	rate_limit {
		zone queue_http {
			key static
			rate 10/1s
			algorithm leaky_bucket
			max_delay 500ms
		}
	}
	respond "ok"`), "caddyfile")

	type result struct {
		code int
		took time.Duration
	}
	results := make([]result, 8)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			code, _, _ := do(t, tester, "GET", "/")
			results[i] = result{code, time.Since(start)}
		}()
	}
	wg.Wait()
	var passed []time.Duration
	denied := 0
	for _, r := range results {
		switch r.code {
		case http.StatusOK:
			passed = append(passed, r.took)
		case http.StatusTooManyRequests:
			denied++
			if r.took > 300*time.Millisecond {
				t.Errorf("a denied request waited %v; it should be answered at once", r.took)
			}
		default:
			t.Fatalf("status %d", r.code)
		}
	}
	if len(passed) != 6 || denied != 2 {
		t.Fatalf("%d passed, %d denied; want 6 and 2", len(passed), denied)
	}
	sort.Slice(passed, func(i, j int) bool { return passed[i] < passed[j] })
	// Released on a 100 ms schedule: the last one about 500 ms in.
	if last := passed[5]; last < 450*time.Millisecond || last > 2*time.Second {
		t.Fatalf("last queued request answered after %v, want about 500ms", last)
	}
	for i := 1; i < len(passed); i++ {
		if gap := passed[i] - passed[i-1]; gap < 50*time.Millisecond {
			t.Errorf("requests %d and %d released %v apart; the queue spaces them 100ms", i, i+1, gap)
		}
	}
}

// A client that gives up while queued frees its slot for the next one.
func TestLeakyQueueCancelFreesSlot(t *testing.T) {
	tester := newTester(t, jsonServer(`{"handler": "rate_limit", "rate_limits": {
		"queue_cancel": {"key": "static", "window": "1s", "max_events": 2, "algorithm": "leaky_bucket", "max_delay": "3s"}
	}}, `+okHandler, ""), "json")

	expectN(t, tester, 1, http.StatusOK, "GET", "/") // slot now; next free slot in 500 ms
	// The second request's slot is 500 ms away; its client gives up at 100 ms.
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	req, _ := http.NewRequestWithContext(ctx, "GET", httpBase+"/", nil)
	if resp, err := tester.Client.Do(req); err == nil {
		resp.Body.Close()
		t.Fatalf("the queued request was answered (%d) before its slot", resp.StatusCode)
	}
	cancel()
	time.Sleep(50 * time.Millisecond) // let the handler see the cancellation
	// Had the abandoned slot been kept, this request would wait ~850 ms.
	began := time.Now()
	expectN(t, tester, 1, http.StatusOK, "GET", "/")
	if took := time.Since(began); took > 600*time.Millisecond {
		t.Fatalf("next request waited %v: the abandoned slot was not freed", took)
	}
}
