package sluice

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

func init() { caddy.RegisterModule(panicMatcher{}) }

// panicMatcher is a matcher whose provisioning panics: a bug in some module
// loaded while a zone provisions.
type panicMatcher struct{}

func (panicMatcher) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "http.matchers.sluice_test_panic", New: func() caddy.Module { return new(panicMatcher) }}
}

func (*panicMatcher) Provision(caddy.Context) error { panic("provisioning bug") }

func (*panicMatcher) MatchWithError(*http.Request) (bool, error) { return true, nil }

var _ caddyhttp.RequestMatcherWithError = (*panicMatcher)(nil)

// A provision that panics after a zone registered a new rate is a failed
// provision: Cleanup runs and the running config's rate stays, exactly.
func TestProvisionPanicIsUndone(t *testing.T) {
	running := []byte(`{"rate_limits": {"panic_a": {"key": "{http.request.header.X-Client}", "max_events": 3, "window": "1m", "algorithm": "sliding_window_counter"}}}`)
	failing := []byte(`{"rate_limits": {
		"panic_a": {"key": "static", "max_events": 1000, "window": "7s", "algorithm": "sliding_window_counter"},
		"panic_b": {"key": "static", "max_events": 1, "window": "1m", "match": [{"sluice_test_panic": {}}]}}}`)
	if _, _, err := provisionJSON(failing, nil); err == nil || !strings.Contains(err.Error(), "internal error while provisioning: provisioning bug") {
		t.Fatalf("provisioning a config whose matcher panics: %v", err)
	}
	want := runScript(t, running, nil)
	got := runScriptAllowingPanic(t, running, failing)
	if !slices.Equal(got, want) {
		t.Fatalf("the panicking config changed the running config's answers:\nwithout: %v\nwith:    %v", want, got)
	}
}

// validate provisions a config holding one rate_limit handler, as
// `caddy validate` does, and returns the error.
func validate(t *testing.T, handler string) error {
	t.Helper()
	raw := `{"apps": {"http": {"servers": {"srv": {"listen": [":0"], "routes": [{"handle": [` + handler + `]}]}}}}}`
	var cfg caddy.Config
	if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
		t.Fatalf("bad test config: %v", err)
	}
	return caddy.Validate(&cfg)
}

