package redis

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
)

// newStore makes a store for tests that count answers: a generous
// timeout, since a loaded test machine can stall a call past 100ms.
func newStore(t testing.TB, client goredis.UniversalClient) *Store {
	t.Helper()
	s, err := New(client, Options{KeyPrefix: uniquePrefix(t), Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// newStillStore is newStore deciding at a clock that stands still in the
// middle of a 10-minute window: a count that must come out exact is not
// moved by a window of fixed_window or sliding_window_counter turning
// during the test (their windows start at multiples of their length).
func newStillStore(t testing.TB, client goredis.UniversalClient) *Store {
	t.Helper()
	const midWindow = int64(1_764_460_500_000_000_000)
	s, err := New(client, Options{KeyPrefix: uniquePrefix(t), Timeout: 10 * time.Second,
		now: func() int64 { return midWindow }, ttlExtra: 3_600_000})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func mustZone(t testing.TB, s *Store, name, alg string, p algorithms.Policy) backend.Limit {
	t.Helper()
	z, err := s.Register(backend.LimitConfig{Name: name, Algorithm: alg, Policy: p})
	if err != nil {
		t.Fatal(err)
	}
	return z
}

// every algorithm, with a limit of 100 per 10 minutes (the queue holds 100).
func hundredPer10m() map[string]algorithms.Policy {
	p := policy(100, 10*time.Minute)
	q := p
	q.MaxDelay = 99 * p.Interval()
	return map[string]algorithms.Policy{
		algorithms.NameSlidingWindow:  p,
		algorithms.NameSlidingCounter: p,
		algorithms.NameFixedWindow:    p,
		algorithms.NameTokenBucket:    p,
		algorithms.NameGCRA:           p,
		algorithms.NameLeakyBucket:    q,
	}
}

// hammer sends n single-unit requests from 64 goroutines and counts the
// admitted ones.
func hammer(t *testing.T, s *Store, n int, reqs func() []backend.Request) int64 {
	t.Helper()
	var admitted atomic.Int64
	var wg sync.WaitGroup
	var next atomic.Int64
	errs := make(chan error, 64)
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(n) {
				r := reqs()
				out := make([]algorithms.Result, len(r))
				ok, err := s.Decide(context.Background(), r, out)
				if err != nil {
					errs <- err
					return
				}
				if ok {
					admitted.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	return admitted.Load()
}

func testExactUnderConcurrency(t *testing.T, client goredis.UniversalClient) {
	for alg, p := range hundredPer10m() {
		t.Run(alg, func(t *testing.T) {
			s := newStillStore(t, client)
			z := mustZone(t, s, "hot", alg, p)
			got := hammer(t, s, 300, func() []backend.Request { return []backend.Request{{Limit: z, Key: "one", Cost: 1}} })
			if got != 100 {
				t.Fatalf("admitted %d of 300, want exactly 100", got)
			}
		})
	}
}

func TestExactUnderConcurrencyStandalone(t *testing.T) {
	testExactUnderConcurrency(t, standaloneClient(t))
}

func TestExactUnderConcurrencyCluster(t *testing.T) {
	testExactUnderConcurrency(t, clusterClient(t))
}

// Two zones whose keys live in different cluster slots: the tighter one
// admits 50, and the looser one must have been charged for exactly those
// 50, however many of its charges were undone for denied requests.
func TestClusterCrossSlotUndo(t *testing.T) {
	client := clusterClient(t)
	for _, alg := range algorithms.Names() {
		t.Run(alg, func(t *testing.T) {
			s := newStillStore(t, client)
			// Loose holds all 200 requests: were it to deny too (with
			// tight's charges in flight), tight's give-backs could race
			// with the last requests, which may then be refused.
			loose := mustZone(t, s, "loose", alg, policy(200, 10*time.Minute))
			tight := mustZone(t, s, "tight", alg, policy(50, 10*time.Minute))
			a, b := "client-a", "client-b"
			if slotOf(loose.(*zone).stateKey(a)) == slotOf(tight.(*zone).stateKey(b)) {
				t.Fatal("the test needs keys in two slots")
			}
			got := hammer(t, s, 200, func() []backend.Request {
				return []backend.Request{{Limit: loose, Key: a, Cost: 1}, {Limit: tight, Key: b, Cost: 1}}
			})
			if got != 50 {
				t.Fatalf("admitted %d, want exactly 50", got)
			}
			out := make([]algorithms.Result, 1)
			if _, err := s.Decide(context.Background(), []backend.Request{{Limit: loose, Key: a, Cost: 0}}, out); err != nil {
				t.Fatal(err)
			}
			if out[0].Remaining != 150 {
				t.Fatalf("the loose zone has %d left, want 150: undone charges leaked", out[0].Remaining)
			}
			// Undone keys keep an expiry too.
			err := client.ForEachMaster(context.Background(), func(ctx context.Context, c *goredis.Client) error {
				keys, err := c.Keys(ctx, s.prefix+"*").Result()
				for _, k := range keys {
					if ttl, _ := c.PTTL(ctx, k).Result(); ttl <= 0 {
						t.Errorf("key %q has no expiry (PTTL %v)", k, ttl)
					}
				}
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}

// The slot the store groups keys by is the one Redis Cluster computes.
func TestSlotMatchesCluster(t *testing.T) {
	client := clusterClient(t)
	ctx := context.Background()
	for _, k := range []string{"", "a", "sluice:api//b{1.2.3.4}", "x{}y", "{}", "{a}{b}", "a{b", "a}b{c}", "p{1}:z//l{k}", "é{ü}"} {
		want, err := client.ClusterKeySlot(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		if got := slotOf(k); int64(got) != want {
			t.Errorf("slotOf(%q) = %d, Redis says %d", k, got, want)
		}
	}
}

func TestKeyLayout(t *testing.T) {
	for _, tc := range []struct {
		prefix, zone, scope string
		kind                byte
		want                string
	}{
		{"sluice:", "api", "", 'b', "sluice:api//b{"},
		{"sluice:", "a/b", "s", 'l', "sluice:a%2Fb/s/l{"},
		{"p:", "{x}%", "", 'w', "p:%7Bx%7D%25//w{"},
	} {
		if got := zonePrefix(tc.prefix, tc.zone, tc.scope, tc.kind); got != tc.want {
			t.Errorf("zonePrefix(%q, %q, %q) = %q, want %q", tc.prefix, tc.zone, tc.scope, got, tc.want)
		}
	}
	// The client's key is the hash tag, so the zones limiting one client
	// share a slot and are decided by one call.
	if slotOf(zonePrefix("sluice:", "api", "", 'b')+"10.0.0.1}") != slotOf(zonePrefix("sluice:", "login", "ip", 'l')+"10.0.0.1}") {
		t.Error("one client's keys in two zones should share a slot")
	}
}

func TestNoScriptRecovers(t *testing.T) {
	ctx := context.Background()
	for name, client := range map[string]goredis.UniversalClient{"standalone": standaloneClient(t), "cluster": clusterClient(t)} {
		t.Run(name, func(t *testing.T) {
			s := newStore(t, client)
			z := mustZone(t, s, "ns", algorithms.NameTokenBucket, policy(3, time.Minute))
			if slotOf(z.(*zone).prefix+"k}") == slotOf(z.(*zone).prefix+"other}") {
				t.Fatal("the test needs keys in two slots")
			}
			for i := range 4 {
				flush := func(ctx context.Context, c *goredis.Client) error { return c.ScriptFlush(ctx).Err() }
				if cc, ok := client.(*goredis.ClusterClient); ok {
					if err := cc.ForEachMaster(ctx, flush); err != nil {
						t.Fatal(err)
					}
				} else if err := flush(ctx, client.(*goredis.Client)); err != nil {
					t.Fatal(err)
				}
				// Two keys in two slots: on the cluster, two calls in one
				// pipeline, both refused with NOSCRIPT and sent again.
				reqs := []backend.Request{{Limit: z, Key: "k", Cost: 1}, {Limit: z, Key: "other", Cost: 0}}
				out := make([]algorithms.Result, 2)
				ok, err := s.Decide(ctx, reqs, out)
				if err != nil {
					t.Fatalf("after SCRIPT FLUSH: %v", err)
				}
				if ok != (i < 3) || out[0].Remaining != max(int64(2-i), 0) {
					t.Fatalf("decision %d: %v %+v", i, ok, out[0])
				}
			}
		})
	}
}

// Every key the store writes expires when its state is idle again.
func TestKeysExpire(t *testing.T) {
	client := standaloneClient(t)
	ctx := context.Background()
	s := newStore(t, client)
	cases := []struct {
		alg  string
		p    algorithms.Policy
		cost int64
		max  time.Duration // the idle time
	}{
		{algorithms.NameTokenBucket, algorithms.Policy{Limit: 10, Window: sec, Burst: 10}, 10, time.Second},
		{algorithms.NameGCRA, policy(10, time.Second), 1, 100 * time.Millisecond},
		{algorithms.NameLeakyBucket, algorithms.Policy{Limit: 10, Window: sec, MaxDelay: sec}, 5, 500 * time.Millisecond},
		{algorithms.NameSlidingWindow, policy(5, 3*time.Second), 2, 3 * time.Second},
		{algorithms.NameFixedWindow, policy(5, time.Minute), 1, time.Minute},
		{algorithms.NameSlidingCounter, policy(5, time.Minute), 1, 2 * time.Minute},
	}
	for _, tc := range cases {
		t.Run(tc.alg, func(t *testing.T) {
			z := mustZone(t, s, "ttl-"+tc.alg, tc.alg, tc.p)
			reqs := []backend.Request{{Limit: z, Key: "k", Cost: tc.cost}}
			out := make([]algorithms.Result, 1)
			if ok, err := s.Decide(ctx, reqs, out); !ok || err != nil {
				t.Fatal(ok, err)
			}
			key := z.(*zone).prefix + "k}"
			ttl, err := client.PTTL(ctx, key).Result()
			if err != nil {
				t.Fatal(err)
			}
			// The expiry is the state's idle time, which is what the
			// answer's ResetAfter says, rounded up to a ms.
			reset := time.Duration(out[0].ResetAfter)
			if ttl <= 0 || ttl > reset+time.Millisecond || ttl < reset-100*time.Millisecond {
				t.Fatalf("PTTL %v, want the reset time %v", ttl, reset)
			}
			if out[0].ResetAfter > int64(tc.max) {
				t.Fatalf("reset after %v beyond the idle time %v", time.Duration(out[0].ResetAfter), tc.max)
			}
			// Giving the units back makes a bucket idle: its key goes.
			if err := s.Refund(ctx, reqs, out); err != nil {
				t.Fatal(err)
			}
			n, _ := client.Exists(ctx, key).Result()
			if tc.alg == algorithms.NameTokenBucket || tc.alg == algorithms.NameSlidingWindow {
				if n != 0 {
					t.Fatalf("a refunded %s key should be gone", tc.alg)
				}
			}
		})
	}
	keys, err := client.Keys(ctx, s.prefix+"*").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if ttl, _ := client.PTTL(ctx, k).Result(); ttl <= 0 {
			t.Errorf("key %q has no expiry (PTTL %v)", k, ttl)
		}
	}
}

// dropProxy forwards TCP to addr, and the first time the server answers a
// script call it closes the connection instead of passing the answer on:
// the script ran, the client saw a broken connection.
type dropProxy struct {
	ln      net.Listener
	addr    string
	dropped atomic.Bool
}

func newDropProxy(t *testing.T, addr string) *dropProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &dropProxy{ln: ln, addr: addr}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go p.serve(c)
		}
	}()
	return p
}

func (p *dropProxy) serve(c net.Conn) {
	s, err := net.Dial("tcp", p.addr)
	if err != nil {
		c.Close()
		return
	}
	var sent atomic.Bool // a script call went to the server
	go func() {
		buf := make([]byte, 64<<10)
		for {
			n, err := c.Read(buf)
			if n > 0 {
				if req := strings.ToLower(string(buf[:n])); strings.Contains(req, "eval") || strings.Contains(req, "fcall") {
					sent.Store(true)
				}
				if _, err := s.Write(buf[:n]); err != nil {
					break
				}
			}
			if err != nil {
				break
			}
		}
		s.Close()
	}()
	buf := make([]byte, 64<<10)
	for {
		n, err := s.Read(buf)
		if n > 0 {
			if sent.Load() && p.dropped.CompareAndSwap(false, true) {
				c.Close()
				s.Close()
				return
			}
			if _, err := c.Write(buf[:n]); err != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	c.Close()
}

// A script whose answer is lost must not run again: the store's calls are
// never retried, while go-redis's own Script.Run on the same client is
// (the control that shows the proxy and the default retries at work).
func TestAtMostOnce(t *testing.T) {
	addr := standalone(t)
	ctx := context.Background()
	direct := standaloneClient(t)
	if err := script.Load(ctx, direct).Err(); err != nil {
		t.Fatal(err)
	}
	if err := direct.Do(ctx, "function", "load", "replace", functionSource).Err(); err != nil {
		t.Fatal(err)
	}
	remaining := func(s *Store, z backend.Limit) int64 {
		t.Helper()
		out := make([]algorithms.Result, 1)
		if _, err := s.Decide(ctx, []backend.Request{{Limit: z, Key: "k", Cost: 0}}, out); err != nil {
			t.Fatal(err)
		}
		return out[0].Remaining
	}
	p := policy(10, time.Hour)

	// The store: the call fails, and it was charged once.
	proxy := newDropProxy(t, addr)
	viaProxy := goredis.NewClient(&goredis.Options{Addr: proxy.ln.Addr().String(), ContextTimeoutEnabled: true, MaxRetries: 3})
	defer viaProxy.Close()
	s, err := New(viaProxy, Options{KeyPrefix: uniquePrefix(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	z := mustZone(t, s, "once", algorithms.NameTokenBucket, p)
	_, err = s.Decide(ctx, []backend.Request{{Limit: z, Key: "k", Cost: 1}}, make([]algorithms.Result, 1))
	if err == nil || !proxy.dropped.Load() {
		t.Fatalf("the proxy should have broken the call: err %v, dropped %v", err, proxy.dropped.Load())
	}
	if !errors.Is(err, io.EOF) && !strings.Contains(err.Error(), "EOF") && !strings.Contains(err.Error(), "reset") {
		t.Logf("error: %v", err)
	}
	if got := remaining(s, z); got != 9 {
		t.Fatalf("after one lost answer %d left, want 9: the script ran %d times", got, 10-got)
	}

	// The control: a plain go-redis script call through a fresh proxy is
	// sent again after the lost answer, and charges twice.
	proxy2 := newDropProxy(t, addr)
	viaProxy2 := goredis.NewClient(&goredis.Options{Addr: proxy2.ln.Addr().String(), ContextTimeoutEnabled: true, MaxRetries: 3})
	defer viaProxy2.Close()
	conf := z.(*zone).st.conf.Load()
	it := item{key: z.(*zone).prefix + "k}", conf: conf, cost: 1}
	args := itemArgs((&Store{}).header(modeDecide), &it, decideCounted, "")
	if err := script.Run(ctx, viaProxy2, []string{it.key}, args...).Err(); err != nil {
		t.Fatalf("go-redis's retry should have hidden the lost answer: %v", err)
	}
	if !proxy2.dropped.Load() {
		t.Fatal("the proxy did not drop the answer")
	}
	if got := remaining(s, z); got != 7 {
		t.Fatalf("the retried call left %d, want 7 (charged twice)", got)
	}
}

func TestNewRequiresContextTimeouts(t *testing.T) {
	c := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:1"})
	defer c.Close()
	if _, err := New(c, Options{}); err == nil || !strings.Contains(err.Error(), "ContextTimeoutEnabled") {
		t.Fatalf("got %v", err)
	}
}

// A Redis that does not answer costs the timeout, not more.
func TestTimeout(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(io.Discard, c) }() // reads, never answers
		}
	}()
	c := goredis.NewClient(&goredis.Options{Addr: ln.Addr().String(), ContextTimeoutEnabled: true, Protocol: 2, DisableIdentity: true})
	defer c.Close()
	s, err := New(c, Options{Timeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	z := mustZone(t, s, "slow", algorithms.NameTokenBucket, policy(1, time.Second))
	start := time.Now()
	_, err = s.Decide(context.Background(), []backend.Request{{Limit: z, Key: "k", Cost: 1}}, make([]algorithms.Result, 1))
	if err == nil {
		t.Fatal("want a timeout")
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("took %v with a 50ms timeout", d)
	}
}

func TestNewRefusesRing(t *testing.T) {
	r := goredis.NewRing(&goredis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1"}, ContextTimeoutEnabled: true})
	defer r.Close()
	if _, err := New(r, Options{}); err == nil || !strings.Contains(err.Error(), "Ring") {
		t.Fatalf("got %v", err)
	}
}

func TestEmptyRequestNeedsNoCall(t *testing.T) {
	// No server behind this client: a call would fail.
	c := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true, MaxRetries: -1})
	defer c.Close()
	s, err := New(c, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := s.Decide(context.Background(), nil, nil); !ok || err != nil {
		t.Fatalf("empty request: %v %v", ok, err)
	}
	if err := s.Refund(context.Background(), nil, nil); err != nil {
		t.Fatal(err)
	}
}

// A server that wants a password: the store works through a client that
// gives it, and a client that does not fails with an error, not a panic.
func TestPassword(t *testing.T) {
	needRedis(t)
	addr, err := startServer("--requirepass", "s3cret-for-tests")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, pass := range []string{"s3cret-for-tests", "wrong"} {
		c := goredis.NewClient(&goredis.Options{Addr: addr, Password: pass, ContextTimeoutEnabled: true})
		s := newStore(t, c)
		z := mustZone(t, s, "pw", algorithms.NameTokenBucket, policy(2, time.Minute))
		ok, err := s.Decide(ctx, []backend.Request{{Limit: z, Key: "k", Cost: 1}}, make([]algorithms.Result, 1))
		if pass == "wrong" {
			if err == nil {
				t.Fatal("a wrong password should fail")
			}
		} else if !ok || err != nil {
			t.Fatalf("with the password: %v %v", ok, err)
		}
		c.Close()
	}
}

// Sentinel: go-redis's failover client finds the master through a
// sentinel, and the store decides there.
func TestSentinel(t *testing.T) {
	needRedis(t)
	master, err := startServer()
	if err != nil {
		t.Fatal(err)
	}
	host, port, _ := net.SplitHostPort(master)
	sentinel, err := startProcess(func(p int) string {
		return "sentinel monitor sluice-test " + host + " " + port + " 1\n" +
			"sentinel down-after-milliseconds sluice-test 5000\n"
	}, "--sentinel")
	if err != nil {
		t.Fatal(err)
	}
	c := goredis.NewFailoverClient(&goredis.FailoverOptions{MasterName: "sluice-test", SentinelAddrs: []string{sentinel}, ContextTimeoutEnabled: true})
	defer c.Close()
	s := newStore(t, c)
	z := mustZone(t, s, "sentinel", algorithms.NameSlidingWindow, policy(3, time.Minute))
	got := hammer(t, s, 20, func() []backend.Request { return []backend.Request{{Limit: z, Key: "k", Cost: 1}} })
	if got != 3 {
		t.Fatalf("admitted %d through the sentinel's master, want 3", got)
	}
	direct := goredis.NewClient(&goredis.Options{Addr: master})
	defer direct.Close()
	if n, _ := direct.Exists(context.Background(), z.(*zone).prefix+"k}").Result(); n != 1 {
		t.Fatal("the state is not on the master the sentinel names")
	}
}
