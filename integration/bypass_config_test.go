package integration

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddytest"
)

// loadRaw posts cfg to the admin API's /load and returns the status and
// the error it gives (or the body).
func loadRaw(t *testing.T, cfg string) (int, string) {
	t.Helper()
	code, out := adminSend(t, "http://"+adminAddr, "POST", "/load", "application/json", withPorts(cfg))
	settle(t, 1)
	var e struct{ Error string }
	if json.Unmarshal([]byte(out), &e) == nil && e.Error != "" {
		return code, e.Error
	}
	return code, out
}

// A config with a huge number is refused with an error that names the
// field, and the running config's rate stays in force, for the keys it
// had seen and for new ones, whatever part of the failed config held the
// number: a later zone, a scope, handler options, a second handler, or
// another site, each after the failed config had registered a new rate
// (1000/1m) for the running zone.
func TestHugeNumbersRefusedRunningRateStays(t *testing.T) {
	for _, alg := range []string{"sliding_window", "fixed_window", "sliding_window_counter", "token_bucket", "gcra", "leaky_bucket"} {
		t.Run(alg, func(t *testing.T) {
			zone := "cfg_running_" + alg
			running := func(rate string) string {
				return fmt.Sprintf(`%q: {"key": "{http.request.header.X-Client}", %s, "algorithm": %q}`, zone, rate, alg)
			}
			handler := func(zones ...string) string {
				return `{"handler": "rate_limit", "rate_limits": {` + strings.Join(zones, ", ") + `}}`
			}
			tester := newTester(t, jsonServer(handler(running(`"max_events": 3, "window": "1h"`))+", "+okHandler, ""), "json")
			expectN(t, tester, 3, http.StatusOK, "GET", "/", "X-Client", "old")
			expect429(t, tester, 1, 3600, "GET", "/", "X-Client", "old")

			raised := running(`"max_events": 1000, "window": "1m"`)
			huge := func(fields string) string {
				return fmt.Sprintf(`"cfg_zz_huge": {"key": "static", %s}`, fields)
			}
			cases := []struct{ name, cfg, want string }{
				{"max_events 2^63-1", jsonServer(handler(raised, huge(`"window": "1m", "max_events": 9223372036854775807`))+", "+okHandler, ""), "max_events"},
				{"max_events near 2^63 in a queue", jsonServer(handler(raised, huge(`"window": "1m", "max_events": 9223372036854774784, "algorithm": "leaky_bucket", "max_delay": "1s"`))+", "+okHandler, ""), `zone "cfg_zz_huge": max_events must be at most 1000000000000000`},
				{"max_events near 2^63 in a fixed window", jsonServer(handler(raised, huge(`"window": "1m", "max_events": 9223372036854774784, "algorithm": "fixed_window"`))+", "+okHandler, ""), `max_events must be at most 1000000000000000`},
				{"max_events of a scope", jsonServer(handler(raised, huge(`"window": "1m", "max_events": 5, "scopes": {"s": {"window": "1m", "max_events": 4611686018427387904, "algorithm": "sliding_window_counter"}}`))+", "+okHandler, ""), `zone "cfg_zz_huge": scope "s": max_events must be at most 1000000000000000`},
				{"window", jsonServer(handler(raised, huge(`"window": 9223372036854774784, "max_events": 5`))+", "+okHandler, ""), `window must be at most 73 years`},
				{"burst", jsonServer(handler(raised, huge(`"window": "1m", "max_events": 5, "algorithm": "token_bucket", "burst": 9223372036854774784`))+", "+okHandler, ""), `burst must be at most 1000000000000000`},
				{"max_delay", jsonServer(handler(raised, huge(`"window": "1m", "max_events": 5, "algorithm": "leaky_bucket", "max_delay": 9223372036854774784`))+", "+okHandler, ""), `max_delay must be between 0 and 73 years`},
				{"cost", jsonServer(handler(raised, huge(`"window": "1m", "max_events": 5, "cost": 9223372036854774784`))+", "+okHandler, ""), `cost 9223372036854775000 can never pass`},
				{"max_keys", jsonServer(handler(raised, huge(`"window": "1m", "max_events": 5, "max_keys": 9223372036854774784`))+", "+okHandler, ""), `max_keys must be at most 1073741824`},
				{"ipv4_prefix", jsonServer(handler(raised, huge(`"window": "1m", "max_events": 5, "ipv4_prefix": 4294967296`))+", "+okHandler, ""), `ipv4_prefix must be between 0 and 32`},
				{"body_limit in a second handler", jsonServer(handler(raised)+`, {"handler": "rate_limit", "body_limit": 9000000000000000000, "rate_limits": {`+huge(`"window": "1m", "max_events": 5`)+`}}, `+okHandler, ""), `body_limit must be from 1 to 16777216 bytes (16MiB), got 9000000000000000000`},
				{"jitter in a second handler", jsonServer(handler(raised)+`, {"handler": "rate_limit", "jitter": -1, "rate_limits": {`+huge(`"window": "1m", "max_events": 5`)+`}}, `+okHandler, ""), `jitter must be a fraction of the wait, 0 or more`},
				{"sweep_interval in a second handler", jsonServer(handler(raised)+`, {"handler": "rate_limit", "sweep_interval": "-1s", "rate_limits": {`+huge(`"window": "1m", "max_events": 5`)+`}}, `+okHandler, ""), `sweep_interval must be positive`},
				{"a later route", jsonServer(handler(raised)+", "+okHandler+`]}, {"match": [{"host": ["a.example"]}], "handle": [`+handler(huge(`"window": "1m", "max_events": 9223372036854774784, "algorithm": "gcra"`)), ""), `max_events must be at most 1000000000000000`},
			}
			for i, tc := range cases {
				code, body := loadRaw(t, tc.cfg)
				if code == http.StatusOK || !strings.Contains(body, tc.want) {
					t.Errorf("%s: /load answered %d %q, want a refusal naming %q", tc.name, code, body, tc.want)
				}
				if passed := countOK(t, tester, 3, "X-Client", "old"); passed != 0 {
					t.Errorf("after the refused config %q, the blocked key got %d of 3 requests through", tc.name, passed)
				}
				if passed := countOK(t, tester, 6, "X-Client", fmt.Sprint("new", i)); passed != 3 {
					t.Errorf("after the refused config %q, a new key got %d of 6 requests through; the running limit is 3", tc.name, passed)
				}
			}
		})
	}
}

