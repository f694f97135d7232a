package redis

import (
	"context"
	"fmt"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/internal/redistest"
)

// ownServer starts a server of the test's own with args, and a client of
// it.
func ownServer(t *testing.T, args ...string) *goredis.Client {
	t.Helper()
	needRedis(t)
	srv, err := redistest.StartServer(nil, args...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	c := goredis.NewClient(&goredis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	return c
}

// decideLeft decides one unit of key and returns what is left of 100.
func decideLeft(t *testing.T, s *Store, z backend.Limit, key string) int64 {
	t.Helper()
	out := make([]algorithms.Result, 1)
	ok, err := s.Decide(context.Background(), []backend.Request{{Limit: z, Key: key, Cost: 1}}, out)
	if err != nil || !ok {
		t.Fatalf("decide %s: %v %v", key, ok, err)
	}
	return out[0].Remaining
}

// The script is loaded once as a Function and run by FCALL; a server that
// lost it (FUNCTION FLUSH here; a restart or a failover alike) gets it
// again, and the call that found it missing runs once.
func TestFunctionLoadedOnceAndAgain(t *testing.T) {
	for _, opts := range []Options{{}, {NoBatch: true}} {
		t.Run(fmt.Sprintf("NoBatch=%v", opts.NoBatch), func(t *testing.T) {
			c := ownServer(t)
			ctx := context.Background()
			opts.KeyPrefix, opts.Timeout, opts.NoCache = uniquePrefix(t), 10*time.Second, true
			s, err := New(c, opts)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			z := mustZone(t, s, "f", algorithms.NameTokenBucket, policy(100, time.Hour))
			for i := range 3 {
				if left := decideLeft(t, s, z, "k"); left != int64(99-i) {
					t.Fatalf("decision %d: %d left, want %d", i, left, 99-i)
				}
			}
			st := commandCalls(t, c)
			// (The first FCALL found no function and did not run.)
			if st["fcall"][0] != 4 || st["evalsha"][0]+st["eval"][0] != 0 || st["function|load"][0] != 1 {
				t.Fatalf("fcall %v, evalsha %v, eval %v, function load %v: want 3 FCALL after one load",
					st["fcall"][0], st["evalsha"][0], st["eval"][0], st["function|load"][0])
			}
			if err := c.Do(ctx, "function", "flush").Err(); err != nil {
				t.Fatal(err)
			}
			if left := decideLeft(t, s, z, "k"); left != 96 {
				t.Fatalf("after FUNCTION FLUSH: %d left, want 96 (charged once)", left)
			}
			if st := commandCalls(t, c); st["function|load"][0] != 2 || s.noFunctions.Load() {
				t.Fatalf("function loads %v, EVALSHA %v: want the function loaded again", st["function|load"][0], s.noFunctions.Load())
			}
		})
	}
}

// A server without Functions (FUNCTION renamed away, as on Redis 6, where
// FCALL is unknown too) or a user the ACL refuses them runs the script by
// EVALSHA, and each call still runs once.
func TestScriptWithoutFunctions(t *testing.T) {
	cases := []struct {
		name   string
		client func(t *testing.T, prefix string) *goredis.Client
	}{
		{"FUNCTION renamed", func(t *testing.T, _ string) *goredis.Client {
			return ownServer(t, "--rename-command", "FUNCTION", "")
		}},
		{"FCALL and FUNCTION renamed", func(t *testing.T, _ string) *goredis.Client {
			return ownServer(t, "--rename-command", "FUNCTION", "", "--rename-command", "FCALL", "")
		}},
		{"ACL without them", func(t *testing.T, prefix string) *goredis.Client {
			admin := ownServer(t)
			args := []any{"ACL", "SETUSER", "old", "on", ">pw", "~" + prefix + "*", "resetchannels", "-@all",
				"+evalsha", "+eval", "+time", "+get", "+set", "+getrange", "+setrange", "+append", "+pexpire", "+pttl", "+del", "+client|setname"}
			if err := admin.Do(context.Background(), args...).Err(); err != nil {
				t.Fatal(err)
			}
			c := goredis.NewClient(&goredis.Options{Addr: admin.Options().Addr, Username: "old", Password: "pw", ContextTimeoutEnabled: true})
			t.Cleanup(func() { c.Close() })
			return c
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			prefix := uniquePrefix(t)
			c := tc.client(t, prefix)
			for _, opts := range []Options{{}, {NoBatch: true}} {
				opts.KeyPrefix, opts.Timeout, opts.NoCache = prefix, 10*time.Second, true
				s, err := New(c, opts)
				if err != nil {
					t.Fatal(err)
				}
				z := mustZone(t, s, fmt.Sprintf("f%v", opts.NoBatch), algorithms.NameSlidingWindow, policy(100, time.Hour))
				for i := range 3 {
					if left := decideLeft(t, s, z, "k"); left != int64(99-i) {
						t.Fatalf("NoBatch=%v decision %d: %d left, want %d", opts.NoBatch, i, left, 99-i)
					}
				}
				if !s.noFunctions.Load() {
					t.Fatal("the store did not go on with EVALSHA")
				}
				s.Close()
			}
		})
	}
}

// On a Cluster each master loads the function when it first lacks it.
func TestFunctionOnCluster(t *testing.T) {
	c := clusterClient(t)
	ctx := context.Background()
	s := newStore(t, c)
	z := mustZone(t, s, "f", algorithms.NameTokenBucket, policy(100, time.Hour))
	keys := []string{"a", "b", "c", "d", "e", "f", "g", "h"}
	for round := range 2 {
		if err := c.ForEachMaster(ctx, func(ctx context.Context, m *goredis.Client) error {
			return m.Do(ctx, "function", "flush").Err()
		}); err != nil {
			t.Fatal(err)
		}
		reqs := make([]backend.Request, len(keys))
		for i, k := range keys {
			reqs[i] = backend.Request{Limit: z, Key: k, Cost: 1}
		}
		out := make([]algorithms.Result, len(reqs))
		if ok, err := s.Decide(ctx, reqs, out); err != nil || !ok {
			t.Fatalf("round %d: %v %v", round, ok, err)
		}
		for i, r := range out {
			if r.Remaining != int64(99-2*round) {
				t.Fatalf("round %d key %s: %d left, want %d", round, keys[i], r.Remaining, 99-2*round)
			}
		}
		for _, k := range keys {
			if left := decideLeft(t, s, z, k); left != int64(98-2*round) {
				t.Fatalf("round %d key %s alone: %d left", round, k, left)
			}
		}
	}
	if s.noFunctions.Load() {
		t.Fatal("the cluster store fell back to EVALSHA")
	}
}
