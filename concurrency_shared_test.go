package sluice

import (
	"context"
	"errors"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sluicehq/sluice/backend"
)

// fakeSlots is a backend's shared slots held in memory: limit per key,
// or unavailable while down is set.
type fakeSlots struct {
	mu    sync.Mutex
	limit int
	held  map[string]map[string]bool
	seq   int
	calls int
	down  bool
}

func newFakeSlots(limit int) *fakeSlots {
	return &fakeSlots{limit: limit, held: map[string]map[string]bool{}}
}

func (f *fakeSlots) Acquire(_ context.Context, key string) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if f.down {
		return "", &backend.UnavailableError{Err: errors.New("down"), RetryAfter: 2 * time.Second}
	}
	if len(f.held[key]) >= f.limit {
		return "", nil
	}
	if f.held[key] == nil {
		f.held[key] = map[string]bool{}
	}
	f.seq++
	id := strconv.Itoa(f.seq)
	f.held[key][id] = true
	return id, nil
}

func (f *fakeSlots) Release(_ context.Context, key, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.down {
		return &backend.UnavailableError{Err: errors.New("down")}
	}
	delete(f.held[key], id)
	return nil
}

func (f *fakeSlots) count(key string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.held[key])
}

func testShared(f *fakeSlots, queue time.Duration, queueMax int64) *sharedConc {
	return newSharedConc(f, queue, queueMax, prometheus.NewGauge(prometheus.GaugeOpts{Name: "t"}), nil)
}

// waitLine spins until key's line in c holds n requests.
func waitLine(t *testing.T, c *sharedConc, key string, n int) {
	t.Helper()
	for i := 0; ; i++ {
		c.mu.Lock()
		got := 0
		if l := c.lines[key]; l != nil {
			got = l.Len()
		}
		c.mu.Unlock()
		if got == n {
			return
		}
		if i > 1e7 {
			t.Fatalf("line of %d, want %d", got, n)
		}
		runtime.Gosched()
	}
}

// Requests in one instance's line get the slots in arrival order; a
// newcomer joins the line rather than asking the backend past it.
func TestSharedConcFIFO(t *testing.T) {
	f := newFakeSlots(1)
	c := testShared(f, time.Minute, 0)
	timer := &manualTimer{fire: make(chan time.Time)}
	first, err := c.take(context.Background(), "k", timer.newTimer)
	if err != nil || first == "" {
		t.Fatal(first, err)
	}
	const n = 5
	got := make(chan int, n)
	ids := make([]string, n)
	for i := range n {
		go func() {
			id, err := c.take(context.Background(), "k", timer.newTimer)
			if err != nil {
				t.Errorf("waiter %d: %v", i, err)
			}
			ids[i] = id
			got <- i
		}()
		waitLine(t, c, "k", i+1)
	}
	c.release("k", first)
	for want := range n {
		i := <-got
		if i != want {
			t.Fatalf("waiter %d got the slot, want %d (arrival order)", i, want)
		}
		c.release("k", ids[i])
	}
	if f.count("k") != 0 || len(c.lines) != 0 {
		t.Fatalf("%d slots held, %d lines left", f.count("k"), len(c.lines))
	}
}

// Beyond queue_max waiters, a request is refused at once; one that leaves
// makes room.
func TestSharedConcQueueMax(t *testing.T) {
	f := newFakeSlots(1)
	c := testShared(f, time.Minute, 2)
	timer := &manualTimer{fire: make(chan time.Time)}
	held, _ := c.take(context.Background(), "k", timer.newTimer)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 2)
	for i := range 2 {
		go func() {
			_, err := c.take(ctx, "k", timer.newTimer)
			done <- err
		}()
		waitLine(t, c, "k", i+1)
	}
	if _, err := c.take(context.Background(), "k", timer.newTimer); err != errQueueTimeout {
		t.Fatalf("a third waiter: %v, want refused at once", err)
	}
	cancel()
	for range 2 {
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("a waiter whose client left: %v", err)
		}
	}
	if len(c.lines) != 0 {
		t.Fatal("the line outlived its waiters")
	}
	c.release("k", held)
}

