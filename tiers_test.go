package sluice

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
)

// tieredConfig is a zone whose tier comes from tier, with a free and a pro
// tier, and scope monthly (status 402) with its own table.
func tieredConfig(zone, tier string) string {
	return `{"rate_limits": {"` + zone + `": {
		"key": "{http.request.header.X-Key}", "algorithm": "token_bucket",
		"tier": "` + tier + `", "default_tier": "free",
		"tiers": [
			{"name": "free", "max_events": 60, "window": "1m", "burst": 10, "concurrency": 2},
			{"name": "pro", "max_events": 600, "window": "1m", "burst": 100, "concurrency": 10}
		],
		"scopes": {"monthly": {"algorithm": "fixed_window", "status": 402,
			"tier": "` + tier + `", "default_tier": "free",
			"tiers": [{"name": "free", "max_events": 1000, "window": "720h"}, {"name": "pro", "max_events": 500000, "window": "720h"}]}}
	}}}`
}

// tierRequest is a request as Caddy hands it on, with the headers and vars
// given.
func tierRequest(headers http.Header, vars map[string]any) *http.Request {
	r := httptest.NewRequest(http.MethodGet, "http://example.com/", nil)
	r.Header = headers
	r = caddyhttp.PrepareRequest(r, caddy.NewReplacer(), httptest.NewRecorder(), &caddyhttp.Server{})
	for k, v := range vars {
		caddyhttp.SetVar(r.Context(), k, v)
	}
	return r
}

func TestTierPick(t *testing.T) {
	tests := []struct {
		name, tier string
		headers    http.Header
		vars       map[string]any
		want       string
		empty      bool
	}{
		{"header names a tier", "{http.request.header.X-Plan}", http.Header{"X-Plan": {"pro"}}, nil, "pro", false},
		{"header names the default", "{http.request.header.X-Plan}", http.Header{"X-Plan": {"free"}}, nil, "free", false},
		{"no header", "{http.request.header.X-Plan}", nil, nil, "free", true},
		{"empty header", "{http.request.header.X-Plan}", http.Header{"X-Plan": {""}}, nil, "free", true},
		{"unknown tier", "{http.request.header.X-Plan}", http.Header{"X-Plan": {"enterprise"}}, nil, "free", false},
		{"another case", "{http.request.header.X-Plan}", http.Header{"X-Plan": {"Pro"}}, nil, "free", false},
		{"padded", "{http.request.header.X-Plan}", http.Header{"X-Plan": {" pro"}}, nil, "free", false},
		{"header twice", "{http.request.header.X-Plan}", http.Header{"X-Plan": {"pro", "pro"}}, nil, "free", true},
		{"joined", "{http.request.header.X-Plan}", http.Header{"X-Plan": {"free,pro"}}, nil, "free", false},
		{"huge", "{http.request.header.X-Plan}", http.Header{"X-Plan": {strings.Repeat("pro", 1<<18)}}, nil, "free", false},
		{"control character", "{http.request.header.X-Plan}", http.Header{"X-Plan": {"pro\x00"}}, nil, "free", false},
		{"header name in another case", "{http.request.header.x-plan}", http.Header{"X-Plan": {"pro"}}, nil, "pro", false},
		{"var", "{http.vars.plan}", nil, map[string]any{"plan": "pro"}, "pro", false},
		{"var unset", "{http.vars.plan}", nil, nil, "free", true},
		{"var of another type", "{http.vars.plan}", nil, map[string]any{"plan": 7}, "free", false},
		{"template", "{http.vars.plan}-{http.request.header.X-Region}", http.Header{"X-Region": {"eu"}}, map[string]any{"plan": "pro"}, "free", false},
		{"query", "{http.request.uri.query.plan}", nil, nil, "free", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, cleanup, err := provisionJSON([]byte(tieredConfig("tier_pick", tt.tier)), nil)
			if err != nil {
				t.Fatal(err)
			}
			defer cleanup()
			r := tierRequest(tt.headers, tt.vars)
			repl := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
			base := h.plan.zones[0].keyed[0]
			got, empty := base.tiers.pick(r, repl)
			if got.tier != tt.want || empty != tt.empty {
				t.Fatalf("picked %q (empty %v), want %q (empty %v)", got.tier, empty, tt.want, tt.empty)
			}
		})
	}
}

