package redis

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/sluicehq/sluice/backend"
)

// slotStores makes n stores over their own clients of the same Redis and
// key prefix: n instances of a fleet.
func slotStores(t *testing.T, n int, client func(t testing.TB) goredis.UniversalClient) []*Store {
	t.Helper()
	prefix := uniquePrefix(t)
	stores := make([]*Store, n)
	for i := range stores {
		s, err := New(client(t), Options{KeyPrefix: prefix, Timeout: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		stores[i] = s
	}
	return stores
}

func standaloneU(t testing.TB) goredis.UniversalClient { return standaloneClient(t) }
func clusterU(t testing.TB) goredis.UniversalClient    { return clusterClient(t) }

func mustSlots(t testing.TB, s *Store, name string, limit int64, ttl time.Duration) backend.Slots {
	t.Helper()
	z, err := s.RegisterSlots(backend.SlotConfig{Name: name, Limit: limit, TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	return z
}

// Goroutines of several stores hold slots of one key for a moment each:
// never more than the limit at once, across the stores, and every slot
// freed afterwards.
func testSlotsCap(t *testing.T, client func(t testing.TB) goredis.UniversalClient) {
	stores := slotStores(t, 2, client)
	const limit = 4
	zs := []backend.Slots{mustSlots(t, stores[0], "cap", limit, 30*time.Second), mustSlots(t, stores[1], "cap", limit, 30*time.Second)}
	var now, peak, got, refused atomic.Int64
	var wg sync.WaitGroup
	for g := range 40 {
		wg.Go(func() {
			z := zs[g%2]
			for range 10 {
				id, err := z.Acquire(context.Background(), "k")
				if err != nil {
					t.Error(err)
					return
				}
				if id == "" {
					refused.Add(1)
					continue
				}
				got.Add(1)
				n := now.Add(1)
				for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
				}
				time.Sleep(time.Millisecond)
				now.Add(-1)
				if err := z.Release(context.Background(), "k", id); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	if peak.Load() > limit || refused.Load() == 0 || got.Load() < limit {
		t.Fatalf("peak %d held at once (limit %d), %d taken, %d refused", peak.Load(), limit, got.Load(), refused.Load())
	}
	for i := range limit {
		if id, err := zs[i%2].Acquire(context.Background(), "k"); err != nil || id == "" {
			t.Fatalf("slot %d after every release: %q %v", i, id, err)
		}
	}
	if id, _ := zs[0].Acquire(context.Background(), "k"); id != "" {
		t.Fatal("a slot beyond the limit")
	}
}

func TestSlotsCapStandalone(t *testing.T) { testSlotsCap(t, standaloneU) }
func TestSlotsCapCluster(t *testing.T)    { testSlotsCap(t, clusterU) }

// Keys of different hash slots each have their own slots, on the same
// node as the key's rate state: the set is tagged by the client's key.
func TestSlotsKeysCluster(t *testing.T) {
	stores := slotStores(t, 1, clusterU)
	z := mustSlots(t, stores[0], "keys", 1, 30*time.Second)
	for _, k := range []string{"a", "b", "c", "d", "203.0.113.7", "", "}x"} {
		id, err := z.Acquire(context.Background(), k)
		if err != nil || id == "" {
			t.Fatalf("key %s: %q %v", k, id, err)
		}
		set := clientKey(z.(*slotZone).prefix, k)
		if slotOf(set) != slotOf(clientKey(zonePrefix(stores[0].prefix, "keys", "", kindBucket), k)) {
			t.Fatalf("the slots of %s live in another cluster slot than its rate state", k)
		}
		if n, err := stores[0].client.ZCard(context.Background(), set).Result(); err != nil || n != 1 {
			t.Fatalf("set %s holds %d, %v", set, n, err)
		}
	}
}

// A store that stops renewing (its instance died) leaves its slots taken
// for the TTL and no longer: another store gets the slot then.
func TestSlotsOfADeadInstanceExpire(t *testing.T) {
	stores := slotStores(t, 2, standaloneU)
	const ttl = time.Second
	dead, live := mustSlots(t, stores[0], "dead", 1, ttl), mustSlots(t, stores[1], "dead", 1, ttl)
	// From before the slot was taken: its TTL runs from then at the
	// earliest, however late a loaded machine gets to the death.
	start := time.Now()
	if id, err := dead.Acquire(context.Background(), "k"); err != nil || id == "" {
		t.Fatal(id, err)
	}
	// Death: no release, and the renewals stop.
	stores[0].client.Close()
	for {
		id, err := live.Acquire(context.Background(), "k")
		if err != nil {
			t.Fatal(err)
		}
		if id != "" {
			break
		}
		if time.Since(start) > 5*ttl {
			t.Fatal("the dead instance's slot never expired")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if waited := time.Since(start); waited < ttl/2 {
		t.Fatalf("the slot was free after %v, before its TTL of %v", waited, ttl)
	}
}

// A slot held past several TTLs by a live store is renewed: nobody else
// gets it until it is released.
func TestSlotsRenewedWhileHeld(t *testing.T) {
	stores := slotStores(t, 2, standaloneU)
	const ttl = time.Second
	holder, other := mustSlots(t, stores[0], "renew", 1, ttl), mustSlots(t, stores[1], "renew", 1, ttl)
	id, err := holder.Acquire(context.Background(), "k")
	if err != nil || id == "" {
		t.Fatal(id, err)
	}
	deadline := time.Now().Add(3 * ttl)
	for time.Now().Before(deadline) {
		if got, err := other.Acquire(context.Background(), "k"); err != nil || got != "" {
			t.Fatalf("a slot held by a live store was taken by another: %q %v", got, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := holder.Release(context.Background(), "k", id); err != nil {
		t.Fatal(err)
	}
	if got, err := other.Acquire(context.Background(), "k"); err != nil || got == "" {
		t.Fatalf("after the release: %q %v", got, err)
	}
	// The renewing goroutine ends once nothing is held.
	if err := other.Release(context.Background(), "k", "no such id"); err != nil {
		t.Fatal(err)
	}
	stores[0].slots.mu.Lock()
	held := len(stores[0].slots.sets)
	stores[0].slots.mu.Unlock()
	if held != 0 {
		t.Fatalf("%d sets still renewed after the release", held)
	}
}

// A renewal never brings back a slot that was released: the set holds only
// what is in flight.
func TestSlotsReleaseBeatsRenewal(t *testing.T) {
	stores := slotStores(t, 1, standaloneU)
	z := mustSlots(t, stores[0], "race", 2, time.Second).(*slotZone)
	id, _ := z.Acquire(context.Background(), "k")
	set := z.prefix + "k}"
	if err := z.Release(context.Background(), "k", id); err != nil {
		t.Fatal(err)
	}
	// A renewal sent with the old id, as if it had been snapshotted just
	// before the release.
	if err := renew([]renewal{{z: z, set: set, ids: []any{z.ttlMs, id}}}); err != nil {
		t.Fatal(err)
	}
	if n, _ := stores[0].client.ZCard(context.Background(), set).Result(); n != 0 {
		t.Fatalf("the released slot came back: %d held", n)
	}
}

// Through the module, a Redis that does not answer is unavailable (the
// handler then applies the limit's fail policy), and opens the breaker.
func TestSlotsUnavailable(t *testing.T) {
	client := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { client.Close() })
	s, err := New(client, Options{Timeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	m := &Module{Store: s, breaker: newBreaker(zap.NewNop(), time.Minute)}
	z, err := m.RegisterSlots(backend.SlotConfig{Name: "down", Limit: 1, TTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	for i := range breakerTrips + 1 {
		id, err := z.Acquire(context.Background(), "k")
		if id != "" || !errors.Is(err, backend.ErrUnavailable) {
			t.Fatalf("call %d: %q %v, want unavailable", i, id, err)
		}
	}
	var ue *backend.UnavailableError
	if _, err := z.Acquire(context.Background(), "k"); !errors.As(err, &ue) || ue.RetryAfter == 0 {
		t.Fatalf("after %d failures: %v, want the open breaker's retry time", breakerTrips, err)
	}
}

func TestSlotsConfig(t *testing.T) {
	s := newStore(t, standaloneClient(t))
	for _, cfg := range []backend.SlotConfig{{Name: "a", Limit: 0, TTL: time.Second}, {Name: "a", Limit: 1, TTL: time.Millisecond}, {Name: "a", Limit: 1, TTL: 2 * time.Hour}} {
		if _, err := s.RegisterSlots(cfg); err == nil {
			t.Fatalf("%+v accepted", cfg)
		}
	}
}

// BenchmarkSlotAcquireRelease takes a slot of one of 1,000 keys and frees
// it: two round trips to Redis, from one goroutine per CPU, then from 64
// (requests in flight at once).
func BenchmarkSlotAcquireRelease(b *testing.B) {
	for _, par := range []int{1, 32} {
		b.Run("goroutines_per_cpu_"+strconv.Itoa(par), func(b *testing.B) {
			b.SetParallelism(par)
			benchSlots(b)
		})
	}
}

func benchSlots(b *testing.B) {
	s := newStore(b, standaloneClient(b))
	z := mustSlots(b, s, "bench", 1000, 30*time.Second)
	keys := make([]string, 1000)
	for i := range keys {
		keys[i] = "k" + string(rune('a'+i%26)) + string(rune('a'+i/26%26))
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			k := keys[i%len(keys)]
			i++
			id, err := z.Acquire(context.Background(), k)
			if err != nil || id == "" {
				b.Fatal(id, err)
			}
			if err := z.Release(context.Background(), k, id); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// slotsACL is what docs/redis.md adds to the least ACL of a Sluice user
// for concurrency slots.
const slotsACL = "+zadd +zrem +zremrangebyscore +zcard"

// An ACL user with the documented rights takes, renews and frees slots.
func TestSlotsACLUser(t *testing.T) {
	addr := standalone(t)
	admin := goredis.NewClient(&goredis.Options{Addr: addr})
	t.Cleanup(func() { admin.Close() })
	prefix := uniquePrefix(t)
	args := []any{"ACL", "SETUSER", "slots-user", "reset", "on", ">slots-pass", "~" + prefix + "*", "resetchannels", "-@all", "+evalsha", "+eval", "+time", "+pexpire", "+client|setname"}
	for _, f := range strings.Fields(slotsACL) {
		args = append(args, f)
	}
	if err := admin.Do(context.Background(), args...).Err(); err != nil {
		t.Fatal(err)
	}
	client := goredis.NewClient(&goredis.Options{Addr: addr, Username: "slots-user", Password: "slots-pass", ContextTimeoutEnabled: true})
	t.Cleanup(func() { client.Close() })
	s, err := New(client, Options{KeyPrefix: prefix, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	z := mustSlots(t, s, "acl", 1, time.Second).(*slotZone)
	id, err := z.Acquire(context.Background(), "k")
	if err != nil || id == "" {
		t.Fatalf("acquire: %q %v", id, err)
	}
	if err := renew([]renewal{{z: z, set: z.prefix + "k}", ids: []any{z.ttlMs, id}}}); err != nil {
		t.Fatalf("renew: %v", err)
	}
	if err := z.Release(context.Background(), "k", id); err != nil {
		t.Fatalf("release: %v", err)
	}
}

// A slot of a short TTL taken while the store sleeps for a long one is
// still renewed in time.
func TestSlotsShorterTTLRenewedInTime(t *testing.T) {
	stores := slotStores(t, 2, standaloneU)
	long := mustSlots(t, stores[0], "long", 1, time.Hour)
	short, other := mustSlots(t, stores[0], "short", 1, time.Second), mustSlots(t, stores[1], "short", 1, time.Second)
	if id, err := long.Acquire(context.Background(), "k"); err != nil || id == "" {
		t.Fatal(id, err)
	}
	if id, err := short.Acquire(context.Background(), "k"); err != nil || id == "" {
		t.Fatal(id, err)
	}
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		if got, err := other.Acquire(context.Background(), "k"); err != nil || got != "" {
			t.Fatalf("the slot of a live store expired: it was renewed on the 1h slot's schedule")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// On a cluster, the renewals of sets in different hash slots (one
// pipeline, split by node) all arrive: no slot held by a live store
// expires.
func TestSlotsRenewedCluster(t *testing.T) {
	stores := slotStores(t, 2, clusterU)
	holder, other := mustSlots(t, stores[0], "renewc", 1, time.Second), mustSlots(t, stores[1], "renewc", 1, time.Second)
	keys := []string{"a", "b", "c", "d", "e", "f"}
	for _, k := range keys {
		if id, err := holder.Acquire(context.Background(), k); err != nil || id == "" {
			t.Fatal(k, id, err)
		}
	}
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		for _, k := range keys {
			if got, err := other.Acquire(context.Background(), k); err != nil || got != "" {
				t.Fatalf("key %s: a slot held by a live store was taken by another: %q %v", k, got, err)
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// The renewing goroutine runs only while slots are held.
func TestSlotsRenewerStops(t *testing.T) {
	stores := slotStores(t, 1, standaloneU)
	z := mustSlots(t, stores[0], "stop", 1, time.Second)
	id, _ := z.Acquire(context.Background(), "k")
	running := func() bool {
		stores[0].slots.mu.Lock()
		defer stores[0].slots.mu.Unlock()
		return stores[0].slots.running
	}
	if !running() {
		t.Fatal("no renewing goroutine while a slot is held")
	}
	if err := z.Release(context.Background(), "k", id); err != nil {
		t.Fatal(err)
	}
	// It looks again a third of the TTL later, and ends.
	deadline := time.Now().Add(2 * time.Second)
	for running() {
		if time.Now().After(deadline) {
			t.Fatal("the renewing goroutine outlived the last slot")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// After SCRIPT FLUSH (a restart, a failover), taking and renewing slots
// send the scripts' source once and go on.
func TestSlotsNoScriptRecovers(t *testing.T) {
	stores := slotStores(t, 1, standaloneU)
	z := mustSlots(t, stores[0], "flush", 2, time.Second).(*slotZone)
	if err := stores[0].client.ScriptFlush(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	id, err := z.Acquire(context.Background(), "k")
	if err != nil || id == "" {
		t.Fatalf("acquire after SCRIPT FLUSH: %q %v", id, err)
	}
	if err := stores[0].client.ScriptFlush(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	before, _ := stores[0].client.ZScore(context.Background(), z.prefix+"k}", id).Result()
	time.Sleep(5 * time.Millisecond) // so that the renewed expiry is a later millisecond
	if err := renew([]renewal{{z: z, set: z.prefix + "k}", ids: []any{z.ttlMs, id}}}); err != nil {
		t.Fatalf("renew after SCRIPT FLUSH: %v", err)
	}
	if score, err := stores[0].client.ZScore(context.Background(), z.prefix+"k}", id).Result(); err != nil || score <= before {
		t.Fatalf("the slot's expiry after its renewal: %v (before %v) %v", score, before, err)
	}
}

// A release that fails (Redis away, the breaker open) is tried again in
// the background: the slot is freed once Redis answers, long before its
// TTL, and the goroutine then ends.
func TestSlotsFailedReleaseRetried(t *testing.T) {
	stores := slotStores(t, 1, standaloneU)
	var down atomic.Bool
	z, err := stores[0].registerSlots(backend.SlotConfig{Name: "unfreed", Limit: 1, TTL: time.Minute},
		func(_ context.Context, call func() (bool, error)) (bool, error) {
			if down.Load() {
				return false, errors.New("redis away")
			}
			return call()
		})
	if err != nil {
		t.Fatal(err)
	}
	id, err := z.Acquire(context.Background(), "k")
	if err != nil || id == "" {
		t.Fatalf("acquire: %q %v", id, err)
	}
	down.Store(true)
	if err := z.Release(context.Background(), "k", id); err == nil {
		t.Fatal("a release through a failing Redis succeeded")
	}
	set := z.prefix + "k}"
	if n, _ := stores[0].client.ZCard(context.Background(), set).Result(); n != 1 {
		t.Fatalf("%d slots held after the failed release, want 1", n)
	}
	down.Store(false)
	h := &stores[0].slots
	deadline := time.Now().Add(5 * time.Second) // the retry comes within slotReleaseRetry; the TTL is a minute
	for {
		n, _ := stores[0].client.ZCard(context.Background(), set).Result()
		h.mu.Lock()
		running := h.running
		h.mu.Unlock()
		if n == 0 && !running {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("5 s after Redis came back: %d slots held, renewer running %v", n, running)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if id, _ := z.Acquire(context.Background(), "k"); id == "" {
		t.Fatal("the freed slot cannot be taken")
	}
}
