package sluice

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/backend/memory"
	"github.com/sluicehq/sluice/internal/shed"
)

// exportedMetrics returns the names of every series the handler's
// collectors can export, histograms with their _bucket, _sum and _count.
func exportedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	reg := prometheus.NewRegistry()
	if err := registerMetrics(reg, memory.New(memory.Options{})); err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	fq := regexp.MustCompile(`fqName: "([^"]+)"`)
	ch := make(chan *prometheus.Desc, 64)
	go func() {
		collectors := []prometheus.Collector{metrics.requests, metrics.declined, metrics.shadow, metrics.near, metrics.listed, metrics.missing, metrics.failures, metrics.duration, metrics.state, metrics.refused, shed.Metrics, tarpitHeld, tarpitSkipped, inFlight, budgetMetrics}
		for _, c := range append(collectors, adaptiveCollectors...) {
			c.Describe(ch)
		}
		close(ch)
	}()
	for d := range ch {
		m := fq.FindStringSubmatch(d.String())
		if m == nil {
			t.Fatalf("no name in %v", d)
		}
		names[m[1]] = true
		if m[1] == "caddy_rate_limit_process_time_seconds" {
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				names[m[1]+s] = true
			}
		}
	}
	return names
}

var metricName = regexp.MustCompile(`\bcaddy_rate_limit_[a-z0-9_]+`)

// checkNames fails for every metric text names that Sluice does not export.
func checkNames(t *testing.T, what, text string, exported map[string]bool) {
	t.Helper()
	found := metricName.FindAllString(text, -1)
	if len(found) == 0 {
		t.Fatalf("%s names no metric", what)
	}
	for _, n := range found {
		if !exported[n] {
			t.Errorf("%s uses %s, which Sluice does not export", what, n)
		}
	}
}

// dashboard is the part of the Grafana dashboard the tests read.
type dashboard struct {
	Inputs []struct {
		Name, Type, PluginID string
	} `json:"__inputs"`
	Title  string
	Panels []struct {
		Title      string
		Datasource struct{ UID string }
		Targets    []struct {
			Expr       string
			Datasource struct{ UID string }
		}
	}
	Templating struct {
		List []struct {
			Name    string
			Type    string
			Query   any
			Current struct{ Value string }
		}
	}
}

func readDashboard(t *testing.T) dashboard {
	t.Helper()
	data, err := os.ReadFile("docs/monitoring/grafana-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash dashboard
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatalf("dashboard: %v", err)
	}
	return dash
}

// TestDashboardUsesExistingMetrics: the Grafana dashboard parses, every
// query in it names metrics that exist, and Grafana's import asks for the
// Prometheus data source that every panel then reads.
func TestDashboardUsesExistingMetrics(t *testing.T) {
	exported := exportedMetrics(t)
	dash := readDashboard(t)
	if dash.Title == "" || len(dash.Panels) < 8 {
		t.Fatalf("dashboard %q has %d panels", dash.Title, len(dash.Panels))
	}
	if len(dash.Inputs) != 1 || dash.Inputs[0].Type != "datasource" || dash.Inputs[0].PluginID != "prometheus" {
		t.Errorf("__inputs = %+v, want one Prometheus data source for the import to ask for", dash.Inputs)
	}
	titles := map[string]bool{}
	for _, p := range dash.Panels {
		titles[p.Title] = true
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		if p.Datasource.UID != "${datasource}" {
			t.Errorf("panel %q reads data source %q, not the dashboard's ${datasource}", p.Title, p.Datasource.UID)
		}
		for _, q := range p.Targets {
			checkNames(t, "panel "+p.Title, q.Expr, exported)
			if !strings.Contains(q.Expr, `job=~"$job"`) {
				t.Errorf("panel %q: query %q is not filtered by the job variable", p.Title, q.Expr)
			}
		}
	}
	if !titles["Spend budgets: share left"] {
		t.Error("no spend budget panel")
	}
	vars := map[string]bool{}
	for _, v := range dash.Templating.List {
		vars[v.Name] = true
		switch v.Name {
		case "zone", "job":
			q, _ := json.Marshal(v.Query)
			checkNames(t, "variable "+v.Name, string(q), exported)
		case "datasource":
			if v.Current.Value != "${DS_PROMETHEUS}" {
				t.Errorf("the datasource variable defaults to %q, not the imported ${DS_PROMETHEUS}", v.Current.Value)
			}
		}
	}
	if !vars["datasource"] || !vars["job"] || !vars["zone"] {
		t.Errorf("dashboard variables %v, want datasource, job and zone", vars)
	}
}

