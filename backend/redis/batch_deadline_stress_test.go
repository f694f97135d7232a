package redis

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
)

// slowServer starts a server of the test's own that DEBUG SLEEP may
// stall without holding up the other tests, and a client of it.
func slowServer(t *testing.T) (*goredis.Client, *goredis.Client) {
	t.Helper()
	needRedis(t)
	addr, err := startServer("--enable-debug-command", "yes")
	if err != nil {
		t.Fatal(err)
	}
	c := goredis.NewClient(&goredis.Options{Addr: addr, ContextTimeoutEnabled: true, PoolSize: 64})
	admin := goredis.NewClient(&goredis.Options{Addr: addr, PoolSize: 2})
	t.Cleanup(func() { c.Close(); admin.Close() })
	return c, admin
}

// A caller of the batched path returns by its own deadline even when it
// sends, itself, a batch whose other requests may wait longer: with one
// call in flight on a stalled Redis and minBatch-1 requests of a long
// deadline queued, a request of a short deadline makes the queue leave,
// in its own goroutine.
func TestBatchSenderReturnsByItsDeadline(t *testing.T) {
	c, admin := slowServer(t)
	s, err := New(c, Options{KeyPrefix: uniquePrefix(t), Timeout: 5 * time.Second, NoCache: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	z, err := s.Register(backend.LimitConfig{Name: "z", Algorithm: algorithms.NameTokenBucket,
		Policy: algorithms.Policy{Limit: 1 << 20, Window: int64(time.Second)}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	decide := func(ctx context.Context, key string) {
		var out [1]algorithms.Result
		s.Decide(ctx, []backend.Request{{Limit: z, Key: key, Cost: 1}}, out[:])
	}
	decide(ctx, "warm") // the function loaded, a connection made
	var b *batcher
	s.batchers.Range(func(_, v any) bool { b = v.(*batcher); return false })
	queued := func(n int) {
		t.Helper()
		for range 1000 {
			b.mu.Lock()
			q, f := len(b.queue), b.inFlight
			b.mu.Unlock()
			if q == n && f == 1 {
				return
			}
			time.Sleep(time.Millisecond)
		}
		t.Fatalf("%d requests never queued behind one call", n)
	}

	stalled := make(chan struct{})
	go func() {
		close(stalled)
		admin.Do(ctx, "debug", "sleep", "1")
	}()
	<-stalled
	time.Sleep(30 * time.Millisecond)
	var wg sync.WaitGroup
	for i := range minBatch {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			defer cancel()
			decide(cctx, fmt.Sprint("long", i))
		}()
		if i == 0 {
			queued(0) // the call in flight
		}
	}
	queued(minBatch - 1)
	const short, slack = 40 * time.Millisecond, 150 * time.Millisecond
	cctx, cancel := context.WithTimeout(ctx, short)
	defer cancel()
	start := time.Now()
	decide(cctx, "short")
	took := time.Since(start)
	wg.Wait()
	if took > short+slack {
		t.Fatalf("a caller of deadline %v returned after %v", short, took)
	}
}

// Many callers with random short deadlines and cancellations against a
// Redis that stalls for longer than them now and then: each returns by
// its deadline and some slack (which covers the sender's wait
// TestBatchSenderReturnsByItsDeadline is about, at most about a timeout), no goroutine is left behind, and no request is decided twice
// (each has a key of its own, limit 1: a second decision would be
// denied, and it leaves a count of 2).
func TestBatchDeadlineStress(t *testing.T) {
	c, admin := slowServer(t)
	const clock = int64(1_764_460_500_000_000_000)
	// Half the callers have no deadline of their own: the store's
	// timeout is theirs, which only the batcher's timer enforces.
	const timeout = 150 * time.Millisecond
	prefix := uniquePrefix(t)
	store := func(timeout time.Duration) (*Store, backend.Limit) {
		s, err := New(c, Options{KeyPrefix: prefix, Timeout: timeout, NoCache: true,
			now: func() int64 { return clock }, ttlExtra: 3_600_000})
		if err != nil {
			t.Fatal(err)
		}
		z, err := s.Register(backend.LimitConfig{Name: "z", Algorithm: algorithms.NameFixedWindow,
			Policy: algorithms.Policy{Limit: 5, Window: int64(time.Hour)}})
		if err != nil {
			t.Fatal(err)
		}
		return s, z
	}
	s, z := store(timeout)
	var err error
	ctx := context.Background()
	var out [1]algorithms.Result
	for range 10 { // the function loaded, despite the short timeout
		if _, err = s.Decide(ctx, []backend.Request{{Limit: z, Key: "warm", Cost: 0}}, out[:]); err == nil {
			break
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	before := runtime.NumGoroutine()

	stop := make(chan struct{})
	var stallers sync.WaitGroup
	stallers.Add(1)
	stalled := make(chan struct{})
	go func() {
		defer stallers.Done()
		close(stalled)
		for {
			admin.Do(ctx, "debug", "sleep", "0.4")
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	<-stalled
	time.Sleep(10 * time.Millisecond)
	const workers, each, slack = 24, 30, 500 * time.Millisecond
	var wg sync.WaitGroup
	var late, n atomic.Int64
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
			for i := range each {
				d := time.Duration(1+rng.IntN(150)) * time.Millisecond
				var cctx context.Context
				var cancel context.CancelFunc
				if rng.IntN(2) == 0 {
					d = timeout
					cctx, cancel = context.WithCancel(ctx)
				} else {
					cctx, cancel = context.WithTimeout(ctx, d)
				}
				if rng.IntN(4) == 0 {
					time.AfterFunc(time.Duration(rng.IntN(int(d))), cancel)
				}
				start := time.Now()
				var out [1]algorithms.Result
				s.Decide(cctx, []backend.Request{{Limit: z, Key: fmt.Sprint(w, "-", i), Cost: 1}}, out[:])
				if over := time.Since(start) - d; over > slack {
					late.Add(1)
				}
				n.Add(1)
				cancel()
			}
		}()
	}
	wg.Wait()
	close(stop)
	stallers.Wait()
	if l := late.Load(); l > 0 {
		t.Errorf("%d of %d callers returned past their deadline and %v", l, n.Load(), slack)
	}
	s.Close()
	// Every request decided once at most: a peek of each key counts one
	// event or none.
	s, z = store(10 * time.Second)
	for w := range workers {
		for i := range each {
			var out [1]algorithms.Result
			if _, err := s.Decide(ctx, []backend.Request{{Limit: z, Key: fmt.Sprint(w, "-", i), Cost: 0}}, out[:]); err != nil {
				t.Fatal(err)
			}
			if out[0].Remaining < 4 {
				t.Fatalf("key %d-%d was decided %d times", w, i, 5-out[0].Remaining)
			}
		}
	}
	s.Close()
	noGoroutinesLeft(t, before)
}

// noGoroutinesLeft fails t if more goroutines than before still run 3 s
// from now: a decision or a call left behind.
func noGoroutinesLeft(t *testing.T, before int) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if g := runtime.NumGoroutine(); g > before {
		buf := make([]byte, 1<<16)
		t.Fatalf("%d goroutines before, %d after:\n%s", before, g, buf[:runtime.Stack(buf, true)])
	}
}
