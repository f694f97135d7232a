package conc

import (
	"context"
	"errors"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/internal/conc/conctest"
)

func testShared(f *conctest.Slots, queue time.Duration, queueMax int64) *Shared {
	return NewShared(f, queue, queueMax, prometheus.NewGauge(prometheus.GaugeOpts{Name: "t"}), nil)
}

// waitLine spins until key's line in c holds n requests.
func waitLine(t *testing.T, c *Shared, key string, n int) {
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
	f := conctest.NewSlots(1)
	c := testShared(f, time.Minute, 0)
	timer := &conctest.Timer{Fire: make(chan time.Time)}
	first, err := c.Take(context.Background(), "k", timer.NewTimer)
	if err != nil || first == "" {
		t.Fatal(first, err)
	}
	const n = 5
	got := make(chan int, n)
	ids := make([]string, n)
	for i := range n {
		go func() {
			id, err := c.Take(context.Background(), "k", timer.NewTimer)
			if err != nil {
				t.Errorf("waiter %d: %v", i, err)
			}
			ids[i] = id
			got <- i
		}()
		waitLine(t, c, "k", i+1)
	}
	c.Release("k", first)
	for want := range n {
		i := <-got
		if i != want {
			t.Fatalf("waiter %d got the slot, want %d (arrival order)", i, want)
		}
		c.Release("k", ids[i])
	}
	if f.Count("k") != 0 || len(c.lines) != 0 {
		t.Fatalf("%d slots held, %d lines left", f.Count("k"), len(c.lines))
	}
}

// Beyond queue_max waiters, a request is refused at once; one that leaves
// makes room.
func TestSharedConcQueueMax(t *testing.T) {
	f := conctest.NewSlots(1)
	c := testShared(f, time.Minute, 2)
	timer := &conctest.Timer{Fire: make(chan time.Time)}
	held, _ := c.Take(context.Background(), "k", timer.NewTimer)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 2)
	for i := range 2 {
		go func() {
			_, err := c.Take(ctx, "k", timer.NewTimer)
			done <- err
		}()
		waitLine(t, c, "k", i+1)
	}
	if _, err := c.Take(context.Background(), "k", timer.NewTimer); err != ErrQueueTimeout {
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
	c.Release("k", held)
}

// The queue's timeout ends a wait; only the first in line asks the
// backend, however long the line.
func TestSharedConcTimeoutAndPolling(t *testing.T) {
	f := conctest.NewSlots(1)
	c := testShared(f, time.Minute, 0)
	fire := make(chan time.Time)
	timer := &conctest.Timer{Fire: fire}
	held, _ := c.Take(context.Background(), "k", timer.NewTimer)
	done := make(chan error, 10)
	for i := range 10 {
		go func() {
			_, err := c.Take(context.Background(), "k", timer.NewTimer)
			done <- err
		}()
		waitLine(t, c, "k", i+1)
	}
	f.ResetCalls()
	start := time.Now()
	for time.Since(start) < 300*time.Millisecond {
		runtime.Gosched()
	}
	calls := f.Calls()
	// One asker polling at most every 50ms (after 2, 4, … ms): about 10 in 300ms.
	if calls > 15 {
		t.Fatalf("%d backend calls in 300ms from a line of 10, want one asker", calls)
	}
	for range 10 {
		fire <- time.Now()
	}
	for range 10 {
		if err := <-done; err != ErrQueueTimeout {
			t.Fatalf("a waiter at the queue's timeout: %v", err)
		}
	}
	c.Release("k", held)
}

// Many keys waiting at once ask the backend about slotPollBudget times a
// second in all, not 20 times a second each.
func TestSharedConcPollBudget(t *testing.T) {
	f := conctest.NewSlots(1)
	c := testShared(f, time.Minute, 0)
	timer := &conctest.Timer{Fire: make(chan time.Time)}
	const keys = 500
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for i := range keys {
		k := strconv.Itoa(i)
		if id, _ := c.Take(ctx, k, timer.NewTimer); id == "" {
			t.Fatal("the first request of a key got no slot")
		}
		wg.Go(func() { _, _ = c.Take(ctx, k, timer.NewTimer) })
	}
	for i := range keys {
		waitLine(t, c, strconv.Itoa(i), 1)
	}
	// Past the first doublings (2 … 32 ms), every head polls at its slowest.
	start := time.Now()
	for time.Since(start) < 300*time.Millisecond {
		runtime.Gosched()
	}
	f.ResetCalls()
	start = time.Now()
	for time.Since(start) < time.Second {
		runtime.Gosched()
	}
	calls := f.Calls()
	cancel()
	wg.Wait()
	// 500 keys at 50 ms would be 10,000 calls a second.
	if calls > 2*slotPollBudget {
		t.Fatalf("%d backend calls in a second from %d waiting keys, want about %d", calls, keys, slotPollBudget)
	}
	t.Logf("%d calls in a second from %d waiting keys", calls, keys)
}
