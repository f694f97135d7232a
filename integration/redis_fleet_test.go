package integration

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice/internal/redistest"
)

// A fleet: three Caddy processes built from cmd/caddy, each on its own
// loopback ports, sharing one Redis. Every algorithm must admit exactly
// its limit in total, however the requests spread over the instances.

const (
	fleetSize    = 3
	fleetClients = 64
	fleetLimit   = 100
	// 3 × the limit: a store that limits each instance on its own admits
	// all of them, so the test tells the two apart.
	fleetRequests = fleetSize * fleetLimit
	// fleetQueueRequests floods the queue of five places: enough to fill
	// it many times over, few enough to end within its first slot.
	fleetQueueRequests = 40
)

var fleetAlgorithms = []string{"sliding_window", "sliding_window_counter", "fixed_window", "token_bucket", "gcra", "leaky_bucket"}

// fleetSite is a site with one route per algorithm: /<algorithm> is
// limited by a zone of that name, one key for every client, 100 per 10
// minutes. backend, when not empty, is each handler's own backend; more
// is added to the site (more routes).
func fleetSite(algorithms []string, backend, more string) string {
	var b strings.Builder
	// /up goes through the backend too, so that each instance has
	// connected to Redis before a flood.
	b.WriteString("http://127.0.0.1:@HTTP@ {\n" + fleetRoute("/up", backend, "fleet_up", "key up\n\t\t\t\trate 1000000/1s"))
	for _, a := range algorithms {
		b.WriteString(fleetRoute("/"+a, backend, "fleet_"+a, "key one\n\t\t\t\trate 100/10m\n\t\t\t\talgorithm "+a))
	}
	b.WriteString(more + "}\n")
	return b.String()
}

// fleetRoute limits path by one zone; backend, when not empty, is the
// handler's own backend line.
func fleetRoute(path, backend, zone, options string) string {
	return fmt.Sprintf("\thandle %s {\n\t\trate_limit {\n\t\t\t%s\n\t\t\tzone %s {\n\t\t\t\t%s\n\t\t\t}\n\t\t}\n\t\trespond ok\n\t}\n",
		path, backend, zone, options)
}

// fleetGlobals are the global options of every instance; more goes in
// the options block (a rate_limit default backend, say).
func fleetGlobals(more string) string {
	return "{\n\tadmin 127.0.0.1:@ADMIN@\n\thttp_port @HTTP@\n\tdefault_bind 127.0.0.1\n\tpersist_config off\n\tlog {\n\t\tlevel ERROR\n\t}\n" + more + "}\n"
}

// redisBackend is a `backend redis` block at depth tabs, of options and a
// timeout of 2 s: the fleet tests count admissions on a machine that may
// be busy, where a call can take longer than the default 100 ms (and be
// refused for it).
func redisBackend(depth int, options ...string) string {
	in := strings.Repeat("\t", depth)
	var b strings.Builder
	b.WriteString("backend redis {\n")
	for _, o := range append(options, "timeout 2s") {
		b.WriteString(in + "\t" + o + "\n")
	}
	return b.String() + in + "}"
}

// globalBackend is the global option block that makes a redis backend
// the default of every handler.
func globalBackend(options ...string) string {
	return "\trate_limit {\n\t\t" + redisBackend(2, options...) + "\n\t}\n"
}

type fleet struct {
	bases []string // http://127.0.0.1:port of each instance
}

