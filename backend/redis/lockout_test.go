package redis

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
)

// The lock-out tests run every step against the memory store and the
// Redis store at the same instants (the twin), which must answer the same,
// field by field; the expectations are then checked on that answer.

const (
	minute = int64(time.Minute)
	hour   = int64(time.Hour)
)

var loginSteps = backend.Lockout{minute, 5 * minute, 24 * hour}

// lockTwin is a twin over one sliding_window zone of 3 per 10 minutes with
// lockout 1m 5m 24h.
func lockTwin(t *testing.T, client goredis.UniversalClient) *twin {
	t.Helper()
	return newTwinWith(t, client, false, t0, zoneSpec{name: "login", alg: algorithms.NameSlidingWindow, policy: policy(3, 10*time.Minute), lockout: loginSteps})
}

// want checks one request's answer (the same from both stores).
func (tw *twin) want(key string, allowed bool, retry int64) {
	tw.t.Helper()
	ok, out := tw.do(ask{key: key, cost: 1})
	if ok != allowed || out[0].RetryAfter != retry || (!allowed && (out[0].Remaining != 0 || out[0].ResetAfter != retry)) {
		tw.fail("%q at t0+%s: got allowed=%v %+v, want allowed=%v retry %s", key, algorithms.FormatSpan(tw.clock-t0), ok, out[0], allowed, algorithms.FormatSpan(retry))
	}
}

// level checks the key's record in both stores.
func (tw *twin) level(key string, level int32, wait int64) {
	tw.t.Helper()
	ctx := context.Background()
	for name, get := range map[string]func() (backend.LockoutState, int64, error){
		"memory": func() (backend.LockoutState, int64, error) {
			return tw.cur.mem.InspectLockout(ctx, tw.cur.memZ[0], key)
		},
		"redis": func() (backend.LockoutState, int64, error) {
			return tw.cur.red.InspectLockout(ctx, tw.cur.redZ[0], key)
		},
	} {
		st, w, err := get()
		if err != nil || st.Level != level || w != wait {
			tw.fail("%s: %q at t0+%s: level %d, locked %s more (%v); want level %d, %s", name, key, algorithms.FormatSpan(tw.clock-t0), st.Level, algorithms.FormatSpan(w), err, level, algorithms.FormatSpan(wait))
		}
	}
}

func (tw *twin) reset(key string) {
	tw.t.Helper()
	ctx := context.Background()
	if err := tw.cur.mem.Reset(ctx, tw.cur.memZ[0], key); err != nil {
		tw.t.Fatal(err)
	}
	if err := tw.cur.red.Reset(ctx, tw.cur.redZ[0], key); err != nil {
		tw.t.Fatal(err)
	}
}

// exhaust spends the key's 3 units.
func (tw *twin) exhaust(key string) {
	tw.t.Helper()
	for range 3 {
		tw.want(key, true, 0)
	}
}

// 1m → 5m → 24h → 24h: each lock-out starts when the key is denied again
// after the one before ended; requests during a lock-out do not escalate.
func TestLockoutEscalation(t *testing.T) {
	tw := lockTwin(t, standaloneClient(t))
	tw.exhaust("k")
	tw.want("k", false, minute) // denied by the window: locked 1m
	tw.level("k", 1, minute)
	tw.clock += 30 * int64(time.Second)
	tw.want("k", false, 30*int64(time.Second)) // still the first lock-out
	tw.want("other", true, 0)                  // another key is not touched
	tw.level("k", 1, 30*int64(time.Second))

	tw.clock = t0 + minute // the lock-out is over; the window still denies
	tw.want("k", false, 5*minute)
	tw.level("k", 2, 5*minute)
	tw.clock += 5*minute - 1
	tw.want("k", false, 1)
	tw.clock++
	tw.want("k", false, 24*hour)
	tw.level("k", 3, 24*hour)

	tw.clock += 24 * hour // the window is empty again: the key passes
	tw.exhaust("k")
	tw.want("k", false, 24*hour) // the last step repeats
	tw.level("k", 3, 24*hour)
}

// A reset (reset_when's, or the admin API's) clears the level with the
// usage: the next denial is a first one.
func TestLockoutResetClearsLevel(t *testing.T) {
	tw := lockTwin(t, standaloneClient(t))
	tw.exhaust("k")
	tw.want("k", false, minute)
	tw.clock += minute
	tw.want("k", false, 5*minute)
	tw.reset("k")
	tw.level("k", 0, 0)
	tw.exhaust("k") // a full quota at once, during what was a lock-out
	tw.want("k", false, minute)
	tw.level("k", 1, minute)
}

// The level is forgotten once the key has gone its longest step (24h)
// past the end of its last lock-out; a nanosecond sooner it escalates.
func TestLockoutDecay(t *testing.T) {
	for _, tc := range []struct {
		name  string
		quiet int64 // after the end of the 5m lock-out
		retry int64
		level int32
	}{
		{"just before", 24*hour - 1, 24 * hour, 3},
		{"after the longest step", 24 * hour, minute, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tw := lockTwin(t, standaloneClient(t))
			tw.exhaust("k")
			tw.want("k", false, minute)
			tw.clock += minute
			tw.want("k", false, 5*minute) // ends at t0+6m
			tw.clock = t0 + 6*minute + tc.quiet
			tw.exhaust("k")
			tw.want("k", false, tc.retry)
			tw.level("k", tc.level, tc.retry)
		})
	}
}