// A template of several parts picks the tier its whole value names.
func TestTierPickTemplate(t *testing.T) {
	h, cleanup, err := provisionJSON([]byte(`{"rate_limits": {"tier_tmpl": {"key": "k",
		"tier": "{http.vars.plan}-{http.request.header.X-Region}", "default_tier": "basic-eu",
		"tiers": [{"name": "basic-eu", "max_events": 5, "window": "1m"}, {"name": "pro-us", "max_events": 50, "window": "1m"}]}}}`), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cleanup()
	r := tierRequest(http.Header{"X-Region": {"us"}}, map[string]any{"plan": "pro"})
	got, _ := h.plan.zones[0].keyed[0].tiers.pick(r, r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer))
	if got.tier != "pro-us" {
		t.Fatalf("picked %q, want pro-us", got.tier)
	}
}

// Each tier is its own limit, named by its scope, tier and policy version;
// clients are shown the scope alone.
func TestTierLimits(t *testing.T) {
	h, cleanup, err := provisionJSON([]byte(tieredConfig("tier_limits", "{http.request.header.X-Plan}")), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cleanup()
	z := h.plan.zones[0]
	var names []string
	for _, l := range z.limits {
		names = append(names, fmt.Sprintf("%s %d/%s burst %d conc %d shown %q status %d", l.scope, l.MaxEvents, time.Duration(l.Window), l.Burst, l.Concurrency, l.policyName(), l.denyStatus))
	}
	want := []string{
		"@free:" + tierVersion("token_bucket", algorithms.Policy{Limit: 60, Window: int64(time.Minute), Burst: 10}) + " 60/1m0s burst 10 conc 2 shown \"tier_limits\" status 429",
		"@pro:" + tierVersion("token_bucket", algorithms.Policy{Limit: 600, Window: int64(time.Minute), Burst: 100}) + " 600/1m0s burst 100 conc 10 shown \"tier_limits\" status 429",
		"monthly@free:" + tierVersion("fixed_window", algorithms.Policy{Limit: 1000, Window: int64(720 * time.Hour)}) + " 1000/720h0m0s burst 0 conc 0 shown \"tier_limits.monthly\" status 402",
		"monthly@pro:" + tierVersion("fixed_window", algorithms.Policy{Limit: 500000, Window: int64(720 * time.Hour)}) + " 500000/720h0m0s burst 0 conc 0 shown \"tier_limits.monthly\" status 402",
	}
	if strings.Join(names, "\n") != strings.Join(want, "\n") {
		t.Fatalf("limits:\n%s\nwant:\n%s", strings.Join(names, "\n"), strings.Join(want, "\n"))
	}
	if len(z.keyed) != 2 || z.keyed[0].tiers == nil || z.keyed[1].tiers == nil {
		t.Fatalf("keyed limits: %d, want the two tier tables", len(z.keyed))
	}
	for _, l := range z.limits {
		if l.conc == nil != (l.Concurrency == 0) {
			t.Fatalf("%s: concurrency %d, limiter %v", l.scope, l.Concurrency, l.conc)
		}
	}
}

// The version changes with what the state means (algorithm, rate, burst,
// queue) and only with it.
func TestTierVersion(t *testing.T) {
	base := algorithms.Policy{Limit: 60, Window: int64(time.Minute), Burst: 10}
	v := tierVersion("token_bucket", base)
	if len(v) != 8 || v != tierVersion("token_bucket", base) {
		t.Fatalf("version %q is not a stable 8-digit hash", v)
	}
	changed := map[string]string{
		"algorithm": tierVersion("gcra", base),
		"limit":     tierVersion("token_bucket", algorithms.Policy{Limit: 61, Window: base.Window, Burst: 10}),
		"window":    tierVersion("token_bucket", algorithms.Policy{Limit: 60, Window: int64(time.Hour), Burst: 10}),
		"burst":     tierVersion("token_bucket", algorithms.Policy{Limit: 60, Window: base.Window, Burst: 11}),
		"max_delay": tierVersion("token_bucket", algorithms.Policy{Limit: 60, Window: base.Window, Burst: 10, MaxDelay: 1}),
	}
	seen := map[string]string{v: "base"}
	for what, w := range changed {
		if other, dup := seen[w]; dup {
			t.Fatalf("changing %s gives the version of %s: %s", what, other, w)
		}
		seen[w] = what
	}
	// Concurrency is not state of the store, and a default written out is
	// the same policy: neither renames the tier's state.
	for _, pair := range [][2]string{
		{`"tiers": [{"name": "free", "max_events": 5, "window": "1m", "concurrency": 2}]`, `"tiers": [{"name": "free", "max_events": 5, "window": "1m", "concurrency": 3}]`},
		{`"algorithm": "gcra", "tiers": [{"name": "free", "max_events": 5, "window": "1m"}]`, `"algorithm": "gcra", "tiers": [{"name": "free", "max_events": 5, "window": "1m", "burst": 5}]`},
	} {
		var scopes [2]string
		for i, tiers := range pair {
			h, cleanup, err := provisionJSON([]byte(`{"rate_limits": {"tier_ver": {"key": "k", "tier": "{http.vars.plan}", "default_tier": "free", `+tiers+`}}}`), nil)
			if err != nil {
				t.Fatal(err)
			}
			scopes[i] = h.plan.zones[0].limits[0].scope
			cleanup()
		}
		if scopes[0] != scopes[1] {
			t.Fatalf("%s and %s: the state is renamed from %s to %s", pair[0], pair[1], scopes[0], scopes[1])
		}
	}
}

// An upgrade applies at the next request, with the new tier's full burst;
// a tier whose policy changes starts afresh, an unchanged one keeps its
// usage.
func TestTierUpgradeAndReload(t *testing.T) {
	now := func() int64 { return fuzzStart }
	cfg := func(freeBurst int) string {
		return `{"rate_limits": {"tier_upgrade": {"key": "{http.request.header.X-Key}", "algorithm": "token_bucket",
			"tier": "{http.request.header.X-Plan}", "default_tier": "free",
			"tiers": [{"name": "free", "max_events": 60, "window": "1m", "burst": ` + strconv.Itoa(freeBurst) + `},
				{"name": "pro", "max_events": 600, "window": "1m", "burst": 100}]}}}`
	}
	h, cleanup, err := provisionJSON([]byte(cfg(3)), now)
	if err != nil {
		t.Fatal(err)
	}
	defer cleanup()
	send := func(h *Handler, plan string) int {
		hdr := http.Header{"X-Key": {"alice"}}
		if plan != "" {
			hdr.Set("X-Plan", plan)
		}
		w := httptest.NewRecorder()
		r := tierRequest(hdr, nil)
		if err := h.ServeHTTP(w, r, okHandler); err != nil {
			return err.(caddyhttp.HandlerError).StatusCode
		}
		return http.StatusOK
	}
	count := func(h *Handler, plan string, n int) (ok int) {
		for range n {
			if send(h, plan) == http.StatusOK {
				ok++
			}
		}
		return ok
	}
	if got := count(h, "", 5); got != 3 {
		t.Fatalf("free: %d of 5 admitted, want 3", got)
	}
	if got := count(h, "pro", 120); got != 100 {
		t.Fatalf("after the upgrade: %d of 120 admitted, want pro's burst of 100", got)
	}
	// A reload that keeps free's policy keeps its usage; pro's changed
	// burst... is unchanged here, so pro stays spent too.
	h2, cleanup2, err := provisionJSON([]byte(cfg(3)), now)
	if err != nil {
		t.Fatal(err)
	}
	defer cleanup2()
	if got := count(h2, "free", 1) + count(h2, "pro", 1); got != 0 {
		t.Fatalf("a reload with the same tiers admitted %d: the tiers lost their usage", got)
	}
	// free's burst changed: its state is new, with the new burst.
	h3, cleanup3, err := provisionJSON([]byte(cfg(4)), now)
	if err != nil {
		t.Fatal(err)
	}
	defer cleanup3()
	if got := count(h3, "free", 6); got != 4 {
		t.Fatalf("free after its policy changed: %d of 6 admitted, want a fresh burst of 4", got)
	}
}

// A flood of made-up tier values adds no state beyond the table: every
// one lands in the default tier's limits.
func TestTierFloodStaysInTable(t *testing.T) {
	h, cleanup, err := provisionJSON([]byte(tieredConfig("tier_flood", "{http.request.header.X-Plan}")), func() int64 { return fuzzStart })
	if err != nil {
		t.Fatal(err)
	}
	defer cleanup()
	for i := range 500 {
		r := tierRequest(http.Header{"X-Key": {"k"}, "X-Plan": {"plan-" + strconv.Itoa(i)}}, nil)
		_ = h.ServeHTTP(httptest.NewRecorder(), r, okHandler)
	}
	keys := map[string]int64{}
	for _, st := range h.plan.store.(backend.StatsReporter).Stats() {
		if st.Zone == "tier_flood" {
			keys[st.Scope] += st.Keys
		}
	}
	z := h.plan.zones[0]
	want := map[string]int64{z.limits[0].scope: 1, z.limits[1].scope: 0, z.limits[2].scope: 1, z.limits[3].scope: 0}
	if fmt.Sprint(keys) != fmt.Sprint(want) {
		t.Fatalf("keys by limit after the flood: %v, want %v", keys, want)
	}
}

func TestTierProvisionErrors(t *testing.T) {
	const tiers = `"tiers": [{"name": "free", "max_events": 60, "window": "1m"}, {"name": "pro", "max_events": 600, "window": "1m"}]`
	tests := []struct{ name, zone, want string }{
		{"no tier", `"key": "k", ` + tiers + `, "default_tier": "free"`, `zone "z": tiers: set tier to the placeholder`},
		{"tier without table", `"key": "k", "tier": "{http.vars.plan}", "max_events": 5, "window": "1m"`, `zone "z": tier: no tiers table`},
		{"default without table", `"key": "k", "default_tier": "free", "max_events": 5, "window": "1m"`, `zone "z": tiers: set tier`},
		{"tier without placeholder", `"key": "k", "tier": "pro", ` + tiers + `, "default_tier": "free"`, `zone "z": tier "pro" has no placeholder`},
		{"tier from the body", `"key": "k", "tier": "{http.request.body.json.plan}", ` + tiers + `, "default_tier": "free"`, `zone "z": tier "{http.request.body.json.plan}" reads the request body`},
		{"no default", `"key": "k", "tier": "{http.vars.plan}", ` + tiers, `zone "z": tiers: no default tier`},
		{"default not in table", `"key": "k", "tier": "{http.vars.plan}", ` + tiers + `, "default_tier": "gold"`, `zone "z": default tier "gold" is not in the tiers table (free, pro)`},
		{"duplicate tier", `"key": "k", "tier": "{http.vars.plan}", "default_tier": "free", "tiers": [{"name": "free", "max_events": 60, "window": "1m"}, {"name": "free", "max_events": 6, "window": "1m"}]`, `zone "z": tiers: tier "free" given twice`},
		{"tier without rate", `"key": "k", "tier": "{http.vars.plan}", "default_tier": "free", "tiers": [{"name": "free", "max_events": 60}]`, `zone "z": tiers: tier "free" needs a rate`},
		{"bad tier name", `"key": "k", "tier": "{http.vars.plan}", "default_tier": "free", "tiers": [{"name": "fr ee", "max_events": 60, "window": "1m"}]`, `zone "z": tiers[0]: tier name "fr ee": only letters`},
		{"empty tier name", `"key": "k", "tier": "{http.vars.plan}", "default_tier": "free", "tiers": [{"name": "", "max_events": 60, "window": "1m"}]`, `zone "z": tiers[0]: a tier name must be 1 to 64 bytes`},
		{"rate beside tiers", `"key": "k", "tier": "{http.vars.plan}", "default_tier": "free", "max_events": 5, "window": "1m", ` + tiers, `zone "z": max_events, window would do nothing with tiers`},
		{"concurrency beside tiers", `"key": "k", "tier": "{http.vars.plan}", "default_tier": "free", "concurrency": 5, ` + tiers, `zone "z": concurrency would do nothing with tiers`},
		{"lease", `"key": "k", "tier": "{http.vars.plan}", "default_tier": "free", "lease": 2, ` + tiers, `zone "z": lease cannot be used with tiers`},
		{"queue", `"key": "k", "tier": "{http.vars.plan}", "default_tier": "free", "queue": "1s", ` + tiers, `zone "z": queue cannot be used with tiers`},
		{"burst on a window", `"key": "k", "tier": "{http.vars.plan}", "default_tier": "free", "tiers": [{"name": "free", "max_events": 60, "window": "1m", "burst": 5}]`, `zone "z": tiers: tier "free": burst does not apply to algorithm sliding_window`},
		{"cost above a tier", `"key": "k", "cost": 20, "tier": "{http.vars.plan}", "default_tier": "free", "tiers": [{"name": "free", "max_events": 10, "window": "1m"}]`, `zone "z": tiers: tier "free": cost 20 can never pass`},
		{"tier in a scope", `"key": "k", "max_events": 5, "window": "1m", "scopes": {"m": {"tier": "{http.vars.plan}", "default_tier": "gold", ` + tiers + `}}`, `zone "z": scope "m": default tier "gold" is not in the tiers table`},
		{"tier on a zone of scopes", `"tier": "{http.vars.plan}", "scopes": {"m": {"max_events": 5, "window": "1m"}}`, `zone "z": tier would do nothing on a zone without a rate of its own`},
		{"tiered scope status", `"key": "k", "max_events": 5, "window": "1m", "scopes": {"m": {"status": 99, "tier": "{http.vars.plan}", "default_tier": "free", ` + tiers + `}}`, `zone "z": scope "m": status must be from 400 to 599, got 99`},
		{"scope status", `"key": "k", "max_events": 5, "window": "1m", "scopes": {"m": {"max_events": 5, "window": "1m", "status": 302}}`, `zone "z": scope "m": status must be from 400 to 599, got 302`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := validate(t, `{"handler": "rate_limit", "rate_limits": {"z": {`+tt.zone+`}}}`)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want it to contain %q", err, tt.want)
			}
		})
	}
	many := make([]string, MaxTiers+1)
	for i := range many {
		many[i] = fmt.Sprintf(`{"name": "t%d", "max_events": 5, "window": "1m"}`, i)
	}
	err := validate(t, `{"handler": "rate_limit", "rate_limits": {"z": {"key": "k", "tier": "{http.vars.plan}", "default_tier": "t0", "tiers": [`+strings.Join(many, ",")+`]}}}`)
	if err == nil || !strings.Contains(err.Error(), "tiers: at most 64 tiers, got 65") {
		t.Fatalf("65 tiers: %v", err)
	}
}

