package redis

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	goredis "github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
)

// callCounter counts the script calls a client sends, pipelined or not.
// callCounter counts script calls; while fail is set it fails them, as
// a connection reset would, without reaching Redis.
type callCounter struct {
	n    atomic.Int64
	fail atomic.Bool
}

var errInjected = errors.New("injected: connection reset by peer")

// count counts cmd and reports whether it fails.
func (c *callCounter) count(cmd goredis.Cmder) bool {
	if n := cmd.Name(); n == "fcall" || n == "evalsha" || n == "eval" {
		c.n.Add(1)
		if c.fail.Load() {
			cmd.SetErr(errInjected)
			return true
		}
	}
	return false
}

func (c *callCounter) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (c *callCounter) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		if c.count(cmd) {
			return errInjected
		}
		return next(ctx, cmd)
	}
}

func (c *callCounter) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		failed := false
		for _, cmd := range cmds {
			failed = c.count(cmd) || failed
		}
		if failed {
			return errInjected
		}
		return next(ctx, cmds)
	}
}

// cacheRig is a store on its own client, with a clock the test moves and
// a count of the calls it makes.
type cacheRig struct {
	s     *Store
	calls *callCounter
	mu    sync.Mutex
	clock int64
}

func newCacheRig(t *testing.T, opts Options) *cacheRig {
	t.Helper()
	c := goredis.NewClient(&goredis.Options{Addr: standalone(t), ContextTimeoutEnabled: true, PoolSize: 64})
	t.Cleanup(func() { c.Close() })
	r := &cacheRig{calls: new(callCounter), clock: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()}
	c.AddHook(r.calls)
	opts.KeyPrefix = uniquePrefix(t)
	opts.Timeout = 10 * time.Second
	opts.now = r.now
	opts.ttlExtra = 3_600_000
	s, err := New(c, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	r.s = s
	return r
}

func (r *cacheRig) now() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.clock
}

func (r *cacheRig) advance(d time.Duration) {
	r.mu.Lock()
	r.clock += int64(d)
	r.mu.Unlock()
}

func (r *cacheRig) decide(t *testing.T, reqs ...backend.Request) (bool, []algorithms.Result) {
	t.Helper()
	out := make([]algorithms.Result, len(reqs))
	ok, err := r.s.Decide(context.Background(), reqs, out)
	if err != nil {
		t.Fatal(err)
	}
	return ok, out
}

// A flood on a key over its limit is answered locally until the retry
// time Redis gave, then Redis decides again.
func TestCacheFloodSkipsRedis(t *testing.T) {
	r := newCacheRig(t, Options{})
	z := mustZone(t, r.s, "cflood", algorithms.NameTokenBucket, policy(10, time.Second))
	req := backend.Request{Limit: z, Key: "k", Cost: 1}
	for i := range 10 {
		if ok, _ := r.decide(t, req); !ok {
			t.Fatalf("request %d denied", i)
		}
	}
	ok, first := r.decide(t, req)
	if ok || first[0].RetryAfter != int64(100*time.Millisecond) {
		t.Fatalf("11th: allowed=%v retry=%d, want denied with retry 100ms", ok, first[0].RetryAfter)
	}
	calls := r.calls.n.Load()
	r.advance(40 * time.Millisecond)
	for range 1000 {
		ok, res := r.decide(t, req)
		if ok || res[0].RetryAfter != int64(60*time.Millisecond) || res[0].Limit != 10 {
			t.Fatalf("cached answer: allowed=%v %+v, want denied, retry 60ms, limit 10", ok, res[0])
		}
	}
	if got := r.calls.n.Load() - calls; got != 0 {
		t.Fatalf("%d calls to Redis for 1000 requests on a key over its limit, want 0", got)
	}
	r.advance(60 * time.Millisecond)
	if ok, _ := r.decide(t, req); !ok {
		t.Fatal("denied at the retry time: the cache outlived what Redis said")
	}
	if got := r.calls.n.Load() - calls; got != 1 {
		t.Fatalf("%d calls at the retry time, want 1", got)
	}
}

