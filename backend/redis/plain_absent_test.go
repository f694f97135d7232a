package redis

import (
	"context"
	"fmt"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
)

// A zone of buckets or fixed windows whose keys are absent writes first
// (decideAbsent: one SET NX per request, no GET), and reads first once its
// keys are present (a GET and a SET, no SET in vain), and writes first
// again once they are absent again: each decided as decideKeys decides it
// alone (replies, values and expiries), the Function on database 0 and
// decideKeys's on database 1. A key of another type, met while the zone
// writes first, fails its request alone; so does a cost past the limit,
// which no absent key would allow, write nothing.
func TestPlainAbsentFirstFollowsTheZone(t *testing.T) {
	generic := loadGeneric(t)
	ctx := context.Background()
	c := goredis.NewClient(&goredis.Options{Addr: standalone(t), ContextTimeoutEnabled: true, PoolSize: 1})
	t.Cleanup(func() { c.Close() })
	conn := c.Conn()
	t.Cleanup(func() { conn.Close() })
	clock := int64(1_764_460_000_000_000_000) + 17*int64(time.Minute) + 123_456_789
	s, err := New(c, Options{KeyPrefix: uniquePrefix(t), Timeout: 10 * time.Second, now: func() int64 { return clock }, NoCache: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })

	// stats is the server's GET and SET calls, scripts' included.
	stats := func() (gets, sets int) {
		t.Helper()
		info := conn.Info(ctx, "commandstats").Val()
		for _, f := range []struct {
			name string
			n    *int
		}{{"get", &gets}, {"set", &sets}} {
			if m := regexp.MustCompile(`cmdstat_` + f.name + `:calls=(\d+)`).FindStringSubmatch(info); m != nil {
				*f.n, _ = strconv.Atoi(m[1])
			}
		}
		return gets, sets
	}
	// call decides reqs, one request each, in one batched call on both
	// databases, compares, and returns database 0's GET and SET calls.
	call := func(z backend.Limit, reqs ...backend.Request) (gets, sets int, reply any) {
		t.Helper()
		live := make([]*pending, len(reqs))
		for i := range reqs {
			items, _, err := s.resolve(reqs[i : i+1])
			if err != nil {
				t.Fatal(err)
			}
			live[i] = &pending{ctx: ctx, items: items}
		}
		cmd, _ := s.manyCmd(ctx, live, nil)
		var replies [2]any
		var seen [2][]string
		for db, name := range []string{functionName, generic} {
			args := slices.Clone(cmd.Args())
			args[0], args[1] = "fcall", name
			if err := conn.Do(ctx, "select", db).Err(); err != nil {
				t.Fatal(err)
			}
			g0, s0 := stats()
			var before, after *goredis.TimeCmd
			var fc *goredis.Cmd
			if _, err := conn.Pipelined(ctx, func(p goredis.Pipeliner) error {
				before = p.Time(ctx)
				fc = p.Do(ctx, args...)
				after = p.Time(ctx)
				return nil
			}); err != nil && err != fc.Err() {
				t.Fatal(err)
			}
			g1, s1 := stats()
			if db == 0 {
				// (stats itself is not a GET or a SET.)
				gets, sets = g1-g0, s1-s0
			}
			replies[db] = fc.Val()
			if fc.Err() != nil {
				replies[db] = fc.Err().Error()
			}
			// Each key's value, and its expiry as ms after the call:
			// between the two times read around it.
			for _, r := range live {
				key := r.items[0].key
				v := conn.Type(ctx, key).Val()
				if v == "string" {
					v = conn.Get(ctx, key).Val()
				}
				exp := conn.Do(ctx, "pexpiretime", key).Val().(int64)
				seen[db] = append(seen[db], fmt.Sprint(key, " ", v), fmt.Sprint(exp), fmt.Sprint(exp-after.Val().UnixMilli()), fmt.Sprint(exp-before.Val().UnixMilli()))
			}
		}
		if !reflect.DeepEqual(replies[0], replies[1]) {
			t.Fatalf("decidePlain replied %q, decideKeys %q", replies[0], replies[1])
		}
		for i := 0; i < len(seen[0]); i += 4 {
			if seen[0][i] != seen[1][i] {
				t.Fatalf("decidePlain left %q, decideKeys %q", seen[0][i], seen[1][i])
			}
			e0, _ := strconv.ParseInt(seen[0][i+1], 10, 64)
			e1, _ := strconv.ParseInt(seen[1][i+1], 10, 64)
			lo0, _ := strconv.ParseInt(seen[0][i+2], 10, 64)
			hi0, _ := strconv.ParseInt(seen[0][i+3], 10, 64)
			lo1, _ := strconv.ParseInt(seen[1][i+2], 10, 64)
			hi1, _ := strconv.ParseInt(seen[1][i+3], 10, 64)
			if (e0 < 0) != (e1 < 0) || e0 >= 0 && (lo0 > hi1 || lo1 > hi0) {
				t.Fatalf("%s: expires %d to %d ms after the call by decidePlain, %d to %d by decideKeys", seen[0][i], lo0, hi0, lo1, hi1)
			}
		}
		return gets, sets, replies[0]
	}

	n := 0
	fresh := func() string { n++; return fmt.Sprintf("10.1.%d.%d", n/256, n%256) }
	const per = 4
	for _, alg := range []string{algorithms.NameTokenBucket, algorithms.NameFixedWindow} {
		t.Run(alg, func(t *testing.T) {
			z := mustZone(t, s, "z-"+alg, alg, policy(1000, time.Hour))
			// run makes calls of per requests of keys named by key, and
			// checks the commands of the last of them: gets GETs and sets
			// SETs a request.
			run := func(what string, calls int, key func(i int) string, gets, sets int) {
				t.Helper()
				var g, st int
				for k := range calls {
					reqs := make([]backend.Request, per)
					for i := range reqs {
						reqs[i] = backend.Request{Limit: z, Key: key(i), Cost: 1 + int64(i%2)}
					}
					g, st, _ = call(z, reqs...)
					clock += int64(time.Second) + int64(k)
				}
				if g != gets*per || st != sets*per {
					t.Fatalf("%s: %d GETs and %d SETs for %d requests, want %d and %d a request", what, g, st, per, gets, sets)
				}
			}
			run("absent keys", 5, func(int) string { return fresh() }, 0, 1)
			// The same key twice in one call: the second sees the
			// first's value.
			k := fresh()
			call(z, backend.Request{Limit: z, Key: k, Cost: 2}, backend.Request{Limit: z, Key: k, Cost: 2}, backend.Request{Limit: z, Key: k, Cost: 2})
			// A cost no absent key allows, and the key of another type.
			call(z, backend.Request{Limit: z, Key: fresh(), Cost: 1001}, backend.Request{Limit: z, Key: fresh(), Cost: 0})
			bad := fresh()
			items, _, _ := s.resolve([]backend.Request{{Limit: z, Key: bad, Cost: 1}})
			for db := range 2 {
				conn.Do(ctx, "select", db)
				conn.HSet(ctx, items[0].key, "f", "v")
			}
			_, _, reply := call(z, backend.Request{Limit: z, Key: fresh(), Cost: 1}, backend.Request{Limit: z, Key: bad, Cost: 1}, backend.Request{Limit: z, Key: fresh(), Cost: 1})
			if r, ok := reply.([]any); !ok || len(r) < 3 || !strings.Contains(fmt.Sprint(r), "WRONGTYPE") {
				t.Fatalf("the key of another type: %v", reply)
			}
			run("absent keys after", 2, func(int) string { return fresh() }, 0, 1)
			// Four keys over and over: present from the second call on.
			hot := []string{fresh(), fresh(), fresh(), fresh()}
			run("present keys", 4, func(i int) string { return hot[i] }, 1, 1)
			run("absent keys again", 3, func(int) string { return fresh() }, 0, 1)
		})
	}
}
