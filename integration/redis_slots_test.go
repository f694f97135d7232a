package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/redistest"
)

// adaptiveLimit reads the adaptive limit of the instance's zone from its admin API.
func (in *slotInstance) adaptiveLimit(t *testing.T, zone string) int64 {
	t.Helper()
	resp, err := http.Get(in.admin + "/rate_limit/zones")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var listing struct {
		Zones []struct {
			Name   string `json:"name"`
			Limits []struct {
				Adaptive *adaptiveState `json:"adaptive"`
			} `json:"limits"`
		} `json:"zones"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&listing); err != nil {
		t.Fatal(err)
	}
	for _, z := range listing.Zones {
		for _, l := range z.Limits {
			if z.Name == zone && l.Adaptive != nil {
				return l.Adaptive.Limit
			}
		}
	}
	t.Fatalf("%s: zone %q has no adaptive limit", in.admin, zone)
	return 0
}

// Concurrency slots shared through Redis by Caddy instances built from
// cmd/caddy: the cap holds for the fleet, and the slots of an instance
// killed mid-request come free after slot_ttl.

// slotInstance is one Caddy process of a slot test.
type slotInstance struct {
	base, admin string // http://127.0.0.1:port of its site and of its admin API
	cmd         *exec.Cmd
}

// startSlotInstance runs the binary on a site whose rate_limit zone is
// zone (with options), backed by the Redis at addr (or by the options of
// a redis backend, when addr holds spaces), in front of upstream.
func startSlotInstance(t *testing.T, addr, zone, options, upstream string) *slotInstance {
	t.Helper()
	admin, port := freePort(t), freePort(t)
	cfg := fleetGlobals("") + fmt.Sprintf(`http://127.0.0.1:%d {
	handle /up {
		respond ok
	}
	handle {
		rate_limit {
			%s
			zone %s {
				%s
			}
		}
		reverse_proxy %s
	}
}
`, port, redisBackend(3, strings.Split("address "+addr, "\n")...), zone, options, strings.TrimPrefix(upstream, "http://"))
	cfg = strings.NewReplacer("@ADMIN@", strconv.Itoa(admin), "@HTTP@", strconv.Itoa(port)).Replace(cfg)
	dir := t.TempDir()
	file := filepath.Join(dir, "Caddyfile")
	if err := os.WriteFile(file, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := startCaddy(t, file, "XDG_DATA_HOME="+dir, "XDG_CONFIG_HOME="+dir)
	base := "http://127.0.0.1:" + strconv.Itoa(port)
	waitUp(t, base+"/up")
	return &slotInstance{base: base, admin: "http://127.0.0.1:" + strconv.Itoa(admin), cmd: cmd}
}

var slotClient = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 200, MaxConnsPerHost: 200}, Timeout: 60 * time.Second}

// 200 clients split over two instances that share one Redis: the upstream
// never serves more than the cap at once, and every client is served from
// the queue.
func TestRedisSlotsCapAcrossInstances(t *testing.T) {
	redis := redistest.Standalone(t, "")
	u := newCountingUpstream(t, func(*http.Request) { time.Sleep(20 * time.Millisecond) })
	const limit = 5
	opts := fmt.Sprintf("key static\n\t\t\t\tconcurrency %d\n\t\t\t\tqueue 30s", limit)
	a := startSlotInstance(t, redis.Addr, "rslots_cap", opts, u.URL)
	b := startSlotInstance(t, redis.Addr, "rslots_cap", opts, u.URL)
	const clients = 200
	var wg sync.WaitGroup
	var ok atomic.Int64
	codes := make(chan int, clients)
	start := time.Now()
	for i := range clients {
		base := a.base
		if i%2 == 1 {
			base = b.base
		}
		wg.Go(func() {
			code := status(context.Background(), base)
			if code == http.StatusOK {
				ok.Add(1)
			}
			codes <- code
		})
	}
	wg.Wait()
	close(codes)
	if peak := u.peak.Load(); peak > limit || peak < 2 {
		t.Fatalf("the upstream served %d requests at once, want at most %d (and more than one instance's worth used)", peak, limit)
	}
	if ok.Load() != clients {
		other := map[int]int{}
		for c := range codes {
			other[c]++
		}
		t.Fatalf("%d of %d clients served: %v", ok.Load(), clients, other)
	}
	t.Logf("peak in flight at the upstream: %d of %d, 200 clients over two instances in %v", u.peak.Load(), limit, time.Since(start).Round(time.Millisecond))
}

// An instance killed (SIGKILL) while holding the only slot leaves it taken
// until slot_ttl, then another instance gets it. A slot held longer than
// slot_ttl by a live instance is renewed, not lost.
func TestRedisSlotsKilledInstanceExpire(t *testing.T) {
	redis := redistest.Standalone(t, "")
	arrived := make(chan struct{}, 2)
	u := newCountingUpstream(t, func(r *http.Request) {
		if r.Header.Get("X-Hang") != "" {
			arrived <- struct{}{}
			<-r.Context().Done()
		}
	})
	const ttl = 2 * time.Second
	opts := "key static\n\t\t\t\tconcurrency 1\n\t\t\t\tslot_ttl 2s"
	a := startSlotInstance(t, redis.Addr, "rslots_kill", opts, u.URL)
	b := startSlotInstance(t, redis.Addr, "rslots_kill", opts, u.URL)
	go status(context.Background(), a.base, "X-Hang", "1")
	within(t, arrived, "the request held on instance a")

	// Live and holding: renewed past twice the TTL.
	for end := time.Now().Add(2 * ttl); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if code := status(context.Background(), b.base); code != http.StatusServiceUnavailable {
			t.Fatalf("instance b got %d while a holds the only slot (held %v), want 503", code, 2*ttl)
		}
	}

	if err := a.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	if code := status(context.Background(), b.base); code != http.StatusServiceUnavailable {
		t.Fatalf("right after the kill, instance b got %d, want 503 (the slot lasts until slot_ttl)", code)
	}
	for {
		// A request sent before the slot expired may be answered after,
		// later still on a loaded machine: the one that counts is the
		// last sent.
		sent := time.Since(killed)
		code := status(context.Background(), b.base)
		if code == http.StatusOK {
			break
		}
		if code != http.StatusServiceUnavailable {
			t.Fatalf("instance b got %d", code)
		}
		if sent > ttl+time.Second {
			t.Fatalf("the killed instance's slot still held %v after the kill (slot_ttl %v)", sent, ttl)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("the killed instance's slot came free %v after SIGKILL (slot_ttl %v, renewed every %v)", time.Since(killed).Round(10*time.Millisecond), ttl, ttl/3)
}

// On one instance, requests waiting for a slot shared through Redis leave
// the line in the order they arrived.
func TestRedisSlotsQueueOrder(t *testing.T) {
	redis := redistest.Standalone(t, "")
	expectQueueOrder(t, func(u *countingUpstream) {
		newTester(t, caddyfileServer(fmt.Sprintf(`
	rate_limit {
		backend redis {
			address %s
			timeout 2s
		}
		zone rslots_order {
			key static
			concurrency 1
			queue 30s
		}
	}
	reverse_proxy %s`, redis.Addr, strings.TrimPrefix(u.URL, "http://"))), "caddyfile")
	})
}

// expectQueueOrder loads a site of concurrency 1 with a queue in front of
// the upstream it is given, holds one request there, sends five more, each
// once the one before is in line, and requires the upstream to get them in that order, one at a time.
func expectQueueOrder(t *testing.T, load func(u *countingUpstream)) {
	t.Helper()
	release := make(chan struct{})
	var mu sync.Mutex
	var order []int
	arrived := make(chan struct{}, 10)
	u := newCountingUpstream(t, func(r *http.Request) {
		n, _ := strconv.Atoi(r.Header.Get("X-N"))
		mu.Lock()
		order = append(order, n)
		mu.Unlock()
		arrived <- struct{}{}
		<-release
	})
	load(u)
	var wg sync.WaitGroup
	send := func(n int) {
		wg.Go(func() {
			if resp, err := get(context.Background(), "X-N", strconv.Itoa(n)); err != nil || resp.StatusCode != http.StatusOK {
				t.Errorf("request %d: %v %v", n, resp, err)
			}
		})
	}
	send(0)
	within(t, arrived, "the first request")
	for n := 1; n <= 5; n++ {
		send(n)
		waitInLine(t, n, fmt.Sprintf("request %d", n))
	}
	for range 5 {
		release <- struct{}{}
		within(t, arrived, "the next in line")
	}
	release <- struct{}{}
	wg.Wait()
	if peak := u.peak.Load(); peak != 1 {
		t.Fatalf("the upstream served %d requests at once, want 1", peak)
	}
	if fmt.Sprint(order) != "[0 1 2 3 4 5]" {
		t.Fatalf("the upstream got the requests in order %v, want arrival order [0 1 2 3 4 5]", order)
	}
}

// slot_ttl and Redis: the options are accepted there and refused where
// they would do nothing.
func TestRedisSlotsConfig(t *testing.T) {
	redis := redistest.Standalone(t, "")
	for cfg, want := range map[string]string{
		"key static\n\t\t\tconcurrency 2\n\t\t\tslot_ttl 10s":                "slot_ttl: on the memory backend",
		"key static\n\t\t\tconcurrency 2\n\t\t\tslot_ttl 10ms":               "slot_ttl must be from 1s to 1h",
		"key static\n\t\t\tconcurrency 2\n\t\t\tqueue_max 3":                 "queue_max would do nothing without queue",
		"key static\n\t\t\tconcurrency 2\n\t\t\tqueue 1s\n\t\t\tqueue_max 0": "queue_max",
	} {
		assertLoadError(t, caddyfileServer(`
	rate_limit {
		zone rslots_bad {
			`+cfg+`
		}
	}
	respond "ok"`), "caddyfile", want)
	}
	newTester(t, caddyfileServer(fmt.Sprintf(`
	rate_limit {
		backend redis {
			address %s
			timeout 2s
		}
		zone rslots_ok {
			key static
			concurrency 2
			slot_ttl 10s
			queue 1s
			queue_max 5
		}
	}
	respond "ok"`, redis.Addr)), "caddyfile")
	if code := status(context.Background(), httpBase); code != http.StatusOK {
		t.Fatalf("a request under the Redis-shared cap got %d", code)
	}
}

// With Redis unreachable, a concurrency limit follows its fail policy:
// open admits (holding no slot), closed answers 503 backend_unavailable.
func TestRedisSlotsFailPolicy(t *testing.T) {
	newTester(t, caddyfileServer(fmt.Sprintf(`
	rate_limit {
		backend redis {
			address 127.0.0.1:%d
			timeout 50ms
		}
		zone rslots_fail_open {
			match path /open
			key static
			concurrency 1
			fail open
		}
		zone rslots_fail_closed {
			match path /closed
			key static
			concurrency 1
			fail closed
		}
	}
	respond "ok"`, freePort(t))), "caddyfile")
	for path, want := range map[string]int{"/open": http.StatusOK, "/closed": http.StatusServiceUnavailable} {
		req, _ := http.NewRequest(http.MethodGet, httpBase+path, nil)
		resp, err := slotClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Fatalf("%s with Redis down: %d, want %d", path, resp.StatusCode, want)
		}
	}
	metrics := adminRequest(t, "GET", "/metrics", "", "")
	for _, want := range []string{
		`caddy_rate_limit_refused_requests_total{reason="backend_unavailable",zone="rslots_fail_closed"} 1`,
		`caddy_rate_limit_backend_failures_total{policy="open",scope="",zone="rslots_fail_open"} 1`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

// Each tier's concurrency is shared through Redis like any other: the
// free tier's 2 slots of a key are taken, the pro tier's are its own.
func TestRedisSlotsTiers(t *testing.T) {
	redis := redistest.Standalone(t, "")
	u, arrived, release := holdingUpstream(t)
	newTester(t, caddyfileServer(fmt.Sprintf(`
	rate_limit {
		backend redis {
			address %s
			timeout 2s
		}
		zone rslots_tiers {
			by header X-Key
			tier {http.request.header.X-Plan}
			tiers {
				free 1000/1m concurrency 2
				pro 1000/1m concurrency 3
				default free
			}
		}
	}
	reverse_proxy %s`, redis.Addr, strings.TrimPrefix(u.URL, "http://"))), "caddyfile")
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() { status(context.Background(), httpBase, "X-Key", "k", "X-Hang", "1") })
		within(t, arrived, "a held request of the free tier")
	}
	if code := status(context.Background(), httpBase, "X-Key", "k"); code != http.StatusServiceUnavailable {
		t.Fatalf("a third request of the free tier got %d, want 503", code)
	}
	if code := status(context.Background(), httpBase, "X-Key", "k", "X-Plan", "pro"); code != http.StatusOK {
		t.Fatalf("the same key on the pro tier got %d, want 200 (its own slots)", code)
	}
	close(release)
	wg.Wait()
}

// A client that goes away frees its slot in Redis for the next request.
func TestRedisSlotsDisconnectFreesSlot(t *testing.T) {
	redis := redistest.Standalone(t, "")
	arrived := make(chan struct{}, 1)
	u := newCountingUpstream(t, func(r *http.Request) {
		if r.Header.Get("X-Hang") != "" {
			arrived <- struct{}{}
			<-r.Context().Done()
		}
	})
	newTester(t, caddyfileServer(fmt.Sprintf(`
	rate_limit {
		backend redis {
			address %s
			timeout 2s
		}
		zone rslots_gone {
			key static
			concurrency 1
		}
	}
	reverse_proxy %s`, redis.Addr, strings.TrimPrefix(u.URL, "http://"))), "caddyfile")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	var first atomic.Int64
	go func() {
		first.Store(int64(status(ctx, httpBase, "X-Hang", "1")))
		close(done)
	}()
	select {
	case <-arrived:
	case <-done: // say why, rather than wait for an arrival that cannot come
		t.Fatalf("the hanging request was answered %d (0: no answer) before it reached the upstream", first.Load())
	case <-time.After(30 * time.Second):
		t.Fatal("the hanging request never reached the upstream")
	}
	if code := status(context.Background(), httpBase); code != http.StatusServiceUnavailable {
		t.Fatalf("a second request while the slot is held: %d, want 503", code)
	}
	cancel()
	within(t, done, "the client that left")
	eventuallyOK(t, "the slot of a client that left was never freed in Redis")
}
