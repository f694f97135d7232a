package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice/internal/redistest"
)

// The same fleet against a Redis Cluster of three masters, the backend
// named in each handler: every algorithm admits exactly 100, and a
// request limited by a per-client zone and a global zone, whose keys live
// in different slots, never passes either limit.
func TestRedisFleetCluster(t *testing.T) {
	nodes := redistest.Cluster(t)
	prefix := fmt.Sprintf("fleet%d:", time.Now().UnixNano())
	backend := redisBackend(3, "address "+strings.Join(nodes, " "), "cluster", "key_prefix "+prefix)
	site := fleetSite(fleetAlgorithms, backend, `	handle /two_slots {
		rate_limit {
			`+backend+`
			zone fleet_per_client {
				key {http.request.header.X-Client}
				rate 2/10m
			}
			zone fleet_all {
				key everyone
				rate 100/10m
			}
		}
		respond ok
	}
`)
	f := startFleet(t, fleetSize, fleetGlobals("")+site)
	for _, a := range fleetAlgorithms {
		t.Run(a, func(t *testing.T) {
			f.expectLimit(t, a)
		})
	}
	t.Run("two_slots", func(t *testing.T) {
		// 64 clients of 2 each could take 128: the global zone stops them
		// at 100. A request that one slot denies is taken back from the
		// other; a request racing with such an undo may be refused (never
		// admitted over the limit), so the flood admits at most 100, and
		// requests one at a time afterwards find exactly the rest.
		total := 10 * fleetClients
		r := f.flood(t, "/two_slots", total, func(c int) http.Header {
			return http.Header{"X-Client": {"client-" + strconv.Itoa(c)}}
		})
		if len(r.other) > 0 || r.admitted > fleetLimit || r.admitted+r.denied != total {
			t.Fatalf("admitted %d, denied %d of %d, other %v (per instance %v), want at most %d", r.admitted, r.denied, total, r.other, r.perInstance, fleetLimit)
		}
		for c, n := range r.perClient {
			if n > 2 {
				t.Fatalf("client %d was admitted %d times, over its 2", c, n)
			}
		}
		late := 0
		for i := 0; ; i++ {
			req, _ := http.NewRequest("GET", f.bases[i%len(f.bases)]+"/two_slots", nil)
			req.Header.Set("X-Client", "late-"+strconv.Itoa(i))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode == http.StatusTooManyRequests {
				break
			}
			if resp.StatusCode != http.StatusOK || late == fleetLimit {
				t.Fatalf("request %d one at a time: %s after %d more admitted", i, resp.Status, late)
			}
			late++
		}
		if r.admitted+late != fleetLimit {
			t.Fatalf("the flood admitted %d and requests one at a time %d more: %d in all, want %d", r.admitted, late, r.admitted+late, fleetLimit)
		}
		t.Logf("two slots: the flood admitted %d of %d in %v (per instance %v, %d clients admitted), then %d more one at a time", r.admitted, total, r.elapsed.Round(time.Millisecond), r.perInstance, len(r.perClient), late)
		// The two zones' keys are spread over the masters: the requests
		// were decided across slots, not by one node.
		holding := 0
		for _, addr := range nodes {
			c := goredis.NewClient(&goredis.Options{Addr: addr})
			n := 0
			for _, zone := range []string{"fleet_per_client", "fleet_all"} {
				keys, err := c.Keys(context.Background(), prefix+zone+"/*").Result()
				if err != nil {
					t.Fatal(err)
				}
				n += len(keys)
			}
			c.Close()
			if n > 0 {
				holding++
			}
		}
		if holding < 2 {
			t.Fatalf("the two zones' keys are on %d master(s), want them spread", holding)
		}
	})
}

