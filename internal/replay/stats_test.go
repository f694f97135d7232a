package replay

import (
	"strings"
	"testing"
)

func TestPercentileIsNearestRank(t *testing.T) {
	v := []int64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	for p, want := range map[float64]int64{50: 5, 90: 9, 99: 10, 99.9: 10, 10: 1, 11: 2} {
		if got := Percentile(v, p); got != want {
			t.Errorf("p%v = %d, want %d", p, got, want)
		}
	}
	if Percentile(nil, 50) != 0 {
		t.Error("empty")
	}
}

func TestProposeRules(t *testing.T) {
	d := Distribution{P99: 20, P999: 41, Max: 900}
	for rule, want := range map[string]int64{RuleP99x3: 60, RuleP999: 41, RuleMax: 900} {
		if got, err := Propose(rule, d); err != nil || got != want {
			t.Errorf("%s: %d %v, want %d", rule, got, err, want)
		}
	}
	if got, _ := Propose(RuleP99x3, Distribution{}); got != 1 {
		t.Errorf("no traffic: %d, want 1", got)
	}
	if _, err := Propose("p95", d); err == nil || !strings.Contains(err.Error(), "p99x3, p999 or max") {
		t.Errorf("unknown rule: %v", err)
	}
}

// A key's peak is the most it asked for in any window; the burst it needs
// is the backlog its requests build in a bucket draining at the rate.
func TestPeakAndBurstOfAKey(t *testing.T) {
	const s = int64(1e9)
	// 10 per minute; requests at 0, 1, 2 s (a burst of 3), then 61, 62 s,
	// then 5 at 100 s of cost 2.
	ls := newLimitStats("z", "", 60*s, 10.0/float64(60*s))
	for _, at := range []int64{0, 1, 2, 61, 62} {
		ls.observe("k", 1, true, at*s)
	}
	for range 5 {
		ls.observe("k", 2, false, 100*s)
	}
	k := ls.keys["k"]
	// Window (40 s, 100 s]: 61, 62 and the five of cost 2 = 12.
	if k.peak != 12 {
		t.Errorf("peak %d, want 12", k.peak)
	}
	// At 100 s the backlog left by 61 and 62 s has drained (38 s at one
	// per 6 s): the five requests of cost 2 need a bucket of 10.
	if got := ls.Bursts().Max; got != 10 {
		t.Errorf("burst %d, want 10", got)
	}
	if ls.Denied != 5 || ls.DeniedKeys() != 1 || ls.TopDenied(10)[0].Denied != 5 {
		t.Errorf("denied %d keys %d", ls.Denied, ls.DeniedKeys())
	}
	m, ok := ls.WorstMinute()
	if !ok || m.Start != 60 || m.Denied != 5 || m.Requests != 7 {
		t.Errorf("worst minute %+v", m)
	}
	tl := ls.Timeline(0, 2, 48)
	if len(tl.Denied) != 2 || tl.Denied[1] != 5 || tl.Requests[0] != 3 {
		t.Errorf("timeline %+v", tl)
	}
}

func TestSparkline(t *testing.T) {
	if got := Sparkline([]int64{0, 1, 3, 6}); got != "▁▃▅█" {
		t.Errorf("sparkline %q", got)
	}
	if got := Sparkline([]int64{0, 0}); got != "  " {
		t.Errorf("empty sparkline %q", got)
	}
}