// A denial of cost c is remembered for cost c only: a larger cost has a
// later retry time, a smaller one may pass.
func TestCacheOnlyForSameCost(t *testing.T) {
	r := newCacheRig(t, Options{})
	z := mustZone(t, r.s, "ccost", algorithms.NameTokenBucket, policy(10, time.Hour))
	calls := r.calls.n.Load()
	for i, step := range []struct {
		cost  int64
		ok    bool
		calls int64 // in all so far
		why   string
	}{
		{6, true, 1, "6 of 10"},
		{5, false, 2, "5 more of 10: Redis denies, the cache remembers cost 5"},
		{5, false, 2, "cost 5 again: answered locally"},
		{9, false, 3, "cost 9: a later retry time only Redis knows"},
		{3, true, 4, "cost 3 with 4 units left: must not be answered by cost 5's denial"},
		{5, false, 5, "cost 5 after taking 3: the retry time moved, Redis decides"},
	} {
		ok, _ := r.decide(t, backend.Request{Limit: z, Key: "k", Cost: step.cost})
		if got := r.calls.n.Load() - calls; ok != step.ok || got != step.calls {
			t.Fatalf("step %d (%s): allowed=%v after %d calls, want %v after %d", i, step.why, ok, got, step.ok, step.calls)
		}
	}
}

// A refund through this store gives units back: the remembered denial
// goes.
func TestCacheRefundForgets(t *testing.T) {
	r := newCacheRig(t, Options{})
	z := mustZone(t, r.s, "crefund", algorithms.NameFixedWindow, policy(2, time.Hour))
	req := backend.Request{Limit: z, Key: "k", Cost: 1}
	_, granted := r.decide(t, req)
	r.decide(t, req)
	if ok, _ := r.decide(t, req); ok {
		t.Fatal("third of 2 allowed")
	}
	if err := r.s.Refund(context.Background(), []backend.Request{req}, granted); err != nil {
		t.Fatal(err)
	}
	if ok, _ := r.decide(t, req); !ok {
		t.Fatal("denied after a refund: the cache kept a denial that no longer holds")
	}
}

// A new policy for the zone (a reload) is decided by Redis, not by what
// the old policy denied.
func TestCachePolicyChangeForgets(t *testing.T) {
	r := newCacheRig(t, Options{})
	z := mustZone(t, r.s, "cpolicy", algorithms.NameFixedWindow, policy(2, time.Hour))
	req := backend.Request{Limit: z, Key: "k", Cost: 1}
	r.decide(t, req)
	r.decide(t, req)
	if ok, _ := r.decide(t, req); ok {
		t.Fatal("third of 2 allowed")
	}
	r.s.mu.Lock()
	held := r.s.held[0]
	r.s.mu.Unlock()
	bigger := &registration{alg: algorithms.NameFixedWindow, policy: policy(5, time.Hour), owner: "reload"}
	if err := held.z.register(bigger, r.now()); err != nil {
		t.Fatal(err)
	}
	defer held.z.unregister(bigger, r.now())
	if ok, _ := r.decide(t, req); !ok {
		t.Fatal("denied under a limit of 5 after 2: answered with the old policy's denial")
	}
}

// Each key's own denial: a request on two keys is answered locally only
// when both are known to be over; a shadow key always goes to Redis.
func TestCacheSeveralKeysAndShadow(t *testing.T) {
	r := newCacheRig(t, Options{})
	a := mustZone(t, r.s, "cmulti_a", algorithms.NameFixedWindow, policy(1, time.Hour))
	b := mustZone(t, r.s, "cmulti_b", algorithms.NameFixedWindow, policy(100, time.Hour))
	ra, rb := backend.Request{Limit: a, Key: "k", Cost: 1}, backend.Request{Limit: b, Key: "k", Cost: 1}
	r.decide(t, ra)
	r.decide(t, ra) // a is now remembered as over
	calls := r.calls.n.Load()
	if ok, _ := r.decide(t, ra, rb); ok {
		t.Fatal("allowed with a over its limit")
	}
	if got := r.calls.n.Load() - calls; got != 1 {
		t.Fatalf("b unknown: %d calls, want 1 (Redis answers for b)", got)
	}
	shadow := ra
	shadow.Shadow = true
	calls = r.calls.n.Load()
	ok, res := r.decide(t, shadow)
	if !ok || res[0].Allowed {
		t.Fatalf("shadow: allowed=%v result allowed=%v, want the request allowed and the key's result denied", ok, res[0].Allowed)
	}
	if got := r.calls.n.Load() - calls; got != 1 {
		t.Fatalf("shadow request: %d calls, want 1", got)
	}
}

