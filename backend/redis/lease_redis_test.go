package redis

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
)

// Against a real Redis, through the module as a handler uses it: a lease
// takes N units in one script call, spends them locally, and the last
// config using it gives the unused units back when it closes (a Caddy
// stop); a reload that keeps the lease keeps them held instead.
func TestLeaseRedis(t *testing.T) {
	addr := standalone(t)
	prefix := uniquePrefix(t)
	raw := `{"addresses": ["` + addr + `"], "key_prefix": "` + prefix + `", "timeout": "10s"}`
	cfg := backend.LimitConfig{Name: "leased", Algorithm: algorithms.NameTokenBucket, Policy: policy(1000, time.Hour), Lease: 10}
	ctx := context.Background()
	calls := func() float64 { return commandCalls(t, standaloneClient(t))["script"][0] }
	// left asks Redis, without a lease, what the key has left.
	left := func() int64 {
		t.Helper()
		s := newStore(t, standaloneClient(t))
		s.prefix = prefix
		h := mustZone(t, s, "leased", algorithms.NameTokenBucket, policy(1000, time.Hour))
		out := make([]algorithms.Result, 1)
		if _, err := s.Decide(ctx, []backend.Request{{Limit: h, Key: "k", Cost: 0}}, out); err != nil {
			t.Fatal(err)
		}
		return out[0].Remaining
	}

	old, err := provisionModule(t, raw)
	if err != nil {
		t.Fatal(err)
	}
	h, err := old.Register(cfg)
	if err != nil {
		t.Fatal(err)
	}
	before := calls()
	out := make([]algorithms.Result, 1)
	for i := range 25 {
		if ok, err := old.Decide(ctx, []backend.Request{{Limit: h, Key: "k", Cost: 1}}, out); err != nil || !ok || out[0].Remaining != 999-int64(i) {
			t.Fatalf("request %d: %v %v %+v", i, ok, err, out[0])
		}
	}
	if n := calls() - before; n != 3 {
		t.Fatalf("%v script calls for 25 requests with a lease of 10, want 3", n)
	}
	if got := left(); got != 970 {
		t.Fatalf("Redis has %d left, want 970 (3 leases of 10)", got)
	}

	// A reload: the new config registers the same limit before the old one
	// closes; the 5 units held stay held and are spent by the new one.
	cur, err := provisionModule(t, raw)
	if err != nil {
		t.Fatal(err)
	}
	h2, err := cur.Register(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := old.Close(); err != nil {
		t.Fatal(err)
	}
	before = calls()
	if ok, err := cur.Decide(ctx, []backend.Request{{Limit: h2, Key: "k", Cost: 1}}, out); err != nil || !ok || out[0].Remaining != 974 {
		t.Fatalf("after the reload: %v %v %+v", ok, err, out[0])
	}
	if n := calls() - before; n != 0 || left() != 970 {
		t.Fatalf("after the reload: %v calls, Redis has %d left; want 0 and 970", n, left())
	}
	// The stop: the 4 units still held go back.
	if err := cur.Close(); err != nil {
		t.Fatal(err)
	}
	if got := left(); got != 974 {
		t.Fatalf("after the stop Redis has %d left, want 974 (26 spent)", got)
	}
}

// The module refuses a lease it cannot serve, naming why.
func TestLeaseRedisRefuses(t *testing.T) {
	m, err := provisionModule(t, `{"addresses": ["127.0.0.1:1"], "key_prefix": "`+uniquePrefix(t)+`"}`)
	if err != nil {
		t.Fatal(err)
	}
	q := policy(1000, time.Hour)
	q.MaxDelay = int64(time.Second)
	if _, err := m.Register(backend.LimitConfig{Name: "q", Algorithm: algorithms.NameLeakyBucket, Policy: q, Lease: 10}); err == nil || !contains(err.Error(), "leaky_bucket") {
		t.Fatalf("a leaky queue with a lease: %v", err)
	}
}
