package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddytest"
	"github.com/sluicehq/sluice/internal/redistest"
)

// tierSite is a zone of plans: per API key free 60/1m burst 10 and pro
// 600/1m burst 100 (concurrency caps of 2 and 10 on the memory backend),
// and per account a monthly quota of 15 for free, answered with 402.
func tierSite(zone, backend string, conc bool) string {
	free, pro := "", ""
	if conc {
		free, pro = " concurrency 2", " concurrency 10"
	}
	return caddyfileServer(fmt.Sprintf(`
	rate_limit {
		%s
		respond json
		zone %s {
			by header X-Key
			algorithm token_bucket
			tier {http.request.header.X-Plan}
			tiers {
				free 60/1m burst 10%s
				pro 600/1m burst 100%s
				default free
			}
			scope monthly {
				by header X-Account
				tier {http.request.header.X-Plan}
				tiers {
					free 15/30d
					pro 500000/30d
					default free
				}
				algorithm fixed_window
				status 402
			}
		}
	}
	respond "ok"`, backend, zone, free, pro))
}

// expectBurst sends requests until one is refused, which must be with
// status refused, and requires want admitted before it: exactly, plus what
// the rate refilled meanwhile (one unit per interval), since a slow
// machine (the race detector) can take longer than an interval. It returns
// the number admitted.
func expectBurst(t *testing.T, tester *caddytest.Tester, want int, interval time.Duration, refused int, header ...string) int {
	t.Helper()
	start := time.Now()
	n := 0
	for ; ; n++ {
		r := fetch(t, tester, "GET", "/", header...)
		if r.code == refused {
			break
		}
		if r.code != http.StatusOK || n > 2*want+10 {
			t.Fatalf("request %d: %d %s, want 200 until a %d", n+1, r.code, r.body, refused)
		}
	}
	if extra := int(time.Since(start) / interval); n < want || n > want+extra {
		t.Fatalf("%d admitted before a %d, want %d (and %d refilled meanwhile at most)", n, refused, want, extra)
	}
	return n
}

func testTiers(t *testing.T, zone, backend string) {
	tester := newTester(t, tierSite(zone, backend, backend == ""), "caddyfile")

	// A free key hits its burst; the same key as pro is admitted at once,
	// with pro's whole burst.
	alice := []string{"X-Key", "alice", "X-Account", "acct-alice"}
	expectBurst(t, tester, 10, time.Second, 429, alice...)
	r := fetch(t, tester, "GET", "/", alice...)
	if r.code != 429 || !strings.Contains(r.body, `"code":"rate_limit_exceeded"`) || strings.Contains(r.body, "@") {
		t.Fatalf("free, spent: %d %s", r.code, r.body)
	}
	pro := append(alice, "X-Plan", "pro")
	expectBurst(t, tester, 100, 100*time.Millisecond, 429, pro...)

	// An unknown plan is the default tier.
	expectBurst(t, tester, 10, time.Second, 429, "X-Key", "bob", "X-Account", "acct-bob", "X-Plan", "gold")

	// A flood of made-up plans for one key all land in the default tier:
	// 10 admitted in all, not 10 per value.
	flood := map[int]int{}
	start := time.Now()
	for i := range 200 {
		for code, n := range count(t, tester, 1, "X-Key", "mallory", "X-Account", "acct-mallory-"+strconv.Itoa(i), "X-Plan", "plan-"+strconv.Itoa(i)) {
			flood[code] += n
		}
	}
	if extra := int(time.Since(start) / time.Second); flood[200] < 10 || flood[200] > 10+extra || flood[200]+flood[429] != 200 {
		t.Fatalf("200 made-up plans: %v, want 10 admitted in all (and %d refilled meanwhile at most)", flood, extra)
	}
	_, body := adminCall(t, "GET", "/rate_limit/zones")
	var v struct {
		Zones []struct {
			Name   string
			Limits []struct {
				Scope    string
				Keys     *int64
				Requests float64
			}
		}
	}
	if err := json.Unmarshal([]byte(body), &v); err != nil {
		t.Fatal(err)
	}
	for _, z := range v.Zones {
		if z.Name != zone {
			continue
		}
		if len(z.Limits) != 4 {
			t.Fatalf("%d limits after the flood, want the table's 4: %s", len(z.Limits), body)
		}
		for _, l := range z.Limits {
			free := strings.Contains(l.Scope, "@free:")
			if !free && !strings.Contains(l.Scope, "@pro:") {
				t.Fatalf("limit %q is not of the table", l.Scope)
			}
			if l.Keys != nil && l.Scope[0] == '@' && *l.Keys != map[bool]int64{true: 3, false: 1}[free] {
				t.Fatalf("limit %q holds %d keys, want alice, bob and mallory in free, alice in pro", l.Scope, *l.Keys)
			}
		}
	}

	// Per account, the month's 15 are shared by the account's keys: one
	// key meets its rate (429) with the month not spent, the next spends
	// the month (402, with the quota's own body).
	carol := func(key string) []string { return []string{"X-Key", key, "X-Account", "acct-carol"} }
	spent := expectBurst(t, tester, 10, time.Second, 429, carol("carol-1")...)
	if got := count(t, tester, 15-spent, carol("carol-2")...); got[200] != 15-spent {
		t.Fatalf("carol's second key: %v, want the month's last %d", got, 15-spent)
	}
	r = fetch(t, tester, "GET", "/", carol("carol-3")...)
	ra, _ := strconv.Atoi(r.header.Get("Retry-After"))
	var doc struct {
		Error struct{ Code, Message, Zone, Scope string }
	}
	if err := json.Unmarshal([]byte(r.body), &doc); err != nil || r.code != http.StatusPaymentRequired || doc.Error.Code != "quota_exceeded" ||
		!strings.Contains(doc.Error.Message, "quota") || doc.Error.Scope != "monthly" || ra < 3600 {
		t.Fatalf("the month spent: %d, Retry-After %q, %s (%v): want 402 quota_exceeded of scope monthly", r.code, r.header.Get("Retry-After"), r.body, err)
	}
	// The admin API names a scope's tiers by the scope: carol's month is
	// spent in free, untouched in pro, and a reset gives it back.
	code, body := adminCall(t, "GET", "/rate_limit/zones/"+zone+"/keys/acct-carol?scope=monthly")
	var st struct {
		Limits []struct {
			Scope     string
			Remaining int64
		}
	}
	if err := json.Unmarshal([]byte(body), &st); err != nil || code != 200 || len(st.Limits) != 2 ||
		!strings.HasPrefix(st.Limits[0].Scope, "monthly@free:") || st.Limits[0].Remaining != 0 || st.Limits[1].Remaining != 500000 {
		t.Fatalf("carol's month through the admin API: %d %s", code, body)
	}
	if code, body := adminCall(t, "DELETE", "/rate_limit/zones/"+zone+"/keys/acct-carol?scope=monthly"); code != 200 {
		t.Fatalf("reset: %d %s", code, body)
	}
	if r := fetch(t, tester, "GET", "/", carol("carol-3")...); r.code != 200 {
		t.Fatalf("after the reset: %d %s", r.code, r.body)
	}
	// The rate still answers 429 for an account with its month left.
	expectBurst(t, tester, 10, time.Second, 429, "X-Key", "dan", "X-Account", "acct-dan")
}