func TestProvisionErrors(t *testing.T) {
	tests := []struct {
		name, zone, want string
	}{
		{"zero max_events", `"window": "1m", "max_events": 0`, `zone "z": max_events must be at least 1, got 0`},
		{"negative max_events", `"window": "1m", "max_events": -5`, `zone "z": max_events must be at least 1, got -5`},
		{"missing window", `"max_events": 5`, `zone "z": window must be positive, got 0s`},
		{"negative window", `"window": "-1m", "max_events": 5`, `zone "z": window must be positive`},
		{"negative burst", `"window": "1m", "max_events": 5, "burst": -1, "algorithm": "token_bucket"`, `zone "z": burst must be at least 1, got -1`},
		{"burst on sliding window", `"window": "1m", "max_events": 5, "burst": 10`, `zone "z": burst does not apply to algorithm sliding_window`},
		{"unknown algorithm", `"window": "1m", "max_events": 5, "algorithm": "leaky"`, `zone "z": unknown algorithm "leaky"`},
		{"v4 prefix too long", `"window": "1m", "max_events": 5, "ipv4_prefix": 33`, `zone "z": ipv4_prefix must be between 0 and 32, got 33`},
		{"v4 prefix negative", `"window": "1m", "max_events": 5, "ipv4_prefix": -1`, `zone "z": ipv4_prefix must be between 0 and 32, got -1`},
		{"v6 prefix too long", `"window": "1m", "max_events": 5, "ipv6_prefix": 129`, `zone "z": ipv6_prefix must be between 0 and 128, got 129`},
		{"cost above burst", `"window": "1m", "max_events": 5, "cost": 6`, `zone "z": cost 6 can never pass: the limit holds at most 5 units (raise max_events)`},
		{"cost above bucket", `"window": "1m", "max_events": 50, "burst": 5, "algorithm": "gcra", "cost": 6`, `zone "z": cost 6 can never pass: the limit holds at most 5 units (raise burst)`},
		{"negative cost", `"window": "1m", "max_events": 5, "cost": -1`, `zone "z": cost must be at least 0, got -1`},
		{"cost text", `"window": "1m", "max_events": 5, "cost": "lots"`, `cost must be a whole number or a placeholder, got "lots"`},
		{"negative max_keys", `"window": "1m", "max_events": 5, "max_keys": -1`, `zone "z": max_keys must be at least 1, got -1`},
		{"huge burst", `"window": "24h", "max_events": 1, "burst": 1099511627776, "algorithm": "token_bucket"`, `zone "z": burst 1099511627776 × interval`},
		{"max_delay on a token bucket", `"window": "1s", "max_events": 5, "algorithm": "token_bucket", "max_delay": "1s"`, `zone "z": max_delay applies only to algorithm leaky_bucket, not token_bucket`},
		{"burst with a queue", `"window": "1s", "max_events": 5, "algorithm": "leaky_bucket", "max_delay": "1s", "burst": 3`, `zone "z": burst does not apply to a leaky_bucket queue`},
		{"negative max_delay", `"window": "1s", "max_events": 5, "algorithm": "leaky_bucket", "max_delay": "-1s"`, `zone "z": max_delay must be positive`},
		{"cost above the queue", `"window": "1s", "max_events": 10, "algorithm": "leaky_bucket", "max_delay": "500ms", "cost": 7`, `zone "z": cost 7 can never pass: the limit holds at most 6 units (raise max_delay)`},
		{"burst on fixed window", `"window": "1m", "max_events": 5, "algorithm": "fixed_window", "burst": 10`, `zone "z": burst does not apply to algorithm fixed_window`},
		{"bad missing", `"window": "1m", "max_events": 5, "missing": "ignore"`, `zone "z": missing must be shared, skip or deny, got "ignore"`},
		{"cost of nested braces", `"window": "1m", "max_events": 5, "cost": "{{}}"`, `cost must be a whole number or a placeholder`},
		{"cost of an open brace", `"window": "1m", "max_events": 5, "cost": "{"`, `cost must be a whole number or a placeholder`},
		{"unknown normalizer", `"window": "1m", "max_events": 5, "normalize": [{"name": "soundex"}]`, `zone "z": normalize[0]: unknown normalizer "soundex"`},
		{"phone without region", `"window": "1m", "max_events": 5, "normalize": [{"name": "phone"}]`, `zone "z": normalize[0]: normalizer phone needs a default region`},
		{"hash secret unset", `"window": "1m", "max_events": 5, "key": "{http.vars.client_ip}", "hash": "{env.SLUICE_TEST_NO_SUCH_VAR}"`, `zone "z": hash: the secret "{env.SLUICE_TEST_NO_SUCH_VAR}" is empty`},
		{"hash secret short", `"window": "1m", "max_events": 5, "hash": "short"`, `zone "z": hash: the secret must be at least 16 bytes, got 5`},
		{"bad allow", `"window": "1m", "max_events": 5, "allow": ["10.0.0.0/40"]`, `zone "z": allow:`},
		{"bad deny", `"window": "1m", "max_events": 5, "deny": ["nowhere"]`, `zone "z": deny:`},
		{"bad scope name", `"window": "1m", "max_events": 5, "scopes": {"a/b": {"window": "1m", "max_events": 1}}`, `zone "z": scope "a/b": a scope name must be non-empty`},
		{"scope without rate", `"window": "1m", "max_events": 5, "scopes": {"ip": {"key": "{http.vars.client_ip}"}}`, `zone "z": scope "ip": max_events must be at least 1, got 0`},
		{"key without rate", `"key": "{http.vars.client_ip}", "scopes": {"ip": {"window": "1m", "max_events": 1}}`, `zone "z": key would do nothing on a zone without a rate of its own (only scopes): set max_events and window, or move it into a scope`},
		{"missing on a static key", `"window": "1m", "max_events": 5, "key": "global", "missing": "deny"`, `zone "z": missing would do nothing: the key "global" has no placeholder`},
		{"prefix and hash on an empty key", `"window": "1m", "max_events": 5, "ipv4_prefix": 24, "hash": "0123456789abcdef0"`, `zone "z": hash, ipv4_prefix would do nothing: the key "" has no placeholder`},
		{"normalize on a scope's static key", `"window": "1m", "max_events": 5, "key": "{http.vars.client_ip}", "scopes": {"all": {"key": "all", "window": "1m", "max_events": 50, "normalize": [{"name": "lower"}]}}`, `zone "z": scope "all": normalize would do nothing`},
		{"max_delay without rate", `"max_delay": "1s", "scopes": {"ip": {"window": "1m", "max_events": 1, "algorithm": "leaky_bucket"}}`, `zone "z": max_delay would do nothing on a zone without a rate of its own`},
		{"lease without rate", `"lease": 10, "scopes": {"ip": {"key": "{http.vars.client_ip}", "window": "1m", "max_events": 100}}`, `zone "z": lease would do nothing on a zone without a rate of its own`},
		{"count_when without rate", `"count_when": {"status_code": [401]}, "reset_when": {"status_code": [2]}, "scopes": {"ip": {"key": "{http.vars.client_ip}", "window": "1m", "max_events": 5}}`, `zone "z": count_when, reset_when would do nothing on a zone without a rate of its own`},
		{"max_keys without rate", `"max_keys": 10, "scopes": {"ip": {"key": "{http.vars.client_ip}", "window": "1m", "max_events": 1}}`, `zone "z": max_keys would do nothing on a zone without a rate of its own`},
		{"prefixes and missing without rate", `"ipv4_prefix": 24, "ipv6_prefix": 64, "missing": "deny", "scopes": {"ip": {"window": "1m", "max_events": 1}}`, `zone "z": ipv4_prefix, ipv6_prefix, missing would do nothing on a zone without a rate of its own (only scopes): set max_events and window, or move them into a scope`},
		{"burst and algorithm without rate", `"burst": 3, "algorithm": "gcra", "scopes": {"ip": {"window": "1m", "max_events": 1}}`, `zone "z": burst, algorithm would do nothing`},
		{"empty body field", `"window": "1m", "max_events": 5, "key": "{http.request.body.json.}"`, `zone "z": key: placeholder {http.request.body.json.} names no field`},
		{"empty JSON path segment", `"window": "1m", "max_events": 5, "key": "{http.request.body.field.a..b}"`, `zone "z": key: placeholder {http.request.body.field.a..b}: the JSON path "a..b" has an empty segment`},
		{"cost names no body field", `"window": "1m", "max_events": 5, "cost": "{http.request.body.json.}"`, `cost: placeholder {http.request.body.json.} names no field`},
		{"bad matcher", `"window": "1m", "max_events": 5, "match": [{"no_such_matcher": {}}]`, `zone "z": loading matchers`},

		// Huge numbers are refused by name, never wrapped. Caddy passes
		// JSON numbers through float64, so 9223372036854774784 arrives as
		// 9223372036854775000 and 2^63−1 does not fit an int64 at all.
		{"max_events 2^63-1", `"window": "1m", "max_events": 9223372036854775807`, `max_events of type int64`}, // Caddy refuses it before Sluice sees it
		{"max_events near 2^63 in a queue", `"window": "1m", "max_events": 9223372036854774784, "algorithm": "leaky_bucket", "max_delay": "1s"`, `zone "z": max_events must be at most 1000000000000000, got 9223372036854775000`},
		{"max_events near 2^63 in a fixed window", `"window": "1m", "max_events": 9223372036854774784, "algorithm": "fixed_window"`, `zone "z": max_events must be at most 1000000000000000`},
		{"max_events past 10^15", `"window": "1h", "max_events": 1000000000000001, "algorithm": "sliding_window_counter"`, `zone "z": max_events must be at most 1000000000000000, got 1000000000000001`},
		{"max_events of a scope", `"window": "1m", "max_events": 5, "scopes": {"s": {"window": "1m", "max_events": 9223372036854774784, "algorithm": "gcra"}}`, `zone "z": scope "s": max_events must be at most 1000000000000000`},
		{"sliding_window events past 2^32", `"window": "1m", "max_events": 4294967296`, `zone "z": max_events must be at most 4294967295 for sliding_window`},
		{"huge window", `"window": 9223372036854774784, "max_events": 5`, `zone "z": window must be at most 73 years, got 2562047h47m16.854775s`},
		{"huge burst", `"window": "1h", "max_events": 5, "burst": 9223372036854774784, "algorithm": "token_bucket"`, `zone "z": burst must be at most 1000000000000000, got 9223372036854775000`},
		{"huge max_delay", `"window": "1s", "max_events": 5, "algorithm": "leaky_bucket", "max_delay": 9223372036854774784`, `zone "z": max_delay must be between 0 and 73 years`},
		{"queue longer than 73 years", `"window": "500000h", "max_events": 1, "algorithm": "leaky_bucket", "max_delay": "400000h"`, `zone "z": max_delay 400000h + interval 500000h exceeds 73 years`},
		{"huge constant cost", `"window": "1m", "max_events": 5, "cost": 9223372036854774784`, `zone "z": cost 9223372036854775000 can never pass: the limit holds at most 5 units`},
		{"huge max_keys", `"window": "1m", "max_keys": 9223372036854774784, "max_events": 5`, `zone "z": max_keys must be at most 1073741824, got 9223372036854775000`},
		{"huge ipv4_prefix", `"window": "1m", "max_events": 5, "ipv4_prefix": 2147483648`, `zone "z": ipv4_prefix must be between 0 and 32, got 2147483648`},
		{"huge ipv6_prefix", `"window": "1m", "max_events": 5, "ipv6_prefix": -9223372036854774784`, `zone "z": ipv6_prefix must be between 0 and 128`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := validate(t, `{"handler": "rate_limit", "rate_limits": {"z": {`+tt.zone+`}}}`)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want it to contain %q", err, tt.want)
			}
		})
	}
	for _, handler := range []struct{ opt, want string }{
		{`"jitter": -0.1`, "jitter must be a fraction of the wait, 0 or more (0.2 adds up to 20%), got -0.1"},
		{`"sweep_interval": "-1s"`, "sweep_interval must be positive (0 is the default, 1m), got -1s"},
		{`"body_limit": -1`, "body_limit must be from 1 to 16777216 bytes (16MiB), got -1"},
		{`"body_limit": 9000000000000000000`, "body_limit must be from 1 to 16777216 bytes (16MiB), got 9000000000000000000"},
		{`"body_limit": 16777217`, "body_limit must be from 1 to 16777216 bytes (16MiB), got 16777217"},
		{`"body_limit": 1024`, "body_limit would do nothing: no key or cost reads the request body"},
	} {
		err := validate(t, `{"handler": "rate_limit", `+handler.opt+`, "rate_limits": {"z": {"window": "1m", "max_events": 1}}}`)
		if err == nil || !strings.Contains(err.Error(), handler.want) {
			t.Errorf("%s: error %v, want %q", handler.opt, err, handler.want)
		}
	}
}