// sameMaster reports whether the Redis Cluster of nodes serves keys a and
// b from one master, as Redis hashes them. A script may read a key of
// another slot of its own master, but not one of another master: a test
// of keys that must share a slot checks that they would not share even
// the master otherwise.
func sameMaster(t *testing.T, nodes []string, a, b string) bool {
	t.Helper()
	c := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: nodes})
	defer c.Close()
	ctx := context.Background()
	//lint:ignore SA1019 CLUSTER SLOTS still answers on Redis 7 and Valkey 8, and names each range's master first
	slots, err := c.ClusterSlots(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	master := func(key string) string {
		slot, err := c.ClusterKeySlot(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range slots {
			if int64(r.Start) <= slot && slot <= int64(r.End) && len(r.Nodes) > 0 {
				return r.Nodes[0].Addr
			}
		}
		t.Fatalf("no master serves slot %d of %q", slot, key)
		return ""
	}
	return master(a) == master(b)
}

// On a Redis Cluster, every admin operation (inspect, lock-out inspect,
// grant, reset) and reset_when work for every key, whatever its hash tag:
// the bucket of requests without a key, keys starting with } or NUL, keys
// holding braces, a plain key. A key's state, its lock-out record and a
// budget's reservations are one slot's keys, reset by one command.
func TestAdminClusterEveryKey(t *testing.T) {
	nodes := redistest.Cluster(t)
	// What makes the test: hashed whole, as an empty hash tag makes them,
	// a budget's state and reservations are on different masters.
	for _, key := range []string{"", "}x"} {
		if state := "a1:adm_budget//l{" + key + "}"; sameMaster(t, nodes, state, state+":R") {
			t.Fatalf("%q and its reservations are on one master: choose another key_prefix", state)
		}
	}
	tester := newTester(t, caddyfileServer(`
	rate_limit {
		backend redis {
			address `+strings.Join(nodes, " ")+`
			cluster
			key_prefix a1:
			timeout 5s
		}
		zone adm_lock {
			match {
				path /lock
			}
			key {query.k}
			rate 2/1h
			lockout 1m 5m
		}
		zone adm_budget {
			match {
				path /budget
			}
			key {query.k}
			rate 2/1h
			charge_when status 2xx
		}
		zone adm_login {
			match {
				path /login
			}
			key {query.k}
			rate 3/1h
			count_when status 4xx
			reset_when status 2xx
		}
	}
	@wrong query pw=wrong
	respond @wrong "wrong" 401
	respond "ok" 200`), "caddyfile")
	type adminKey struct {
		name, key string
		missing   bool
	}
	for _, k := range []adminKey{
		{name: "missing", missing: true},
		{name: "}x", key: "}x"},
		{name: "{x}", key: "{x}"},
		{name: "NUL x", key: "\x00x"},
		{name: "alice", key: "alice"},
	} {
		t.Run(k.name, func(t *testing.T) {
			send := func(path, pw string) int {
				q := url.Values{}
				if !k.missing {
					q.Set("k", k.key)
				}
				if pw != "" {
					q.Set("pw", pw)
				}
				code, _, _ := do(t, tester, "GET", path+"?"+q.Encode())
				return code
			}
			expect := func(what string, want []int, path, pw string) {
				t.Helper()
				var got []int
				for range want {
					got = append(got, send(path, pw))
				}
				if fmt.Sprint(got) != fmt.Sprint(want) {
					t.Errorf("%s: %v, want %v", what, got, want)
				}
			}
			op := func(method, zone, tail string) (lockoutState, bool) {
				t.Helper()
				path := "/rate_limit/zones/" + zone + "/keys/" + url.PathEscape(k.key) + tail
				if k.missing {
					path = "/rate_limit/zones/" + zone + "/missing" + tail
				}
				code, body := adminCall(t, method, path)
				var v struct {
					Limits []struct {
						lockoutState
						Key string
					}
				}
				if code != http.StatusOK || json.Unmarshal([]byte(body), &v) != nil || len(v.Limits) != 1 || v.Limits[0].Key != k.key {
					t.Errorf("%s %s: %d %s, want the state of key %q", method, path, code, body, k.key)
					return lockoutState{}, false
				}
				return v.Limits[0].lockoutState, true
			}
			const ok, denied, spent, wrong = http.StatusOK, http.StatusTooManyRequests, http.StatusServiceUnavailable, http.StatusUnauthorized

			// 2 failures, then a success forgives them (reset_when): 3
			// more failures pass before the fourth is refused; an
			// operator's reset forgives them too.
			expect("login: 2 wrong passwords", []int{wrong, wrong}, "/login", "wrong")
			expect("login: the right password", []int{ok}, "/login", "right")
			expect("login: failures after the success", []int{wrong, wrong, wrong, denied}, "/login", "wrong")
			if st, done := op("DELETE", "adm_login", ""); done && st.Remaining != 3 {
				t.Errorf("reset the login key: %+v, want 3 remaining", st)
			}
			expect("login: failures after the reset", []int{wrong, wrong, wrong, denied}, "/login", "wrong")

			expect("lockout: 2 of 2, then denied and locked out", []int{ok, ok, denied}, "/lock", "")
			if st, done := op("GET", "adm_lock", ""); done && (st.LockoutLevel != 1 || st.LockedOut <= 0 || st.Remaining != 0) {
				t.Errorf("inspect the locked-out key: %+v, want level 1, locked out, 0 remaining", st)
			}
			if st, done := op("DELETE", "adm_lock", ""); done && (st.LockoutLevel != 0 || st.LockedOut != 0 || st.Remaining != 2) {
				t.Errorf("reset the locked-out key: %+v, want no lock-out and 2 remaining", st)
			}
			expect("lockout after the reset", []int{ok, ok, denied}, "/lock", "")

			expect("budget: 2 of 2, then spent", []int{ok, ok, spent}, "/budget", "")
			if st, done := op("POST", "adm_budget", "/grant?units=1"); done && st.Remaining != 1 {
				t.Errorf("grant 1: %+v, want 1 remaining", st)
			}
			expect("budget after a grant of 1", []int{ok, spent}, "/budget", "")
			if st, done := op("DELETE", "adm_budget", ""); done && st.Remaining != 2 {
				t.Errorf("reset the budget: %+v, want 2 remaining", st)
			}
			expect("budget after the reset", []int{ok, ok, spent}, "/budget", "")
		})
	}
}

// On a Redis Cluster, a budget keyed by a header counts the requests that
// lack it (missing shared: the empty key) and keys starting with } as one
// budget each, like any key, and they break nothing for other zones: a
// budget's reservations are a key of their own beside its state, and both
// must share a slot, or every such request fails in Redis and, counted as
// an outage, opens the circuit breaker for every zone of that Redis.
func TestBudgetClusterKeylessRequestsAreOneBudget(t *testing.T) {
	nodes := redistest.Cluster(t)
	// What makes the test: hashed whole, as an empty hash tag makes them,
	// these keys' states and reservations are on different masters.
	for _, key := range []string{"", "}x"} {
		if state := "b2:bkc_sms//l{" + key + "}"; sameMaster(t, nodes, state, state+":R") {
			t.Fatalf("%q and its reservations are on one master: choose another key_prefix", state)
		}
	}
	tester := newTester(t, caddyfileServer(`
	rate_limit {
		backend redis {
			address `+strings.Join(nodes, " ")+`
			cluster
			key_prefix b2:
			timeout 2s
		}
		respond json
		zone bkc_sms {
			match {
				path /sms
			}
			key {http.request.header.X-User}
			rate 3/10m
			charge_when status 2xx
			fail open
		}
		zone bkc_login {
			match {
				path /login
			}
			key {http.request.header.X-User}
			rate 5/10m
			fail closed
		}
	}
	respond "ok"`), "caddyfile")
	// tally sends n requests and counts the answers: sent, refused by the
	// spent budget, refused for a backend that failed, other.
	type tally struct{ ok, spent, down, other int }
	send := func(n int, path string, header ...string) tally {
		var c tally
		for range n {
			code, _, body := do(t, tester, "POST", path, header...)
			switch {
			case code == http.StatusOK:
				c.ok++
			case code == http.StatusServiceUnavailable && strings.Contains(body, `"code":"budget_exhausted"`):
				c.spent++
			case code == http.StatusServiceUnavailable:
				c.down++
			default:
				c.other++
			}
		}
		return c
	}
	keyless := send(3, "/sms")
	var logins tally
	for i := range 12 { // fresh users' first logins, right after
		c := send(1, "/login", "X-User", fmt.Sprintf("user%d", i))
		logins.ok, logins.down, logins.other = logins.ok+c.ok, logins.down+c.down, logins.other+c.other
	}
	more := send(3, "/sms")
	brace := send(6, "/sms", "X-User", "}x")
	named := send(6, "/sms", "X-User", "alice")
	t.Logf("keyless: %+v then %+v; logins: %+v; }x: %+v; alice: %+v", keyless, more, logins, brace, named)
	want := tally{ok: 3}
	if keyless != want || more != (tally{spent: 3}) || logins != (tally{ok: 12}) ||
		brace != (tally{ok: 3, spent: 3}) || named != (tally{ok: 3, spent: 3}) {
		t.Fatalf("keyless requests %+v then %+v (want 3 sent, then 3 refused as spent); fresh logins %+v (want 12 sent); "+
			"key }x %+v, alice %+v (want 3 sent and 3 spent each)", keyless, more, logins, brace, named)
	}
}

// On a Redis Cluster, a key whose state the script fails on (a corrupt
// one here; a key of another type is the same) fails its own requests by
// its zone's fail policy, alone, whether it is decided in a batch with
// other keys of its slot or by a call of its own: Redis answered, so the
// circuit breaker stays closed and every other key and zone of that Redis
// is decided exactly.
func TestRedisClusterKeyFailureFailsAlone(t *testing.T) {
	nodes := redistest.Cluster(t)
	tester := newTester(t, caddyfileServer(`
	rate_limit {
		backend redis {
			address `+strings.Join(nodes, " ")+`
			cluster
			key_prefix kf:
			timeout 2s
		}
		zone kf_api {
			match {
				path /api
			}
			key {http.request.header.X-Key}
			rate 3/10m
			algorithm token_bucket
			fail closed
		}
		zone kf_login {
			match {
				path /login
			}
			key {http.request.header.X-Key}
			rate 3/10m
			fail closed
		}
	}
	respond "ok"`), "caddyfile")
	c := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: nodes})
	defer c.Close()
	// A bucket whose rate is not a number: the script fails rebasing it.
	// The keys "p}…" all have the hash tag "p": one slot, one batch queue.
	corrupt := strconv.FormatInt(time.Now().Add(time.Hour).UnixNano(), 10) + ":x"
	if err := c.Set(t.Context(), "kf:kf_api//b{p}bad}", corrupt, time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	count := func(counts map[int]int, path, key string) {
		code, _, _ := do(t, tester, "GET", path, "X-Key", key)
		counts[code]++
	}
	bad := map[int]int{}
	for range 5 {
		count(bad, "/api", "p}bad")
	}
	logins := map[int]int{}
	for i := range 6 {
		count(logins, "/login", fmt.Sprintf("user%d", i))
	}
	// Concurrently: the corrupt key among keys of its own slot.
	const clients = 16
	var mu sync.Mutex
	badAfter, healthy := map[int]int{}, map[int]int{}
	var wg sync.WaitGroup
	for i := range clients {
		wg.Go(func() {
			b, h := map[int]int{}, map[int]int{}
			count(b, "/api", "p}bad")
			for range 4 {
				count(h, "/api", fmt.Sprintf("p}%d", i))
			}
			count(b, "/api", "p}bad")
			mu.Lock()
			defer mu.Unlock()
			for code, n := range b {
				badAfter[code] += n
			}
			for code, n := range h {
				healthy[code] += n
			}
		})
	}
	wg.Wait()
	t.Logf("corrupt key: %v then %v; fresh logins: %v; healthy keys of its slot: %v", bad, badAfter, logins, healthy)
	if bad[http.StatusServiceUnavailable] != 5 || badAfter[http.StatusServiceUnavailable] != 2*clients {
		t.Fatalf("the corrupt key: %v then %v, want every request 503 (fail closed)", bad, badAfter)
	}
	if logins[http.StatusOK] != 6 {
		t.Fatalf("fresh logins after the corrupt key's failures: %v, want 6 × 200", logins)
	}
	if healthy[http.StatusOK] != 3*clients || healthy[http.StatusTooManyRequests] != clients {
		t.Fatalf("%d keys of 3/10m, 4 requests each, beside the corrupt key: %v, want %d × 200 and %d × 429", clients, healthy, 3*clients, clients)
	}
}