func TestTiersMemory(t *testing.T) {
	testTiers(t, "tiers_mem", "")
}

func TestTiersRedis(t *testing.T) {
	redis := redistest.Standalone(t, "")
	testTiers(t, "tiers_redis", fmt.Sprintf("backend redis {\n\t\t\taddress %s\n\t\t\tkey_prefix tierstest:\n\t\t\ttimeout 2s\n\t\t}", redis.Addr))
}

// Each tier has its own concurrency cap, per key: free holds 2 in flight,
// the same key as pro 10 more.
func TestTiersConcurrency(t *testing.T) {
	release := make(chan struct{})
	arrived := make(chan struct{}, 20)
	u := newCountingUpstream(t, func(r *http.Request) {
		if r.Header.Get("X-Hang") != "" {
			arrived <- struct{}{}
			<-release
		}
	})
	newTester(t, caddyfileServer(fmt.Sprintf(`
	rate_limit {
		zone tiers_conc {
			by header X-Key
			tier {http.request.header.X-Plan}
			tiers {
				free 1000/1m concurrency 2
				pro 1000/1m concurrency 3
				default free
			}
		}
	}
	reverse_proxy %s`, strings.TrimPrefix(u.URL, "http://"))), "caddyfile")
	var wg sync.WaitGroup
	hold := func(n int, header ...string) {
		for range n {
			wg.Go(func() {
				if resp, err := get(context.Background(), append(header, "X-Hang", "1")...); err != nil || resp.StatusCode != http.StatusOK {
					t.Errorf("held request: %v %v", resp, err)
				}
			})
			within(t, arrived, "a held request")
		}
	}
	status := func(header ...string) int {
		resp, err := get(context.Background(), header...)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode
	}
	hold(2, "X-Key", "k")
	if got := status("X-Key", "k"); got != http.StatusServiceUnavailable {
		t.Fatalf("free, third in flight: %d, want 503", got)
	}
	if got := status("X-Key", "other"); got != http.StatusOK {
		t.Fatalf("another free key: %d, want 200", got)
	}
	hold(3, "X-Key", "k", "X-Plan", "pro")
	if got := status("X-Key", "k", "X-Plan", "pro"); got != http.StatusServiceUnavailable {
		t.Fatalf("pro, fourth in flight: %d, want 503", got)
	}
	close(release)
	wg.Wait()
	if peak := u.peak.Load(); peak != 5 {
		t.Fatalf("the upstream served %d at once, want 2 free + 3 pro", peak)
	}
}