// startFleet runs n Caddy processes of the Caddyfile cfg, whose @ADMIN@
// and @HTTP@ become each instance's free ports; env is added to their
// environment.
func startFleet(t *testing.T, n int, cfg string, env ...string) *fleet {
	t.Helper()
	f := &fleet{}
	for range n {
		admin, port := freePort(t), freePort(t)
		dir := t.TempDir()
		file := filepath.Join(dir, "Caddyfile")
		text := strings.NewReplacer("@ADMIN@", strconv.Itoa(admin), "@HTTP@", strconv.Itoa(port)).Replace(cfg)
		if err := os.WriteFile(file, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		startCaddy(t, file, append([]string{"XDG_DATA_HOME=" + dir, "XDG_CONFIG_HOME=" + dir}, env...)...)
		base := "http://127.0.0.1:" + strconv.Itoa(port)
		waitUp(t, base+"/up")
		f.bases = append(f.bases, base)
	}
	return f
}

// floodResult counts the answers of a flood.
type floodResult struct {
	admitted, denied int
	perInstance      []int       // admitted by each instance
	perClient        map[int]int // admitted per client
	bodies           []string    // of the admitted requests
	other            map[string]int
	elapsed          time.Duration
}

// flood sends total requests to path from fleetClients concurrent
// clients, request i to instance i mod n; header, when not nil, gives
// the headers of a client's requests.
func (f *fleet) flood(t *testing.T, path string, total int, header func(client int) http.Header) floodResult {
	t.Helper()
	client := &http.Client{
		Timeout:   30 * time.Second,
		Transport: &http.Transport{MaxIdleConnsPerHost: fleetClients, MaxConnsPerHost: fleetClients},
	}
	defer client.CloseIdleConnections()
	res := floodResult{perInstance: make([]int, len(f.bases)), perClient: map[int]int{}, other: map[string]int{}}
	var mu sync.Mutex
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for c := range fleetClients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= total {
					return
				}
				inst := i % len(f.bases)
				req, _ := http.NewRequest("GET", f.bases[inst]+path, nil)
				if header != nil {
					req.Header = header(c)
				}
				resp, err := client.Do(req)
				var body []byte
				if err == nil {
					body, _ = io.ReadAll(resp.Body)
					resp.Body.Close()
				}
				mu.Lock()
				switch {
				case err != nil:
					res.other[err.Error()]++
				case resp.StatusCode == http.StatusOK:
					res.admitted++
					res.perInstance[inst]++
					res.perClient[c]++
					res.bodies = append(res.bodies, string(body))
				case resp.StatusCode == http.StatusTooManyRequests:
					res.denied++
				default:
					res.other[resp.Status]++
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	res.elapsed = time.Since(start)
	return res
}

// expectExactly checks that a flood of fleetRequests admitted exactly the
// limit and answered 429 to the rest, give or take the units a bucket
// refills while the flood lasts: one per refill (0 for a window, whose
// units never come back within the test). A flood on a loaded machine may
// outlast a refill, and then rightly admits one more per refill; on an
// idle one it ends in about a second, and the count is exact. (Which
// instance admitted how many is logged, not checked: whichever instance
// reaches Redis first wins.)
func expectExactly(t *testing.T, r floodResult, refill time.Duration) {
	t.Helper()
	if len(r.other) > 0 {
		t.Fatalf("answers other than 200 and 429: %v", r.other)
	}
	most := fleetLimit
	if refill > 0 {
		most += int(r.elapsed / refill)
	}
	if r.admitted < fleetLimit || r.admitted > most || r.admitted+r.denied != fleetRequests {
		t.Fatalf("admitted %d, denied %d of %d in %v (per instance %v), want exactly %d admitted (%d with the units refilled meanwhile)",
			r.admitted, r.denied, fleetRequests, r.elapsed, r.perInstance, fleetLimit, most)
	}
	t.Logf("admitted %d of %d in %v (per instance %v)", r.admitted, fleetRequests, r.elapsed.Round(time.Millisecond), r.perInstance)
}

// expectLimit floods the route of algorithm a and expects exactly the
// limit through. The windows of fixed_window (and the weights of
// sliding_window_counter) turn at multiples of 10 minutes since the
// epoch, where a flood may rightly pass twice the limit: a flood that
// would start within a second of such an edge waits until it has passed.
func (f *fleet) expectLimit(t *testing.T, a string) {
	t.Helper()
	if a == "fixed_window" || a == "sliding_window_counter" {
		if left := 10*time.Minute - time.Duration(time.Now().UnixNano())%(10*time.Minute); left < time.Second {
			time.Sleep(left + 100*time.Millisecond)
		}
	}
	var refill time.Duration // 100 per 10 minutes: a bucket gives a unit back every 6 s
	if a == "token_bucket" || a == "gcra" || a == "leaky_bucket" {
		refill = 6 * time.Second
	}
	expectExactly(t, f.flood(t, "/"+a, fleetRequests, nil), refill)
}

const fleetPassword = "fleet-secret-7f3a9c"

// Three instances, one standalone Redis with a password, the backend
// given once in the global options with the password from the
// environment: every algorithm admits exactly 100 of 300 requests from 64
// concurrent clients. The same zones on the memory backend admit 100 per
// instance.
func TestRedisFleetStandalone(t *testing.T) {
	redis := redistest.Standalone(t, fleetPassword)
	prefix := fmt.Sprintf("fleet%d:", time.Now().UnixNano())
	cfg := fleetGlobals(globalBackend("address "+redis.Addr, "password {env.REDIS_PASSWORD}", "key_prefix "+prefix)) +
		fleetSite(fleetAlgorithms, "", fleetRoute("/memory", "backend memory", "fleet_memory", "key one\n\t\t\t\trate 100/10m")+
			fleetQueueRoute)

	// The secret stays in the environment: the adapted JSON holds the
	// placeholder, not the password.
	file := filepath.Join(t.TempDir(), "Caddyfile")
	if err := os.WriteFile(file, []byte(strings.NewReplacer("@ADMIN@", "2019", "@HTTP@", "8080").Replace(cfg)), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(binary(t), "adapt", "--config", file)
	cmd.Env = append(os.Environ(), "REDIS_PASSWORD="+fleetPassword)
	out, err := cmd.CombinedOutput()
	if err != nil || strings.Contains(string(out), fleetPassword) || !strings.Contains(string(out), `"password":"{env.REDIS_PASSWORD}"`) {
		t.Fatalf("caddy adapt: %v; want the placeholder and not the password in:\n%s", err, out)
	}

	f := startFleet(t, fleetSize, cfg, "REDIS_PASSWORD="+fleetPassword)
	window := time.Now().Truncate(10 * time.Minute)
	for _, a := range fleetAlgorithms {
		t.Run(a, func(t *testing.T) {
			f.expectLimit(t, a)
		})
	}
	t.Run("leaky_bucket_queue", func(t *testing.T) { expectFleetQueue(t, f) })
	// The control: the memory backend limits each instance on its own.
	t.Run("memory_backend", func(t *testing.T) {
		r := f.flood(t, "/memory", fleetRequests, nil)
		if r.admitted != fleetRequests {
			t.Fatalf("memory backend: admitted %d of %d (per instance %v), want each instance to admit its own %d", r.admitted, fleetRequests, r.perInstance, fleetLimit)
		}
		t.Logf("memory backend: admitted %d of %d (per instance %v)", r.admitted, fleetRequests, r.perInstance)
	})

	// Every key the fleet wrote is under the prefix and expires.
	c := goredis.NewClient(&goredis.Options{Addr: redis.Addr, Password: fleetPassword})
	defer c.Close()
	for _, a := range fleetAlgorithms {
		if a == "fixed_window" && !time.Now().Truncate(10*time.Minute).Equal(window) {
			continue // its 10-minute window ended meanwhile, and its key with it
		}
		keys, err := c.Keys(context.Background(), prefix+"fleet_"+a+"//?{one}").Result()
		if err != nil || len(keys) != 1 {
			t.Fatalf("the key of %s: %v %v, want one", a, keys, err)
		}
		if ttl, err := c.PTTL(context.Background(), keys[0]).Result(); err != nil || ttl <= 0 {
			t.Errorf("key %s has no expiry: %v %v", keys[0], ttl, err)
		}
	}
}

// fleetQueueRoute is a leaky bucket queue of 4 per 4 s (a slot every
// second) where a request waits up to 4 s; it answers with the time it was
// let through. Slots a second apart leave room for a loaded machine: the
// flood must end within one slot, and a release stamped late by a busy
// scheduler must not look like a slot given early.
const fleetQueueRoute = `	handle /queue {
		rate_limit {
			zone fleet_queue {
				key {http.request.header.X-Queue}
				rate 4/4s
				algorithm leaky_bucket
				max_delay 4s
			}
		}
		respond "{time.now.unix_ms}"
	}
`

// expectFleetQueue floods the queue: one request passes at once and four
// wait for the next four slots (4 s ÷ 1 s), whichever instance they
// reached. The flood is short, to end within the first slot where the
// count is exact: fleetQueueRequests, far more than the five that pass. Then six requests, one after the other to each instance in turn:
// five are let through a second apart, by all three instances.
func expectFleetQueue(t *testing.T, f *fleet) {
	queue := func(name string) func(int) http.Header {
		return func(int) http.Header { return http.Header{"X-Queue": {name}} }
	}
	r := f.flood(t, "/queue", fleetQueueRequests, queue("flood"))
	// A flood that outlasts a slot (a loaded machine) rightly finds a
	// place more per slot gone.
	if most := 5 + int(r.elapsed/time.Second); len(r.other) > 0 || r.admitted < 5 || r.admitted > most || r.admitted+r.denied != fleetQueueRequests {
		t.Fatalf("queue: admitted %d, denied %d, other %v in %v (per instance %v), want 5 admitted (%d with the slots gone meanwhile)", r.admitted, r.denied, r.other, r.elapsed, r.perInstance, most)
	}
	gaps := releaseGaps(t, r.bodies)
	t.Logf("queue flood: admitted %d of %d (per instance %v), released %v ms apart", r.admitted, fleetQueueRequests, r.perInstance, gaps)

	// Staggered so that each instance gets a turn; the order of arrival
	// does not change the outcome.
	codes := make([]int, 6)
	bodies := make([]string, 6)
	var wg sync.WaitGroup
	for i := range codes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest("GET", f.bases[i%len(f.bases)]+"/queue", nil)
			req.Header.Set("X-Queue", "turns")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			codes[i], bodies[i] = resp.StatusCode, string(b)
		}()
		time.Sleep(20 * time.Millisecond)
	}
	wg.Wait()
	var admitted []string
	instances := map[int]bool{}
	for i, c := range codes {
		if c == http.StatusOK {
			admitted = append(admitted, bodies[i])
			instances[i%len(f.bases)] = true
		}
	}
	if len(admitted) != 5 || len(instances) != len(f.bases) {
		t.Fatalf("in turns: answers %v, want 5 admitted by all %d instances and one 429", codes, len(f.bases))
	}
	t.Logf("queue in turns: answers %v, released %v ms apart", codes, releaseGaps(t, admitted))
}

// releaseGaps reads the release times (Unix ms) in the bodies and
// requires one slot, 1 s, between each and the next, give or take what a
// loaded machine delays a stamp (a wrong queue gives 0 or 2 s).
func releaseGaps(t *testing.T, bodies []string) []int64 {
	t.Helper()
	var released []int64
	for _, b := range bodies {
		ms, err := strconv.ParseInt(b, 10, 64)
		if err != nil {
			t.Fatalf("body %q", b)
		}
		released = append(released, ms)
	}
	slices.Sort(released)
	var gaps []int64
	for i := 1; i < len(released); i++ {
		gaps = append(gaps, released[i]-released[i-1])
		if gap := gaps[i-1]; gap < 700 || gap > 1300 {
			t.Fatalf("released at %v ms: a gap of %d ms, want 1000 (one slot)", released, gap)
		}
	}
	return gaps
}

// fleetACL is the least a Redis 6+ ACL user needs, as docs/redis.md
// gives it: its keys, the script calls, and the commands the script and
// the client's connection set-up run.
const fleetACL = "on >fleet-user-pass ~sluice:* resetchannels -@all +fcall +function|load +evalsha +eval +time +get +set +getrange +setrange +append +pexpire +pttl +del +client|setname"

// A fleet logs in as an ACL user with only those rights, the credentials
// read from the environment, and shares its limits.
func TestRedisFleetACLUser(t *testing.T) {
	redis := redistest.Standalone(t, "")
	admin := goredis.NewClient(&goredis.Options{Addr: redis.Addr})
	defer admin.Close()
	args := []any{"ACL", "SETUSER", "sluice"}
	for _, f := range strings.Fields(fleetACL) {
		args = append(args, f)
	}
	if err := admin.Do(context.Background(), args...).Err(); err != nil {
		t.Fatal(err)
	}
	if err := admin.Do(context.Background(), "ACL", "SETUSER", "default", "off").Err(); err != nil {
		t.Fatal(err)
	}
	algs := fleetAlgorithms
	cfg := fleetGlobals(globalBackend("address "+redis.Addr, "username {env.REDIS_USER}", "password {env.REDIS_PASSWORD}")) + fleetSite(algs, "", "")
	f := startFleet(t, fleetSize, cfg, "REDIS_USER=sluice", "REDIS_PASSWORD=fleet-user-pass")
	for _, a := range algs {
		t.Run(a, func(t *testing.T) {
			f.expectLimit(t, a)
		})
	}
}

// A fleet that finds its master through Sentinel shares it as well.
func TestRedisFleetSentinel(t *testing.T) {
	_, sentinel := redistest.Sentinel(t, "fleet-master")
	prefix := fmt.Sprintf("fleet%d:", time.Now().UnixNano())
	algs := []string{"sliding_window", "token_bucket"}
	cfg := fleetGlobals(globalBackend("sentinel fleet-master "+sentinel.Addr, "key_prefix "+prefix)) + fleetSite(algs, "", "")
	f := startFleet(t, fleetSize, cfg)
	for _, a := range algs {
		t.Run(a, func(t *testing.T) {
			f.expectLimit(t, a)
		})
	}
}

// 64 clients at once through one Caddy: their decisions are gathered into
// shared script calls (far fewer calls than requests), and each key still
// admits exactly its limit. (A long timeout and fail closed: on a loaded
// machine a timed-out call must show as a failure, not as an admission.)
func TestRedisBatchedDecisions(t *testing.T) {
	addr, c := perfRedis(t)
	tester := newTester(t, caddyfileServerWith(fmt.Sprintf(`	rate_limit {
		backend redis {
			address %s
			local_cache off
			timeout 10s
		}
	}`, addr), `	rate_limit {
		zone batch_exact {
			by header X-Key
			rate 100/1h
			fail closed
		}
	}
	respond "ok"`), "caddyfile")
	const clients, each, keys = 64, 40, 16 // 160 requests per key
	before := scriptCalls(t, c)
	var mu sync.Mutex
	admitted := make(map[string]int)
	var failed []string
	var wg sync.WaitGroup
	for g := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := fmt.Sprintf("k%d", g%keys)
			for range each {
				req, _ := http.NewRequest("GET", httpBase+"/", nil)
				req.Header.Set("X-Key", key)
				resp, err := tester.Client.Do(req)
				if err != nil {
					mu.Lock()
					failed = append(failed, err.Error())
					mu.Unlock()
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				mu.Lock()
				switch resp.StatusCode {
				case http.StatusOK:
					admitted[key]++
				case http.StatusTooManyRequests:
				default:
					failed = append(failed, resp.Status)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(failed) > 0 {
		t.Fatalf("%d requests failed: %v", len(failed), failed[:min(len(failed), 5)])
	}
	for k := range keys {
		if n := admitted[fmt.Sprintf("k%d", k)]; n != 100 {
			t.Errorf("key k%d: %d admitted, want exactly 100", k, n)
		}
	}
	requests := clients * each
	calls := scriptCalls(t, c) - before
	t.Logf("%d requests, %d script calls (%.2f per request)", requests, calls, float64(calls)/float64(requests))
	if calls > requests*3/4 {
		t.Fatalf("%d script calls for %d concurrent requests: decisions are not batched", calls, requests)
	}
}

// perfRedis starts a server of the test's own and returns its address
// and a client to it.
func perfRedis(t *testing.T) (string, *goredis.Client) {
	t.Helper()
	addr := redistest.Standalone(t, "").Addr
	c := goredis.NewClient(&goredis.Options{Addr: addr})
	t.Cleanup(func() { c.Close() })
	return addr, c
}

// scriptCalls is how many times Redis ran the decision script.
func scriptCalls(t *testing.T, c *goredis.Client) int {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, m := range regexp.MustCompile(`cmdstat_(?:eval(?:sha)?|fcall):calls=(\d+)`).FindAllStringSubmatch(info, -1) {
		v, _ := strconv.Atoi(m[1])
		n += v
	}
	return n
}

// A flood on one key over its limit reaches Redis about once per retry
// time, not once per request; with local_cache off, every request does.
func TestRedisOverLimitCacheFlood(t *testing.T) {
	addr, c := perfRedis(t)
	for _, tt := range []struct {
		cache    string
		maxCalls int
		minCalls int
	}{
		{"on", 10, 6},
		{"off", 200, 200},
	} {
		t.Run("local_cache_"+tt.cache, func(t *testing.T) {
			// timeout 5s: on a busy machine a call may take longer than the
			// default 100ms, and one that times out lets its request through.
			tester := newTester(t, caddyfileServerWith(fmt.Sprintf(`	rate_limit {
		backend redis {
			address %s
			local_cache %s
			timeout 5s
		}
	}`, addr, tt.cache), `	rate_limit {
		zone perf_flood_`+tt.cache+` {
			by header X-Key
			rate 5/1h
		}
	}
	respond "ok"`), "caddyfile")
			before := scriptCalls(t, c)
			expectN(t, tester, 5, 200, "GET", "/", "X-Key", "flood")
			for range 195 {
				expect429(t, tester, 3000, 3600, "GET", "/", "X-Key", "flood")
			}
			calls := scriptCalls(t, c) - before
			if calls > tt.maxCalls || calls < tt.minCalls {
				t.Fatalf("local_cache %s: %d script calls for 200 requests, want %d to %d", tt.cache, calls, tt.minCalls, tt.maxCalls)
			}
			// Another key is not held back by the flooded one.
			expectN(t, tester, 5, 200, "GET", "/", "X-Key", "other")
		})
	}
}