// On a Redis Cluster, two instances share each key's slots, the keys
// spread over the cluster's masters: no key ever has more than its cap at
// the upstream.
func TestRedisSlotsCluster(t *testing.T) {
	nodes := redistest.Cluster(t)
	var mu sync.Mutex
	now, peak := map[string]int{}, map[string]int{}
	u := newCountingUpstream(t, func(r *http.Request) {
		k := r.Header.Get("X-Key")
		mu.Lock()
		now[k]++
		peak[k] = max(peak[k], now[k])
		mu.Unlock()
		time.Sleep(10 * time.Millisecond)
		mu.Lock()
		now[k]--
		mu.Unlock()
	})
	backend := strings.Join(nodes, " ") + "\ncluster"
	opts := "by header X-Key\n\t\t\t\tconcurrency 2\n\t\t\t\tqueue 30s"
	a := startSlotInstance(t, backend, "rslots_cluster", opts, u.URL)
	b := startSlotInstance(t, backend, "rslots_cluster", opts, u.URL)
	keys := []string{"alpha", "bravo", "charlie", "delta", "echo", "foxtrot"}
	var wg sync.WaitGroup
	var ok atomic.Int64
	for i := range 120 {
		base := a.base
		if i%2 == 1 {
			base = b.base
		}
		wg.Go(func() {
			if status(context.Background(), base, "X-Key", keys[i%len(keys)]) == http.StatusOK {
				ok.Add(1)
			}
		})
	}
	wg.Wait()
	if ok.Load() != 120 {
		t.Fatalf("%d of 120 served", ok.Load())
	}
	for _, k := range keys {
		if peak[k] > 2 || peak[k] < 1 {
			t.Fatalf("key %s had %d requests at the upstream at once, want at most 2 (peaks %v)", k, peak[k], peak)
		}
	}
	t.Logf("peaks per key at the upstream: %v", peak)
}

// On a Redis Cluster, the requests that share one quota because they lack
// their key (missing shared, the empty key) are locked out like any key:
// their state and lock-out record live in one slot. In two slots
// ("a7x//l{}" and "a7x//o{}" hash whole, here to two masters), every such
// request would fail in the script ("non local key"), trip the circuit
// breaker, and the whole backend would fail open for every key and zone.
func TestRedisClusterMissingKeyLockout(t *testing.T) {
	nodes := redistest.Cluster(t)
	tester := newTester(t, caddyfileServer(`
	rate_limit {
		backend redis {
			address `+strings.Join(nodes, " ")+`
			cluster
			key_prefix a7:
			timeout 2s
		}
		zone a7x {
			key {http.request.header.X-Key}
			rate 2/1h
			lockout 1m 5m
		}
	}
	respond ok`), "caddyfile")
	expectN(t, tester, 2, http.StatusOK, "GET", "/")
	expect429(t, tester, 59, 60, "GET", "/")
	expect429(t, tester, 59, 60, "GET", "/")
	// The keyless requests broke nothing for the keys that have one.
	expectN(t, tester, 2, http.StatusOK, "GET", "/", "X-Key", "victim")
	expect429(t, tester, 59, 60, "GET", "/", "X-Key", "victim")
}