// A config that picks no tier, or whose tiers are not a table, is refused
// at load, naming the field.
func TestTiersConfigErrors(t *testing.T) {
	for cfg, want := range map[string]string{
		"tiers {\n\t\t\t\tfree 1/s\n\t\t\t\tdefault free\n\t\t\t}":                                                "tiers: set tier to the placeholder",
		"tier {http.vars.plan}\n\t\t\ttiers {\n\t\t\t\tfree 1/s\n\t\t\t\tfree 2/s\n\t\t\t\tdefault free\n\t\t\t}": "given twice",
		"tier {http.vars.plan}\n\t\t\ttiers {\n\t\t\t\tfree 1/s\n\t\t\t\tdefault pro\n\t\t\t}":                    "is not in the tiers table (free)",
		"tier plan\n\t\t\ttiers {\n\t\t\t\tfree 1/s\n\t\t\t\tdefault free\n\t\t\t}":                               "has no placeholder",
		"tier {http.vars.plan}\n\t\t\ttiers {\n\t\t\t\tfree 1/s\n\t\t\t}":                                         "tiers: no default tier",
	} {
		assertLoadError(t, caddyfileServer(`
	rate_limit {
		zone tiers_bad {
			key k
			`+cfg+`
		}
	}
	respond "ok"`), "caddyfile", want)
	}
	redis := redistest.Standalone(t, "")
	assertLoadError(t, caddyfileServer(fmt.Sprintf(`
	rate_limit {
		backend redis {
			address %s
			timeout 2s
		}
		zone tiers_lease {
			key k
			lease 2
			tier {http.vars.plan}
			tiers {
				free 1000/1m
				default free
			}
		}
	}
	respond "ok"`, redis.Addr)), "caddyfile", "lease cannot be used with tiers")
}

// A reload that changes one tier's rate starts that tier afresh and
// keeps the other's usage.
func TestTiersReload(t *testing.T) {
	site := func(freeBurst int) string {
		return caddyfileServer(fmt.Sprintf(`
	rate_limit {
		zone tiers_reload {
			by header X-Key
			algorithm token_bucket
			tier {http.request.header.X-Plan}
			tiers {
				free 1/1h burst %d
				pro 1/1h burst 2
				default free
			}
		}
	}
	respond "ok"`, freeBurst))
	}
	tester := newTester(t, site(3), "caddyfile")
	expectN(t, tester, 3, 200, "GET", "/", "X-Key", "k")
	expectN(t, tester, 2, 200, "GET", "/", "X-Key", "k", "X-Plan", "pro")
	expect429(t, tester, 1, 3600, "GET", "/", "X-Key", "k", "X-Plan", "pro")
	loadConfig(t, withPorts(site(4)), "caddyfile")
	expectN(t, tester, 4, 200, "GET", "/", "X-Key", "k")
	expect429(t, tester, 1, 3600, "GET", "/", "X-Key", "k")
	expect429(t, tester, 1, 3600, "GET", "/", "X-Key", "k", "X-Plan", "pro")
}

// The plans example of docs/protection.md, as written: a free key spends
// its burst of 10, is admitted at once as pro, and an unknown plan is free.
func TestDocsTiersExample(t *testing.T) {
	tester := newTester(t, docSite(t, "../docs/protection.md", "tier {http.request.header.X-Plan}"), "caddyfile")
	key := []string{"X-API-Key", "doc-key"}
	expectBurst(t, tester, 10, time.Second, 429, key...)
	expectBurst(t, tester, 200, 60*time.Millisecond, 429, append(key, "X-Plan", "pro")...)
	expectBurst(t, tester, 10, time.Second, 429, "X-API-Key", "doc-other", "X-Plan", "platinum")
}

// Reloads that change a tier's rate leave no series of the old versions
// behind: after five of them, the zone has one requests_total series per
// tier, not one per version it ever had.
func TestTiersReloadsLeaveNoStaleSeries(t *testing.T) {
	cfg := func(free int) string {
		return caddyfileServerWith("metrics", fmt.Sprintf(`
	rate_limit {
		zone a5_tier_series {
			key static
			tier {http.request.header.X-Plan}
			tiers {
				free %d/1m
				pro 600/1m
				default free
			}
		}
	}
	respond ok`, free))
	}
	tester := newTester(t, cfg(60), "caddyfile")
	for i := range 5 {
		if i > 0 {
			adminRequest(t, "POST", "/load", "text/caddyfile", withPorts(cfg(60+i)))
		}
		do(t, tester, "GET", "/")
		do(t, tester, "GET", "/", "X-Plan", "pro")
	}
	page := adminRequest(t, "GET", "/metrics", "", "")
	var series []string
	for _, line := range strings.Split(page, "\n") {
		if strings.HasPrefix(line, "caddy_rate_limit_requests_total{") && strings.Contains(line, `zone="a5_tier_series"`) {
			series = append(series, line)
		}
	}
	if len(series) != 2 {
		t.Fatalf("%d requests_total series after 5 versions of free, want 2 (free's newest and pro):\n%s", len(series), strings.Join(series, "\n"))
	}
}
