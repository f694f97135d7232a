package integration

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// A fleet of three Caddy processes shares a hot key with a lease of 10:
// each process takes 10 units per call to Redis and spends them locally,
// so the key costs about one script call per 10 requests, and the fleet
// admits the limit give or take instances × lease.
func TestRedisLeaseFleet(t *testing.T) {
	addr, c := perfRedis(t)
	const lease, limit = 10, 1000
	algs := []string{"token_bucket", "gcra", "sliding_window", "fixed_window", "sliding_window_counter"}
	var routes strings.Builder
	for _, a := range algs {
		routes.WriteString(fleetRoute("/lease/"+a, "", "lease_fleet_"+a,
			fmt.Sprintf("key one\n\t\t\t\trate %d/1h\n\t\t\t\talgorithm %s\n\t\t\t\tlease %d", limit, a, lease)))
		routes.WriteString(fleetRoute("/nolease/"+a, "", "nolease_fleet_"+a,
			fmt.Sprintf("key one\n\t\t\t\trate %d/1h\n\t\t\t\talgorithm %s", limit, a)))
	}
	f := startFleet(t, fleetSize, fleetGlobals(globalBackend("address "+addr))+fleetSite(nil, "", routes.String()))
	for _, a := range algs {
		t.Run(a, func(t *testing.T) {
			if a == "fixed_window" || a == "sliding_window_counter" {
				// Both floods in one hour window.
				if left := time.Hour - time.Duration(time.Now().UnixNano())%time.Hour; left < 30*time.Second {
					t.Skip("an hour turns within the test")
				}
			}
			const first = 900
			calls := scriptCalls(t, c)
			r := f.flood(t, "/nolease/"+a, first, nil)
			without := scriptCalls(t, c) - calls
			calls = scriptCalls(t, c)
			r = f.flood(t, "/lease/"+a, first, nil)
			with := scriptCalls(t, c) - calls
			if r.admitted != first || len(r.other) > 0 {
				t.Fatalf("admitted %d of %d below the limit (%v)", r.admitted, first, r.other)
			}
			// One take per lease, and at most one more per instance for
			// the units each holds at the end.
			if most := first/lease + fleetSize; with > most {
				t.Fatalf("%d script calls for %d requests with a lease of %d, more than %d", with, first, lease, most)
			}
			t.Logf("%s: %d script calls for %d requests without a lease (%.3f per request), %d with lease %d (%.3f)",
				a, without, first, float64(without)/first, with, lease, float64(with)/first)

			// Past the limit: the fleet admits the limit, give or take what
			// the instances hold.
			calls = scriptCalls(t, c)
			r2 := f.flood(t, "/lease/"+a, 3*limit, nil)
			past := scriptCalls(t, c) - calls
			// Past the limit the over-limit cache answers: a refused take
			// is not tried again before Redis's retry time.
			if past > 3*limit/20 {
				t.Fatalf("%d script calls for %d requests past the limit, more than 0.05 per request", past, 3*limit)
			}
			total := first + r2.admitted
			if total > limit+fleetSize*lease || total < limit-fleetSize*lease || len(r2.other) > 0 {
				t.Fatalf("admitted %d in all, want %d ± %d (%v)", total, limit, fleetSize*lease, r2.other)
			}
			t.Logf("%s: admitted %d of a limit of %d with %d instances × lease %d (per instance %v); %d script calls for the %d requests past the limit",
				a, total, limit, fleetSize, lease, r2.perInstance, past, 3*limit)
		})
	}
}

// A lease that would do nothing, be much looser than the rate, or weaken
// a limit that guards accounts is refused when the config loads, naming
// why.
func TestRedisLeaseRefused(t *testing.T) {
	const redis = "backend redis {\n\t\t\taddress 127.0.0.1:1\n\t\t}"
	for _, c := range []struct{ name, backend, zone, want string }{
		{"memory", "", "key one\n\t\t\trate 1000/1m\n\t\t\tlease 10", "lease 10 does nothing on the memory backend"},
		{"one_percent", redis, "key one\n\t\t\trate 1000/1m\n\t\t\tlease 50", "lease 50 is more than 1% of rate 1000/1m (10)"},
		{"scope_one_percent", redis, "key one\n\t\t\trate 100000/1h\n\t\t\tscope ip {\n\t\t\t\tby ip\n\t\t\t\trate 500/1h\n\t\t\t\tlease 6\n\t\t\t}", "lease 6 is more than 1% of rate 500/1h (5)"},
		{"one", redis, "key one\n\t\t\trate 1000/1m\n\t\t\tlease 1", "lease 1 takes one unit per call"},
		{"fail_closed", redis, "key one\n\t\t\trate 1000/1m\n\t\t\tfail closed\n\t\t\tlease 10", "fails closed"},
		{"body_key", redis, "by json user\n\t\t\trate 1000/1m\n\t\t\tlease 10", "read from the request body"},
		{"email", redis, "by header X-User\n\t\t\tnormalize email\n\t\t\trate 1000/1m\n\t\t\tlease 10", "normalized as email"},
		{"hash", redis, "by header X-User\n\t\t\thash 0123456789abcdef0123\n\t\t\trate 1000/1m\n\t\t\tlease 10", "hashed key"},
		{"shadow", redis, "key one\n\t\t\trate 1000/1m\n\t\t\tlease 10\n\t\t\tshadow", "shadow zone"},
		{"leaky_bucket", redis, "key one\n\t\t\trate 1000/1m\n\t\t\talgorithm leaky_bucket\n\t\t\tlease 10", "leaky_bucket lets requests out one interval apart"},
		{"cost", redis, "key one\n\t\t\trate 10000/1m\n\t\t\tcost 20\n\t\t\tlease 10", "lease 10 is less than cost 20"},
		{"burst", redis, "key one\n\t\t\trate 10000/1m\n\t\t\talgorithm token_bucket\n\t\t\tburst 5\n\t\t\tlease 10", "lease 10 is more than burst 5"},
	} {
		t.Run(c.name, func(t *testing.T) {
			assertLoadError(t, caddyfileServer(`	rate_limit {
		`+c.backend+`
		zone lease_refused_`+c.name+` {
			`+c.zone+`
		}
	}
	respond "ok"`), "caddyfile", c.want)
		})
	}
}

