package sluice

import (
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/sluicehq/sluice/algorithms"
)

// Every error a limit's check gives names, as a typed error, the option
// it is about, so that the adapter can point at its line without reading
// the message.
func TestCheckErrorsNameAnOption(t *testing.T) {
	sec := caddy.Duration(time.Second)
	for _, tc := range []struct {
		l    Limit
		want string
	}{
		{Limit{MaxEvents: 5, Window: 1e9, Algorithm: "tokenbucket"}, "algorithm"},
		{Limit{MaxEvents: 5, Window: 1e9, Burst: 3}, "burst"},
		{Limit{MaxEvents: 5, Window: 1e9, MaxDelay: 1e9}, "max_delay"},
		{Limit{MaxEvents: 5, Window: 1e9, Cost: &Cost{n: 9}}, "cost"},
		{Limit{MaxEvents: 5e15, Window: 1e9}, "max_events"},
		{Limit{MaxEvents: 5, Window: 1 << 62}, "window"},
		{Limit{MaxEvents: 5, Window: 1e9, MaxKeys: MaxKeysLimit + 1}, "max_keys"},
		{Limit{MaxEvents: 5, Window: 1e9, Hash: "short"}, "hash"},
		{Limit{MaxEvents: 5, Window: 1e9, Normalize: []Normalize{{Name: "soundex"}}}, "normalize"},
		{Limit{MaxEvents: 5, Window: 1e9, Key: "{http.request.body.json.}"}, "key"},
		{Limit{MaxEvents: 5, Window: 1e9, Fail: "maybe"}, "fail"},
		{Limit{MaxEvents: 5, Window: 1e9, Missing: "ignore"}, "missing"},
		{Limit{MaxEvents: 1, Window: 1 << 60, Burst: 100, Algorithm: algorithms.NameGCRA}, "burst"},
		{Limit{MaxEvents: 5, Window: 1e9, Concurrency: -1}, "concurrency"},
		{Limit{MaxEvents: 5, Window: 1e9, Queue: sec}, "queue"},
		{Limit{MaxEvents: 5, Window: 1e9, Lease: 1}, "lease"},
		{Limit{MaxEvents: 5, Window: 1e9, Align: "week", Algorithm: algorithms.NameFixedWindow}, "align"},
		{Limit{MaxEvents: 5, Window: 1e9, Timezone: "Asia/Dhaka"}, "timezone"},
		{Limit{MaxEvents: 5, Window: 1e9, Settle: "nothing"}, "settle"},
		{Limit{MaxEvents: 5, Window: 1e9, Lockout: []caddy.Duration{}}, "lockout"},
		{Limit{MaxEvents: 5, Window: 1e9, CostMin: -1}, "cost_min"},
		{Limit{MaxEvents: 5, Window: 1e9, Adaptive: &Adaptive{Decrease: 2}}, "adaptive"},
		{Limit{MaxEvents: 5, Window: 1e9, CountWhen: &caddyhttp.ResponseMatcher{}}, "count_when"},
	} {
		_, err := tc.l.check()
		if err == nil {
			t.Fatalf("%+v: no error", tc.l)
		}
		if opt := optionOf(err); opt != tc.want {
			t.Errorf("%v: about %q, want %q", err, opt, tc.want)
		}
		if opt := optionOf(err); optionLines[opt] == nil && !caddyfileOptions[opt] {
			t.Errorf("%v: names %q, not a Caddyfile option", err, opt)
		}
	}
}

var caddyfileOptions = map[string]bool{"algorithm": true, "burst": true, "max_delay": true, "cost": true, "max_keys": true, "hash": true, "normalize": true, "fail": true, "missing": true, "ipv4_prefix": true, "ipv6_prefix": true,
	"concurrency": true, "queue": true, "lease": true, "align": true, "timezone": true, "settle": true, "lockout": true, "adaptive": true, "count_when": true}