func TestTierCaddyfile(t *testing.T) {
	const ok = `:8080
rate_limit {
	zone api {
		by header X-Key
		algorithm token_bucket
		tier {http.request.header.X-Plan}
		tiers {
			free 60/1m burst 10 concurrency 2
			pro 600/1m burst 100
			default free
		}
		scope monthly {
			tier {http.request.header.X-Plan}
			tiers {
				free 1000/30d
				pro 500000/30d
				default free
			}
			algorithm fixed_window
			status 402
		}
	}
}
`
	out, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(ok), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`"tier":"{http.request.header.X-Plan}"`, `"default_tier":"free"`,
		`"tiers":[{"burst":10,"concurrency":2,"max_events":60,"name":"free","window":60000000000},{"burst":100,"max_events":600,"name":"pro","window":60000000000}]`,
		`"status":402`, `{"max_events":500000,"name":"pro","window":2592000000000000}`,
	} {
		if !strings.Contains(string(out), want) {
			t.Fatalf("adapted JSON lacks %s:\n%s", want, out)
		}
	}

	zone := func(body string) string {
		return ":8080\nrate_limit {\n\tzone a {\n\t\tkey k\n" + body + "\t}\n}\n"
	}
	tests := []struct {
		name, block, want string
		line              int
	}{
		{"duplicate tier", zone("\t\ttier {http.vars.plan}\n\t\ttiers {\n\t\t\tfree 1/s\n\t\t\tfree 2/s\n\t\t\tdefault free\n\t\t}\n"), `zone "a": tiers: tier "free" given twice`, 8},
		{"default twice", zone("\t\ttier {http.vars.plan}\n\t\ttiers {\n\t\t\tfree 1/s\n\t\t\tdefault free\n\t\t\tdefault free\n\t\t}\n"), `tiers: default already specified`, 9},
		{"tier called default", zone("\t\ttier {http.vars.plan}\n\t\ttiers {\n\t\t\tdefault 1/s\n\t\t}\n"), `no tier can be called default`, 7},
		{"tier without rate", zone("\t\ttier {http.vars.plan}\n\t\ttiers {\n\t\t\tfree\n\t\t\tdefault free\n\t\t}\n"), `tiers: tier "free" needs a rate`, 7},
		{"bad rate", zone("\t\ttier {http.vars.plan}\n\t\ttiers {\n\t\t\tfree 1/x\n\t\t\tdefault free\n\t\t}\n"), `tiers: tier "free": invalid rate "1/x"`, 7},
		{"unknown tier option", zone("\t\ttier {http.vars.plan}\n\t\ttiers {\n\t\t\tfree 1/s queue 1s\n\t\t\tdefault free\n\t\t}\n"), `unknown option "queue" (want burst or concurrency)`, 7},
		{"burst without value", zone("\t\ttier {http.vars.plan}\n\t\ttiers {\n\t\t\tfree 1/s burst\n\t\t\tdefault free\n\t\t}\n"), `tier "free": burst needs a value`, 7},
		{"burst zero", zone("\t\ttier {http.vars.plan}\n\t\ttiers {\n\t\t\tfree 1/s burst 0\n\t\t\tdefault free\n\t\t}\n"), `burst must be a whole number ≥ 1, got "0"`, 7},
		{"empty table", zone("\t\ttier {http.vars.plan}\n\t\ttiers {\n\t\t}\n"), `tiers: the table has no tier`, 7},
		{"no default", zone("\t\ttier {http.vars.plan}\n\t\ttiers {\n\t\t\tfree 1/s\n\t\t}\n"), `tiers: no default tier`, 6},
		{"unknown default", zone("\t\ttier {http.vars.plan}\n\t\ttiers {\n\t\t\tfree 1/s\n\t\t\tdefault gold\n\t\t}\n"), `default tier "gold" is not in the tiers table (free)`, 6},
		{"no tier placeholder", zone("\t\ttiers {\n\t\t\tfree 1/s\n\t\t\tdefault free\n\t\t}\n"), `tiers: set tier to the placeholder`, 5},
		{"constant tier", zone("\t\ttier pro\n\t\ttiers {\n\t\t\tfree 1/s\n\t\t\tdefault free\n\t\t}\n"), `tier "pro" has no placeholder`, 5},
		{"rate beside tiers", zone("\t\trate 5/s\n\t\ttier {http.vars.plan}\n\t\ttiers {\n\t\t\tfree 1/s\n\t\t\tdefault free\n\t\t}\n"), `max_events, window would do nothing with tiers`, 5},
		{"lease with tiers", zone("\t\tlease 2\n\t\ttier {http.vars.plan}\n\t\ttiers {\n\t\t\tfree 1000/s\n\t\t\tdefault free\n\t\t}\n"), `lease cannot be used with tiers`, 5},
		{"burst on a window tier", zone("\t\ttier {http.vars.plan}\n\t\ttiers {\n\t\t\tfree 1/s burst 5\n\t\t\tdefault free\n\t\t}\n"), `tiers: tier "free": burst does not apply to algorithm sliding_window`, 6},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(tt.block), nil)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want it to contain %q:\n%s", err, tt.want, tt.block)
			}
			if line := "Caddyfile:" + strconv.Itoa(tt.line); !strings.Contains(err.Error(), line) {
				t.Fatalf("error %q does not name %s", err, line)
			}
		})
	}
}

