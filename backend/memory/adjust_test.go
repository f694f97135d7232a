package memory

import (
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
)

// admitted counts how many of n one-unit requests of key pass now.
func admitted(t *testing.T, s *Store, l backend.Limit, key string, n int) int {
	t.Helper()
	passed := 0
	for range n {
		if ok, _ := decide(t, s, backend.Request{Limit: l, Key: key, Cost: 1}); ok {
			passed++
		}
	}
	return passed
}

// A window algorithm's max_events moves while the limit runs, for keys
// that already hold events: raised, the room appears at once; lowered, a
// key over the new limit waits for its events to leave the window.
func TestSetMaxEvents(t *testing.T) {
	for _, alg := range []string{algorithms.NameSlidingWindow, algorithms.NameSlidingCounter, algorithms.NameFixedWindow} {
		t.Run(alg, func(t *testing.T) {
			c := newFakeClock()
			s := newStore(t, c)
			l := testZone(t, s, alg, algorithms.Policy{Limit: 5, Window: 60 * sec}, 0)
			adj, ok := l.(backend.Adjustable)
			if !ok || !adj.CanAdjust() {
				t.Fatalf("%s cannot adjust", alg)
			}
			if got := admitted(t, s, l, "k", 10); got != 5 {
				t.Fatalf("at 5: %d admitted", got)
			}
			if err := adj.SetMaxEvents(8); err != nil {
				t.Fatal(err)
			}
			if got := admitted(t, s, l, "k", 10); got != 3 {
				t.Fatalf("raised to 8: %d more admitted, want 3", got)
			}
			_, out := decide(t, s, backend.Request{Limit: l, Key: "fresh", Cost: 1})
			if out[0].Limit != 8 || out[0].Remaining != 7 {
				t.Fatalf("a fresh key at 8: %+v", out[0])
			}
			if err := adj.SetMaxEvents(2); err != nil {
				t.Fatal(err)
			}
			if got := admitted(t, s, l, "fresh", 5); got != 1 {
				t.Fatalf("lowered to 2: %d more admitted for a key holding 1, want 1", got)
			}
			c.advance(2 * time.Minute)
			if got := admitted(t, s, l, "k", 5); got != 2 {
				t.Fatalf("lowered to 2, a window later: %d admitted", got)
			}
		})
	}
}

// A bucket algorithm's max_events moves while the limit runs, its burst
// in proportion, and each key's state stays: at the moment of a change a
// key that emptied its bucket has emptied the new one (lowered: no free
// burst; raised: no burst on top of the one it had), a fresh key has the
// new burst, and half a depth later half the new bucket is back.
func TestSetMaxEventsBuckets(t *testing.T) {
	for _, alg := range []string{algorithms.NameTokenBucket, algorithms.NameGCRA, algorithms.NameLeakyBucket} {
		t.Run(alg, func(t *testing.T) {
			c := newFakeClock()
			s := newStore(t, c)
			// 10 a second, burst 10: the bucket is a second deep.
			l := testZone(t, s, alg, algorithms.Policy{Limit: 10, Window: sec}, 0)
			adj := l.(backend.Adjustable)
			if !adj.CanAdjust() {
				t.Fatal("cannot adjust")
			}
			if got := admitted(t, s, l, "k", 20); got != 10 {
				t.Fatalf("at 10: %d admitted", got)
			}
			for _, n := range []int64{4, 40, 10} {
				if err := adj.SetMaxEvents(n); err != nil {
					t.Fatal(err)
				}
				if got := admitted(t, s, l, "k", 50); got != 0 {
					t.Fatalf("an empty bucket, changed to %d: %d admitted at once", n, got)
				}
			}
			if err := adj.SetMaxEvents(40); err != nil {
				t.Fatal(err)
			}
			_, out := decide(t, s, backend.Request{Limit: l, Key: "fresh", Cost: 1})
			if out[0].Limit != 40 || out[0].Remaining != 39 {
				t.Fatalf("a fresh key at 40: %+v, want the burst of 40", out[0])
			}
			c.advance(500 * time.Millisecond)
			if got := admitted(t, s, l, "k", 50); got != 20 {
				t.Fatalf("half a second at 40: %d admitted, want 20", got)
			}
			if err := adj.SetMaxEvents(4); err != nil {
				t.Fatal(err)
			}
			c.advance(500 * time.Millisecond)
			if got := admitted(t, s, l, "k", 50); got != 2 {
				t.Fatalf("half a second at 4: %d admitted, want 2", got)
			}
		})
	}
}

// A value the algorithm refuses is refused, and the limit keeps deciding
// with the one before.
func TestSetMaxEventsInvalid(t *testing.T) {
	c := newFakeClock()
	s := newStore(t, c)
	l := testZone(t, s, algorithms.NameSlidingWindow, algorithms.Policy{Limit: 5, Window: 60 * sec}, 0)
	adj := l.(backend.Adjustable)
	for _, n := range []int64{0, -1, 1 << 40} {
		if err := adj.SetMaxEvents(n); err == nil {
			t.Errorf("max_events %d accepted", n)
		}
	}
	if got := admitted(t, s, l, "k", 10); got != 5 {
		t.Fatalf("after refused changes: %d admitted, want 5", got)
	}
}

