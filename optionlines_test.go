package sluice

import (
	"testing"

	"github.com/sluicehq/sluice/algorithms"
)

// Every error a limit's check can give names an option the Caddyfile has,
// so that the adapter can point at its line.
func TestCheckErrorsNameAnOption(t *testing.T) {
	for _, l := range []Limit{
		{MaxEvents: 5, Window: 1e9, Algorithm: "tokenbucket"},
		{MaxEvents: 5, Window: 1e9, Burst: 3},
		{MaxEvents: 5, Window: 1e9, MaxDelay: 1e9},
		{MaxEvents: 5, Window: 1e9, Cost: &Cost{n: 9}},
		{MaxEvents: 5e15, Window: 1e9},
		{MaxEvents: 5, Window: 1 << 62},
		{MaxEvents: 5, Window: 1e9, MaxKeys: MaxKeysLimit + 1},
		{MaxEvents: 5, Window: 1e9, Hash: "short"},
		{MaxEvents: 5, Window: 1e9, Normalize: []Normalize{{Name: "soundex"}}},
		{MaxEvents: 5, Window: 1e9, Key: "{http.request.body.json.}"},
		{MaxEvents: 5, Window: 1e9, Fail: "maybe"},
		{MaxEvents: 5, Window: 1e9, Missing: "ignore"},
		{MaxEvents: 1, Window: 1 << 60, Burst: 100, Algorithm: algorithms.NameGCRA},
	} {
		_, err := l.check()
		if err == nil {
			t.Fatalf("%+v: no error", l)
		}
		opt := optionOf(err)
		if _, ok := optionLines[opt]; !ok && !caddyfileOptions[opt] {
			t.Errorf("%v: names %q, not a Caddyfile option", err, opt)
		}
	}
}

var caddyfileOptions = map[string]bool{"algorithm": true, "burst": true, "max_delay": true, "cost": true, "max_keys": true, "hash": true, "normalize": true, "fail": true, "missing": true, "ipv4_prefix": true, "ipv6_prefix": true}
