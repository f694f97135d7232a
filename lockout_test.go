package sluice

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// Provisioning refuses lock-outs that cannot mean what they say, naming
// the field.
func TestLockoutProvisionErrors(t *testing.T) {
	for _, tc := range []struct {
		name, limit, zone, want string
	}{
		{"zero step", `"lockout": ["1m", 0]`, "", `lockout: step 2 must be positive`},
		{"negative step", `"lockout": ["-1m"]`, "", `lockout: step 1 must be positive`},
		{"decreasing", `"lockout": ["5m", "1m"]`, "", `lockout: each step must be at least as long as the one before: step 2 is 1m after 5m`},
		{"too long", `"lockout": ["721h"]`, "", `lockout: step 1 must be at most 720h`},
		{"empty list", `"lockout": []`, "", `lockout: give at least one step`},
		{"shadow", `"lockout": ["1m"]`, `, "shadow": true`, `lockout: a shadow zone never denies`},
		{"queue", `"lockout": ["1m"], "algorithm": "leaky_bucket", "max_delay": "1s"`, "", `lockout cannot be used with max_delay`},
		{"lease", `"lockout": ["1m"], "lease": 2, "max_events": 1000`, "", `lockout cannot be used with lease`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			limit := `"key": "{http.vars.client_ip}", "max_events": 5, "window": "1m", ` + tc.limit
			if strings.Contains(tc.limit, "max_events") {
				limit = `"key": "{http.vars.client_ip}", "window": "1m", ` + tc.limit
			}
			cfg := `{"rate_limits": {"lockout_err": {` + limit + tc.zone + `}}}`
			_, cleanup, err := provisionJSON([]byte(cfg), nil)
			if err == nil {
				cleanup()
				t.Fatalf("provisioned %s", cfg)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q, want it to contain %q", err, tc.want)
			}
		})
	}
	// A concurrency cap alone has no rate to deny by.
	cfg := `{"rate_limits": {"lockout_conc": {"key": "{http.vars.client_ip}", "concurrency": 2, "lockout": ["1m"]}}}`
	if _, cleanup, err := provisionJSON([]byte(cfg), nil); err == nil || !strings.Contains(err.Error(), "lockout needs a rate") {
		if err == nil {
			cleanup()
		}
		t.Fatalf("concurrency alone: %v", err)
	}
}

func TestLockoutCaddyfileErrors(t *testing.T) {
	for _, tc := range []struct {
		name, block, want string
		line              int
	}{
		{"no steps", "rate_limit {\n\tzone a {\n\t\trate 5/m\n\t\tlockout\n\t}\n}", "lockout needs at least one duration", 5},
		{"bad step", "rate_limit {\n\tzone a {\n\t\trate 5/m\n\t\tlockout 1m soon\n\t}\n}", `invalid lockout step 2 "soon"`, 5},
		{"decreasing", "rate_limit {\n\tzone a {\n\t\trate 5/m\n\t\tlockout 1h 1m\n\t\tkey {http.vars.client_ip}\n\t}\n}", "each step must be at least as long as the one before", 5},
		{"twice", "rate_limit {\n\tzone a {\n\t\trate 5/m\n\t\tlockout 1m\n\t\tlockout 2m\n\t}\n}", "lockout already specified", 6},
		{"in a scope with a queue", "rate_limit {\n\tzone a {\n\t\tscope s {\n\t\t\trate 5/m\n\t\t\talgorithm leaky_bucket\n\t\t\tmax_delay 1s\n\t\t\tlockout 1m\n\t\t}\n\t}\n}", "lockout cannot be used with max_delay", 8},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := ":8080\n" + tc.block + "\n"
			_, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(cfg), nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "Caddyfile:"+strconv.Itoa(tc.line)) {
				t.Fatalf("error %v, want %q at line %d", err, tc.want, tc.line)
			}
		})
	}
}

// lockoutLogin is a login limit of 3 failures a minute, counted by the
// response, with lockout 1m 5m 24h, on a fake clock; login answers what
// the password says.
func lockoutLogin(tb testing.TB, name string, clock *atomic.Int64) func(password string) (status int, retry string, reached bool) {
	tb.Helper()
	cfg := `{"rate_limits": {"` + name + `": {"key": "{http.vars.client_ip}", "max_events": 3, "window": "10m",
		"count_when": {"status_code": [401]}, "reset_when": {"status_code": [2]}, "lockout": ["1m", "5m", "24h"]}}}`
	h, cleanup, err := provisionJSON([]byte(cfg), clock.Load)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(cleanup)
	return func(password string) (int, string, bool) {
		reached := false
		next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) error {
			reached = true
			if password == "right" {
				w.WriteHeader(http.StatusOK)
			} else {
				w.WriteHeader(http.StatusUnauthorized)
			}
			return nil
		})
		_, r := benchRequest(tb, "http://example.com/login", "192.0.2.77:4242")
		rec := httptest.NewRecorder()
		status := http.StatusOK
		if err := h.ServeHTTP(rec, r, next); err != nil {
			var he caddyhttp.HandlerError
			if !errors.As(err, &he) {
				tb.Fatal(err)
			}
			status = he.StatusCode
		} else if rec.Code != 0 {
			status = rec.Code
		}
		return status, rec.Header().Get("Retry-After"), reached
	}
}

