package redis

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/internal/redistest"
)

func TestBreakerTripsAndProbes(t *testing.T) {
	const openFor = 40 * time.Millisecond
	b := newBreaker(zap.NewNop(), openFor)
	calls := 0
	down := errors.New("connection refused")
	var fail error = down
	call := func() (bool, error) { calls++; return fail == nil, fail }

	// A caller that left is not Redis's failure.
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	for range 10 {
		if _, err := b.do(gone, call); errors.Is(err, backend.ErrUnavailable) || !errors.Is(err, down) {
			t.Fatalf("a cancelled caller's error %v: want it as is, not unavailable", err)
		}
	}
	ctx := context.Background()
	for i := range breakerTrips {
		_, err := b.do(ctx, call)
		if ue, ok := errors.AsType[*backend.UnavailableError](err); !ok || !errors.Is(err, down) || ue.RetryAfter != 0 {
			t.Fatalf("failure %d: %v, want unavailable wrapping the cause, no retry time yet", i, err)
		}
	}
	before := calls
	_, err := b.do(ctx, call)
	ue, ok := errors.AsType[*backend.UnavailableError](err)
	if !ok || calls != before || ue.RetryAfter <= 0 || ue.RetryAfter > openFor {
		t.Fatalf("after %d failures: %v (%d calls made), want an open breaker with 0 < retry ≤ %v and no call", breakerTrips, err, calls-before, openFor)
	}

	// Once openFor has passed (a lower bound), one probe goes through; it
	// fails, so the breaker opens again at once.
	time.Sleep(openFor)
	if _, err := b.do(ctx, call); calls != before+1 || !errors.Is(err, down) {
		t.Fatalf("probe: %v after %d calls, want the probe made and failed", err, calls-before)
	}
	if _, err := b.do(ctx, call); calls != before+1 || !errors.Is(err, backend.ErrUnavailable) {
		t.Fatalf("after a failed probe: %v, want open again without a call", err)
	}
	time.Sleep(openFor)
	fail = nil
	if ok, err := b.do(ctx, call); !ok || err != nil {
		t.Fatalf("probe after recovery: %v %v", ok, err)
	}
	for range 5 {
		if ok, err := b.do(ctx, call); !ok || err != nil {
			t.Fatalf("closed again: %v %v", ok, err)
		}
	}
	if calls != before+7 {
		t.Fatalf("%d calls after recovery, want every request to reach Redis again", calls-before-1)
	}
}

// A Redis that does not answer costs the first requests their timeout,
// then the breaker answers at once.
func TestModuleBreakerOnDeadRedis(t *testing.T) {
	port, err := redistest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	m, err := provisionModule(t, `{"addresses": ["127.0.0.1:`+strconv.Itoa(port)+`"], "timeout": "50ms", "key_prefix": "`+uniquePrefix(t)+`"}`)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	z, err := m.Register(backend.LimitConfig{Name: "breaker_dead", Algorithm: algorithms.NameTokenBucket, Policy: algorithms.Policy{Limit: 2, Window: int64(time.Hour)}})
	if err != nil {
		t.Fatal(err)
	}
	reqs := []backend.Request{{Limit: z, Key: "k", Cost: 1}}
	out := make([]algorithms.Result, 1)
	var open []time.Duration
	for i := range breakerTrips + 100 {
		start := time.Now()
		_, err := m.Decide(context.Background(), reqs, out)
		if !errors.Is(err, backend.ErrUnavailable) {
			t.Fatalf("decision %d: %v, want unavailable", i, err)
		}
		if i >= breakerTrips {
			open = append(open, time.Since(start))
		}
	}
	// The median: a loaded machine (the race detector, other packages'
	// tests) stalls a few decisions for milliseconds; one that waited for
	// Redis would stall them all, by its retries or its 50 ms timeout.
	slices.Sort(open)
	if median := open[len(open)/2]; median > 5*time.Millisecond {
		t.Fatalf("decisions with the breaker open took %v (median; fastest %v, slowest %v)", median, open[0], open[len(open)-1])
	}
	if err := m.Refund(context.Background(), reqs, []algorithms.Result{{Allowed: true}}); !errors.Is(err, backend.ErrUnavailable) {
		t.Fatalf("refund: %v, want unavailable", err)
	}
}

// The cost of a decision while Redis is down and the breaker open.
func BenchmarkDecideBreakerOpen(b *testing.B) {
	m := new(Module)
	m.Store, _ = New(goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true}), Options{KeyPrefix: "bench:"})
	m.breaker = newBreaker(zap.NewNop(), time.Hour)
	z, err := m.Register(backend.LimitConfig{Name: "bench_breaker", Algorithm: algorithms.NameTokenBucket, Policy: algorithms.Policy{Limit: 2, Window: int64(time.Hour)}})
	if err != nil {
		b.Fatal(err)
	}
	defer m.Store.Close()
	reqs := []backend.Request{{Limit: z, Key: "k", Cost: 1}}
	out := make([]algorithms.Result, 1)
	for range breakerTrips {
		_, _ = m.Decide(context.Background(), reqs, out)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := m.Decide(context.Background(), reqs, out); !errors.Is(err, backend.ErrUnavailable) {
			b.Fatal(err)
		}
	}
}

// A key Redis refuses (one of another type) fails the requests that name
// it, batched or not: Redis answered, so the breaker stays closed and the
// other keys are still decided.
func TestKeyOfAnotherTypeFailsAlone(t *testing.T) {
	for _, noBatch := range []bool{false, true} {
		t.Run("nobatch="+strconv.FormatBool(noBatch), func(t *testing.T) {
			c := standaloneClient(t)
			prefix := uniquePrefix(t)
			m := new(Module)
			var err error
			if m.Store, err = New(c, Options{KeyPrefix: prefix, NoBatch: noBatch}); err != nil {
				t.Fatal(err)
			}
			m.breaker = newBreaker(zap.NewNop(), time.Hour)
			z, err := m.Register(backend.LimitConfig{Name: "poisoned", Algorithm: algorithms.NameTokenBucket, Policy: algorithms.Policy{Limit: 2, Window: int64(time.Hour)}})
			if err != nil {
				t.Fatal(err)
			}
			if err := c.HSet(context.Background(), prefix+"poisoned//b{poison}", "f", "1").Err(); err != nil {
				t.Fatal(err)
			}
			out := make([]algorithms.Result, 1)
			for i := range breakerTrips + 2 {
				_, err := m.Decide(context.Background(), []backend.Request{{Limit: z, Key: "poison", Cost: 1}}, out)
				if !errors.Is(err, backend.ErrUnavailable) || !strings.Contains(err.Error(), "WRONGTYPE") {
					t.Fatalf("poisoned key, decision %d: %v, want unavailable for WRONGTYPE", i, err)
				}
			}
			if ok, err := m.Decide(context.Background(), []backend.Request{{Limit: z, Key: "healthy", Cost: 1}}, out); !ok || err != nil {
				t.Fatalf("another key after the poisoned one: %v %v, want decided and allowed", ok, err)
			}
		})
	}
}
