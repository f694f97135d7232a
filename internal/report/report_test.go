package report

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

const scrape = `# HELP caddy_rate_limit_requests_total Requests decided by a rate limit zone.
# TYPE caddy_rate_limit_requests_total counter
caddy_rate_limit_requests_total{key="",scope="",zone="api"} 10000
caddy_rate_limit_requests_total{key="",scope="",zone="login"} 1000
caddy_rate_limit_requests_total{key="",scope="ip",zone="login"} 1000
caddy_rate_limit_requests_total{key="",scope="",zone="search"} 100000
caddy_rate_limit_requests_total{key="",scope="",zone="feed"} 100000
caddy_rate_limit_requests_total{key="",scope="",zone="idle"} 0
caddy_rate_limit_requests_total{key="",scope="",zone="otp"} 0
caddy_rate_limit_requests_total{key="",scope="",zone="nokey"} 1000
# TYPE caddy_rate_limit_missing_key_requests_total counter
caddy_rate_limit_missing_key_requests_total{policy="deny",scope="",zone="otp"} 40
caddy_rate_limit_missing_key_requests_total{policy="shared",scope="",zone="nokey"} 20
# TYPE caddy_rate_limit_declined_requests_total counter
caddy_rate_limit_declined_requests_total{key="",scope="",zone="api"} 900
caddy_rate_limit_declined_requests_total{key="",scope="",zone="login"} 3
caddy_rate_limit_declined_requests_total{key="",scope="ip",zone="login"} 0
# TYPE caddy_rate_limit_shadow_declined_requests_total counter
caddy_rate_limit_shadow_declined_requests_total{scope="",zone="search"} 50
caddy_rate_limit_shadow_declined_requests_total{scope="",zone="feed"} 500
# TYPE caddy_rate_limit_denying_evictions_total counter
caddy_rate_limit_denying_evictions_total{scope="ip",zone="login"} 2
# TYPE process_start_time_seconds gauge
process_start_time_seconds 1.7e+09
`

func TestReport(t *testing.T) {
	rows, start, err := Parse([]byte(scrape))
	if err != nil {
		t.Fatal(err)
	}
	if start != 1.7e9 || len(rows) != 8 {
		t.Fatalf("start %v, %d rows", start, len(rows))
	}
	shadow := map[string]bool{"search": true, "feed": true}
	for _, tc := range []struct {
		name string
		age  time.Duration
		want map[string]string // zone/scope → verdict prefix
	}{
		{"a week of data", 8 * 24 * time.Hour, map[string]string{
			"api/":     "TUNE: 9.0% denied",
			"login/":   "ok: denying some abuse",
			"login/ip": "ok; 2 denied keys evicted",
			"search/":  "READY to enforce: under 0.1% for 8.0d",
			"feed/":    "TUNE: would deny 0.50%",
			"idle/":    "no traffic yet",
			// Every request refused for a missing key: traffic, none decided.
			"otp/": "CHECK: 40 requests without a usable key and none decided",
			// 2% without a key is over the alert's 1%.
			"nokey/": "ok; 2.0% of requests without a usable key",
		}},
		{"two days of data", 48 * time.Hour, map[string]string{
			"search/": "watch: under 0.1% for 2.0d, enforce after 7.0d",
			"feed/":   "TUNE: would deny 0.50%",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			now := time.Unix(1_700_000_000, 0).Add(tc.age)
			if err := Write(&out, rows, shadow, start, now, 7*24*time.Hour); err != nil {
				t.Fatal(err)
			}
			for id, want := range tc.want {
				zone, scope, _ := strings.Cut(id, "/")
				line := reportLine(out.String(), zone, orDash(scope))
				if !strings.Contains(line, want) {
					t.Errorf("%s: line %q, want %q in it\n%s", id, line, want, out.String())
				}
			}
		})
	}
	t.Run("shadow zones unknown", func(t *testing.T) {
		var out bytes.Buffer
		if err := Write(&out, rows, nil, 0, time.Now(), time.Hour); err != nil {
			t.Fatal(err)
		}
		if line := reportLine(out.String(), "search", "-"); !strings.Contains(line, "shadow") || !strings.Contains(line, "watch") {
			t.Errorf("a zone that only would-denied, with no start time: %q, want a shadow zone not yet ready", line)
		}
	})
}

func reportLine(out, zone, scope string) string {
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) > 2 && f[0] == zone && f[1] == scope {
			return l
		}
	}
	return ""
}

func TestReportRefusesGarbage(t *testing.T) {
	if _, _, err := Parse([]byte("caddy_rate_limit_requests_total{zone=\"a\" 12\n")); err == nil {
		t.Fatal("a broken scrape was read")
	}
}