// BenchmarkTierPick is the cost of picking a request's tier, on its own.
//
//	go test -run '^$' -bench TierPick -benchmem .
func BenchmarkTierPick(b *testing.B) {
	for _, c := range []struct{ name, tier string }{
		{"header", "{http.request.header.X-Plan}"},
		{"var", "{http.vars.plan}"},
	} {
		b.Run(c.name, func(b *testing.B) {
			h, cleanup, err := provisionJSON([]byte(tieredConfig("tier_bench_"+c.name, c.tier)), nil)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(cleanup)
			ts := h.plan.zones[0].keyed[0].tiers
			r := tierRequest(http.Header{"X-Plan": {"pro"}}, map[string]any{"plan": "pro"})
			repl := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
			b.ReportAllocs()
			for b.Loop() {
				if l, _ := ts.pick(r, repl); l.tier != "pro" {
					b.Fatal(l.tier)
				}
			}
		})
	}
}

// tierHotPath returns a func that sends one request of a pro client
// through a tiered zone (or, untiered, through the same rate without
// tiers), after a first request that made the key.
func tierHotPath(tb testing.TB, tiered bool) func() {
	tb.Helper()
	var ticking atomic.Int64
	ticking.Store(fuzzStart)
	cfg := `{"rate_limits": {"tier_hot": {"key": "{http.request.header.X-Key}", "algorithm": "token_bucket",
		"tier": "{http.request.header.X-Plan}", "default_tier": "free",
		"tiers": [{"name": "free", "max_events": 60, "window": "1m", "burst": 10}, {"name": "pro", "max_events": 600, "window": "1m", "burst": 100}]}}}`
	if !tiered {
		cfg = `{"rate_limits": {"tier_hot_plain": {"key": "{http.request.header.X-Key}", "algorithm": "token_bucket", "max_events": 600, "window": "1m", "burst": 100}}}`
	}
	h, cleanup, err := provisionJSON([]byte(cfg), func() int64 { return ticking.Add(int64(time.Second)) })
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(cleanup)
	w, r := benchRequest(tb, "http://example.com/", "192.0.2.7:4242")
	r.Header.Set("X-Key", "alice")
	r.Header.Set("X-Plan", "pro")
	if err := h.ServeHTTP(w, r, okHandler); err != nil {
		tb.Fatal(err)
	}
	fresh := freshReplacer(r)
	return func() {
		fresh()
		if err := h.ServeHTTP(w, r, okHandler); err != nil {
			tb.Fatal(err)
		}
	}
}

