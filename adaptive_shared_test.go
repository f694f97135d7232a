package sluice

import (
	"context"
	"strconv"
	"testing"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/internal/redistest"
)

// An adaptive concurrency limit whose slots Redis shares: the cap this
// instance sends with each acquire is its controller's, after a reload
// too, and the local cap of fail local (the fallback while Redis is away)
// follows it.
func TestAdaptiveSharedSlotsFollowTheController(t *testing.T) {
	redis := redistest.Standalone(t, "")
	// A 5s timeout: on a busy machine a call may take longer than the
	// default 100ms. slot_ttl 1s: the store's renewing goroutine, started by the slots
	// taken below, ends a third of it after they are freed, long before
	// the tests that count goroutines.
	nw, ctl := reloadBackedOff(t, `{"backend": {"name": "redis", "addresses": ["`+redis.Addr+`"], "timeout": "5s"}, "rate_limits": {"adapt_shared": {"key": "k", "concurrency": 100, "slot_ttl": "1s", "fail": "local", "adaptive": {"min": 10, "interval": "1s"}}}}`)
	l := nw.plan.zones[0].keyed[0]
	if l.shared == nil || l.adapt == nil || l.adapt.ctl != ctl {
		t.Fatal("the limit is not an adaptive limit on shared slots")
	}
	if got := l.conc.Max(); got != 70 {
		t.Fatalf("the local fallback's cap is %d, want 70", got)
	}
	// The shared cap is what Redis is sent: 70 slots of the key are
	// granted, the 71st is not.
	ctx := context.Background()
	for i := range 71 {
		id, err := l.shared.Slots().Acquire(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		if (id != "") != (i < 70) {
			t.Fatalf("acquire %d: got %q, want a slot for the first 70 only", i+1, id)
		}
		if id != "" {
			defer func() { _ = l.shared.Slots().Release(ctx, "k", id) }()
		}
	}
}

// A reload in the middle of an incident keeps a bucket rate where it
// backed off, its burst with it, on the memory backend and on Redis: a
// fresh key of the reloaded config gets 70 of the 100 units.
func TestAdaptiveBucketSurvivesReload(t *testing.T) {
	redis := redistest.Standalone(t, "")
	// A 5s timeout: on a busy machine a call may take longer than the
	// default 100ms.
	for i, store := range []string{"", `"backend": {"name": "redis", "addresses": ["` + redis.Addr + `"], "timeout": "5s"}, `} {
		nw, _ := reloadBackedOff(t, `{`+store+`"rate_limits": {"adapt_bucket_reload`+strconv.Itoa(i)+`": {"key": "k", "max_events": 100, "window": "1h", "algorithm": "token_bucket", "adaptive": {"min": 10, "interval": "1s"}}}}`)
		l := nw.plan.zones[0].keyed[0]
		passed := 0
		for range 150 {
			out := make([]algorithms.Result, 1)
			ok, err := nw.plan.store.Decide(context.Background(), []backend.Request{{Limit: l.handle, Key: "fresh", Cost: 1}}, out)
			if err != nil {
				t.Fatal(err)
			}
			if ok {
				passed++
			}
		}
		if passed != 70 {
			t.Fatalf("%q: a fresh key got %d units after the reload, want the burst of 70", store, passed)
		}
	}
}