// A shadow request is decided by the lock-out but never locks a key out,
// and a cost above what the limit holds (a request that could never pass)
// does not either.
func TestLockoutShadowAndNever(t *testing.T) {
	tw := lockTwin(t, standaloneClient(t))
	tw.exhaust("k")
	if ok, out := tw.do(ask{key: "k", cost: 1, shadow: true}); !ok || out[0].Allowed {
		tw.fail("shadow request: %v %+v", ok, out[0])
	}
	tw.level("k", 0, 0)
	tw.want("k", false, minute)
	if _, out := tw.do(ask{key: "k", cost: 1, shadow: true}); out[0].RetryAfter != minute {
		tw.fail("shadow request during a lock-out: %+v", out[0])
	}
	if ok, out := tw.do(ask{key: "fresh", cost: 4}); ok || out[0].RetryAfter != algorithms.Never {
		tw.fail("cost 4 of 3: %v %+v", ok, out[0])
	}
	tw.level("fresh", 0, 0)
	tw.want("fresh", true, 0)
}

// Inspect shows a locked-out key as having nothing left until the end of
// its lock-out, in both stores.
func TestLockoutInspect(t *testing.T) {
	tw := lockTwin(t, standaloneClient(t))
	tw.exhaust("k")
	tw.want("k", false, minute)
	tw.clock += 10 * int64(time.Second)
	ctx := context.Background()
	mu, err1 := tw.cur.mem.Inspect(ctx, tw.cur.memZ[0], "k")
	ru, err2 := tw.cur.red.Inspect(ctx, tw.cur.redZ[0], "k")
	want := algorithms.Usage{Limit: 3, Remaining: 0, RetryAfter: 50 * int64(time.Second), ResetAfter: 50 * int64(time.Second)}
	if err1 != nil || err2 != nil || mu != want || ru != want {
		t.Fatalf("inspect: memory %+v (%v), redis %+v (%v); want %+v", mu, err1, ru, err2, want)
	}
}

