package sluice

import (
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// An allowed request counts as near the limit when it leaves its key under
// 1 - near_limit of the limit; a denied one never does, and a zone's scopes
// count with the zone's ratio.
func TestNearLimitCounts(t *testing.T) {
	cases := []struct {
		name, zone, near, algorithm string
		requests                    int
		want                        float64
	}{
		// 10/1m: request n leaves 10-n; under 20% is 1 and 0 left.
		{"default", "nl_default", "", "sliding_window", 12, 2},
		// Under half: 4, 3, 2, 1, 0 left.
		{"half", "nl_half", `, "near_limit": 0.5`, "sliding_window", 10, 5},
		// 1 - 0.7 is 0.30000000000000004 in floats: a key left with
		// exactly 3 of 10 is not under 30%.
		{"decimal", "nl_decimal", `, "near_limit": 0.7`, "fixed_window", 10, 3},
		// A bucket counts against its size (burst 10).
		{"bucket", "nl_bucket", "", "token_bucket", 10, 2},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := fmt.Sprintf(`{"rate_limits": {%q: {"key": "{http.request.header.X-Client}", "max_events": 10, "window": "1m", "algorithm": %q%s,
				"scopes": {"all": {"key": "static", "max_events": 1000, "window": "1m"}}}}}`, c.zone, c.algorithm, c.near)
			h, done, err := provisionJSON([]byte(cfg), func() int64 { return fuzzStart })
			if err != nil {
				t.Fatal(err)
			}
			defer done()
			near := metrics.near.WithLabelValues(c.zone, "")
			scope := metrics.near.WithLabelValues(c.zone, "all")
			before, beforeScope := testutil.ToFloat64(near), testutil.ToFloat64(scope)
			for range c.requests {
				serve(h, "c1", "1")
			}
			if got := testutil.ToFloat64(near) - before; got != c.want {
				t.Errorf("near the limit: %v, want %v", got, c.want)
			}
			// The scope's 1000 are far from used.
			if got := testutil.ToFloat64(scope) - beforeScope; got != 0 {
				t.Errorf("scope near the limit: %v, want 0", got)
			}
		})
	}
}

func TestNearLimitChecked(t *testing.T) {
	for _, v := range []string{"1", "1.5", "-0.2"} {
		cfg := `{"rate_limits": {"nl_bad": {"key": "static", "max_events": 10, "window": "1m", "near_limit": ` + v + `}}}`
		_, done, err := provisionJSON([]byte(cfg), func() int64 { return fuzzStart })
		if err == nil {
			done()
			t.Fatalf("near_limit %s loaded", v)
		}
		if want := "near_limit must be a fraction of the limit between 0 and 1, such as 0.8, got " + v; !strings.Contains(err.Error(), want) {
			t.Errorf("near_limit %s: %v, want it to say %q", v, err, want)
		}
	}
}