// countOK sends n requests and counts the 200s.
func countOK(t *testing.T, tester *caddytest.Tester, n int, header ...string) int {
	t.Helper()
	passed := 0
	for i := 0; i < n; i++ {
		if code, _, _ := do(t, tester, "GET", "/", header...); code == http.StatusOK {
			passed++
		}
	}
	return passed
}

// body_limit has one cap, 16MiB, in JSON and in the Caddyfile: JSON took
// 9e18 (a 150 MiB body then took RSS from 54 to 416 MB) while the Caddyfile
// stopped at 1GiB.
func TestBodyLimitCappedAlike(t *testing.T) {
	tester := newTester(t, jsonServer(okHandler, ""), "json")
	jsonCfg := func(limit string) string {
		return jsonServer(`{"handler": "rate_limit", "body_limit": `+limit+`, "rate_limits": {"cfg_body": {"key": "{http.request.body.json.user}", "window": "1m", "max_events": 2}}}, `+okHandler, "")
	}
	for _, limit := range []string{"9e18", "9000000000000000000", "1073741824", "16777217"} {
		if code, body := loadRaw(t, jsonCfg(limit)); code == http.StatusOK || !strings.Contains(body, "body_limit must be from 1 to 16777216 bytes (16MiB)") {
			t.Errorf("JSON body_limit %s: /load answered %d %q, want it refused naming the cap", limit, code, body)
		}
	}
	site := func(limit string) string {
		return caddyfileServer(`	rate_limit {
		body_limit ` + limit + `
		zone cfg_body_cf {
			by json user
			rate 2/1m
		}
	}
	respond "ok"`)
	}
	for _, limit := range []string{"1GiB", "16777217", "17MB"} {
		assertLoadError(t, site(limit), "caddyfile", "at most 16MiB (16777216 bytes)")
	}
	// At the cap, both load, and a field within the cap still keys.
	loadConfig(t, jsonCfg("16777216"), "json")
	loadConfig(t, site("16MiB"), "caddyfile")
	big := `{"user": "ann", "pad": "` + strings.Repeat("x", 1<<20) + `"}`
	for i := 0; i < 2; i++ {
		if code, _ := post(t, tester, "/", "application/json", big); code != http.StatusOK {
			t.Fatalf("request %d of a 1MiB body: %d", i+1, code)
		}
	}
	if code, _ := post(t, tester, "/", "application/json", big); code != http.StatusTooManyRequests {
		t.Fatalf("third request of the same user: %d, want 429", code)
	}
}

