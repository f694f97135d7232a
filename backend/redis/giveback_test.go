package redis

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/internal/redistest"
)

// oomDuringUndo makes the server refuse writes (maxmemory 1, as a Redis
// out of memory does) while an undo call is in flight, and only then: the
// decision before it is taken, its give-back fails on the real server.
type oomDuringUndo struct {
	admin *goredis.Client
	mu    sync.Mutex
	undos int
}

// scriptMode is the mode argument of a script call: after the command,
// the script (or function) and the keys.
func scriptMode(cmd goredis.Cmder) string {
	a := cmd.Args()
	if len(a) < 3 {
		return ""
	}
	n, ok := a[2].(int)
	if !ok || len(a) <= 3+n {
		return ""
	}
	m, _ := a[3+n].(string)
	return m
}

func (o *oomDuringUndo) around(ctx context.Context, cmds []goredis.Cmder, next func() error) error {
	undo := false
	for _, c := range cmds {
		undo = undo || scriptMode(c) == "x"
	}
	if !undo {
		return next()
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.undos++
	if err := o.admin.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
		return err
	}
	err := next()
	if e := o.admin.ConfigSet(ctx, "maxmemory", "0").Err(); e != nil {
		return e
	}
	return err
}

func (o *oomDuringUndo) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (o *oomDuringUndo) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		return o.around(ctx, []goredis.Cmder{cmd}, func() error { return next(ctx, cmd) })
	}
}

func (o *oomDuringUndo) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		return o.around(ctx, cmds, func() error { return next(ctx, cmds) })
	}
}

// When Redis refuses the give-back of what one slot took while another
// slot denied, the units stay charged: each failure is counted (the
// metric and the store's count), and the log gets one line a minute at
// most, with how many failed since its last: a give-back that fails
// must not be dropped without a trace.
func TestGiveBackFailuresCountedAndLoggedOnce(t *testing.T) {
	srv := redistest.Standalone(t, "")
	admin := goredis.NewClient(&goredis.Options{Addr: srv.Addr})
	t.Cleanup(func() { admin.Close() })
	c := goredis.NewClient(&goredis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	oom := &oomDuringUndo{admin: admin}
	c.AddHook(oom)
	// split groups the keys by hash slot as on a cluster, so that the
	// two zones' keys are decided by two calls and one is given back.
	s, err := New(c, Options{KeyPrefix: uniquePrefix(t), Timeout: 10 * time.Second, NoCache: true, split: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	core, logs := observer.New(zap.InfoLevel)
	clock := time.Unix(1_800_000_000, 0)
	s.drops.logger, s.drops.now = zap.New(core), func() time.Time { return clock }
	open := mustZone(t, s, "gb_open", algorithms.NameFixedWindow, policy(1000, time.Hour))
	full := mustZone(t, s, "gb_full", algorithms.NameFixedWindow, policy(1, time.Hour))
	ctx := context.Background()
	out := make([]algorithms.Result, 2)
	// The key is the hash tag: two keys, two slots.
	if slotOf("{a}") == slotOf("{b}") {
		t.Fatal("keys a and b share a slot")
	}
	// Both keys exist: an undo writes the open one's value back (a key
	// that did not exist is deleted, which a Redis out of memory still
	// does).
	for _, r := range []backend.Request{{Limit: full, Key: "b", Cost: 1}, {Limit: open, Key: "a", Cost: 1}} {
		if ok, err := s.Decide(ctx, []backend.Request{r}, out[:1]); !ok || err != nil {
			t.Fatalf("the first request of %s: %v %v", r.Limit.Name(), ok, err)
		}
	}
	metric := testutil.ToFloat64(undoFailures)
	const n = 20
	both := []backend.Request{{Limit: open, Key: "a", Cost: 1}, {Limit: full, Key: "b", Cost: 1}}
	for i := range n {
		if ok, err := s.Decide(ctx, both, out); ok || err != nil {
			t.Fatalf("request %d on a full limit: allowed=%v err=%v", i, ok, err)
		}
	}
	if oom.undos != n {
		t.Fatalf("%d undo calls for %d requests denied by one of two slots, want %d", oom.undos, n, n)
	}
	// The give-backs really failed: the open zone kept every unit.
	if ok, err := s.Decide(ctx, []backend.Request{{Limit: open, Key: "a", Cost: 0}}, out[:1]); !ok || err != nil || out[0].Remaining != 999-n {
		t.Fatalf("the open zone: %v %v, %d left; want %d (its give-backs refused)", ok, err, out[0].Remaining, 999-n)
	}
	if got := s.drops.failures(); got != n {
		t.Errorf("the store counted %d failed give-backs, want %d", got, n)
	}
	if got := testutil.ToFloat64(undoFailures) - metric; got != n {
		t.Errorf(`caddy_rate_limit_redis_give_back_failures_total{op="undo"} went up by %v, want %d`, got, n)
	}
	lines := logs.FilterMessageSnippet("giving back").All()
	if len(lines) != 1 || lines[0].ContextMap()["failed"] != int64(1) || !strings.Contains(lines[0].ContextMap()["error"].(string), "OOM") {
		t.Fatalf("%d failed give-backs logged %+v, want one line of the first, with Redis's OOM", n, lines)
	}
	clock = clock.Add(dropsLogEvery)
	if ok, err := s.Decide(ctx, both, out); ok || err != nil {
		t.Fatalf("a minute later: allowed=%v err=%v", ok, err)
	}
	lines = logs.FilterMessageSnippet("giving back").All()
	if len(lines) != 2 || lines[1].ContextMap()["failed"] != int64(n) {
		t.Fatalf("a minute later, logged %+v; want a second line with the %d failed since the first", lines, n)
	}
}

// A lease's unused units that Redis does not take back when the last
// config using it unloads are counted and logged too.
func TestLeaseReturnFailureCounted(t *testing.T) {
	srv := redistest.Standalone(t, "")
	admin := goredis.NewClient(&goredis.Options{Addr: srv.Addr})
	t.Cleanup(func() { admin.Close() })
	m, err := provisionModule(t, `{"addresses": ["`+srv.Addr+`"], "key_prefix": "`+uniquePrefix(t)+`", "timeout": "10s"}`)
	if err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zap.InfoLevel)
	m.Store.drops.logger = zap.New(core)
	h, err := m.Register(backend.LimitConfig{Name: "gb_leased", Algorithm: algorithms.NameTokenBucket, Policy: policy(1000, time.Hour), Lease: 10})
	if err != nil {
		t.Fatal(err)
	}
	out := make([]algorithms.Result, 1)
	if ok, err := m.Decide(context.Background(), []backend.Request{{Limit: h, Key: "k", Cost: 1}}, out); !ok || err != nil {
		t.Fatalf("the first request: %v %v", ok, err)
	}
	metric := testutil.ToFloat64(leaseFailures)
	if err := admin.ConfigSet(context.Background(), "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	_ = m.Close()
	if err := admin.ConfigSet(context.Background(), "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(leaseFailures) - metric; got != 1 || m.Store.drops.failures() != 1 {
		t.Errorf(`the 9 units Redis refused back: the metric went up by %v, the store counted %d; want 1 each`, got, m.Store.drops.failures())
	}
	if n := logs.FilterMessageSnippet("giving back").FilterField(zap.String("op", "lease")).Len(); n != 1 {
		t.Errorf("logged %v, want one line of the lease's failed return", logs.All())
	}
}