func TestProvisionAcceptsMholtConfigs(t *testing.T) {
	for _, handler := range []string{
		`{"handler": "rate_limit", "rate_limits": {"static_example": {"match": [{"method": ["GET"]}], "key": "static", "window": "1m", "max_events": 100}, "dynamic_example": {"key": "{http.request.remote.host}", "window": "5s", "max_events": 2}}, "distributed": {}}`,
		`{"handler": "rate_limit", "rate_limits": {"p": {"key": "{http.vars.client_ip}", "window": 60000000000, "max_events": 10, "ipv4_prefix": 24, "ipv6_prefix": 56}}, "jitter": 0.2, "sweep_interval": "30s", "log_key": true, "disable_metrics": true}`,
		// Values mholt's loads that make little sense still load: a jitter
		// written as a percent (a warning says it is a fraction), sweeps
		// outside 1s–24h (taken within them).
		`{"handler": "rate_limit", "rate_limits": {"z": {"window": "1m", "max_events": 1}}, "jitter": 20, "sweep_interval": "500ms"}`,
		`{"handler": "rate_limit", "rate_limits": {"z": {"window": "1m", "max_events": 1}}, "jitter": 1e308, "sweep_interval": 1}`,
		`{"handler": "rate_limit", "rate_limits": {"z": {"window": "1m", "max_events": 1}}, "sweep_interval": 9223372036854774784}`,
	} {
		if err := validate(t, handler); err != nil {
			t.Errorf("config for mholt/caddy-ratelimit rejected: %v\n%s", err, handler)
		}
	}
}

func TestCostJSON(t *testing.T) {
	for _, tt := range []struct{ in, out string }{
		{`5`, `5`},
		{`0`, `0`},
		{`"7"`, `7`},
		{`"{http.request.header.X-Cost}"`, `"{http.request.header.X-Cost}"`},
	} {
		var c Cost
		if err := json.Unmarshal([]byte(tt.in), &c); err != nil {
			t.Fatalf("%s: %v", tt.in, err)
		}
		out, _ := json.Marshal(c)
		if string(out) != tt.out {
			t.Errorf("%s → %s, want %s", tt.in, out, tt.out)
		}
	}
	for _, bad := range []string{`"x"`, `true`, `1.5`, `-1`} {
		var c Cost
		err := json.Unmarshal([]byte(bad), &c)
		if err == nil {
			err = c.validate()
		}
		if err == nil {
			t.Errorf("cost %s accepted", bad)
		}
	}
}
