package sluice

import (
	"reflect"
	"slices"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/sluicehq/sluice/backend"
)

// A compiled plan runs what its config has and nothing else: each feature
// turns on only its own flags and steps.
func TestCompileRunsOnlyWhatIsConfigured(t *testing.T) {
	type want struct {
		shadows, queues, watching bool
		admitted                  []string // the admitted request's steps, in order
		screened, extras          bool     // of the zone and of its limit
		cost                      int64    // of a limit without extras
	}
	plain := `"key": "{http.vars.client_ip}", "max_events": 10, "window": "1m"`
	for _, c := range []struct {
		name, handler, zone string
		want                want
	}{
		{"plain", ``, plain, want{cost: 1}},
		{"headers", ``, plain + `, "headers": "draft"`, want{admitted: []string{"headers"}, cost: 1}},
		{"metrics", `"disable_metrics": false`, plain, want{admitted: []string{"near"}, cost: 1}},
		{"metrics and headers", `"disable_metrics": false`, plain + `, "headers": "both"`, want{admitted: []string{"near", "headers"}, cost: 1}},
		{"shadow", ``, plain + `, "shadow": true`, want{shadows: true, cost: 1}},
		{"leaky queue", ``, `"key": "k", "max_events": 10, "window": "1s", "algorithm": "leaky_bucket", "max_delay": "2s"`, want{queues: true, cost: 1}},
		{"leaky without queue", ``, `"key": "k", "max_events": 10, "window": "1s", "algorithm": "leaky_bucket"`, want{cost: 1}},
		{"outcomes", ``, plain + `, "count_when": {"status_code": [401]}`, want{watching: true, cost: 1}},
		{"adaptive", ``, `"key": "k", "max_events": 100, "window": "1h", "algorithm": "token_bucket", "adaptive": {"min": 10, "interval": "1s"}`, want{watching: true, extras: true}},
		{"matchers", ``, plain + `, "match": [{"method": ["POST"]}]`, want{screened: true, cost: 1}},
		{"deny list", ``, plain + `, "deny": ["192.0.2.0/24"]`, want{screened: true, cost: 1}},
		{"allow list", ``, plain + `, "allow": ["198.51.100.0/24"]`, want{screened: true, cost: 1}},
		{"tiers", ``, `"key": "k", "tier": "{http.request.header.X-Plan}", "default_tier": "free", "tiers": [{"name": "free", "max_events": 1, "window": "1h"}, {"name": "pro", "max_events": 100, "window": "1h"}]`, want{extras: true}},
		{"body key", ``, `"key": "{http.request.body.json.user}", "max_events": 10, "window": "1m"`, want{extras: true}},
		{"constant cost", ``, plain + `, "cost": 3`, want{cost: 3}},
		{"zero cost", ``, plain + `, "cost": 0`, want{}},
		{"cost placeholder", ``, plain + `, "cost": "{http.request.header.X-Cost}"`, want{extras: true}},
		{"concurrency", ``, `"key": "k", "concurrency": 2`, want{extras: true}},
		{"concurrency with a rate", ``, plain + `, "concurrency": 2`, want{extras: true}},
		{"budget", ``, plain + `, "charge_when": {"status_code": [2]}`, want{watching: true, extras: true}},
		{"shed by capacity", `"disable_metrics": true, "shed": {"group": "compile-c", "capacity": 10}`, plain, want{cost: 1}},
		{"shed by latency", `"disable_metrics": true, "shed": {"group": "compile-l", "latency_target": "200ms"}`, plain, want{watching: true, cost: 1}},
	} {
		t.Run(c.name, func(t *testing.T) {
			handler := `"disable_metrics": true, `
			if c.handler != "" {
				handler = c.handler + `, `
			}
			h, cleanup, err := provisionJSON([]byte(`{`+handler+`"rate_limits": {"compile": {`+c.zone+`}}}`), nil)
			if err != nil {
				t.Fatal(err)
			}
			defer cleanup()
			p := h.plan
			z := p.zones[0]
			l := z.keyed[0]
			got := want{shadows: p.shadows, queues: p.queues, watching: p.watching, screened: z.screened, extras: l.extras}
			if !l.extras {
				got.cost = l.cost
			}
			for _, step := range p.admitted {
				switch reflect.ValueOf(step).Pointer() {
				case reflect.ValueOf(countNear).Pointer():
					got.admitted = append(got.admitted, "near")
				case reflect.ValueOf(sendHeaders).Pointer():
					got.admitted = append(got.admitted, "headers")
				default:
					got.admitted = append(got.admitted, "?")
				}
			}
			if !reflect.DeepEqual(got, c.want) {
				t.Errorf("compiled %+v, want %+v", got, c.want)
			}
		})
	}
}