// Picking the tier allocates nothing: a tiered request allocates what the
// same request without tiers does (the header key's value, boxed by
// Caddy's replacer).
func TestTierServeHTTPAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool drops values at random under the race detector")
	}
	plain := testing.AllocsPerRun(200, tierHotPath(t, false))
	if got := testing.AllocsPerRun(200, tierHotPath(t, true)); got != plain {
		t.Fatalf("%v allocations per tiered request, %v without tiers", got, plain)
	}
	for _, tier := range []string{"{http.request.header.X-Plan}", "{http.vars.plan}"} {
		h, cleanup, err := provisionJSON([]byte(tieredConfig("tier_allocs", tier)), nil)
		if err != nil {
			t.Fatal(err)
		}
		ts := h.plan.zones[0].keyed[0].tiers
		r := tierRequest(http.Header{"X-Plan": {"pro"}}, map[string]any{"plan": "pro"})
		repl := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
		if got := testing.AllocsPerRun(200, func() { ts.pick(r, repl) }); got != 0 {
			t.Fatalf("%s: %v allocations per pick, want 0", tier, got)
		}
		cleanup()
	}
}

// BenchmarkServeHTTPTier is one allowed request through a tiered zone and
// through the same rate without tiers.
//
//	go test -run '^$' -bench ServeHTTPTier -benchmem .
func BenchmarkServeHTTPTier(b *testing.B) {
	for _, tiered := range []bool{false, true} {
		b.Run(map[bool]string{false: "untiered", true: "tiered"}[tiered], func(b *testing.B) {
			send := tierHotPath(b, tiered)
			b.ReportAllocs()
			for b.Loop() {
				send()
			}
		})
	}
}

