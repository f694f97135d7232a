package integration

import (
	"context"
	"fmt"
	"io"
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
	// The window algorithms' windows end on the hour: keep the three
	// requests and the check inside one.
	if left := time.Until(time.Now().Truncate(time.Hour).Add(time.Hour)); left < 5*time.Second {
		time.Sleep(left + 100*time.Millisecond)
	}
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
// requests at once: six are admitted and released 100 ms apart (the server
// stamps each release with its clock), two would wait longer and get 429
// at once.
func TestLeakyQueueDelaysOverHTTP(t *testing.T) {
	tester := newTester(t, caddyfileServer(`
	rate_limit {
		zone queue_http {
			key static
			rate 10/1s
			algorithm leaky_bucket
			max_delay 500ms
		}
	}
	respond "{time.now.unix_ms}"`), "caddyfile")

	type result struct {
		code     int
		took     time.Duration
		released int64 // server clock, ms
	}
	results := make([]result, 8)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			code, _, body := do(t, tester, "GET", "/")
			results[i] = result{code: code, took: time.Since(start)}
			if code == http.StatusOK {
				fmt.Sscan(body, &results[i].released)
			}
		}()
	}
	wg.Wait()
	var released []int64
	denied := 0
	for _, r := range results {
		switch r.code {
		case http.StatusOK:
			released = append(released, r.released)
		case http.StatusTooManyRequests:
			denied++
			if r.took > 400*time.Millisecond {
				t.Errorf("a denied request waited %v; it should be answered at once", r.took)
			}
		default:
			t.Fatalf("status %d", r.code)
		}
	}
	if len(released) != 6 || denied != 2 {
		t.Fatalf("%d passed, %d denied; want 6 and 2", len(released), denied)
	}
	sort.Slice(released, func(i, j int) bool { return released[i] < released[j] })
	for i := 1; i < len(released); i++ {
		if gap := released[i] - released[i-1]; gap < 90 {
			t.Errorf("releases %d and %d were %d ms apart; the queue spaces them 100 ms", i, i+1, gap)
		}
	}
	if span := released[5] - released[0]; span < 490 || span > 1500 {
		t.Fatalf("six releases spanned %d ms, want about 500", span)
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

// Clients that give up in the middle of the queue do not make it release
// two requests at once (five cancellations once released five requests
// in one millisecond). Release times are stamped by the server.
func TestLeakyQueueCancellationsNeverBurst(t *testing.T) {
	tester := newTester(t, caddyfileServer(`
	rate_limit {
		zone queue_cancel_burst {
			key static
			rate 5/1s
			algorithm leaky_bucket
			max_delay 3s
		}
	}
	respond "{time.now.unix_ms}"`), "caddyfile")

	var mu sync.Mutex
	var released []int64
	var wg sync.WaitGroup
	send := func(timeout time.Duration) {
		defer wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", httpBase+"/", nil)
		resp, err := tester.Client.Do(req)
		if err != nil {
			return // gave up while queued
		}
		defer resp.Body.Close()
		var at int64
		if b, _ := io.ReadAll(resp.Body); resp.StatusCode == http.StatusOK && len(b) > 0 {
			fmt.Sscan(string(b), &at)
			mu.Lock()
			released = append(released, at)
			mu.Unlock()
		}
	}
	// Three rounds: queue six, of which the middle four give up early;
	// then newcomers take what is left.
	for round := 0; round < 3; round++ {
		for i := 0; i < 6; i++ {
			wg.Add(1)
			timeout := 10 * time.Second
			if i > 0 && i < 5 {
				timeout = 100 * time.Millisecond
			}
			go send(timeout)
			time.Sleep(10 * time.Millisecond)
		}
		time.Sleep(150 * time.Millisecond)
	}
	wg.Wait()
	sort.Slice(released, func(i, j int) bool { return released[i] < released[j] })
	if len(released) < 4 {
		t.Fatalf("only %d requests released", len(released))
	}
	for i := 1; i < len(released); i++ {
		if gap := released[i] - released[i-1]; gap < 180 {
			t.Fatalf("requests released %d ms apart (all: %v); the queue spaces them 200 ms", gap, released)
		}
	}
}