// When the retry time comes, one request asks Redis while the others
// wait for its answer, instead of all of them reaching Redis at once.
func TestCacheRetryTimeProbesOnce(t *testing.T) {
	r := newCacheRig(t, Options{})
	z := mustZone(t, r.s, "cprobe", algorithms.NameTokenBucket, policy(10, time.Second))
	req := backend.Request{Limit: z, Key: "k", Cost: 1}
	for range 11 {
		r.decide(t, req)
	}
	r.advance(100 * time.Millisecond) // one unit back
	calls := r.calls.n.Load()
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for range 64 {
		wg.Go(func() {
			out := make([]algorithms.Result, 1)
			ok, err := r.s.Decide(context.Background(), []backend.Request{req}, out)
			if err != nil {
				t.Error(err)
			}
			if ok {
				admitted.Add(1)
			}
		})
	}
	wg.Wait()
	if admitted.Load() != 1 {
		t.Fatalf("%d admitted with one unit back, want 1", admitted.Load())
	}
	// One call takes the unit, the next learns the new retry time.
	if got := r.calls.n.Load() - calls; got != 2 {
		t.Fatalf("%d calls for 64 requests at the retry time, want 2", got)
	}
}

// The cache holds at most its size, dropping the oldest key.
func TestCacheBounded(t *testing.T) {
	r := newCacheRig(t, Options{CacheSize: 3})
	z := mustZone(t, r.s, "cbound", algorithms.NameFixedWindow, policy(1, time.Hour))
	keys := []string{"a", "b", "c", "d", "e"}
	for _, k := range keys {
		r.decide(t, backend.Request{Limit: z, Key: k, Cost: 1})
		r.decide(t, backend.Request{Limit: z, Key: k, Cost: 1})
	}
	if n := r.s.cache.len(); n != 3 {
		t.Fatalf("cache holds %d keys, want its size 3", n)
	}
	calls := r.calls.n.Load()
	r.decide(t, backend.Request{Limit: z, Key: "e", Cost: 1})
	if r.calls.n.Load() != calls {
		t.Fatal("the newest key was not remembered")
	}
	r.decide(t, backend.Request{Limit: z, Key: "a", Cost: 1})
	if r.calls.n.Load() != calls+1 {
		t.Fatal("the oldest key was still remembered past the size")
	}
}

func TestCacheOff(t *testing.T) {
	r := newCacheRig(t, Options{NoCache: true})
	z := mustZone(t, r.s, "coff", algorithms.NameFixedWindow, policy(1, time.Hour))
	req := backend.Request{Limit: z, Key: "k", Cost: 1}
	for range 10 {
		r.decide(t, req)
	}
	if got := r.calls.n.Load(); got < 10 {
		t.Fatalf("%d calls for 10 requests with the cache off", got)
	}
	if r.s.cache != nil {
		t.Fatal("cache made although off")
	}
}

