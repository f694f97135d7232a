package integration

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
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

// What a Redis that runs out of memory does to the limits: an evicting
// policy deletes the state of denied clients, who start over; noeviction
// refuses the writes of decisions, which fail by their zones' fail policy.
// Sluice reads the policy when a config loads, and when Redis answers
// again after an outage, and warns about an evicting one.

// memoryRedis starts a redis-server of 2 MB under policy for this test.
func memoryRedis(t *testing.T, policy string, args ...string) *redistest.Server {
	t.Helper()
	redistest.Need(t)
	s, err := redistest.StartServer(nil, append([]string{"--maxmemory", "2mb", "--maxmemory-policy", policy}, args...)...)
	if err != nil {
		t.Fatalf("starting redis-server: %v", err)
	}
	t.Cleanup(s.Stop)
	return s
}

// loggedConfig is a Caddyfile whose log goes to logFile (JSON), with the
// rate_limit handler of backend and zones on :9080, and on :9081 another
// handler of the same zones: two handlers with over-limit caches of their
// own, as two instances of a fleet have.
func loggedConfig(logFile, backend, zones string) string {
	site := `
	rate_limit {
		backend redis {
			` + backend + `
		}
		` + zones + `
	}
	respond "ok"`
	return withPorts(`{
	skip_install_trust
	admin localhost:2999
	http_port 9080
	log {
		output file ` + logFile + `
		format json
	}
}
:9080 {` + site + `
}
:9081 {` + site + `
}`)
}

// waitLog waits until the log holds a line containing every part, and
// returns the log.
func waitLog(t *testing.T, logFile string, parts ...string) string {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		data, _ := os.ReadFile(logFile)
		if logLines(string(data), parts...) > 0 {
			return string(data)
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 20s, no log line holds %q; the log:\n%s", parts, data)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// logLines counts the lines of log that hold every part.
func logLines(log string, parts ...string) int {
	n := 0
	for line := range strings.SplitSeq(log, "\n") {
		all := line != ""
		for _, p := range parts {
			all = all && strings.Contains(line, p)
		}
		if all {
			n++
		}
	}
	return n
}

const (
	evictsMsg  = `"msg":"redis evicts keys once it holds maxmemory`
	refusesMsg = `"msg":"redis refuses writes once it holds maxmemory`
)

// A Redis whose policy can evict keys is named in a warning when the
// config loads, with its policy and maxmemory; one that does not evict is
// noted (a full one fails the decisions), without a warning.
func TestRedisEvictingPolicyWarns(t *testing.T) {
	for _, tc := range []struct {
		policy string
		warns  bool
	}{
		{"allkeys-lru", true},
		{"volatile-lru", true}, // every Sluice key has an expiry
		{"allkeys-lfu", true},
		{"noeviction", false},
	} {
		t.Run(tc.policy, func(t *testing.T) {
			redis := memoryRedis(t, tc.policy)
			logFile := filepath.Join(t.TempDir(), "caddy.log")
			newTester(t, loggedConfig(logFile, "address "+redis.Addr, `zone mem_warn {
			key {http.request.header.X-Key}
			rate 3/10m
		}`), "caddyfile")
			policy := `"maxmemory_policy":"` + tc.policy + `"`
			if !tc.warns {
				log := waitLog(t, logFile, refusesMsg, policy, `"maxmemory":2097152`, `"level":"info"`)
				if n := logLines(log, evictsMsg); n != 0 {
					t.Fatalf("%d warnings about eviction for noeviction:\n%s", n, log)
				}
				return
			}
			waitLog(t, logFile, evictsMsg, policy, `"maxmemory":2097152`, `"address":"`+redis.Addr+`"`, `"level":"warn"`, `"logger":"http.rate_limit.backends.redis"`)
		})
	}
}

// A Redis without maxmemory evicts nothing and is not warned about.
func TestRedisWithoutMaxmemoryDoesNotWarn(t *testing.T) {
	redistest.Need(t)
	redis, err := redistest.StartServer(nil, "--maxmemory-policy", "allkeys-lru")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(redis.Stop)
	logFile := filepath.Join(t.TempDir(), "caddy.log")
	tester := newTester(t, loggedConfig(logFile, "address "+redis.Addr, `zone mem_nolimit {
			key {http.request.header.X-Key}
			rate 3/10m
		}`), "caddyfile")
	expectN(t, tester, 3, http.StatusOK, "GET", "/", "X-Key", "alice")
	// The check runs in the background; the request above came after the
	// config load, and the check takes one call (a lower bound).
	time.Sleep(500 * time.Millisecond)
	data, _ := os.ReadFile(logFile)
	if n := logLines(string(data), `"msg":"redis `, "maxmemory"); n != 0 {
		t.Fatalf("%d log lines about maxmemory for a Redis without it:\n%s", n, data)
	}
}

// The policy is read again when Redis answers after an outage: it may be
// another Redis, or another config, by then.
func TestRedisPolicyReadAgainAfterOutage(t *testing.T) {
	redis := memoryRedis(t, "noeviction")
	logFile := filepath.Join(t.TempDir(), "caddy.log")
	tester := newTester(t, loggedConfig(logFile, "address "+redis.Addr+"\n\t\t\ttimeout 50ms", `zone mem_outage {
			key {http.request.header.X-Key}
			rate 1000/10m
		}`), "caddyfile")
	waitLog(t, logFile, refusesMsg)
	c := goredis.NewClient(&goredis.Options{Addr: redis.Addr})
	defer c.Close()
	ctx := context.Background()
	if err := c.ConfigSet(ctx, "maxmemory-policy", "allkeys-lru").Err(); err != nil {
		t.Fatal(err)
	}
	// Redis holds every command for 2 s: the decisions time out and the
	// breaker opens; once it answers, a probe closes the breaker.
	if err := c.Do(ctx, "CLIENT", "PAUSE", "2000", "ALL").Err(); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		do(t, tester, "GET", "/", "X-Key", "k"+strconv.Itoa(i))
	}
	waitLog(t, logFile, `"msg":"redis unreachable`)
	deadline := time.Now().Add(20 * time.Second)
	for logLines(readLog(logFile), `"msg":"redis answers again`) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the breaker never closed:\n%s", readLog(logFile))
		}
		do(t, tester, "GET", "/", "X-Key", "after")
		time.Sleep(20 * time.Millisecond)
	}
	waitLog(t, logFile, evictsMsg, `"maxmemory_policy":"allkeys-lru"`)
}