// A reload that changes the window keeps the adjusted max_events over the
// new window, for the handle that adjusted it; the new config's handle
// decides by its own policy.
func TestSetMaxEventsAcrossReload(t *testing.T) {
	c := newFakeClock()
	old := newStore(t, c)
	name := t.Name()
	cfg := backend.LimitConfig{Name: name, Algorithm: algorithms.NameFixedWindow, Policy: algorithms.Policy{Limit: 5, Window: 60 * sec}, Owner: "old"}
	l, err := old.Register(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.(backend.Adjustable).SetMaxEvents(3); err != nil {
		t.Fatal(err)
	}
	cfg.Policy.Window, cfg.Owner = 30*sec, "new"
	nw := newStore(t, c)
	l2, err := nw.Register(cfg)
	if err != nil {
		t.Fatal(err)
	}
	_, out := decide(t, old, backend.Request{Limit: l, Key: "k", Cost: 1})
	if out[0].Limit != 3 || out[0].ResetAfter > 30*sec {
		t.Fatalf("old handle after the reload: %+v, want limit 3 over 30 s", out[0])
	}
	_, out = decide(t, nw, backend.Request{Limit: l2, Key: "k", Cost: 1})
	if out[0].Limit != 5 || out[0].Remaining != 3 {
		t.Fatalf("new handle: %+v, want 5 with 3 left", out[0])
	}
}

// Deciding with an adjusted limit allocates no more than without.
func TestSetMaxEventsNoAlloc(t *testing.T) {
	c := newFakeClock()
	s := newStore(t, c)
	l := testZone(t, s, algorithms.NameFixedWindow, algorithms.Policy{Limit: 1 << 40, Window: 60 * sec}, 0)
	_ = l.(backend.Adjustable).SetMaxEvents(1 << 41)
	reqs := []backend.Request{{Limit: l, Key: "k", Cost: 1}}
	out := make([]algorithms.Result, 1)
	if n := testing.AllocsPerRun(100, func() { _, _ = s.Decide(t.Context(), reqs, out) }); n != 0 {
		t.Fatalf("%v allocations per decision", n)
	}
}

// A queue (leaky_bucket with max_delay) keeps the slots it gave out when
// max_events changes; the next slots are spaced by the new interval, and
// max_delay stays, so the queue holds max_delay ÷ the new interval more.
func TestSetMaxEventsQueue(t *testing.T) {
	c := newFakeClock()
	s := newStore(t, c)
	l := testZone(t, s, algorithms.NameLeakyBucket, algorithms.Policy{Limit: 10, Window: sec, MaxDelay: sec}, 0)
	adj := l.(backend.Adjustable)
	delays := func(n int) []int64 {
		var d []int64
		for range n {
			ok, out := decide(t, s, backend.Request{Limit: l, Key: "k", Cost: 1})
			if !ok {
				break
			}
			d = append(d, out[0].Delay/int64(time.Millisecond))
		}
		return d
	}
	if got := delays(3); fmt.Sprint(got) != "[0 100 200]" {
		t.Fatalf("at 10/s: delays %v ms", got)
	}
	if err := adj.SetMaxEvents(20); err != nil {
		t.Fatal(err)
	}
	if got := delays(30); fmt.Sprint(got) != "[300 350 400 450 500 550 600 650 700 750 800 850 900 950 1000]" {
		t.Fatalf("raised to 20/s: delays %v ms", got)
	}
	if err := adj.SetMaxEvents(5); err != nil {
		t.Fatal(err)
	}
	c.advance(time.Second)
	if got := delays(30); fmt.Sprint(got) != "[50 250 450 650 850]" {
		t.Fatalf("lowered to 5/s, a second later: delays %v ms", got)
	}
}

// A flood of keys while max_events moves under it, from 1 to 1000 and
// back, at one instant: no key is admitted more than the largest burst in
// force (the depth of the bucket, at the fastest rate), and nothing races
// (go test -race).
func TestSetMaxEventsFlood(t *testing.T) {
	c := newFakeClock()
	s := newStore(t, c)
	// 100 a second, burst 10: the bucket is 100 ms deep; at 1000 a second
	// the burst is 100.
	l := testZone(t, s, algorithms.NameGCRA, algorithms.Policy{Limit: 100, Window: sec, Burst: 10}, 0)
	adj := l.(backend.Adjustable)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for n := int64(1); ; n = n*7%1000 + 1 {
			select {
			case <-stop:
				return
			default:
			}
			if err := adj.SetMaxEvents(n); err != nil {
				t.Error(err)
				return
			}
		}
	})
	const keys = 500
	var passed [keys]atomic.Int64
	var flood sync.WaitGroup
	for g := range 4 {
		flood.Go(func() {
			for i := range 20 * keys {
				k := (i*7 + g) % keys
				if ok, _ := decide(t, s, backend.Request{Limit: l, Key: strconv.Itoa(k), Cost: 1}); ok {
					passed[k].Add(1)
				}
			}
		})
	}
	flood.Wait()
	close(stop)
	wg.Wait()
	for k := range passed {
		if n := passed[k].Load(); n > 100 || n < 1 {
			t.Fatalf("key %d: %d admitted at one instant, want from 1 to the largest burst, 100", k, n)
		}
	}
}
