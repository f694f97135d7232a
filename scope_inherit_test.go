package sluice

import (
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// A scope without a key counts by its zone's key as the zone builds it:
// its normalizers, hash, prefixes and missing policy.
func TestScopeCountsByTheZoneKey(t *testing.T) {
	for _, c := range []struct {
		name, zone string
		header     string // X-User, "" for none
		remote     string
		wantReqs   int
		refused    bool
	}{
		{"normalized and hashed", `"key": "{http.request.header.X-User}", "normalize": [{"name": "lower"}], "hash": "0123456789abcdef0123"`, "Alice", "192.0.2.7", 2, false},
		{"missing skip", `"key": "{http.request.header.X-User}", "missing": "skip"`, "", "192.0.2.7", 0, false},
		{"missing deny", `"key": "{http.request.header.X-User}", "missing": "deny"`, "", "192.0.2.7", 0, true},
		{"missing shared", `"key": "{http.request.header.X-User}"`, "", "192.0.2.7", 2, false},
		{"prefix", `"key": "{http.vars.client_ip}", "ipv4_prefix": 24`, "", "192.0.2.7", 2, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			h, cleanup, err := provisionJSON([]byte(`{"rate_limits": {"z": {`+c.zone+`, "max_events": 10, "window": "1m",
				"scopes": {"day": {"max_events": 100, "window": "24h"}}}}}`), nil)
			if err != nil {
				t.Fatal(err)
			}
			defer cleanup()
			for _, extras := range []bool{false, true} {
				for _, z := range h.plan.zones {
					for _, l := range z.keyed {
						l.extras = extras
					}
				}
				_, r := benchRequest(t, "http://example.com/", c.remote+":4242")
				if c.header != "" {
					r.Header.Set("X-User", c.header)
				}
				caddyhttp.SetVar(r.Context(), caddyhttp.ClientIPVarKey, c.remote)
				repl := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
				s := &requestState{}
				f, err := h.plan.collect(r, repl, s)
				if err != nil {
					t.Fatal(err)
				}
				if (f != nil) != c.refused || len(s.reqs) != c.wantReqs {
					t.Fatalf("extras %v: refused %v, %d requests %+v; want refused %v, %d", extras, f != nil, len(s.reqs), s.reqs, c.refused, c.wantReqs)
				}
				if len(s.reqs) == 2 && s.reqs[0].Key != s.reqs[1].Key {
					t.Errorf("extras %v: zone key %q, scope key %q", extras, s.reqs[0].Key, s.reqs[1].Key)
				}
				if c.name == "prefix" && len(s.reqs) > 0 && s.reqs[1].Key != "192.0.2.0/24" {
					t.Logf("scope key %q", s.reqs[1].Key)
				}
				if c.name == "normalized and hashed" && len(s.reqs) > 0 && (s.reqs[1].Key == "alice" || s.reqs[1].Key == "Alice") {
					t.Errorf("scope key %q not hashed", s.reqs[1].Key)
				}
			}
		})
	}
}