func readLog(file string) string {
	data, _ := os.ReadFile(file)
	return string(data)
}

// A user whose ACL does not allow CONFIG GET cannot read the policy:
// that is said once, however often configs load.
func TestRedisPolicyUnreadableSaidOnce(t *testing.T) {
	redis := memoryRedis(t, "allkeys-lru")
	c := goredis.NewClient(&goredis.Options{Addr: redis.Addr})
	defer c.Close()
	// The rights docs/redis.md names for a least-privileged user.
	acl := strings.Fields("SETUSER sluice on >a-long-random-password ~mem:* resetchannels -@all +fcall +function|load +evalsha +eval +time +get +set +getrange +setrange +append +pexpire +pttl +del +client|setname")
	args := []any{"ACL"}
	for _, a := range acl {
		args = append(args, a)
	}
	if err := c.Do(context.Background(), args...).Err(); err != nil {
		t.Fatal(err)
	}
	logFile := filepath.Join(t.TempDir(), "caddy.log")
	backend := "address " + redis.Addr + "\n\t\t\tusername sluice\n\t\t\tpassword a-long-random-password\n\t\t\tkey_prefix mem:"
	zone := func(rate string) string {
		return `zone mem_acl {
			key {http.request.header.X-Key}
			rate ` + rate + `
		}`
	}
	tester := newTester(t, loggedConfig(logFile, backend, zone("3/10m")), "caddyfile")
	const unreadable = `"msg":"cannot read Redis's maxmemory-policy (CONFIG GET refused)`
	waitLog(t, logFile, unreadable, "NOPERM")
	expectN(t, tester, 3, http.StatusOK, "GET", "/", "X-Key", "alice")
	expect429(t, tester, 1, 600, "GET", "/", "X-Key", "alice")
	loadConfig(t, loggedConfig(logFile, backend, zone("4/10m")), "caddyfile")
	time.Sleep(500 * time.Millisecond) // the reload's check, in the background: a lower bound
	if n := logLines(readLog(logFile), unreadable); n != 1 {
		t.Fatalf("%d lines saying the policy cannot be read after a reload, want 1:\n%s", n, readLog(logFile))
	}
	// With the right docs/redis.md adds for it, the next config load reads it.
	if err := c.Do(context.Background(), "ACL", "SETUSER", "sluice", "+config|get").Err(); err != nil {
		t.Fatal(err)
	}
	loadConfig(t, loggedConfig(logFile, backend, zone("5/10m")), "caddyfile")
	waitLog(t, logFile, evictsMsg, `"maxmemory_policy":"allkeys-lru"`)
}

// flooder sends requests of fresh keys to a site, as a client that makes
// up a key per request does.
type flooder struct {
	client *http.Client
	base   string
	sent   atomic.Int64
	codes  sync.Map // status → *atomic.Int64
}

func newFlooder(base string) *flooder {
	return &flooder{client: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}}, base: base}
}