// A reload that changes a tier's rate drops the old version's metric
// series once no running config uses it; a version both configs use keeps
// its series (and its counts) through the reload.
func TestTierSeriesDroppedWithTheirVersion(t *testing.T) {
	now := func() int64 { return fuzzStart }
	cfg := func(free int) string {
		return `{"rate_limits": {"tier_series": {"key": "static",
			"tier": "{http.request.header.X-Plan}", "default_tier": "free",
			"tiers": [{"name": "free", "max_events": ` + strconv.Itoa(free) + `, "window": "1m"},
				{"name": "pro", "max_events": 600, "window": "1m"}]}}}`
	}
	series := func() (scopes []string) {
		ch := make(chan prometheus.Metric, 100)
		go func() { metrics.requests.Collect(ch); close(ch) }()
		for m := range ch {
			var pb dto.Metric
			_ = m.Write(&pb)
			labels := map[string]string{}
			for _, l := range pb.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["zone"] == "tier_series" {
				scopes = append(scopes, labels["scope"])
			}
		}
		slices.Sort(scopes)
		return scopes
	}
	serve := func(h *Handler, plan string) {
		r := tierRequest(http.Header{"X-Plan": {plan}}, nil)
		_ = h.ServeHTTP(httptest.NewRecorder(), r, okHandler)
	}
	h1, cleanup1, err := provisionJSON([]byte(cfg(60)), now)
	if err != nil {
		t.Fatal(err)
	}
	serve(h1, "free")
	serve(h1, "pro")
	before := series()
	if len(before) != 2 {
		t.Fatalf("series %v, want one per tier", before)
	}
	h2, cleanup2, err := provisionJSON([]byte(cfg(61)), now) // free changes, pro does not
	if err != nil {
		t.Fatal(err)
	}
	defer cleanup2()
	serve(h2, "free")
	cleanup1() // the old config goes
	after := series()
	if len(after) != 2 || slices.Contains(after, before[0]) == slices.Contains(after, before[1]) {
		t.Fatalf("series before %v, after the reload %v: want free's old version gone and pro's kept", before, after)
	}
}
