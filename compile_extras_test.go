package sluice

import "testing"

// Every limit that needs more than its key takes the full collect path:
// a body read under any spelling, a cost from the request in JSON or as
// a sum, a scope inheriting a body key, tiers beside a key-less scope.
func TestExtrasWhereNeeded(t *testing.T) {
	for _, c := range []struct {
		name, zone string
		want       map[string]bool // limit display name → extras
	}{
		{"body size key", `"key": "{http.request.body.size}", "max_events": 5, "window": "1m"`, map[string]bool{"z": true}},
		{"body form key inherited", `"key": "{http.request.body.form.user}", "max_events": 5, "window": "1m", "scopes": {"d": {"max_events": 9, "window": "1h"}, "g": {"key": "global", "max_events": 9, "window": "1h"}}`,
			map[string]bool{"z": true, "z/d": true, "z/g": false}},
		{"body field cost", `"key": "{http.request.header.X}", "cost": "{http.request.body.field.n}", "max_events": 5, "window": "1m"`, map[string]bool{"z": true}},
		{"constant sum", `"key": "{http.request.header.X}", "cost": "1+2", "max_events": 5, "window": "1m"`, map[string]bool{"z": true}},
		{"string constant", `"key": "{http.request.header.X}", "cost": "3", "max_events": 5, "window": "1m"`, map[string]bool{"z": false}},
		{"cost_min", `"key": "{http.request.header.X}", "cost": "{http.request.header.C}", "cost_min": 2, "max_events": 5, "window": "1m"`, map[string]bool{"z": true}},
		{"handler placeholder cost", `"key": "{http.request.header.X}", "cost": "{http.vars.c}", "max_events": 5, "window": "1m"`, map[string]bool{"z": true}},
		{"tiers and a key-less scope", `"key": "{http.request.header.X}", "tier": "{http.request.header.P}", "default_tier": "f", "tiers": [{"name": "f", "max_events": 5, "window": "1m"}], "scopes": {"d": {"max_events": 9, "window": "1h"}}`,
			map[string]bool{"z": true, "z/d": false}},
		{"concurrency scope", `"key": "{http.request.header.X}", "max_events": 5, "window": "1m", "scopes": {"c": {"concurrency": 2}}`, map[string]bool{"z": false, "z/c": true}},
	} {
		t.Run(c.name, func(t *testing.T) {
			h, cleanup, err := provisionJSON([]byte(`{"rate_limits": {"z": {`+c.zone+`}}}`), nil)
			if err != nil {
				t.Fatal(err)
			}
			defer cleanup()
			got := map[string]bool{}
			for _, z := range h.plan.zones {
				for _, l := range z.keyed {
					name := z.name
					if l.scope != "" {
						name += "/" + l.scope
					}
					got[name] = l.extras
				}
			}
			for n, w := range c.want {
				if g, ok := got[n]; !ok || g != w {
					t.Errorf("%s: extras %v (found %v), want %v; all %v", n, g, ok, w, got)
				}
			}
		})
	}
}