// The queue's timeout ends a wait; only the first in line asks the
// backend, however long the line.
func TestSharedConcTimeoutAndPolling(t *testing.T) {
	f := newFakeSlots(1)
	c := testShared(f, time.Minute, 0)
	fire := make(chan time.Time)
	timer := &manualTimer{fire: fire}
	held, _ := c.take(context.Background(), "k", timer.newTimer)
	done := make(chan error, 10)
	for i := range 10 {
		go func() {
			_, err := c.take(context.Background(), "k", timer.newTimer)
			done <- err
		}()
		waitLine(t, c, "k", i+1)
	}
	f.mu.Lock()
	f.calls = 0
	f.mu.Unlock()
	start := time.Now()
	for time.Since(start) < 300*time.Millisecond {
		runtime.Gosched()
	}
	f.mu.Lock()
	calls := f.calls
	f.mu.Unlock()
	// One asker polling at most every 50ms (after 2, 4, … ms): about 10 in 300ms.
	if calls > 15 {
		t.Fatalf("%d backend calls in 300ms from a line of 10, want one asker", calls)
	}
	for range 10 {
		fire <- time.Now()
	}
	for range 10 {
		if err := <-done; err != errQueueTimeout {
			t.Fatalf("a waiter at the queue's timeout: %v", err)
		}
	}
	c.release("k", held)
}

// While the backend is away: fail open admits without a slot, closed
// answers 503 with the breaker's Retry-After, local caps this instance.
func TestSharedConcFailPolicies(t *testing.T) {
	for _, tc := range []struct {
		fail      string
		wantCodes [2]int // a request, and another sent while it is in flight
	}{
		{FailOpen, [2]int{http.StatusOK, http.StatusOK}},
		{FailClosed, [2]int{http.StatusServiceUnavailable, 0}}, // the second is never sent
		{FailLocal, [2]int{http.StatusOK, http.StatusServiceUnavailable}},
	} {
		t.Run(tc.fail, func(t *testing.T) {
			u := newUnitHandler(t, concConfig, byZone(nil))
			l := u.h.zones[0].limits[0]
			f := newFakeSlots(1)
			f.down = true
			l.Fail = tc.fail
			l.shared = testShared(f, 0, 0)
			if tc.fail != FailLocal {
				l.conc = nil
			}
			var inner answer
			outer := u.serveNext(context.Background(), nil, caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error {
				inner = u.serve(context.Background(), nil)
				return nil
			}))
			if outer.code != tc.wantCodes[0] || inner.code != tc.wantCodes[1] {
				t.Fatalf("answers %d, %d; want %v", outer.code, inner.code, tc.wantCodes)
			}
			if tc.fail == FailClosed && outer.header.Get("Retry-After") != "2" {
				t.Fatalf("Retry-After %q, want the breaker's 2", outer.header.Get("Retry-After"))
			}
			if tc.fail == FailLocal && l.conc.size() != 0 {
				t.Fatal("the local slot was not freed")
			}
		})
	}
}

// Through the handler, slots shared by the backend cap requests in flight
// and are freed when the request ends.
func TestSharedConcHandler(t *testing.T) {
	u := newUnitHandler(t, concConfig, byZone(nil))
	l := u.h.zones[0].limits[0]
	f := newFakeSlots(1)
	l.shared, l.conc = testShared(f, 0, 0), nil
	var inner answer
	outer := u.serveNext(context.Background(), nil, caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error {
		if f.count("static") != 1 {
			t.Errorf("%d slots held in flight, want 1", f.count("static"))
		}
		inner = u.serve(context.Background(), nil)
		return nil
	}))
	if outer.code != http.StatusOK || inner.code != http.StatusServiceUnavailable {
		t.Fatalf("answers %d, %d; want 200, 503", outer.code, inner.code)
	}
	if n := len(f.held); n != 1 || f.count("static") != 0 {
		t.Fatalf("slots left held: %v", f.held)
	}
}

