package integration

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
)

// Options that would do nothing are refused when the config loads, naming
// the option (and, from a Caddyfile, its line), rather than accepted and
// ignored: a zone-level max_delay on a zone of scopes looks like a queue
// and is none.
func TestNoOpOptionsAreRefused(t *testing.T) {
	scopes := `"scopes": {"ip": {"key": "{http.vars.client_ip}", "window": "1m", "max_events": 1, "algorithm": "leaky_bucket"}}`
	tests := []struct{ name, cfg, kind, want string }{
		{"max_delay on a zone of scopes", jsonServer(`{"handler": "rate_limit", "rate_limits": {"noop_delay": {"max_delay": "1s", `+scopes+`}}}`, ""), "json",
			`zone \"noop_delay\": max_delay would do nothing on a zone without a rate of its own (only scopes)`},
		{"max_keys on a zone of scopes", jsonServer(`{"handler": "rate_limit", "rate_limits": {"noop_keys": {"max_keys": 100, `+scopes+`}}}`, ""), "json",
			`zone \"noop_keys\": max_keys would do nothing on a zone without a rate of its own`},
		{"missing on a static key", jsonServer(`{"handler": "rate_limit", "rate_limits": {"noop_missing": {"key": "all", "missing": "deny", "window": "1m", "max_events": 5}}}`, ""), "json",
			`zone \"noop_missing\": missing would do nothing: the key \"all\" has no placeholder`},
		{"body_limit without a body field", jsonServer(`{"handler": "rate_limit", "body_limit": 1024, "rate_limits": {"noop_body": {"key": "{http.vars.client_ip}", "window": "1m", "max_events": 5}}}`, ""), "json",
			`body_limit would do nothing: no key or cost reads the request body`},
		{"Caddyfile max_delay on a zone of scopes", caddyfileServer(`
	rate_limit {
		zone noop_cf {
			scope ip {
				by ip
				rate 1/s
				algorithm leaky_bucket
			}
			max_delay 2s
		}
	}
	respond ok`), "caddyfile", `zone \"noop_cf\": max_delay would do nothing on a zone without a rate of its own (only scopes): set max_events and window, or move it into a scope, at Caddyfile:17`},
	}
	// The error comes back inside the admin API's JSON: quotes are escaped.
	// Lines count the default_bind line withPorts adds to the globals.
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { assertLoadError(t, tt.cfg, tt.kind, tt.want) })
	}
}

// Durations in errors are written as a config writes them ("24h", "500000h"),
// not as Go prints them ("24h0m0s") nor in nanoseconds.
func TestDurationsInErrorsAsWritten(t *testing.T) {
	tests := []struct{ name, cfg, kind, want string }{
		{"queue past 73 years", jsonServer(`{"handler": "rate_limit", "rate_limits": {"dur_queue": {"key": "{http.vars.client_ip}", "window": "500000h", "max_events": 1, "algorithm": "leaky_bucket", "max_delay": "400000h"}}}`, ""), "json",
			`zone \"dur_queue\": max_delay 400000h + interval 500000h exceeds 73 years`},
		{"no window", jsonServer(`{"handler": "rate_limit", "rate_limits": {"dur_window": {"key": "{http.vars.client_ip}", "max_events": 1}}}`, ""), "json",
			`zone \"dur_window\": window must be positive, got 0s`},
		{"Caddyfile sweep_interval", caddyfileServer(`
	rate_limit {
		sweep_interval -25h
		zone dur_sweep {
			by ip
			rate 1/s
		}
	}
	respond ok`), "caddyfile", `invalid sweep_interval \"-25h\": must be positive (0 is the default, 1m), at Caddyfile:11`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { assertLoadError(t, tt.cfg, tt.kind, tt.want) })
	}
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

// A config error points at the option's line, not at its zone's.
func TestConfigErrorNamesTheOptionsLine(t *testing.T) {
	cfg := caddyfileServer(`
	rate_limit {
		zone line_of_option {
			key static
			rate 10/1m
			algorithm tokenbucket
		}
	}
	respond "ok"`)
	line := 0
	for i, l := range strings.Split(cfg, "\n") {
		if strings.Contains(l, "algorithm tokenbucket") {
			line = i + 1
		}
	}
	assertLoadError(t, cfg, "caddyfile", `tokenbucket\" (choose one of`)
	assertLoadError(t, cfg, "caddyfile", "Caddyfile:"+strconv.Itoa(line)+`"}`)
}

// Two zones of one name in one config with different rates are refused
// at load (accepted, which rate applies to both would change from run to
// run).
func TestSameZoneNameTwoRatesRefused(t *testing.T) {
	assertLoadError(t, `{
	skip_install_trust
	admin localhost:2999
	http_port 9080
	https_port 9443
}
:9080 {
	rate_limit {
		zone twice {
			key {remote_host}
			rate 2/1h
		}
	}
	respond "a"
}
:9081 {
	rate_limit {
		zone twice {
			key {remote_host}
			rate 100/1h
		}
	}
	respond "b"
}`, "caddyfile", "defined twice in this config")
}

// A cost whose numbers alone add up past what the limit holds refuses
// every request, as a constant cost that large does: a config error, not
// a zone that answers 429 to everyone.
func TestCostSumOverLimitRefused(t *testing.T) {
	for _, cost := range []string{"6+6", "{http.request.header.X-Cost}+11", "5+{http.request.header.X-Cost}+3+3"} {
		assertLoadError(t, caddyfileServer(`
	rate_limit {
		zone a7sum {
			key {remote_host}
			rate 10/1m
			cost `+cost+`
		}
	}
	respond ok`), "caddyfile", "can never pass")
	}
}
