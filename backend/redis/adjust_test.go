package redis

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
)

func admitted(t *testing.T, s *Store, l backend.Limit, key string, n int) int {
	t.Helper()
	passed := 0
	for range n {
		out := make([]algorithms.Result, 1)
		ok, err := s.Decide(context.Background(), []backend.Request{{Limit: l, Key: key, Cost: 1}}, out)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			passed++
		}
	}
	return passed
}

// A window algorithm's max_events moves while the limit runs, on the
// counts Redis already holds.
func TestSetMaxEvents(t *testing.T) {
	client := standaloneClient(t)
	s := newStore(t, client)
	for _, alg := range []string{algorithms.NameSlidingWindow, algorithms.NameSlidingCounter, algorithms.NameFixedWindow} {
		l := mustZone(t, s, "adj_"+alg, alg, policy(5, time.Hour))
		adj := l.(backend.Adjustable)
		if !adj.CanAdjust() {
			t.Fatalf("%s cannot adjust", alg)
		}
		if got := admitted(t, s, l, "k", 10); got != 5 {
			t.Fatalf("%s at 5: %d admitted", alg, got)
		}
		if err := adj.SetMaxEvents(8); err != nil {
			t.Fatal(err)
		}
		if got := admitted(t, s, l, "k", 10); got != 3 {
			t.Fatalf("%s raised to 8: %d more admitted, want 3", alg, got)
		}
		if err := adj.SetMaxEvents(2); err != nil {
			t.Fatal(err)
		}
		out := make([]algorithms.Result, 1)
		ok, err := s.Decide(context.Background(), []backend.Request{{Limit: l, Key: "fresh", Cost: 1}}, out)
		if err != nil || !ok || out[0].Limit != 2 || out[0].Remaining != 1 {
			t.Fatalf("%s lowered to 2, a fresh key: %v %v %+v", alg, ok, err, out[0])
		}
		if got := admitted(t, s, l, "fresh", 5); got != 1 {
			t.Fatalf("%s lowered to 2: %d more admitted, want 1", alg, got)
		}
		if err := adj.SetMaxEvents(0); err == nil {
			t.Fatalf("%s: max_events 0 accepted", alg)
		}
	}
}

// A bucket's max_events moves too, with its burst in proportion, and the
// state in Redis stays as written (under the registered interval): an
// emptied bucket is empty at any new rate, a fresh key gets the new burst.
func TestSetMaxEventsBuckets(t *testing.T) {
	client := standaloneClient(t)
	s := newStore(t, client)
	for _, alg := range []string{algorithms.NameTokenBucket, algorithms.NameGCRA, algorithms.NameLeakyBucket} {
		l := mustZone(t, s, "adj_"+alg, alg, policy(5, time.Hour))
		adj := l.(backend.Adjustable)
		if !adj.CanAdjust() {
			t.Fatalf("%s cannot adjust", alg)
		}
		if got := admitted(t, s, l, "k", 10); got != 5 {
			t.Fatalf("%s at 5: %d admitted", alg, got)
		}
		raw, err := client.Get(context.Background(), l.(*zone).stateKey("k")).Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range []int64{2, 50} {
			if err := adj.SetMaxEvents(n); err != nil {
				t.Fatal(err)
			}
			if got := admitted(t, s, l, "k", 10); got != 0 {
				t.Fatalf("%s: an empty bucket changed to %d: %d admitted", alg, n, got)
			}
			out := make([]algorithms.Result, 1)
			if _, err := s.Decide(context.Background(), []backend.Request{{Limit: l, Key: "fresh" + strconv.FormatInt(n, 10), Cost: 1}}, out); err != nil || out[0].Limit != n {
				t.Fatalf("%s: a fresh key at %d: %+v %v", alg, n, out[0], err)
			}
		}
		// Denied requests wrote nothing: the state is the one written at
		// the registered rate, untouched by the changes.
		if after, _ := client.Get(context.Background(), l.(*zone).stateKey("k")).Result(); after != raw {
			t.Fatalf("%s: the state went from %q to %q", alg, raw, after)
		}
		if err := adj.SetMaxEvents(0); err == nil {
			t.Fatalf("%s: max_events 0 accepted", alg)
		}
	}
}

// The largest max_events an adaptive limit may reach: the interval is a
// nanosecond, the burst 10^15, and the script still decides exactly.
func TestSetMaxEventsHuge(t *testing.T) {
	client := standaloneClient(t)
	s := newStore(t, client)
	l := mustZone(t, s, "adj_huge", algorithms.NameGCRA, policy(10, time.Second))
	if err := l.(backend.Adjustable).SetMaxEvents(algorithms.MaxEvents); err != nil {
		t.Fatal(err)
	}
	out := make([]algorithms.Result, 1)
	ok, err := s.Decide(context.Background(), []backend.Request{{Limit: l, Key: "k", Cost: 1000}}, out)
	if err != nil || !ok || out[0].Limit != algorithms.MaxEvents || out[0].Remaining != algorithms.MaxEvents-1000 {
		t.Fatalf("at 10^15: %v %v %+v", ok, err, out[0])
	}
}