// On the memory backend, queue_max caps each key's waiters: beyond it a
// request is refused at once; another key has its own line.
func TestConcurrencyQueueMax(t *testing.T) {
	c := testLimiter(1, time.Minute)
	c.queueMax = 2
	held, _ := c.take("k")
	for i := range 2 {
		if k, w := c.take("k"); k == nil || w == nil {
			t.Fatalf("waiter %d refused below queue_max", i)
		}
	}
	if k, w := c.take("k"); k != nil || w != nil {
		t.Fatal("a third waiter joined a line of queue_max 2")
	}
	other, _ := c.take("other")
	if _, w := c.take("other"); w == nil {
		t.Fatal("another key's line is full too")
	}
	_, _ = held, other
}

func TestConcurrencySharedConfig(t *testing.T) {
	for cfg, want := range map[string]string{
		`"concurrency": 2, "queue": "1s", "queue_max": -1`:         "queue_max must be from 1",
		`"concurrency": 2, "queue_max": 3`:                         "queue_max would do nothing without queue",
		`"slot_ttl": "10s"`:                                        "slot_ttl would do nothing without concurrency",
		`"concurrency": 2, "slot_ttl": "100ms"`:                    "slot_ttl must be from 1s to 1h",
		`"concurrency": 2, "slot_ttl": "2h"`:                       "slot_ttl must be from 1s to 1h",
		`"concurrency": 2, "slot_ttl": "10s"`:                      "slot_ttl: on the memory backend",
		`"concurrency": 2, "queue": "1s", "queue_max": 2000000000`: "queue_max must be from 1",
	} {
		_, cleanup, err := provisionJSON([]byte(`{"rate_limits": {"cfg": {"key": "static", "max_events": 10, "window": "1m", `+cfg+`}}}`), nil)
		if cleanup != nil {
			cleanup()
		}
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", cfg, err, want)
		}
	}
}

// A limit of shared slots alone counts the requests its backend failed,
// under its fail policy.
func TestSharedConcFailuresCounted(t *testing.T) {
	u := newUnitHandler(t, `{"rate_limits": {"ccf": {"key": "static", "concurrency": 1, "fail": "open"}}}`, byZone(nil))
	l := u.h.zones[0].keyed[0]
	f := newFakeSlots(1)
	f.down = true
	l.shared, l.conc = testShared(f, 0, 0), nil
	l.failC = metrics.failures.WithLabelValues("ccf", "", "open")
	before := testutil.ToFloat64(l.failC)
	if a := u.serve(context.Background(), nil); a.code != http.StatusOK {
		t.Fatalf("fail open: %d", a.code)
	}
	if got := testutil.ToFloat64(l.failC) - before; got != 1 {
		t.Fatalf("%v failures counted, want 1", got)
	}
}

// Many keys waiting at once ask the backend about slotPollBudget times a
// second in all, not 20 times a second each.
func TestSharedConcPollBudget(t *testing.T) {
	f := newFakeSlots(1)
	c := testShared(f, time.Minute, 0)
	timer := &manualTimer{fire: make(chan time.Time)}
	const keys = 500
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for i := range keys {
		k := strconv.Itoa(i)
		if id, _ := c.take(ctx, k, timer.newTimer); id == "" {
			t.Fatal("the first request of a key got no slot")
		}
		wg.Go(func() { _, _ = c.take(ctx, k, timer.newTimer) })
	}
	for i := range keys {
		waitLine(t, c, strconv.Itoa(i), 1)
	}
	// Past the first doublings (2 … 32 ms), every head polls at its slowest.
	start := time.Now()
	for time.Since(start) < 300*time.Millisecond {
		runtime.Gosched()
	}
	f.mu.Lock()
	f.calls = 0
	f.mu.Unlock()
	start = time.Now()
	for time.Since(start) < time.Second {
		runtime.Gosched()
	}
	f.mu.Lock()
	calls := f.calls
	f.mu.Unlock()
	cancel()
	wg.Wait()
	// 500 keys at 50 ms would be 10,000 calls a second.
	if calls > 2*slotPollBudget {
		t.Fatalf("%d backend calls in a second from %d waiting keys, want about %d", calls, keys, slotPollBudget)
	}
	t.Logf("%d calls in a second from %d waiting keys", calls, keys)
}