// With the default order, rate_limit runs before basic_auth, so
// {http.auth.user.id} is empty for every request and all users share one
// quota: that is warned about once, naming the order line that fixes it.
// With the order fixed, each user has a quota of their own and nothing is
// warned about.
func TestAuthKeyBeforeBasicAuthWarnsOnce(t *testing.T) {
	const (
		annHash = "$2a$04$UAqEEEUk9QCx3IP5YIAOOef3LQ8cEdoAD9ImU1pdlqEOTK8GCbLDq" // ann-password
		bobHash = "$2a$04$yUKIUvBo9pg60hbZxiV3eePg7Rfnea2Lh1Xltu/SsR0piJdtzB6ta" // bob-password
	)
	ann := []string{"Authorization", "Basic " + base64.StdEncoding.EncodeToString([]byte("ann:ann-password"))}
	bob := []string{"Authorization", "Basic " + base64.StdEncoding.EncodeToString([]byte("bob:bob-password"))}
	run := func(t *testing.T, zone, order string) (annOK, bobOK, warnings int) {
		logFile := filepath.Join(t.TempDir(), "caddy.log")
		tester := newTester(t, caddyfileServerWith(order+`
	log {
		output file `+logFile+`
		format json
		level WARN
	}`, `	rate_limit {
		zone `+zone+` {
			key {http.auth.user.id}
			rate 3/1h
		}
	}
	basic_auth {
		ann `+annHash+`
		bob `+bobHash+`
	}
	respond "ok"`), "caddyfile")
		annOK = countOK(t, tester, 4, ann...)
		bobOK = countOK(t, tester, 4, bob...)
		logs, err := os.ReadFile(logFile)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(logs), "\n") {
			if strings.Contains(line, `"placeholder":"{http.auth.user.id}"`) {
				warnings++
				if !strings.Contains(line, "order rate_limit after basic_auth") || !strings.Contains(line, `"zone":"`+zone+`"`) {
					t.Errorf("the warning does not name the zone and the order line that fixes it: %s", line)
				}
			}
		}
		return annOK, bobOK, warnings
	}
	t.Run("default order", func(t *testing.T) {
		annOK, bobOK, warnings := run(t, "cfg_auth_default", "")
		if annOK+bobOK != 3 {
			t.Errorf("ann got %d and bob %d of 4 through: expected one quota of 3 shared by both", annOK, bobOK)
		}
		if warnings != 1 {
			t.Errorf("%d warnings about {http.auth.user.id}, want exactly 1", warnings)
		}
	})
	t.Run("order fixed", func(t *testing.T) {
		annOK, bobOK, warnings := run(t, "cfg_auth_ordered", "\torder rate_limit after basic_auth")
		if annOK != 3 || bobOK != 3 {
			t.Errorf("ann got %d and bob %d of 4 through: expected 3 each", annOK, bobOK)
		}
		if warnings != 0 {
			t.Errorf("%d warnings about {http.auth.user.id}, want none", warnings)
		}
	})
}

// At the largest max_events each algorithm accepts, costs up to the largest
// a placeholder can give never wrap a count: the quota is spent once, and a
// cost above it is refused without a Retry-After.
func TestHugeCostsNeverWrap(t *testing.T) {
	zones := []string{}
	for _, alg := range []string{"sliding_window", "fixed_window", "sliding_window_counter", "token_bucket", "gcra", "leaky_bucket"} {
		events := "1000000000000000"
		if alg == "sliding_window" {
			events = "4294967295"
		}
		zones = append(zones, fmt.Sprintf(`%q: {"match": [{"path": ["/%s"]}], "key": "static", "window": "1h", "max_events": %s, "algorithm": %q, "cost": "{http.request.header.X-Cost}"}`, "cfg_cost_"+alg, alg, events, alg))
	}
	tester := newTester(t, jsonServer(`{"handler": "rate_limit", "rate_limits": {`+strings.Join(zones, ", ")+`}}, `+okHandler, ""), "json")
	for _, alg := range []string{"sliding_window", "fixed_window", "sliding_window_counter", "token_bucket", "gcra", "leaky_bucket"} {
		most := "1000000000000000"
		if alg == "sliding_window" {
			most = "4294967295"
		}
		path := "/" + alg
		for _, huge := range []string{"9223372036854775807", "99999999999999999999", "1000000000000001"} {
			if code, ra, _ := do(t, tester, "GET", path, "X-Cost", huge); code != http.StatusTooManyRequests || ra != "" {
				t.Errorf("%s: cost %s: %d with Retry-After %q, want 429 without one", alg, huge, code, ra)
			}
		}
		expectN(t, tester, 1, http.StatusOK, "GET", path, "X-Cost", most)
		after := []string{most, "9223372036854775807", "1"}
		if strings.Contains(alg, "bucket") || alg == "gcra" {
			after = after[:2] // a bucket of 10^15 an hour refills a unit every nanosecond
		}
		for _, cost := range after {
			if code, _, _ := do(t, tester, "GET", path, "X-Cost", cost); code != http.StatusTooManyRequests {
				t.Errorf("%s: after the whole quota was spent, cost %s got %d, want 429", alg, cost, code)
			}
		}
	}
}
