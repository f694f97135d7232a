package integration

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice/internal/redistest"
)

// foRedis is a server this test started on a fixed port, so it can
// be killed and started again where Caddy expects it.
type foRedis struct {
	t    *testing.T
	port int
	cmd  *exec.Cmd
}

func foStartRedis(t *testing.T, port int) *foRedis {
	t.Helper()
	redistest.Need(t)
	r := &foRedis{t: t, port: port}
	r.start()
	t.Cleanup(r.kill)
	return r
}

func (r *foRedis) start() {
	r.t.Helper()
	r.cmd = redistest.Command("--port", strconv.Itoa(r.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", r.t.TempDir())
	if err := r.cmd.Start(); err != nil {
		r.t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if out, err := r.cli("PING"); err == nil && strings.TrimSpace(out) == "PONG" {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	r.t.Fatalf("%s on port %d did not answer", r.cmd.Path, r.port)
}

func (r *foRedis) kill() {
	if r.cmd != nil && r.cmd.Process != nil {
		_ = r.cmd.Process.Signal(syscall.SIGCONT)
		_ = r.cmd.Process.Kill()
		_ = r.cmd.Wait()
		r.cmd = nil
	}
}

func (r *foRedis) cli(args ...string) (string, error) {
	out, err := redistest.CLI(append([]string{"-p", strconv.Itoa(r.port)}, args...)...).CombinedOutput()
	return string(out), err
}

// clients is INFO clients' connected_clients, less the CLI's own.
func (r *foRedis) clients() int {
	r.t.Helper()
	out, err := r.cli("INFO", "clients")
	if err != nil {
		r.t.Fatal(err)
	}
	m := regexp.MustCompile(`connected_clients:(\d+)`).FindStringSubmatch(out)
	if m == nil {
		r.t.Fatalf("INFO clients: %q", out)
	}
	n, _ := strconv.Atoi(m[1])
	return n - 1
}

// foCaddy is a Caddy process of the built binary.
type foCaddy struct {
	t                              *testing.T
	base, admin                    string
	adminPort, httpPort, redisPort int
}

// foConfig is one site with a rate_limit handler on Redis: /open,
// /closed and /local are zones failing open, closed and local; /shared a
// zone of 5 per hour for everyone (rate is varied to make reloads real).
func foConfig(adminPort, httpPort, redisPort, sharedRate int) string {
	zone := func(name, path, key string, events int, fail string) string {
		return fmt.Sprintf(`%q: {"match": [{"path": [%q]}], "key": %q, "max_events": %d, "window": "1h", "fail": %q}`, name, path, key, events, fail)
	}
	zones := strings.Join([]string{
		zone("fo_open", "/open", "global", 1000000, "open"),
		zone("fo_closed", "/closed", "global", 1000000, "closed"),
		zone("fo_local", "/local", "{http.request.header.X-Client}", 3, "local"),
		zone("fo_shared", "/shared", "global", sharedRate, "open"),
	}, ",")
	return fmt.Sprintf(`{"admin": {"listen": "127.0.0.1:%d"},
	  "logging": {"logs": {"default": {"level": "WARN"}}},
	  "apps": {"http": {"servers": {"s": {"listen": ["127.0.0.1:%d"], "routes": [{"handle": [
		{"handler": "rate_limit", "backend": {"name": "redis", "addresses": ["127.0.0.1:%d"], "timeout": "50ms"}, "rate_limits": {%s}},
		{"handler": "static_response", "body": "ok"}]}]}}}}}`, adminPort, httpPort, redisPort, zones)
}

func foStartCaddy(t *testing.T, redisPort int) *foCaddy {
	t.Helper()
	adminPort, httpPort := freePort(t), freePort(t)
	cfg := foConfig(adminPort, httpPort, redisPort, 5)
	file := filepath.Join(t.TempDir(), "caddy.json")
	if err := os.WriteFile(file, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	startCaddy(t, file)
	c := &foCaddy{t: t, base: fmt.Sprintf("http://127.0.0.1:%d", httpPort), admin: fmt.Sprintf("http://127.0.0.1:%d", adminPort),
		adminPort: adminPort, httpPort: httpPort, redisPort: redisPort}
	waitUp(t, c.base+"/")
	return c
}

var foClient = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}, Timeout: 10 * time.Second}

// get answers "status Retry-After".
func (c *foCaddy) get(path, client string) string {
	req, _ := http.NewRequest("GET", c.base+path, nil)
	req.Header.Set("X-Client", client)
	resp, err := foClient.Do(req)
	if err != nil {
		return "error " + err.Error()
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return strings.TrimSpace(fmt.Sprintf("%d %s", resp.StatusCode, resp.Header.Get("Retry-After")))
}

func (c *foCaddy) goroutines() int {
	c.t.Helper()
	resp, err := http.Get(c.admin + "/debug/pprof/goroutine?debug=1")
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	line, _ := bufio.NewReader(resp.Body).ReadString('\n')
	var n int
	if _, err := fmt.Sscanf(line, "goroutine profile: total %d", &n); err != nil {
		c.t.Fatalf("goroutine profile %q: %v", line, err)
	}
	return n
}

func (c *foCaddy) load(cfg string) {
	c.t.Helper()
	if code, body := adminSend(c.t, c.admin, "POST", "/load", "application/json", cfg); code != 200 {
		c.t.Fatalf("POST /load: %d %s", code, body)
	}
	waitListeners(c.t, map[int]int{c.adminPort: 1, c.httpPort: 1})
	foClient.CloseIdleConnections()
}

// settle waits for the goroutine count to stop falling (connections and
// timers of a finished reload wind down) and returns it.
func (c *foCaddy) settle() int {
	n := c.goroutines()
	for range 20 {
		time.Sleep(100 * time.Millisecond)
		m := c.goroutines()
		if m >= n {
			return min(m, n)
		}
		n = m
	}
	return n
}

func foCount(answers []string) map[string]int {
	m := map[string]int{}
	for _, a := range answers {
		m[a]++
	}
	return m
}

// foSetup starts a Redis and a Caddy of foConfig using it.
func foSetup(t *testing.T) (*foRedis, *foCaddy) {
	t.Helper()
	redis := foStartRedis(t, freePort(t))
	c := foStartCaddy(t, redis.port)
	// The first call dials Redis and loads the script: on a busy machine
	// that can take longer than the 50ms timeout, and a zone failing open
	// then admits what Redis would have counted (6 of 7 where 5 pass was
	// seen once). /closed answers 200 only once Redis has.
	eventually(t, "Redis answering the first calls", func() bool { return c.get("/closed", "warm") == "200" })
	return redis, c
}

// Redis killed under load and started again on the same port, through
// the built binary: each fail policy does what it says, the breaker makes
// a dead Redis cheap, and shared limiting resumes within a second.
func TestBinaryRedisFailover(t *testing.T) {
	redis, c := foSetup(t)

	// Shared limiting: 5 of 7 for everyone, counted in Redis.
	var shared []string
	for i := range 7 {
		shared = append(shared, c.get("/shared", strconv.Itoa(i)))
	}
	if got := foCount(shared); got["200"] != 5 || got["429 3600"] != 2 {
		t.Fatalf("shared zone with Redis up: %v", got)
	}
	// Two keys: the warm-up's on /closed and the shared zone's.
	if out, _ := redis.cli("DBSIZE"); strings.TrimSpace(out) != "2" {
		t.Fatal("no key in Redis: the zone was not decided there")
	}

	// Load on /open across the kill: never anything but 200.
	var stop atomic.Bool
	var wg sync.WaitGroup
	var mu sync.Mutex
	load := map[string]int{}
	for w := range 8 {
		wg.Go(func() {
			for !stop.Load() {
				a := c.get("/open", "w"+strconv.Itoa(w))
				mu.Lock()
				load[a]++
				mu.Unlock()
			}
		})
	}
	time.Sleep(200 * time.Millisecond)
	redis.kill()
	time.Sleep(500 * time.Millisecond)

	if got := c.get("/open", "a"); got != "200" {
		t.Errorf("open zone with Redis dead: %q, want 200", got)
	}
	closed := c.get("/closed", "a")
	if ra, _ := strconv.Atoi(strings.TrimPrefix(closed, "503 ")); !strings.HasPrefix(closed, "503 ") || ra < 1 {
		t.Errorf("closed zone with Redis dead: %q, want 503 with Retry-After ≥ 1", closed)
	}
	var local []string
	for range 5 {
		local = append(local, c.get("/local", "l1"))
	}
	if got := strings.Join(local, "|"); got != "200|200|200|429 3600|429 3600" {
		t.Errorf("local zone with Redis dead: %q, want exactly 3 admitted per client", got)
	}
	if got := c.get("/local", "l2"); got != "200" {
		t.Errorf("local zone, another client: %q", got)
	}

	stop.Store(true)
	wg.Wait()
	if len(load) != 1 || load["200"] == 0 {
		t.Errorf("answers on /open under load across the kill: %v, want only 200", load)
	}

	// With the breaker open, a request costs no timeout: without it, each
	// would dial the dead Redis again and again for its 50 ms. Timed
	// without the load above, which a busy machine queues them behind.
	var open []time.Duration
	for range 200 {
		start := time.Now()
		c.get("/open", "lat")
		open = append(open, time.Since(start))
	}
	sort.Slice(open, func(i, j int) bool { return open[i] < open[j] })
	t.Logf("with Redis dead (breaker open): median %v, p99 %v per request over HTTP; %d requests under load, all 200", open[100], open[198], load["200"])
	if open[100] > 25*time.Millisecond {
		t.Errorf("median request with the breaker open took %v, half the 50 ms timeout or more", open[100])
	}

	// Restart on the same port: the breaker's probe finds it.
	redis.start()
	back := time.Now()
	for c.get("/closed", "a") != "200" {
		if time.Since(back) > 5*time.Second {
			t.Fatal("the closed zone still fails 5s after Redis came back")
		}
		time.Sleep(5 * time.Millisecond)
	}
	noticed := time.Since(back)
	t.Logf("Redis back: noticed after %v", noticed)
	if noticed > 1500*time.Millisecond {
		t.Errorf("Redis back noticed after %v, want about a second at most", noticed)
	}
	shared = shared[:0]
	for i := range 7 {
		shared = append(shared, c.get("/shared", strconv.Itoa(i)))
	}
	if got := foCount(shared); got["200"] != 5 || got["429 3600"] != 2 {
		t.Fatalf("shared zone after Redis came back (empty): %v, want 5 of 7", got)
	}
}

// A Redis that stops answering (not refusing: SIGSTOP) costs each request
// the timeout only until the breaker opens.
func TestBinaryRedisTimeoutTripsBreaker(t *testing.T) {
	redis, c := foSetup(t)
	if got := c.get("/open", "a"); got != "200" {
		t.Fatalf("first request %q", got)
	}
	if err := redis.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	var lat []time.Duration
	for range 20 {
		start := time.Now()
		if got := c.get("/open", "a"); got != "200" {
			t.Fatalf("open zone with Redis stopped: %q", got)
		}
		lat = append(lat, time.Since(start))
	}
	slow := 0
	for _, d := range lat {
		if d >= 40*time.Millisecond {
			slow++
		}
	}
	t.Logf("with Redis stopped: per-request times %v", lat)
	if slow > 4 || lat[0] < 40*time.Millisecond {
		t.Errorf("%d of 20 requests paid the 50ms timeout, want the first few (3 trip the breaker), then none: %v", slow, lat)
	}
	if got := c.get("/closed", "a"); !strings.HasPrefix(got, "503 ") {
		t.Errorf("closed zone with Redis stopped: %q", got)
	}
	_ = redis.cmd.Process.Signal(syscall.SIGCONT)
	back := time.Now()
	for c.get("/closed", "a") != "200" {
		if time.Since(back) > 5*time.Second {
			t.Fatal("the closed zone still fails 5s after Redis resumed")
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Logf("Redis resumed: noticed after %v", time.Since(back))
}

// 50 reloads and a Redis restart leave no goroutine and no connection
// behind.
func TestBinaryRedisNoLeaks(t *testing.T) {
	redis, c := foSetup(t)
	warm := func() {
		for _, p := range []string{"/open", "/closed", "/local", "/shared"} {
			c.get(p, "a")
		}
	}
	warm()
	g0, c0 := c.settle(), redis.clients()
	for i := range 50 {
		c.load(foConfig(c.adminPort, c.httpPort, c.redisPort, 5+i%2))
		warm()
	}
	g1, c1 := c.settle(), redis.clients()
	t.Logf("50 reloads: goroutines %d → %d, Redis connections %d → %d", g0, g1, c0, c1)
	if g1 > g0+5 || c1 > c0+2 {
		t.Errorf("after 50 reloads: goroutines %d → %d, Redis connections %d → %d", g0, g1, c0, c1)
	}

	// Each restart may leave the pool a few idle connections (it dials
	// while requests wait); across restarts that number must not grow.
	g2, c2 := g1, c1
	for i := range 3 {
		redis.kill()
		for range 20 {
			warm()
		}
		redis.start()
		deadline := time.Now().Add(5 * time.Second)
		for c.get("/closed", "a") != "200" && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		warm()
		g2, c2 = c.settle(), redis.clients()
		t.Logf("Redis restart %d: goroutines %d → %d, Redis connections → %d", i+1, g1, g2, c2)
	}
	if g2 > g1+5 || c2 > c1+3 {
		t.Errorf("after 3 Redis restarts: goroutines %d → %d, Redis connections %d → %d", g1, g2, c1, c2)
	}
}

// A request whose keys Redis cannot decide (here a key of another type)
// fails alone: its failures are Redis's answers, not an outage, so they do
// not open the circuit breaker on every other key of the fleet.
func TestRedisKeyFailureFailsOnlyItself(t *testing.T) {
	addr, c := perfRedis(t)
	tester := newTester(t, caddyfileServerWith(fmt.Sprintf(`	rate_limit {
		backend redis {
			address %s
			timeout 10s
		}
	}`, addr), `	rate_limit {
		zone a3_poison {
			by header X-Key
			rate 100/1h
			algorithm token_bucket
			fail closed
		}
	}
	respond "ok"`), "caddyfile")
	if err := c.HSet(t.Context(), "sluice:a3_poison//b{poison}", "f", "1").Err(); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		if code, _, _ := do(t, tester, "GET", "/", "X-Key", "poison"); code != http.StatusServiceUnavailable {
			t.Fatalf("the poisoned key: %d, want 503 (fail closed)", code)
		}
	}
	for i := range 5 {
		if code, _, _ := do(t, tester, "GET", "/", "X-Key", fmt.Sprintf("healthy%d", i)); code != http.StatusOK {
			t.Fatalf("a healthy key after the poisoned one failed: %d, want 200", code)
		}
	}
}

// Slots whose release could not reach Redis (it paused for 1.5 s while
// the requests holding them ended) are freed once Redis answers again;
// otherwise the key would stay full, every request answered 503, until
// slot_ttl (30 s) after all its requests had ended.
func TestRedisSlotsFreedAfterHiccup(t *testing.T) {
	redis := redistest.Standalone(t, "")
	arrived := make(chan struct{}, 2)
	_, addr := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("slow") != "" {
			arrived <- struct{}{}
			time.Sleep(600 * time.Millisecond)
		}
		_, _ = io.WriteString(w, "ok")
	})
	newTester(t, caddyfileServer(fmt.Sprintf(`
	rate_limit {
		backend redis {
			address %s
			timeout 100ms
		}
		zone slot_hiccup {
			key static
			concurrency 2
			slot_ttl 30s
		}
	}
	reverse_proxy %s`, redis.Addr, addr)), "caddyfile")
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			if resp, err := http.Get(httpBase + "/?slow=1"); err == nil {
				resp.Body.Close()
			}
		})
	}
	// Both hold their slots: they reached the upstream.
	within(t, arrived, "the first slow request")
	within(t, arrived, "the second slow request")
	rc := goredis.NewClient(&goredis.Options{Addr: redis.Addr})
	defer rc.Close()
	if err := rc.Do(context.Background(), "CLIENT", "PAUSE", "1500", "ALL").Err(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	// Redis answers again 1.5 s after the pause began; the breaker opens
	// for a moment after the failures.
	time.Sleep(1500 * time.Millisecond)
	deadline := time.Now().Add(5 * time.Second)
	for {
		resp, err := http.Get(httpBase + "/")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			n, _ := rc.ZCard(context.Background(), "sluice:slot_hiccup//s{static}").Result()
			t.Fatalf("5 s after Redis came back, the key's requests all ended, still refused (last %v %v); %d slots held in Redis", resp.StatusCode, err, n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