// Through the handler, on a fake clock: Retry-After is the lock-out's
// remainder, each lock-out after the one before ended is the next step,
// and a good password (reset_when) clears the level.
func TestLockoutThroughHandler(t *testing.T) {
	var clock atomic.Int64
	clock.Store(fuzzStart)
	login := lockoutLogin(t, "lockout_handler", &clock)
	expect := func(password string, status int, retry string, reached bool) {
		t.Helper()
		s, r, got := login(password)
		if s != status || r != retry || got != reached {
			t.Fatalf("%s password at +%s: %d Retry-After %q reached=%v; want %d %q reached=%v",
				password, time.Duration(clock.Load()-fuzzStart), s, r, got, status, retry, reached)
		}
	}
	for range 3 {
		expect("wrong", 401, "", true)
	}
	expect("wrong", 429, "60", false)
	expect("right", 429, "60", false) // a lock-out holds for good passwords too
	clock.Add(int64(time.Minute))
	expect("wrong", 429, "300", false) // the three failures still count: 5m
	clock.Add(int64(5 * time.Minute))
	expect("wrong", 429, "86400", false)
	clock.Add(int64(24 * time.Hour))
	for range 3 {
		expect("wrong", 401, "", true)
	}
	expect("wrong", 429, "86400", false) // the last step repeats
	clock.Add(int64(24 * time.Hour))
	expect("right", 200, "", true) // forgives the failures and the level
	for range 3 {
		expect("wrong", 401, "", true)
	}
	expect("wrong", 429, "60", false)
}

// lockoutSend returns a request on one key through a token_bucket zone,
// with lockout or not: allowed (100/1m, the clock a second on per
// request) or denied (1/1h, the clock a nanosecond on: after the first
// denial, by the limit, or with lockout by the lock-out).
func lockoutSend(tb testing.TB, name, lockout string, denied bool) func() {
	tb.Helper()
	rate, step := `"max_events": 100, "window": "1m"`, int64(time.Second)
	if denied {
		rate, step = `"max_events": 1, "window": "1h"`, 1
	}
	cfg := `{"rate_limits": {"hot_lockout_` + name + `": {"key": "{http.vars.client_ip}", ` + rate + `, "algorithm": "token_bucket"` + lockout + `}}}`
	var ticking atomic.Int64
	ticking.Store(fuzzStart)
	h, cleanup, err := provisionJSON([]byte(cfg), func() int64 { return ticking.Add(step) })
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(cleanup)
	next := caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { return nil })
	w, r := benchRequest(tb, "http://example.com/login", "192.0.2.7:4242")
	send := func() { _ = h.ServeHTTP(w, r, next) }
	send()
	send()
	return send
}

var lockoutCases = []struct{ name, lockout string }{
	{"plain", ""},
	{"lockout", `, "lockout": ["1m", "5m", "24h"]`},
}

// BenchmarkLockoutServeHTTP is what lockout adds to a request on the
// memory store, against the same zone without lockout.
//
//	go test -run '^$' -bench LockoutServeHTTP -benchmem .
func BenchmarkLockoutServeHTTP(b *testing.B) {
	for _, denied := range []bool{false, true} {
		for _, c := range lockoutCases {
			name := map[bool]string{false: "allowed", true: "denied"}[denied] + "/" + c.name
			b.Run(name, func(b *testing.B) {
				send := lockoutSend(b, strings.ReplaceAll(name, "/", "_"), c.lockout, denied)
				b.ReportAllocs()
				for b.Loop() {
					send()
				}
			})
		}
	}
}

// Lockout allocates nothing on a request, allowed or locked out: the same
// as the zone without it.
func TestLockoutAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool drops values at random under the race detector")
	}
	for _, denied := range []bool{false, true} {
		var got [2]float64
		for i, c := range lockoutCases {
			send := lockoutSend(t, "allocs_"+c.name+strconv.FormatBool(denied), c.lockout, denied)
			got[i] = testing.AllocsPerRun(200, send)
		}
		if got[1] > got[0] {
			t.Fatalf("denied=%v: %v allocations with lockout, %v without", denied, got[1], got[0])
		}
	}
}

// caddy rate-limit inspect marks a locked-out key in its retry column.
func TestPrintStatesLockout(t *testing.T) {
	var b strings.Builder
	err := printStates(&b, []keyState{
		{Zone: "login", Key: "k", Limit: 5, RetryAfter: 299.5, ResetAfter: 299.5, LockoutLevel: 2, LockedOut: 299.5},
		{Zone: "login", Key: "other", Limit: 5, Remaining: 5},
	})
	out := b.String()
	if err != nil || !strings.Contains(out, "4m59.5s (locked out, level 2)") || strings.Count(out, "locked out") != 1 {
		t.Fatalf("%v\n%s", err, out)
	}
}

// With tiers, each tier's limit locks its keys out with the limit's steps.
func TestLockoutWithTiers(t *testing.T) {
	var clock atomic.Int64
	clock.Store(fuzzStart)
	cfg := `{"rate_limits": {"lockout_tiers": {"key": "{http.vars.client_ip}", "tier": "{http.request.header.X-Plan}",
		"tiers": [{"name": "free", "max_events": 1, "window": "1h"}, {"name": "pro", "max_events": 100, "window": "1h"}],
		"default_tier": "free", "lockout": ["1m", "5m"]}}}`
	h, cleanup, err := provisionJSON([]byte(cfg), clock.Load)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cleanup)
	next := caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { return nil })
	send := func() string {
		rec := httptest.NewRecorder()
		_, r := benchRequest(t, "http://example.com/", "192.0.2.78:4242")
		_ = h.ServeHTTP(rec, r, next)
		return rec.Header().Get("Retry-After")
	}
	for i, want := range []string{"", "60", "60"} {
		if got := send(); got != want {
			t.Fatalf("request %d: Retry-After %q, want %q", i+1, got, want)
		}
	}
	clock.Add(int64(time.Minute))
	if got := send(); got != "300" {
		t.Fatalf("after the first lock-out: Retry-After %q, want 300", got)
	}
}
