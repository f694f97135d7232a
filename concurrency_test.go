package sluice

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/prometheus/client_golang/prometheus"
)

// manualTimer is a queue timer the test fires.
type manualTimer struct{ fire chan time.Time }

func (m *manualTimer) newTimer(time.Duration) (<-chan time.Time, func() bool) {
	return m.fire, func() bool { return true }
}

func testLimiter(n int64, queue time.Duration) *concLimiter {
	return newConcLimiter(n, queue, prometheus.NewGauge(prometheus.GaugeOpts{Name: "t"}))
}

// Waiters get the freed slots in the order they arrived, and a key with
// nothing in flight is forgotten at once.
func TestConcurrencyFIFO(t *testing.T) {
	c := testLimiter(1, time.Minute)
	first, w := c.take("k")
	if w != nil || first == nil {
		t.Fatal("the first request must get the free slot")
	}
	timer := &manualTimer{fire: make(chan time.Time)}
	const n = 5
	got := make(chan int, n)
	for i := range n {
		k, w := c.take("k")
		if w == nil {
			t.Fatalf("request %d got a slot while the only one is taken", i)
		}
		go func() {
			if err := c.await(context.Background(), k, w, timer.newTimer); err != nil {
				t.Errorf("waiter %d: %v", i, err)
			}
			got <- i
		}()
	}
	c.release(first)
	for want := range n {
		i := <-got
		if i != want {
			t.Fatalf("waiter %d got the slot, want %d (arrival order)", i, want)
		}
		c.release(first) // every entry of one key is the same
	}
	if c.size() != 0 {
		t.Fatalf("%d keys tracked with nothing in flight, want 0", c.size())
	}
}

// A waiter whose client leaves gives up its place; the next in line gets
// the slot.
func TestConcurrencyWaiterGivesUp(t *testing.T) {
	c := testLimiter(1, time.Minute)
	held, _ := c.take("k")
	timer := &manualTimer{fire: make(chan time.Time)}
	ctx, cancel := context.WithCancel(context.Background())
	k1, w1 := c.take("k")
	k2, w2 := c.take("k")
	cancel()
	if err := c.await(ctx, k1, w1, timer.newTimer); !errors.Is(err, context.Canceled) {
		t.Fatalf("a cancelled waiter got %v, want context.Canceled", err)
	}
	done := make(chan error)
	go func() { done <- c.await(context.Background(), k2, w2, timer.newTimer) }()
	c.release(held)
	if err := <-done; err != nil {
		t.Fatalf("the second waiter: %v", err)
	}
	c.release(k2)
	if c.size() != 0 {
		t.Fatalf("%d keys left", c.size())
	}
}

// A waiter whose time runs out leaves the line holding nothing; without a
// queue, a request beyond the cap is refused at once.
func TestConcurrencyQueueTimeout(t *testing.T) {
	c := testLimiter(1, time.Second)
	held, _ := c.take("k")
	timer := &manualTimer{fire: make(chan time.Time, 1)}
	k, w := c.take("k")
	timer.fire <- time.Time{}
	if err := c.await(context.Background(), k, w, timer.newTimer); err != errQueueTimeout {
		t.Fatalf("got %v, want the queue timeout", err)
	}
	c.release(held)
	if c.size() != 0 {
		t.Fatalf("%d keys left after the only slot was freed", c.size())
	}
	none := testLimiter(2, 0)
	a, _ := none.take("x")
	b, _ := none.take("x")
	if k, w := none.take("x"); k != nil || w != nil {
		t.Fatal("a third request got past a cap of 2 without a queue")
	}
	none.release(a)
	none.release(b)
	if none.size() != 0 {
		t.Fatal("key kept")
	}
}

// A flood of distinct keys holds memory only for what is in flight.
func TestConcurrencyKeysDropped(t *testing.T) {
	c := testLimiter(1, 0)
	for i := range 10000 {
		k, _ := c.take(strings.Repeat("k", i%50) + string(rune(i)))
		c.release(k)
	}
	if c.size() != 0 {
		t.Fatalf("%d keys kept", c.size())
	}
}

const concConfig = `{"rate_limits": {
	"cc": {"key": "static", "max_events": 100, "window": "1m", "concurrency": 1}}}`

// A request the cap refuses gets 503 with Retry-After, its rate unit
// goes back, and the slot is freed whether next returns, errs or panics.
func TestConcurrencyHandler(t *testing.T) {
	u := newUnitHandler(t, concConfig, byZone(nil))
	c := u.h.zones[0].limits[0].conc
	serve := func(next caddyhttp.Handler) (int, http.Header, error) {
		r := httptest.NewRequest(http.MethodGet, "http://example.com/", nil)
		w := httptest.NewRecorder()
		r = caddyhttp.PrepareRequest(r, caddy.NewReplacer(), w, &caddyhttp.Server{})
		err := u.h.ServeHTTP(w, r, next)
		if he, ok := errors.AsType[caddyhttp.HandlerError](err); ok {
			return he.StatusCode, w.Header(), err
		}
		return w.Code, w.Header(), err
	}
	inside := caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error {
		code, hdr, _ := serve(okHandler)
		if code != http.StatusServiceUnavailable || hdr.Get("Retry-After") != "1" {
			t.Errorf("a second request in flight got %d, Retry-After %q; want 503, 1", code, hdr.Get("Retry-After"))
		}
		return nil
	})
	if code, _, err := serve(inside); code != http.StatusOK || err != nil {
		t.Fatalf("first request: %d %v", code, err)
	}
	if len(u.store.refunds) != 1 {
		t.Fatalf("%d refunds, want the refused request's rate unit given back", len(u.store.refunds))
	}
	if _, _, err := serve(caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error {
		return errors.New("upstream failed")
	})); err == nil {
		t.Fatal("the error was lost")
	}
	func() {
		defer func() { _ = recover() }()
		_, _, _ = serve(caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { panic("boom") }))
	}()
	if c.size() != 0 {
		t.Fatalf("a slot was leaked: %d keys in flight", c.size())
	}
	if code, _, _ := serve(okHandler); code != http.StatusOK {
		t.Fatalf("after an error and a panic, a request got %d", code)
	}
}

// Waiting never leaves a goroutine behind.
func TestConcurrencyNoGoroutineLeak(t *testing.T) {
	before := runtime.NumGoroutine()
	c := testLimiter(1, time.Hour)
	held, _ := c.take("k")
	timer := &manualTimer{fire: make(chan time.Time)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 50)
	for range 50 {
		k, w := c.take("k")
		go func() { done <- c.await(ctx, k, w, timer.newTimer) }()
	}
	cancel()
	for range 50 {
		if err := <-done; err == nil {
			t.Fatal("a cancelled waiter got a slot that was never freed")
		}
	}
	c.release(held)
	if c.size() != 0 {
		t.Fatal("key kept")
	}
	for i := 0; runtime.NumGoroutine() > before && i < 1000; i++ {
		runtime.Gosched()
	}
	if n := runtime.NumGoroutine(); n > before {
		t.Fatalf("%d goroutines, %d before", n, before)
	}
}

func BenchmarkConcurrencySlot(b *testing.B) {
	c := testLimiter(1000, 0)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			k, _ := c.take("key")
			c.release(k)
		}
	})
}

func BenchmarkConcurrencySlotSerial(b *testing.B) {
	c := testLimiter(1000, 0)
	held, _ := c.take("key") // keeps the key's entry, as under load
	b.ReportAllocs()
	for b.Loop() {
		k, _ := c.take("key")
		c.release(k)
	}
	c.release(held)
}
