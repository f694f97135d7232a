// Package report is the logic of `caddy rate-limit report`: it reads the
// rate limit counters of a Prometheus scrape and says, limit by limit,
// whether it denies too much, only catches abuse, or (a shadow zone) is
// ready to be enforced.
package report

import (
	"bytes"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// The thresholds of the report, from the usual practice of rate limiting:
// under 0.1% of requests denied a limit is only catching abuse; over 5%
// either an attack is under way or the limit is too tight; a shadow zone
// may be enforced once it would have denied under 0.1% for a week.
const (
	healthyRatio = 0.001
	alarmRatio   = 0.05
	// missingRatio is the share of requests without a usable key over
	// which the RateLimitMissingKeys alert fires: a client that lost its
	// identifier, or a key template that reads the wrong field.
	missingRatio = 0.01
)

// Row is one limit's counters in a scrape.
type Row struct {
	zone, scope                string
	requests, declined, shadow float64
	missing, denyingEvictions  float64
}

// verdict is what the numbers say to do with a limit.
func (r Row) verdict(shadow bool, age, minAge time.Duration) string {
	switch {
	case r.requests == 0 && r.missing > 0:
		// Requests refused for a missing key (missing deny) or let
		// through (skip) are decided by no limit: the zone has traffic.
		return fmt.Sprintf("CHECK: %.0f requests without a usable key and none decided: is the key right?", r.missing)
	case r.requests == 0:
		return "no traffic yet"
	case shadow && r.shadow/r.requests >= healthyRatio:
		return fmt.Sprintf("TUNE: would deny %.2f%% (over 0.1%%): raise the limit before enforcing", 100*r.shadow/r.requests)
	case shadow && age < minAge:
		return fmt.Sprintf("watch: under 0.1%% for %s, enforce after %s", roundAge(age), roundAge(minAge))
	case shadow:
		return "READY to enforce: under 0.1% for " + roundAge(age)
	case r.declined/r.requests > alarmRatio:
		return fmt.Sprintf("TUNE: %.1f%% denied (over 5%%): an attack, or the limit is too tight; see whether few keys or many are denied", 100*r.declined/r.requests)
	case r.declined/r.requests >= healthyRatio:
		return "ok: denying some abuse"
	}
	return "ok"
}

func roundAge(d time.Duration) string {
	if d >= 24*time.Hour {
		return fmt.Sprintf("%.1fd", d.Hours()/24)
	}
	return d.Round(time.Second).String()
}

// Parse reads the rate limit counters of a Prometheus text scrape,
// and the process's start time (0 when absent).
func Parse(scrape []byte) ([]Row, float64, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(bytes.NewReader(scrape))
	if err != nil {
		return nil, 0, fmt.Errorf("reading the metrics: %v", err)
	}
	rows := map[[2]string]*Row{}
	row := func(m *dto.Metric) *Row {
		var zone, scope string
		for _, l := range m.GetLabel() {
			switch l.GetName() {
			case "zone":
				zone = l.GetValue()
			case "scope":
				scope = l.GetValue()
			}
		}
		k := [2]string{zone, scope}
		if rows[k] == nil {
			rows[k] = &Row{zone: zone, scope: scope}
		}
		return rows[k]
	}
	fields := map[string]func(*Row) *float64{
		"caddy_rate_limit_requests_total":                 func(r *Row) *float64 { return &r.requests },
		"caddy_rate_limit_declined_requests_total":        func(r *Row) *float64 { return &r.declined },
		"caddy_rate_limit_shadow_declined_requests_total": func(r *Row) *float64 { return &r.shadow },
		"caddy_rate_limit_missing_key_requests_total":     func(r *Row) *float64 { return &r.missing },
		"caddy_rate_limit_denying_evictions_total":        func(r *Row) *float64 { return &r.denyingEvictions },
	}
	for name, field := range fields {
		for _, m := range families[name].GetMetric() {
			*field(row(m)) += metricValue(m)
		}
	}
	var start float64
	if f := families["process_start_time_seconds"]; f != nil && len(f.GetMetric()) > 0 {
		start = metricValue(f.GetMetric()[0])
	}
	out := make([]Row, 0, len(rows))
	for _, r := range rows {
		out = append(out, *r)
	}
	slices.SortFunc(out, func(a, b Row) int {
		return strings.Compare(a.zone+"\x00"+a.scope, b.zone+"\x00"+b.scope)
	})
	return out, start, nil
}

func metricValue(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Untyped != nil:
		return m.Untyped.GetValue()
	}
	return 0
}

// Write prints one line per limit: requests, the share denied, the
// share a shadow zone would have denied, and a verdict. shadow names the
// shadow zones (nil: unknown, then a zone is taken for a shadow zone when
// it would have denied and never denied). The counters run since the
// process started, at start (Unix seconds; 0: unknown).
func Write(w io.Writer, rows []Row, shadow map[string]bool, start float64, now time.Time, minAge time.Duration) error {
	var age time.Duration
	if start > 0 {
		age = now.Sub(time.Unix(0, int64(start*1e9)))
		fmt.Fprintf(w, "Counters since the process started %s ago.\n", roundAge(age))
	} else {
		fmt.Fprintln(w, "The scrape has no process_start_time_seconds: no shadow zone can be called ready.")
	}
	if shadow == nil {
		fmt.Fprintln(w, "Which zones are shadow zones is unknown (no admin API answered; give --address): a zone that would have denied and never denied is taken for one.")
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ZONE\tSCOPE\tMODE\tREQUESTS\tDENIED\tWOULD DENY\tMISSING KEY\tVERDICT")
	for _, r := range rows {
		isShadow := shadow[r.zone]
		if shadow == nil {
			isShadow = r.declined == 0 && r.shadow > 0
		}
		mode := "enforce"
		if isShadow {
			mode = "shadow"
		}
		v := r.verdict(isShadow, age, minAge)
		if r.requests > 0 && r.missing/r.requests > missingRatio {
			v += fmt.Sprintf("; %.1f%% of requests without a usable key (over 1%%): is the key right?", 100*r.missing/r.requests)
		}
		if r.denyingEvictions > 0 {
			v += fmt.Sprintf("; %.0f denied keys evicted at max_keys: raise max_keys", r.denyingEvictions)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%.0f\t%s\t%s\t%s\t%s\n", r.zone, orDash(r.scope), mode, r.requests,
			percent(r.declined, r.requests), percent(r.shadow, r.requests), percent(r.missing, r.requests), v)
	}
	return tw.Flush()
}

func percent(n, of float64) string {
	if of == 0 || math.IsNaN(n) {
		return "-"
	}
	return fmt.Sprintf("%.3f%%", 100*n/of)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
