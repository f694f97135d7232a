package integration

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backend"
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
// requests at once: each admitted one is given a slot at least 100 ms after
// the one before and at most 500 ms away, and is answered no earlier than
// it. The queue holds six: when the eight are decided within 100 ms, two
// are denied. (Slots are the store's; answers are checked against them
// only as lower bounds, which a loaded machine cannot break.)
func TestLeakyQueueDelaysOverHTTP(t *testing.T) {
	zone := freshZone("queue_http")
	tester := newTester(t, jsonServer(`{"handler": "rate_limit", "backend": {"name": "sluice_test_slots"}, "rate_limits": {
		"`+zone+`": {"key": "static", "window": "1s", "max_events": 10, "algorithm": "leaky_bucket", "max_delay": "500ms"}
	}}, `+okHandler, ""), "json")

	codes := make([]int, 8)
	answered := make([]int64, 8)
	var wg sync.WaitGroup
	for i := range codes {
		wg.Go(func() {
			codes[i], _, _ = do(t, tester, "GET", "/")
			answered[i] = backend.SystemNow()
		})
	}
	wg.Wait()
	var passed []int64
	for i, code := range codes {
		switch code {
		case http.StatusOK:
			passed = append(passed, answered[i])
		case http.StatusTooManyRequests:
		default:
			t.Fatalf("status %d", code)
		}
	}
	z := slots.of(zone)
	if len(z.granted) != len(passed) || len(z.decided) != len(codes) {
		t.Fatalf("%d passed, the store admitted %d of %d decided", len(passed), len(z.granted), len(z.decided))
	}
	spread := time.Duration(slices.Max(z.decided) - slices.Min(z.decided))
	switch {
	case len(passed) < 6:
		t.Fatalf("%d passed; the queue holds six", len(passed))
	case spread < 100*time.Millisecond && len(passed) != 6:
		t.Fatalf("%d passed of eight decided within %v; want six", len(passed), spread)
	}
	for _, d := range z.delays {
		if d < 0 || d > 500*time.Millisecond {
			t.Fatalf("a request was given a delay of %v, beyond max_delay (delays: %v)", d, z.delays)
		}
	}
	released := z.released()
	assertSpaced(t, released, 100*time.Millisecond)
	assertNotBefore(t, passed, released)
}

// A client that gives up while queued frees its slot for the next one,
// when it was the last slot given. Slots are 2 s apart, so that the
// departure is seen long before the abandoned slot comes.
func TestLeakyQueueCancelFreesSlot(t *testing.T) {
	zone := freshZone("queue_cancel")
	tester := newTester(t, jsonServer(`{"handler": "rate_limit", "backend": {"name": "sluice_test_slots"}, "rate_limits": {
		"`+zone+`": {"key": "static", "window": "2s", "max_events": 1, "algorithm": "leaky_bucket", "max_delay": "10s"}
	}}, `+okHandler, ""), "json")

	expectN(t, tester, 1, http.StatusOK, "GET", "/") // slot now; the next free slot is 2 s later
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	gaveUp := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, "GET", httpBase+"/", nil)
		resp, err := tester.Client.Do(req)
		if err == nil {
			resp.Body.Close()
			err = fmt.Errorf("the queued request was answered (%d)", resp.StatusCode)
		}
		gaveUp <- err
	}()
	waitFor(t, "the second request to be queued", func() bool { return len(slots.of(zone).granted) == 2 })
	cancel()
	if err := <-gaveUp; !errors.Is(err, context.Canceled) {
		t.Fatalf("the client giving up got %v", err)
	}
	waitFor(t, "the abandoned slot to be given back", func() bool { return len(slots.of(zone).refunded) == 1 })

	expectN(t, tester, 1, http.StatusOK, "GET", "/")
	answered := backend.SystemNow()
	z := slots.of(zone)
	freed := z.refunded[0]
	if z.refunded[0] != z.granted[1] {
		t.Fatalf("given back slot %d, the abandoned one was %d", z.refunded[0], z.granted[1])
	}
	// Kept, the abandoned slot would have put this one 2 s later.
	if want := max(freed, z.at[2]); z.granted[2] != want {
		t.Fatalf("the next request got slot %+dms from the freed one, want %+dms", (z.granted[2]-freed)/1e6, (want-freed)/1e6)
	}
	assertNotBefore(t, []int64{answered}, z.granted[2:])
}

// Clients that give up in the middle of the queue do not make it release
// two requests at once: five cancellations once released five requests in
// one millisecond. The slots the store gave the requests that were let
// through are checked, not when the server's goroutines ran.
func TestLeakyQueueCancellationsNeverBurst(t *testing.T) {
	zone := freshZone("queue_cancel_burst")
	tester := newTester(t, jsonServer(`{"handler": "rate_limit", "backend": {"name": "sluice_test_slots"}, "rate_limits": {
		"`+zone+`": {"key": "static", "window": "1s", "max_events": 5, "algorithm": "leaky_bucket", "max_delay": "3s"}
	}}, `+okHandler, ""), "json")

	var mu sync.Mutex
	var answered []int64
	var wg sync.WaitGroup
	send := func(timeout time.Duration) {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", httpBase+"/", nil)
		resp, err := tester.Client.Do(req)
		if err != nil {
			return // gave up while queued
		}
		defer resp.Body.Close()
		if _, err := io.ReadAll(resp.Body); err == nil && resp.StatusCode == http.StatusOK {
			mu.Lock()
			answered = append(answered, backend.SystemNow())
			mu.Unlock()
		}
	}
	// Three rounds: queue six, of which the middle four give up early;
	// then newcomers take what is left. The sleeps only spread the
	// arrivals: any delay the machine adds keeps the same invariant.
	for round := 0; round < 3; round++ {
		for i := 0; i < 6; i++ {
			timeout := 10 * time.Second
			if i > 0 && i < 5 {
				timeout = 100 * time.Millisecond
			}
			wg.Go(func() { send(timeout) })
			time.Sleep(10 * time.Millisecond)
		}
		time.Sleep(150 * time.Millisecond)
	}
	wg.Wait()
	released := slots.of(zone).released()
	if len(released) < 4 {
		t.Fatalf("only %d requests released", len(released))
	}
	assertSpaced(t, released, 200*time.Millisecond)
	assertNotBefore(t, answered, released)
}
