package conc

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/internal/conc/conctest"
)

func testLimiter(n int64, queue time.Duration) *Local {
	return NewLocal(n, queue, 0, prometheus.NewGauge(prometheus.GaugeOpts{Name: "t"}))
}

// Waiters get the freed slots in the order they arrived, and a key with
// nothing in flight is forgotten at once.
func TestConcurrencyFIFO(t *testing.T) {
	c := testLimiter(1, time.Minute)
	first, w := c.Take("k")
	if w != nil || first == nil {
		t.Fatal("the first request must get the free slot")
	}
	timer := &conctest.Timer{Fire: make(chan time.Time)}
	const n = 5
	got := make(chan int, n)
	for i := range n {
		k, w := c.Take("k")
		if w == nil {
			t.Fatalf("request %d got a slot while the only one is taken", i)
		}
		go func() {
			if err := c.Await(context.Background(), k, w, timer.NewTimer); err != nil {
				t.Errorf("waiter %d: %v", i, err)
			}
			got <- i
		}()
	}
	c.Release(first)
	for want := range n {
		i := <-got
		if i != want {
			t.Fatalf("waiter %d got the slot, want %d (arrival order)", i, want)
		}
		c.Release(first) // every entry of one key is the same
	}
	if c.Size() != 0 {
		t.Fatalf("%d keys tracked with nothing in flight, want 0", c.Size())
	}
}

// A waiter whose client leaves gives up its place; the next in line gets
// the slot.
func TestConcurrencyWaiterGivesUp(t *testing.T) {
	c := testLimiter(1, time.Minute)
	held, _ := c.Take("k")
	timer := &conctest.Timer{Fire: make(chan time.Time)}
	ctx, cancel := context.WithCancel(context.Background())
	k1, w1 := c.Take("k")
	k2, w2 := c.Take("k")
	cancel()
	if err := c.Await(ctx, k1, w1, timer.NewTimer); !errors.Is(err, context.Canceled) {
		t.Fatalf("a cancelled waiter got %v, want context.Canceled", err)
	}
	done := make(chan error)
	go func() { done <- c.Await(context.Background(), k2, w2, timer.NewTimer) }()
	c.Release(held)
	if err := <-done; err != nil {
		t.Fatalf("the second waiter: %v", err)
	}
	c.Release(k2)
	if c.Size() != 0 {
		t.Fatalf("%d keys left", c.Size())
	}
}

// A waiter whose time runs out leaves the line holding nothing; without a
// queue, a request beyond the cap is refused at once.
func TestConcurrencyQueueTimeout(t *testing.T) {
	c := testLimiter(1, time.Second)
	held, _ := c.Take("k")
	timer := &conctest.Timer{Fire: make(chan time.Time, 1)}
	k, w := c.Take("k")
	timer.Fire <- time.Time{}
	if err := c.Await(context.Background(), k, w, timer.NewTimer); err != ErrQueueTimeout {
		t.Fatalf("got %v, want the queue timeout", err)
	}
	c.Release(held)
	if c.Size() != 0 {
		t.Fatalf("%d keys left after the only slot was freed", c.Size())
	}
	none := testLimiter(2, 0)
	a, _ := none.Take("x")
	b, _ := none.Take("x")
	if k, w := none.Take("x"); k != nil || w != nil {
		t.Fatal("a third request got past a cap of 2 without a queue")
	}
	none.Release(a)
	none.Release(b)
	if none.Size() != 0 {
		t.Fatal("key kept")
	}
}

// A flood of distinct keys holds memory only for what is in flight.
func TestConcurrencyKeysDropped(t *testing.T) {
	c := testLimiter(1, 0)
	for i := range 10000 {
		k, _ := c.Take(strings.Repeat("k", i%50) + string(rune(i)))
		c.Release(k)
	}
	if c.Size() != 0 {
		t.Fatalf("%d keys kept", c.Size())
	}
}

func BenchmarkConcurrencySlot(b *testing.B) {
	c := testLimiter(1000, 0)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			k, _ := c.Take("key")
			c.Release(k)
		}
	})
}