// flood sends n requests of fresh keys from 16 clients.
func (f *flooder) flood(t *testing.T, n int) {
	t.Helper()
	var wg sync.WaitGroup
	next := atomic.Int64{}
	for range 16 {
		wg.Go(func() {
			for next.Add(1) <= int64(n) {
				req, _ := http.NewRequest("GET", f.base+"/", nil)
				req.Header.Set("X-Key", fmt.Sprintf("junk-%d", f.sent.Add(1)))
				resp, err := f.client.Do(req)
				if err != nil {
					t.Error(err)
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				v, _ := f.codes.LoadOrStore(resp.StatusCode, new(atomic.Int64))
				v.(*atomic.Int64).Add(1)
			}
		})
	}
	wg.Wait()
}

func (f *flooder) count(code int) int64 {
	if v, ok := f.codes.Load(code); ok {
		return v.(*atomic.Int64).Load()
	}
	return 0
}

// siteGet sends one request of key to the site at base.
func siteGet(t *testing.T, base, key string) int {
	t.Helper()
	req, _ := http.NewRequest("GET", base+"/", nil)
	req.Header.Set("X-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// An evicting Redis forgets denied clients: alice, denied at 3/10m, is
// admitted again by another instance once a flood of fresh keys filled
// Redis and evicted her state. Her key is the coldest: the instance that
// denied her answers her from its over-limit cache, without asking Redis.
// It is a limit of running the limits on a Redis that evicts
// (docs/redis.md, Memory and eviction), measured here; noeviction keeps
// her state, and a full Redis fails the decisions instead.
func TestRedisEvictionForgetsDeniedClients(t *testing.T) {
	for _, tc := range []struct {
		policy string
		// forgets: "yes" alice's state is evicted within the flood, "no"
		// never, "may" as the sampling draws (LFU: her 4 requests make
		// her key hotter than a junk key sent once).
		forgets string
	}{
		{"allkeys-lru", "yes"},
		{"volatile-lru", "yes"}, // every Sluice key has an expiry
		{"volatile-ttl", "yes"},
		{"allkeys-random", "may"}, // 15,000 random evictions of ~5,800 keys miss her one time in 14
		{"allkeys-lfu", "may"},
		{"noeviction", "no"},
	} {
		t.Run(tc.policy, func(t *testing.T) {
			redis := memoryRedis(t, tc.policy)
			logFile := filepath.Join(t.TempDir(), "caddy.log")
			newTester(t, loggedConfig(logFile, "address "+redis.Addr+"\n\t\t\tkey_prefix ev:\n\t\t\ttimeout 2s", `zone ev {
			key {http.request.header.X-Key}
			rate 3/10m
			fail closed
		}`), "caddyfile")
			a, b := httpBase, "http://localhost:"+strconv.Itoa(httpPort+1)
			var got []int
			for range 4 {
				got = append(got, siteGet(t, a, "alice"))
			}
			if fmt.Sprint(got) != "[200 200 200 429]" {
				t.Fatalf("alice on instance A: %v, want 3 admitted and denied", got)
			}
			c := goredis.NewClient(&goredis.Options{Addr: redis.Addr})
			defer c.Close()
			ctx := context.Background()
			// EXISTS does not touch the key's access time.
			alive := func() bool {
				n, err := c.Exists(ctx, "ev:ev//l{alice}").Result()
				if err != nil {
					t.Fatal(err)
				}
				return n == 1
			}
			if !alive() {
				t.Fatal("alice's state is not where the test looks for it")
			}
			f := newFlooder(b)
			const step, most = 250, 20_000
			for alive() && f.sent.Load() < most && f.count(http.StatusServiceUnavailable) == 0 {
				f.flood(t, step)
			}
			evicted := !alive()
			stats, _ := c.Info(ctx, "stats").Result()
			evictions := "?"
			for line := range strings.SplitSeq(stats, "\r\n") {
				if v, ok := strings.CutPrefix(line, "evicted_keys:"); ok {
					evictions = v
				}
			}
			got = nil
			for range 4 {
				got = append(got, siteGet(t, b, "alice"))
			}
			onA := siteGet(t, a, "alice")
			t.Logf("%s: %d fresh keys (%d admitted, %d refused with 503; %s keys evicted); alice's state evicted: %v; alice then on instance B: %v, on A: %d",
				tc.policy, f.sent.Load(), f.count(http.StatusOK), f.count(http.StatusServiceUnavailable), evictions, evicted, got, onA)
			switch {
			case tc.forgets == "yes" && !evicted:
				t.Fatalf("alice's state was not evicted by %d fresh keys", f.sent.Load())
			case tc.forgets == "no" && evicted:
				t.Fatal("alice's state was evicted")
			case tc.forgets == "no":
				// Redis filled up and refused writes: the decisions that
				// write failed, and fail closed refused them; alice is
				// never admitted.
				if f.count(http.StatusServiceUnavailable) == 0 || slices.Contains(got, http.StatusOK) || onA == http.StatusOK {
					t.Fatalf("a full Redis that does not evict: %d refused with 503, alice %v on B and %d on A; want the flood refused once Redis is full and alice never admitted",
						f.count(http.StatusServiceUnavailable), got, onA)
				}
			case evicted:
				// A fresh quota on the instance that did not deny her; the
				// one that did still denies her from its cache.
				if fmt.Sprint(got) != "[200 200 200 429]" || onA != http.StatusTooManyRequests {
					t.Fatalf("alice after her state was evicted: %v on B, %d on A; want 3 admitted again on B and A still denying", got, onA)
				}
			default:
				if fmt.Sprint(got) != "[429 429 429 429]" {
					t.Fatalf("alice, her state kept: %v on B, want denied", got)
				}
			}
		})
	}
}
