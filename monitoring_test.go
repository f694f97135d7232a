package sluice

import (
	"encoding/json"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/backend/memory"
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
		collectors := []prometheus.Collector{metrics.requests, metrics.declined, metrics.shadow, metrics.listed, metrics.missing, metrics.failures, metrics.duration, metrics.state, metrics.refused, shedMetrics, tarpitHeld, tarpitSkipped, inFlight, budgetMetrics}
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

// TestDashboardUsesExistingMetrics: the Grafana dashboard parses, and every
// query in it names metrics that exist.
func TestDashboardUsesExistingMetrics(t *testing.T) {
	exported := exportedMetrics(t)
	data, err := os.ReadFile("docs/monitoring/grafana-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Title  string
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
		Templating struct {
			List []struct {
				Name  string
				Query any
			}
		}
	}
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatalf("dashboard: %v", err)
	}
	if dash.Title == "" || len(dash.Panels) < 8 {
		t.Fatalf("dashboard %q has %d panels", dash.Title, len(dash.Panels))
	}
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, q := range p.Targets {
			checkNames(t, "panel "+p.Title, q.Expr, exported)
		}
	}
	for _, v := range dash.Templating.List {
		if v.Name == "zone" {
			q, _ := json.Marshal(v.Query)
			checkNames(t, "variable zone", string(q), exported)
		}
	}
}

// TestAlertRules: the rules name metrics that exist, and, when promtool
// is installed (Debian's prometheus package), load and pass their unit
// tests (rate_limit.rules.test.yml).
func TestAlertRules(t *testing.T) {
	data, err := os.ReadFile("docs/monitoring/rate_limit.rules.yml")
	if err != nil {
		t.Fatal(err)
	}
	exported := exportedMetrics(t)
	for _, expr := range strings.Split(string(data), "expr:")[1:] {
		checkNames(t, "alert rule", expr, exported)
	}
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool is not installed (apt-get install prometheus): the rules were not loaded")
	}
	for _, args := range [][]string{{"check", "rules", "rate_limit.rules.yml"}, {"test", "rules", "rate_limit.rules.test.yml"}} {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = "docs/monitoring"
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}