// A leased limit that fails local loads (its in-process fallback takes no
// lease) and spends its units with one script call per lease.
func TestRedisLeaseFailLocal(t *testing.T) {
	addr, c := perfRedis(t)
	tester := newTester(t, caddyfileServer(`	rate_limit {
		backend redis {
			address `+addr+`
			timeout 2s
		}
		zone lease_fail_local {
			key one
			rate 1000/1m
			algorithm gcra
			fail local
			lease 10
		}
	}
	respond "ok"`), "caddyfile")
	before := scriptRuns(t, c)
	expectN(t, tester, 25, 200, "GET", "/")
	if n := scriptRuns(t, c) - before; n != 3 {
		t.Fatalf("%d script runs for 25 requests with lease 10, want 3", n)
	}
}

// scriptRuns is how many times Redis ran the decision script: the calls
// less those refused (NOSCRIPT: a fresh Redis has not loaded it yet).
func scriptRuns(t *testing.T, c *goredis.Client) int {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, m := range regexp.MustCompile(`cmdstat_(?:eval(?:sha)?|fcall):calls=(\d+),.*failed_calls=(\d+)`).FindAllStringSubmatch(info, -1) {
		calls, _ := strconv.Atoi(m[1])
		failed, _ := strconv.Atoi(m[2])
		n += calls - failed
	}
	return n
}

// The admin API reaches a leased key: inspecting shows Redis's state (the
// units an instance holds count as taken), and a reset gives the key its
// full quota and drops the units held, so the next request takes a new
// lease instead of spending units charged to the state that was reset.
func TestRedisLeaseAdmin(t *testing.T) {
	addr, c := perfRedis(t)
	tester := newTester(t, caddyfileServer(`	rate_limit {
		backend redis {
			address `+addr+`
			timeout 2s
		}
		zone lease_admin {
			key one
			rate 1000/1h
			algorithm token_bucket
			lease 10
		}
	}
	respond "ok"`), "caddyfile")
	expectN(t, tester, 3, 200, "GET", "/")
	if ls := keyOp(t, "GET", "/rate_limit/zones/lease_admin/keys/one"); len(ls) != 1 || ls[0].Remaining != 990 {
		t.Fatalf("inspect: %+v, want 990 left in Redis (a lease of 10 taken)", ls)
	}
	if ls := keyOp(t, "DELETE", "/rate_limit/zones/lease_admin/keys/one"); ls[0].Remaining != 1000 {
		t.Fatalf("reset: %+v", ls)
	}
	before := scriptRuns(t, c)
	expectN(t, tester, 1, 200, "GET", "/")
	if n := scriptRuns(t, c) - before; n != 1 {
		t.Fatalf("%d script runs for the first request after a reset, want 1 (a new lease)", n)
	}
	if ls := keyOp(t, "GET", "/rate_limit/zones/lease_admin/keys/one"); ls[0].Remaining != 990 {
		t.Fatalf("after the reset and a request: %+v, want 990", ls)
	}
}

// Caddy's own placeholders for the whole request body read the body as
// much as a field does: a limit keyed by them guards what the body says,
// and leases no more than one keyed by a field.
func TestLeaseWholeBodyKey(t *testing.T) {
	for _, key := range []string{"{http.request.body}", "{http.request.body_base64}"} {
		t.Run(key, func(t *testing.T) {
			assertLoadError(t, caddyfileServer(`	rate_limit {
		backend redis {
			address 127.0.0.1:1
		}
		zone lease_body {
			key `+key+`
			rate 1000/1m
			lease 10
		}
	}
	respond "ok"`), "caddyfile", "read from the request body")
		})
	}
}
