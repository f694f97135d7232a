package redis

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
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

// Three failures in a row trip the breaker; a success between them resets
// the count, whether the successes before it skipped gobreaker or not.
func TestBreakerTripsOnFailuresInARowOnly(t *testing.T) {
	b := newBreaker(zap.NewNop(), time.Hour)
	ctx := context.Background()
	down := errors.New("connection refused")
	fail := func() (bool, error) { return false, down }
	succeed := func() (bool, error) { return true, nil }
	for round := range 20 {
		for range breakerTrips - 1 {
			if _, err := b.do(ctx, fail); !errors.Is(err, down) {
				t.Fatalf("round %d: %v, want the failure itself", round, err)
			}
		}
		for range round % 3 {
			if _, err := b.do(ctx, succeed); err != nil {
				t.Fatalf("round %d: %v", round, err)
			}
		}
		if ok, err := b.do(ctx, succeed); !ok || err != nil {
			t.Fatalf("round %d: %v after %d failures and a success, want closed", round, err, breakerTrips-1)
		}
	}
	// One Redis answer about one request alone is a success too.
	alone := func() (bool, error) {
		return false, scriptError("WRONGTYPE Operation against a key holding the wrong kind of value")
	}
	for range 5 {
		for range breakerTrips - 1 {
			_, _ = b.do(ctx, fail)
		}
		_, _ = b.do(ctx, alone)
	}
	if ok, err := b.do(ctx, succeed); !ok || err != nil {
		t.Fatalf("after failures broken by answers about one request: %v, want closed", err)
	}
	// Closed with no failure since a success: the successes skip gobreaker.
	counted := b.cb.Counts().Requests
	for range 10 {
		_, _ = b.do(ctx, succeed)
	}
	if n := b.cb.Counts().Requests - counted; n != 0 {
		t.Fatalf("%d successes of a clear breaker went through gobreaker, want none", n)
	}
	for range breakerTrips {
		_, _ = b.do(ctx, fail)
	}
	calls := 0
	if _, err := b.do(ctx, func() (bool, error) { calls++; return true, nil }); calls != 0 || !errors.Is(err, backend.ErrUnavailable) {
		t.Fatalf("after %d failures in a row: %v with %d calls, want open", breakerTrips, err, calls)
	}
}

// The cost of a decision's pass through a closed breaker.
func BenchmarkBreakerClosed(b *testing.B) {
	br := newBreaker(zap.NewNop(), time.Hour)
	ctx := context.Background()
	call := func() (bool, error) { return true, nil }
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if ok, err := br.do(ctx, call); !ok || err != nil {
				b.Fatal(err)
			}
		}
	})
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

// poisons are states of one key that Redis cannot decide, each with what
// its error says: a value of another type, which Redis refuses
// (WRONGTYPE), and a corrupt state, on which the script itself fails (a
// Lua error: a bucket's rate that is not a number, rebased from nil).
var poisons = []struct {
	name, says string
	plant      func(c goredis.UniversalClient, key string) error
}{
	{"another type", "WRONGTYPE", func(c goredis.UniversalClient, key string) error {
		return c.HSet(context.Background(), key, "f", "1").Err()
	}},
	{"corrupt state", "user_function:", func(c goredis.UniversalClient, key string) error {
		return c.Set(context.Background(), key, strconv.FormatInt(time.Now().Add(time.Hour).UnixNano(), 10)+":x", time.Hour).Err()
	}},
}

// A key Redis cannot decide fails the requests that name it, batched or
// not: Redis answered, so the breaker stays closed and the other keys are
// still decided.
func TestKeyRedisCannotDecideFailsAlone(t *testing.T) {
	for _, p := range poisons {
		for _, noBatch := range []bool{false, true} {
			t.Run(p.name+"/nobatch="+strconv.FormatBool(noBatch), func(t *testing.T) {
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
				if err := p.plant(c, prefix+"poisoned//b{poison}"); err != nil {
					t.Fatal(err)
				}
				out := make([]algorithms.Result, 1)
				for i := range breakerTrips + 2 {
					_, err := m.Decide(context.Background(), []backend.Request{{Limit: z, Key: "poison", Cost: 1}}, out)
					if !errors.Is(err, backend.ErrUnavailable) || !strings.Contains(err.Error(), p.says) {
						t.Fatalf("poisoned key, decision %d: %v, want unavailable for %s", i, err, p.says)
					}
				}
				if ok, err := m.Decide(context.Background(), []backend.Request{{Limit: z, Key: "healthy", Cost: 1}}, out); !ok || err != nil {
					t.Fatalf("another key after the poisoned one: %v %v, want decided and allowed", ok, err)
				}
			})
		}
	}
}