func BenchmarkConcurrencySlotSerial(b *testing.B) {
	c := testLimiter(1000, 0)
	held, _ := c.Take("key") // keeps the key's entry, as under load
	b.ReportAllocs()
	for b.Loop() {
		k, _ := c.Take("key")
		c.Release(k)
	}
	c.Release(held)
}

// Raised, a concurrency cap hands the new slots to the waiters in line at
// once; lowered, it takes no slot from a request in flight, and a freed
// slot above the new cap goes back to the pool, not to the next waiter.
func TestConcurrencySetMax(t *testing.T) {
	c := testLimiter(2, time.Minute)
	a, _ := c.Take("k")
	b, _ := c.Take("k")
	timer := &conctest.Timer{Fire: make(chan time.Time)}
	k1, w1 := c.Take("k")
	k2, w2 := c.Take("k")
	k3, w3 := c.Take("k")
	if w1 == nil || w2 == nil || w3 == nil {
		t.Fatal("a third request got a slot of two")
	}
	done := make(chan int, 3)
	for i, kw := range []struct {
		k *Key
		w *Waiter
	}{{k1, w1}, {k2, w2}, {k3, w3}} {
		go func() {
			if err := c.Await(context.Background(), kw.k, kw.w, timer.NewTimer); err != nil {
				t.Errorf("waiter %d: %v", i, err)
			}
			done <- i
		}()
	}
	c.SetMax(4)
	// The first two in line get the new slots; their goroutines may then
	// report in either order.
	if got := []int{<-done, <-done}; min(got[0], got[1]) != 0 || max(got[0], got[1]) != 1 {
		t.Fatalf("waiters %v got the new slots, want 0 and 1", got)
	}
	// 4 in flight, one waiting; the cap falls to 2.
	c.SetMax(2)
	c.Release(a) // 3 in flight: still above the cap, the waiter waits
	select {
	case i := <-done:
		t.Fatalf("waiter %d got a slot above the lowered cap", i)
	default:
	}
	c.Release(b) // 2 in flight, at the cap: the waiter still waits
	select {
	case i := <-done:
		t.Fatalf("waiter %d got a slot at the lowered cap", i)
	default:
	}
	c.Release(k1) // 1 in flight: the slot goes to the waiter
	if i := <-done; i != 2 {
		t.Fatalf("waiter %d, want 2", i)
	}
	if _, w := c.Take("k"); w == nil {
		t.Fatal("a newcomer got a slot with 2 of 2 in flight")
	}
}

// On the memory backend, queue_max caps each key's waiters: beyond it a
// request is refused at once; another key has its own line.
func TestConcurrencyQueueMax(t *testing.T) {
	c := NewLocal(1, time.Minute, 2, prometheus.NewGauge(prometheus.GaugeOpts{Name: "t"}))
	held, _ := c.Take("k")
	for i := range 2 {
		if k, w := c.Take("k"); k == nil || w == nil {
			t.Fatalf("waiter %d refused below queue_max", i)
		}
	}
	if k, w := c.Take("k"); k != nil || w != nil {
		t.Fatal("a third waiter joined a line of queue_max 2")
	}
	other, _ := c.Take("other")
	if _, w := c.Take("other"); w == nil {
		t.Fatal("another key's line is full too")
	}
	_, _ = held, other
}

// Waiting never leaves a goroutine behind.
func TestConcurrencyNoGoroutineLeak(t *testing.T) {
	before := runtime.NumGoroutine()
	c := testLimiter(1, time.Hour)
	held, _ := c.Take("k")
	timer := &conctest.Timer{Fire: make(chan time.Time)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 50)
	for range 50 {
		k, w := c.Take("k")
		go func() { done <- c.Await(ctx, k, w, timer.NewTimer) }()
	}
	cancel()
	for range 50 {
		if err := <-done; err == nil {
			t.Fatal("a cancelled waiter got a slot that was never freed")
		}
	}
	c.Release(held)
	if c.Size() != 0 {
		t.Fatal("key kept")
	}
	for i := 0; runtime.NumGoroutine() > before && i < 1000; i++ {
		runtime.Gosched()
	}
	if n := runtime.NumGoroutine(); n > before {
		t.Fatalf("%d goroutines, %d before", n, before)
	}
}
