package sluice

import (
	"context"
	"testing"

	"github.com/sluicehq/sluice/internal/redistest"
)

// An adaptive concurrency limit whose slots Redis shares: the cap this
// instance sends with each acquire is its controller's, after a reload
// too, and the local cap of fail local (the fallback while Redis is away)
// follows it.
func TestAdaptiveSharedSlotsFollowTheController(t *testing.T) {
	redis := redistest.Standalone(t, "")
	nw, ctl := reloadBackedOff(t, `{"backend": {"name": "redis", "addresses": ["`+redis.Addr+`"]}, "rate_limits": {"adapt_shared": {"key": "k", "concurrency": 100, "fail": "local", "adaptive": {"min": 10, "interval": "1s"}}}}`)
	l := nw.zones[0].keyed[0]
	if l.shared == nil || l.adapt == nil || l.adapt.ctl != ctl {
		t.Fatal("the limit is not an adaptive limit on shared slots")
	}
	if got := l.conc.max.Load(); got != 70 {
		t.Fatalf("the local fallback's cap is %d, want 70", got)
	}
	// The shared cap is what Redis is sent: 70 slots of the key are
	// granted, the 71st is not.
	ctx := context.Background()
	for i := range 71 {
		id, err := l.shared.slots.Acquire(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		if (id != "") != (i < 70) {
			t.Fatalf("acquire %d: got %q, want a slot for the first 70 only", i+1, id)
		}
		if id != "" {
			defer func() { _ = l.shared.slots.Release(ctx, "k", id) }()
		}
	}
}