// The circuit breaker opens on Redis's own failures only: an error of one
// request's keys or script is Redis's answer about that request. The
// replies are Redis 7.0's (measured), Redis 6's forms of the same, and the
// messages the batch script catches for one request.
func TestFailedAlone(t *testing.T) {
	reply := func(msg string) error { return scriptError(msg) }
	for _, c := range []struct {
		name  string
		err   error
		alone bool
	}{
		{"key of another type", reply("WRONGTYPE Operation against a key holding the wrong kind of value script: d3c2, on @user_script:1."), true},
		{"key of another type, caught in a batch", reply("WRONGTYPE Operation against a key holding the wrong kind of value"), true},
		{"key of another master", reply("ERR Script attempted to access a non local key in a cluster node"), true},
		{"keys of two slots", reply("CROSSSLOT Keys in request don't hash to the same slot"), true},
		{"go-redis's cross-slot error", goredis.ErrCrossSlot, true},
		{"Lua error", reply("ERR user_script:1: attempt to perform arithmetic on local 'x' (a nil value) script: 104a, on @user_script:1."), true},
		{"Lua error, caught in a batch", reply("user_script:1227: attempt to compare nil with number"), true},
		{"Lua error of the Function", reply("ERR user_function:270: attempt to perform arithmetic on local 'd' (a nil value) script: sluice_48, on @user_function:270."), true},
		{"Lua error of the Function, caught in a batch", reply("user_function:270: attempt to perform arithmetic on local 'd' (a nil value)"), true},
		{"error() of the script", reply("ERR user_script:333: calendar window: the clock of Redis and of the Caddy that called differ by more than a window script: 800a, on @user_script:333."), true},
		{"Redis 6 key of another type", reply("ERR Error running script (call to f_d3c2): @user_script:1: WRONGTYPE Operation against a key holding the wrong kind of value"), true},
		{"Redis 6 Lua error", reply("ERR Error running script (call to f_104a): @user_script:1: user_script:1: attempt to perform arithmetic on a nil value"), true},
		{"wrapped", fmt.Errorf("redis backend: %w", reply("WRONGTYPE Operation against a key")), true},

		{"out of memory", reply("OOM command not allowed when used memory > 'maxmemory'. script: aadf, on @user_script:1."), false},
		{"out of memory, caught in a batch", reply("OOM command not allowed when used memory > 'maxmemory'."), false},
		{"Redis 6 out of memory in a script", reply("ERR Error running script (call to f_aadf): @user_script:1: @user_script:1: -OOM command not allowed when used memory > 'maxmemory'."), false},
		{"replica after a failover", reply("READONLY You can't write against a read only replica. script: aadf, on @user_script:1."), false},
		{"Redis 6 replica in a script", reply("ERR Error running script (call to f_aadf): @user_script:9: -READONLY You can't write against a read only replica."), false},
		{"loading", reply("LOADING Redis is loading the dataset in memory"), false},
		{"busy", reply("BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE."), false},
		{"master down", reply("MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'."), false},
		{"cluster down", reply("CLUSTERDOWN The cluster is down"), false},
		{"resharding", reply("TRYAGAIN Multiple keys request during rehashing of slot"), false},
		{"no password", reply("NOAUTH Authentication required."), false},
		{"wrong password", reply("WRONGPASS invalid username-password pair or user is disabled."), false},
		{"no permission", reply("NOPERM this user has no permissions to run the 'evalsha' command"), false},
		{"cannot persist", reply("MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist to disk."), false},
		{"too many clients", reply("ERR max number of clients reached"), false},
		{"unknown command", reply("ERR unknown command 'evalsha', with args beginning with: "), false},
		{"a reply of no known kind", reply("SOMETHING new"), false},
		{"timeout", context.DeadlineExceeded, false},
		{"connection refused", &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}, false},
		{"closed pool", goredis.ErrClosed, false},
		{"broken reply", io.ErrUnexpectedEOF, false},
		{"a reply the store cannot read", errors.New("script answered 3 values for 2 keys"), false},
		{"a message that merely looks like a reply", errors.New("WRONGTYPE"), false},
		{"none", nil, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := failedAlone(c.err); got != c.alone {
				t.Errorf("failedAlone(%v) = %v, want %v", c.err, got, c.alone)
			}
		})
	}
}