// A fleet shares a lock-out: the record is written by the call that
// denies, so concurrent requests from many connections (instances) all
// see it. Of 50 concurrent requests on a key with 3 units, 3 pass and the
// key is locked out once, at the first step.
func TestLockoutConcurrentRedis(t *testing.T) {
	client := standaloneClient(t)
	prefix := uniquePrefix(t)
	cfg := backend.LimitConfig{Name: "login", Algorithm: algorithms.NameSlidingWindow, Policy: policy(3, 10*time.Minute), Lockout: loginSteps}
	var stores []*Store
	var zones []backend.Limit
	for range 5 { // five instances, each with its own cache and batcher
		s, err := New(client, Options{KeyPrefix: prefix, Timeout: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		z, err := s.Register(cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		stores, zones = append(stores, s), append(zones, z)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	allowed, locked := 0, 0
	for i := range 50 {
		wg.Go(func() {
			out := make([]algorithms.Result, 1)
			ok, err := stores[i%5].Decide(context.Background(), []backend.Request{{Limit: zones[i%5], Key: "victim", Cost: 1}}, out)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				t.Error(err)
			case ok:
				allowed++
			case out[0].RetryAfter > 0 && out[0].RetryAfter <= minute && out[0].RetryAfter > minute-int64(10*time.Second):
				locked++
			default:
				t.Errorf("denied with %+v, want the first lock-out's retry", out[0])
			}
		})
	}
	wg.Wait()
	st, wait, err := stores[0].InspectLockout(context.Background(), zones[0], "victim")
	if allowed != 3 || locked != 47 || err != nil || st.Level != 1 || wait <= 0 || wait > minute {
		t.Fatalf("allowed %d, locked out %d; record level %d for %s (%v); want 3, 47, level 1 for up to 1m", allowed, locked, st.Level, algorithms.FormatSpan(wait), err)
	}
}

// On a Redis Cluster, a key starting with } or empty (an empty hash tag)
// keeps its state and its record in one slot: the script may touch both.
func TestLockoutClusterEmptyHashTag(t *testing.T) {
	tw := newTwinWith(t, clusterClient(t), false, t0, zoneSpec{name: "login", alg: algorithms.NameTokenBucket, policy: policy(3, 10*time.Minute), lockout: loginSteps})
	for _, key := range []string{"}x{", "\x00}x{", "}", "user{7}", "", "\x00"} {
		tw.exhaust(key)
		tw.want(key, false, minute)
		tw.level(key, 1, minute)
		tw.reset(key)
		tw.level(key, 0, 0)
		tw.want(key, true, 0)
	}
	keys, err := tw.client.(*goredis.ClusterClient).Keys(context.Background(), tw.prefix+"*").Result()
	if err == nil {
		for _, k := range keys {
			if i := strings.IndexByte(k, '{'); i < 0 || strings.IndexByte(k[i+1:], '}') == 0 {
				t.Errorf("key %q has an empty hash tag", k)
			}
		}
	}
}

// Steps that are not lock-outs are refused by both stores.
func TestLockoutRegisterRefuses(t *testing.T) {
	s, err := New(standaloneClient(t), Options{KeyPrefix: uniquePrefix(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, lo := range []backend.Lockout{{0}, {-minute}, {5 * minute, minute}, {backend.MaxLockoutStep + 1}, make(backend.Lockout, 17)} {
		if _, err := s.Register(backend.LimitConfig{Name: t.Name(), Algorithm: algorithms.NameGCRA, Policy: policy(1, time.Minute), Lockout: lo}); err == nil || !strings.Contains(err.Error(), "lockout") {
			t.Errorf("lockout %v: %v, want refused", lo, err)
		}
	}
	if _, err := s.Register(backend.LimitConfig{Name: t.Name(), Algorithm: algorithms.NameGCRA, Policy: policy(1000, time.Minute), Lease: 5, Lockout: loginSteps}); err == nil || !strings.Contains(err.Error(), "lockout cannot be used with lease") {
		t.Errorf("lockout with lease: %v, want refused", err)
	}
}

// BenchmarkLockoutScript is what lockout adds to a decision in Redis:
// the record's GET (and, on the denial that starts a lock-out, its SET),
// against the same zone without lockout; one call per decision, no cache.
//
//	go test -run '^$' -bench LockoutScript -benchmem ./backend/redis/
func BenchmarkLockoutScript(b *testing.B) {
	for _, denied := range []bool{false, true} {
		for _, lo := range []backend.Lockout{nil, loginSteps} {
			name := map[bool]string{false: "allowed", true: "denied"}[denied] + map[bool]string{false: "/plain", true: "/lockout"}[lo != nil]
			b.Run(name, func(b *testing.B) {
				c := standaloneClient(b)
				s, err := New(c, Options{KeyPrefix: uniquePrefix(b), Timeout: 10 * time.Second, NoCache: true, NoBatch: true})
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { s.Close() })
				p := policy(1_000_000, 1_000_000*time.Second)
				if denied {
					p = policy(1, time.Hour)
				}
				z, err := s.Register(backend.LimitConfig{Name: "bench", Algorithm: algorithms.NameTokenBucket, Policy: p, Lockout: lo})
				if err != nil {
					b.Fatal(err)
				}
				ctx := context.Background()
				reqs := []backend.Request{{Limit: z, Key: "10.0.0.1", Cost: 1}}
				out := make([]algorithms.Result, 1)
				for range 2 { // the script is loaded, the key exists (and is locked out)
					if _, err := s.Decide(ctx, reqs, out); err != nil {
						b.Fatal(err)
					}
				}
				calls0, usec0 := commandStats(b, c)
				b.ReportAllocs()
				b.ResetTimer()
				for b.Loop() {
					if _, err := s.Decide(ctx, reqs, out); err != nil {
						b.Fatal(err)
					}
				}
				b.StopTimer()
				if calls1, usec1 := commandStats(b, c); calls1 > calls0 {
					b.ReportMetric((usec1-usec0)/(calls1-calls0), "server_µs/call")
				}
			})
		}
	}
}

// An operator's reset through one instance reaches the others within
// lockoutTrust, although their caches remember the lock-out's denial, which
// would last a day.
func TestLockoutResetReachesOtherInstances(t *testing.T) {
	client := standaloneClient(t)
	prefix := uniquePrefix(t)
	clock := t0
	now := func() int64 { return clock }
	cfg := backend.LimitConfig{Name: "login", Algorithm: algorithms.NameTokenBucket, Policy: policy(1, time.Hour), Lockout: backend.Lockout{24 * hour}}
	var stores [2]*Store
	var zones [2]backend.Limit
	for i := range stores {
		s, err := New(client, Options{KeyPrefix: prefix, Timeout: 10 * time.Second, now: now, ttlExtra: 3_600_000})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		if zones[i], err = s.Register(cfg); err != nil {
			t.Fatal(err)
		}
		stores[i] = s
	}
	decide := func(i int) algorithms.Result {
		t.Helper()
		out := make([]algorithms.Result, 1)
		if _, err := stores[i].Decide(context.Background(), []backend.Request{{Limit: zones[i], Key: "k", Cost: 1}}, out); err != nil {
			t.Fatal(err)
		}
		return out[0]
	}
	decide(0)
	if r := decide(0); r.RetryAfter != 24*hour {
		t.Fatalf("%+v, want locked out for 24h", r)
	}
	if r := decide(0); r.Allowed { // answered by the cache
		t.Fatalf("%+v", r)
	}
	if err := stores[1].Reset(context.Background(), zones[1], "k"); err != nil {
		t.Fatal(err)
	}
	clock += lockoutTrust
	if r := decide(0); !r.Allowed {
		t.Fatalf("a second after another instance's reset: %+v, want allowed", r)
	}
}
