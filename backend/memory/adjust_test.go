package memory

import (
	"strings"
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

// The bucket algorithms refuse: their state is measured in the emission
// interval, which a new max_events changes for every key.
func TestSetMaxEventsBuckets(t *testing.T) {
	c := newFakeClock()
	s := newStore(t, c)
	for _, alg := range []string{algorithms.NameTokenBucket, algorithms.NameGCRA, algorithms.NameLeakyBucket} {
		l := testZone(t, s, alg, algorithms.Policy{Limit: 5, Window: 60 * sec}, 0)
		adj := l.(backend.Adjustable)
		if adj.CanAdjust() {
			t.Errorf("%s says it can adjust", alg)
		}
		if err := adj.SetMaxEvents(6); err == nil || !strings.Contains(err.Error(), "bucket") {
			t.Errorf("%s: %v", alg, err)
		}
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
