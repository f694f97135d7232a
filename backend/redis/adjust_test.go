package redis

import (
	"context"
	"strings"
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
// counts Redis already holds; the bucket algorithms refuse.
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
	for _, alg := range []string{algorithms.NameTokenBucket, algorithms.NameGCRA} {
		l := mustZone(t, s, "adj_"+alg, alg, policy(5, time.Hour))
		adj := l.(backend.Adjustable)
		if err := adj.SetMaxEvents(6); adj.CanAdjust() || err == nil || !strings.Contains(err.Error(), "bucket") {
			t.Errorf("%s: %v", alg, err)
		}
	}
}