// A request waiting for another's answer gives up with its context or
// at the timeout.
func TestCacheWaitEndsWithContext(t *testing.T) {
	// A server that accepts and never answers holds the probing request.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c := goredis.NewClient(&goredis.Options{Addr: ln.Addr().String(), ContextTimeoutEnabled: true, Protocol: 2, DisableIdentity: true})
	defer c.Close()
	s, err := New(c, Options{KeyPrefix: uniquePrefix(t), Timeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	z := mustZone(t, s, "cwait", algorithms.NameFixedWindow, policy(1, time.Hour))
	it := item{key: z.(*zone).prefix + "k}", conf: z.(*zone).st.conf.Load(), cost: 1}
	s.cache.learn([]item{it}, []algorithms.Result{{RetryAfter: 1}}, false, s.cache.now()-2, 0, nil)
	ok, wait, probing := s.cache.answer([]item{it}, make([]algorithms.Result, 1))
	if ok || wait != nil || len(probing) != 1 {
		t.Fatalf("expired entry: ok=%v wait=%v probing=%d, want this request to probe", ok, wait, len(probing))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := s.Decide(ctx, []backend.Request{{Limit: z, Key: "k", Cost: 1}}, make([]algorithms.Result, 1)); err == nil {
		t.Fatal("a request waiting on a probe that never ends returned no error")
	}
	// And with the store's own timeout.
	s.timeout = 50 * time.Millisecond
	if _, err := s.Decide(context.Background(), []backend.Request{{Limit: z, Key: "k", Cost: 1}}, make([]algorithms.Result, 1)); err == nil {
		t.Fatal("a request waiting on a probe that never ends outlived the timeout")
	}
	s.cache.release(probing)
	if _, wait, _ := s.cache.answer([]item{it}, make([]algorithms.Result, 1)); wait != nil {
		t.Fatal("released probe still waited on")
	}
}

func TestModuleLocalCache(t *testing.T) {
	for _, tt := range []struct {
		input string
		json  string
		on    bool
	}{
		{"redis {\n\taddress 127.0.0.1:1\n}", `{"addresses":["127.0.0.1:1"],"name":"redis"}`, true},
		{"redis {\n\taddress 127.0.0.1:1\n\tlocal_cache on\n}", `{"addresses":["127.0.0.1:1"],"local_cache":true,"name":"redis"}`, true},
		{"redis {\n\taddress 127.0.0.1:1\n\tlocal_cache off\n}", `{"addresses":["127.0.0.1:1"],"local_cache":false,"name":"redis"}`, false},
	} {
		m, err := parseModule(t, tt.input)
		if err != nil {
			t.Fatal(err)
		}
		if got := string(caddyconfig.JSONModuleObject(m, "name", "redis", nil)); got != tt.json {
			t.Fatalf("%q adapted to %s, want %s", tt.input, got, tt.json)
		}
		ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
		if err := m.Provision(ctx); err != nil {
			t.Fatal(err)
		}
		if (m.Store.cache != nil) != tt.on {
			t.Fatalf("%q: cache on = %v, want %v", tt.input, m.Store.cache != nil, tt.on)
		}
		m.Close()
		cancel()
	}
	for _, bad := range []string{"local_cache", "local_cache yes", "local_cache on off", "local_cache on\n\tlocal_cache off"} {
		_, err := parseModule(t, "redis {\n\t"+bad+"\n}")
		if err == nil || !strings.Contains(err.Error(), "local_cache") && !strings.Contains(err.Error(), "argument") {
			t.Fatalf("%q: error %v, want one naming local_cache", bad, err)
		}
	}
}

// A denial that Redis gave before a refund of this process ran is not
// remembered: the refund may have made room.
func TestCacheDenialRacingARefund(t *testing.T) {
	c := newOverCache(10, func() int64 { return 1000 })
	it := item{key: "k", conf: new(zoneConf), cost: 1}
	denied := []algorithms.Result{{Limit: 1, RetryAfter: 500}}
	sent, epoch := c.mark()
	c.forget([]item{it}) // a refund of k, between the call and its answer
	c.learn([]item{it}, denied, false, sent, epoch, nil)
	if c.len() != 0 {
		t.Fatal("a denial answered before a refund was remembered")
	}
	sent, epoch = c.mark()
	c.learn([]item{it}, denied, false, sent, epoch, nil)
	if ok, _, _ := c.answer([]item{it}, make([]algorithms.Result, 1)); !ok {
		t.Fatal("a denial with no refund since was not remembered")
	}
}

// A failed call empties the cache: Redis may have come back empty.
func TestCacheClearedByFailedCall(t *testing.T) {
	r := newCacheRig(t, Options{})
	z := mustZone(t, r.s, "cfail", algorithms.NameFixedWindow, policy(1, time.Hour))
	flooded := backend.Request{Limit: z, Key: "k", Cost: 1}
	r.decide(t, flooded)
	r.decide(t, flooded)
	if r.s.cache.len() != 1 {
		t.Fatal("the denial was not remembered")
	}
	other := backend.Request{Limit: z, Key: "other", Cost: 1}
	// A caller whose client left fails too, but that says nothing about
	// Redis: the cache stays, or a client that keeps leaving would empty
	// it for everyone.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := r.s.Decide(ctx, []backend.Request{other}, make([]algorithms.Result, 1)); !errors.Is(err, context.Canceled) {
		t.Fatalf("a call under a cancelled context: err %v, want the cancellation", err)
	}
	if n := r.s.cache.len(); n != 1 {
		t.Fatalf("%d keys remembered after a caller left, want 1", n)
	}
	r.calls.fail.Store(true)
	if _, err := r.s.Decide(context.Background(), []backend.Request{other}, make([]algorithms.Result, 1)); !errors.Is(err, errInjected) {
		t.Fatalf("a failed call: err %v, want the connection's error", err)
	}
	if n := r.s.cache.len(); n != 0 {
		t.Fatalf("%d keys remembered after a failed call, want none", n)
	}
}
