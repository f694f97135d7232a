package sluice

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"

	"github.com/caddyserver/caddy/v2"

	"github.com/sluicehq/sluice/internal/fleet/fleettest"
)

// Provision compiles the config into the plan and leaves the config as it
// was decoded: what a scope inherits from its zone, and every default, is
// the plan's. The configs load no module from raw JSON (match, backend,
// storage), whose raw field Caddy's module loader clears by design.
func TestProvisionLeavesConfig(t *testing.T) {
	if _, _, err := provisionJSON([]byte(`{}`), nil); err != nil { // the base context
		t.Fatal(err)
	}
	const client = `"key": "{http.request.header.X-Client}"`
	tests := []struct{ name, config string }{
		{"plain zone", `{"rate_limits": {"untouched_plain": {` + client + `, "max_events": 5, "window": "1m"}}}`},
		{"scopes inheriting the key", `{"rate_limits": {"untouched_scopes": {
			"key": "{http.request.header.X-User}", "normalize": [{"name": "lower"}], "hash": "0123456789abcdef0123",
			"missing": "skip", "max_events": 5, "window": "1m",
			"scopes": {"daily": {"max_events": 100, "window": "24h"}, "all": {"key": "global", "max_events": 1000, "window": "1m"}}}}}`},
		{"scopes inheriting prefixes", `{"rate_limits": {"untouched_prefixes": {
			"key": "{http.request.remote.host}", "ipv4_prefix": 24, "ipv6_prefix": 64, "max_events": 5, "window": "1m",
			"scopes": {"hour": {"max_events": 50, "window": "1h"}}}}}`},
		{"fail and missing defaults", `{"rate_limits": {"untouched_fail": {"fail": "closed", "scopes": {
			"a": {` + client + `, "max_events": 5, "window": "1m"},
			"b": {` + client + `, "missing": "deny", "fail": "open", "max_events": 5, "window": "1m"}}}}}`},
		{"tiers", `{"rate_limits": {"untouched_tiers": {` + client + `, "tier": "{http.request.header.X-Plan}", "default_tier": "free",
			"tiers": [{"name": "free", "max_events": 5, "window": "1m"}, {"name": "pro", "max_events": 50, "window": "1m", "concurrency": 3}],
			"scopes": {"s": {"tier": "{http.vars.plan}", "default_tier": "basic", "tiers": [{"name": "basic", "max_events": 9, "window": "1h"}]}}}}}`},
		{"distributed with default intervals", `{"distributed": {}, "rate_limits": {"untouched_dist": {` + client + `, "max_events": 5, "window": "1m"}}}`},
		{"concurrency", `{"rate_limits": {"untouched_conc": {` + client + `, "concurrency": 2, "queue": "1s", "queue_max": 4,
			"scopes": {"rate": {"max_events": 5, "window": "1m", "concurrency": 1}}}}}`},
		{"budget", `{"rate_limits": {"untouched_budget": {` + client + `, "max_events": 100, "window": "24h", "algorithm": "fixed_window",
			"align": "day", "charge_when": {"status_code": [2]}, "scopes": {"hourly": {"max_events": 10, "window": "1h", "cost": "{http.request.header.X-Cost}"}}}}}`},
		{"handler options", `{"jitter": 0.2, "sweep_interval": "10ms", "headers": "both", "tarpit": "1s", "shed": {"group": "untouched", "capacity": 10, "priority": 1}, "rate_limits": {"untouched_opts": {` + client + `,
			"max_events": 5, "window": "1m", "lockout": ["1m", "5m"], "count_when": {"status_code": [401]}, "near_limit": 0.5, "status": 403,
			"adaptive": {"min": 2}}}}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h, err := decodeHandler([]byte(tc.config))
			if err != nil {
				t.Fatal(err)
			}
			decoded, err := decodeHandler([]byte(tc.config))
			if err != nil {
				t.Fatal(err)
			}
			before, err := json.Marshal(h)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := caddy.NewContext(fuzzBase)
			t.Cleanup(cancel)
			err = h.provision(ctx, &plan{Handler: h, distStorage: fleettest.NewStorage()})
			t.Cleanup(func() { _ = h.Cleanup() })
			if err != nil {
				t.Fatal(err)
			}
			after, err := json.Marshal(h)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(before, after) {
				t.Errorf("provision changed the config:\nbefore: %s\nafter:  %s", before, after)
			}
			// What JSON leaves out (unexported state, fields it omits when
			// empty) must be as decoded too.
			for name, z := range decoded.RateLimits {
				if got := h.RateLimits[name]; !reflect.DeepEqual(got, z) {
					t.Errorf("provision changed zone %q:\ngot:  %+v\nwant: %+v", name, *got, *z)
				}
			}
			if got, want := configOnly(h), configOnly(decoded); !reflect.DeepEqual(got, want) {
				t.Errorf("provision changed the handler's Go values:\ngot:  %+v\nwant: %+v", got, want)
			}
		})
	}
}

// configOnly is h without the plan Provision compiled it into.
func configOnly(h *Handler) Handler {
	c := *h
	c.plan = nil
	return c
}