// A limit without extras collects through the short path exactly what the
// full path collects for it: the same store requests, limits, refusals and
// shadow notes.
func TestShortPathCollectsAsTheFullPath(t *testing.T) {
	type request struct {
		name, target, user string
	}
	requests := []request{
		{"with a user", "http://example.com/?user=alice", "alice"},
		{"without a user", "http://example.com/", ""},
		{"with two users", "http://example.com/?user=a&user=b", ""},
	}
	for _, c := range []struct{ name, zones string }{
		{"by ip", `"ip": {"key": "{http.vars.client_ip}", "ipv4_prefix": 24, "max_events": 10, "window": "1m"}`},
		{"missing shared", `"user": {"key": "{http.request.uri.query.user}", "max_events": 10, "window": "1m"}`},
		{"missing skip", `"user": {"key": "{http.request.uri.query.user}", "missing": "skip", "max_events": 10, "window": "1m"}`},
		{"missing deny", `"user": {"key": "{http.request.uri.query.user}", "missing": "deny", "max_events": 10, "window": "1m"}`},
		{"missing deny in shadow", `"user": {"key": "{http.request.uri.query.user}", "missing": "deny", "shadow": true, "max_events": 10, "window": "1m"}`},
		{"constant cost and scopes", `"user": {"key": "{http.request.uri.query.user}", "max_events": 10, "window": "1m", "cost": 2,
			"scopes": {"day": {"max_events": 100, "window": "24h", "cost": 0}, "ip": {"key": "{http.vars.client_ip}", "max_events": 5, "window": "1s"}}}`},
		{"two zones", `"a": {"key": "{http.vars.client_ip}", "max_events": 10, "window": "1m"}, "b": {"key": "{http.request.uri.query.user}", "missing": "skip", "max_events": 10, "window": "1m", "shadow": true}`},
	} {
		t.Run(c.name, func(t *testing.T) {
			h, cleanup, err := provisionJSON([]byte(`{"rate_limits": {`+c.zones+`}}`), nil)
			if err != nil {
				t.Fatal(err)
			}
			defer cleanup()
			p := h.plan
			var limits []*limit
			for _, z := range p.zones {
				for _, l := range z.keyed {
					if l.extras {
						t.Fatalf("limit %s has extras: the short path is not tested", l.displayName())
					}
					limits = append(limits, l)
				}
			}
			collect := func(rq request, extras bool) (got collected) {
				for _, l := range limits {
					l.extras = extras
				}
				defer func() {
					for _, l := range limits {
						l.extras = false
					}
				}()
				_, r := benchRequest(t, rq.target, "192.0.2.7:4242")
				caddyhttp.SetVar(r.Context(), caddyhttp.ClientIPVarKey, "192.0.2.7")
				repl := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
				s := &requestState{}
				f, err := p.collect(r, repl, s)
				got = collected{reqs: slices.Clone(s.reqs), limits: slices.Clone(s.limits), shadow: slices.Clone(s.shadow), err: err}
				if f != nil {
					got.refusal = *f
				}
				return got
			}
			for _, rq := range requests {
				short, full := collect(rq, false), collect(rq, true)
				if !reflect.DeepEqual(short, full) {
					t.Errorf("%s: the short path collects\n%+v\nthe full path\n%+v", rq.name, short, full)
				}
				if rq.user != "" && len(short.reqs) == 0 {
					t.Errorf("%s: nothing collected", rq.name)
				}
			}
		})
	}
}

// collected is what collect put in a request state.
type collected struct {
	reqs    []backend.Request
	limits  []*limit
	shadow  []shadowNote
	refusal refusal
	err     error
}