// needPromtool returns promtool's path. Without it the test is skipped
// with a message, except in CI (CI=true), which installs it.
func needPromtool(t *testing.T) string {
	t.Helper()
	promtool, err := exec.LookPath("promtool")
	if err == nil {
		return promtool
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("promtool is not installed (CI=true: .ci/run installs Debian's prometheus package)")
	}
	t.Skip("SKIPPING: promtool is not installed (apt-get install prometheus): the rules and queries were not evaluated")
	return ""
}

// TestAlertRules: the rules name metrics that exist, load, and pass their
// unit tests (rate_limit.rules.test.yml) in promtool.
func TestAlertRules(t *testing.T) {
	data, err := os.ReadFile("docs/monitoring/rate_limit.rules.yml")
	if err != nil {
		t.Fatal(err)
	}
	exported := exportedMetrics(t)
	for _, expr := range strings.Split(string(data), "expr:")[1:] {
		checkNames(t, "alert rule", expr, exported)
	}
	promtool := needPromtool(t)
	for _, args := range [][]string{{"check", "rules", "rate_limit.rules.yml"}, {"test", "rules", "rate_limit.rules.test.yml"}} {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = "docs/monitoring"
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// TestDashboardRatiosForAFleet evaluates the dashboard's ratio panels in
// promtool over a fleet: two instances of one job each deny 30 of 1,000
// requests a minute (3%), and a second job in the same Prometheus denies
// 100 of 500 (20%) of a zone of the same name. Each job's line must read
// its own fleet's ratio.
func TestDashboardRatiosForAFleet(t *testing.T) {
	promtool := needPromtool(t)
	exprs := map[string]string{}
	for _, p := range readDashboard(t).Panels {
		switch p.Title {
		case "Deny ratio", "Shadow zones: would deny":
			e := strings.NewReplacer(`$__rate_interval`, "5m", `"$job"`, `".*"`, `"$zone"`, `".*"`).Replace(p.Targets[0].Expr)
			exprs[p.Title] = e
		}
	}
	if len(exprs) != 2 {
		t.Fatalf("found the ratio panels %v", exprs)
	}
	var b strings.Builder
	b.WriteString("evaluation_interval: 1m\ntests:\n  - interval: 1m\n    input_series:\n")
	series := func(name, labels, values string) {
		fmt.Fprintf(&b, "      - series: '%s{%s}'\n        values: '%s'\n", name, labels, values)
	}
	for _, inst := range []string{"a", "b"} {
		l := `job="edge",instance="` + inst + `",zone="api",scope=""`
		series("caddy_rate_limit_requests_total", l+`,key=""`, "0+1000x30")
		series("caddy_rate_limit_requests_total", `job="edge",instance="`+inst+`",zone="api",scope="ip",key=""`, "0+1000x30")
		series("caddy_rate_limit_declined_requests_total", l+`,key=""`, "0+30x30")
		series("caddy_rate_limit_shadow_declined_requests_total", l, "0+30x30")
	}
	series("caddy_rate_limit_requests_total", `job="batch",instance="c",zone="api",scope="",key=""`, "0+500x30")
	series("caddy_rate_limit_declined_requests_total", `job="batch",instance="c",zone="api",scope="",key=""`, "0+100x30")
	series("caddy_rate_limit_shadow_declined_requests_total", `job="batch",instance="c",zone="api",scope=""`, "0+100x30")
	b.WriteString("    promql_expr_test:\n")
	for _, title := range []string{"Deny ratio", "Shadow zones: would deny"} {
		// In percent, rounded: the rates' floats are not exact.
		fmt.Fprintf(&b, "      - expr: 'round(100 * (%s))'\n        eval_time: 20m\n        exp_samples:\n", exprs[title])
		b.WriteString("          - labels: '{job=\"edge\", zone=\"api\"}'\n            value: 3\n")
		b.WriteString("          - labels: '{job=\"batch\", zone=\"api\"}'\n            value: 20\n")
	}
	file := filepath.Join(t.TempDir(), "dashboard.test.yml")
	if err := os.WriteFile(file, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(promtool, "test", "rules", file).CombinedOutput(); err != nil {
		t.Errorf("promtool test rules: %v\n%s\n%s", err, out, b.String())
	}
}
