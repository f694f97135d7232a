package sluice

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
)

// workedAdaptive is the adaptive block of the worked example: min 50, max
// 2000, +10, ×0.7, every 10 s, p99 marks 200 ms and 500 ms, error-rate
// marks 1% and 5%.
var workedAdaptive = Adaptive{
	Min: 50, Max: 2000, Increase: 10, Decrease: 0.7, Interval: caddy.Duration(10 * time.Second),
	LatencyP99Low: caddy.Duration(200 * time.Millisecond), LatencyP99High: caddy.Duration(500 * time.Millisecond),
	ErrorRateLow: 0.01, ErrorRateHigh: 0.05,
}

// The five cycles of the worked AIMD example: a limit of 500 grows by 10
// twice while the p99 is 120 ms and 140 ms, falls to 364 when it reaches
// 610 ms, and grows again at 180 ms and 160 ms.
func TestAIMDFiveCycles(t *testing.T) {
	cfg, err := workedAdaptive.config(500, MaxConcurrency)
	if err != nil {
		t.Fatal(err)
	}
	const interval = int64(10 * time.Second)
	a := newAIMD(cfg, 500, 0)
	cycles := []struct {
		p99        time.Duration
		before, to int64
		verdict    verdict
	}{
		{120 * time.Millisecond, 500, 510, verdictGrow},
		{140 * time.Millisecond, 510, 520, verdictGrow},
		{610 * time.Millisecond, 520, 364, verdictShrink},
		{180 * time.Millisecond, 364, 374, verdictGrow},
		{160 * time.Millisecond, 374, 384, verdictGrow},
	}
	for i, c := range cycles {
		now := int64(i) * interval
		// 980 fast requests and 20 at the cycle's p99 (2%, so the 99th
		// percentile is among them); 5 of the 1,000 fail (0.5%).
		for j := range 1000 {
			lat := 30 * time.Millisecond
			if j%50 == 0 {
				lat = c.p99
			}
			a.observe(int64(lat), j%200 == 7)
		}
		if _, ok := a.decide(now + interval - 1); ok {
			t.Fatalf("cycle %d: decided before the interval ended", i+1)
		}
		d, ok := a.decide(now + interval)
		if !ok {
			t.Fatalf("cycle %d: no decision at the end of the interval", i+1)
		}
		if d.from != c.before || d.to != c.to || d.verdict != c.verdict || a.current() != c.to {
			t.Errorf("cycle %d (p99 %v): %d → %d (%v), want %d → %d", i+1, c.p99, d.from, d.to, d.verdict, c.before, c.to)
		}
		if d.requests != 1000 || d.errors != 5 {
			t.Errorf("cycle %d: %d requests, %d errors, want 1000 and 5", i+1, d.requests, d.errors)
		}
		if lo, hi := int64(c.p99), int64(c.p99)*1065/1000; d.p99 < lo || d.p99 > hi {
			t.Errorf("cycle %d: p99 %v, want %v to 6.25%% above", i+1, time.Duration(d.p99), c.p99)
		}
	}
}

func TestAIMDVerdicts(t *testing.T) {
	cfg, err := workedAdaptive.config(500, MaxConcurrency)
	if err != nil {
		t.Fatal(err)
	}
	ms := int64(time.Millisecond)
	for _, tc := range []struct {
		name                  string
		requests, errors, lat int64
		want                  verdict
	}{
		{"no traffic holds", 0, 0, 0, verdictHold},
		{"fast and clean grows", 100, 0, 100 * ms, verdictGrow},
		{"between the latency marks holds", 100, 0, 300 * ms, verdictHold},
		{"at the low latency mark holds", 100, 0, 200 * ms, verdictHold},
		{"at the high latency mark holds", 100, 0, 500 * ms, verdictHold},
		{"slow shrinks", 100, 0, 501 * ms, verdictShrink},
		{"fast with errors between the marks holds", 100, 2, 10 * ms, verdictHold},
		{"fast with errors above the high mark shrinks", 100, 6, 10 * ms, verdictShrink},
		{"every request failed shrinks", 3, 3, 10 * ms, verdictShrink},
		{"one request of 1,000 failed grows", 1000, 1, 10 * ms, verdictGrow},
	} {
		if got := cfg.judge(tc.requests, tc.errors, tc.lat); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}

	// Without latency marks, only errors count.
	errOnly, err := (&Adaptive{}).config(10, 100)
	if err != nil {
		t.Fatal(err)
	}
	if v := errOnly.judge(100, 0, int64(time.Hour)); v != verdictGrow {
		t.Errorf("errors only, an hour of latency: %v, want grow", v)
	}
}

func TestAIMDBounds(t *testing.T) {
	cfg := aimdConfig{min: 50, max: 2000, increase: 10, decrease: 0.7}
	for _, tc := range []struct {
		limit int64
		v     verdict
		want  int64
	}{
		{1995, verdictGrow, 2000},
		{2000, verdictGrow, 2000},
		{60, verdictShrink, 50},
		{50, verdictShrink, 50},
		{500, verdictHold, 500},
	} {
		if got := cfg.next(tc.limit, tc.v); got != tc.want {
			t.Errorf("%d after %v: %d, want %d", tc.limit, tc.v, got, tc.want)
		}
	}
	// A decrease that rounds back to the limit still takes one off.
	gentle := aimdConfig{min: 1, max: 10, increase: 1, decrease: 0.9}
	if got := gentle.next(2, verdictShrink); got != 1 {
		t.Errorf("2 × 0.9: %d, want 1", got)
	}
	// An increase larger than the room left stops at max, without
	// overflowing.
	huge := aimdConfig{min: 1, max: 100, increase: 1 << 62}
	if got := huge.next(99, verdictGrow); got != 100 {
		t.Errorf("99 + 2^62 within 100: %d", got)
	}
}

// A quiet spell is no evidence: the limit holds, and the interval after it
// starts with the first decision, not at the planned end.
func TestAIMDNoTraffic(t *testing.T) {
	cfg, _ := workedAdaptive.config(500, MaxConcurrency)
	a := newAIMD(cfg, 500, 0)
	s := int64(time.Second)
	if d, ok := a.decide(100 * s); !ok || d.verdict != verdictHold || a.current() != 500 {
		t.Fatalf("after 100 s without requests: %+v %v, limit %d", d, ok, a.current())
	}
	a.observe(int64(time.Millisecond), false)
	if _, ok := a.decide(105 * s); ok {
		t.Fatal("decided 5 s into a 10 s interval")
	}
	if d, ok := a.decide(110 * s); !ok || d.to != 510 {
		t.Fatalf("at 110 s: %+v %v, want 510", d, ok)
	}
}

// Observations made while another goroutine decides are each counted once.
func TestAIMDConcurrentObservations(t *testing.T) {
	cfg, _ := workedAdaptive.config(500, MaxConcurrency)
	a := newAIMD(cfg, 500, 0)
	var wg sync.WaitGroup
	const workers, each = 4, 5000
	for range workers {
		wg.Go(func() {
			for range each {
				a.observe(int64(time.Millisecond), false)
			}
		})
	}
	var total int64
	for i := int64(1); i <= 50; i++ {
		d, _ := a.decide(i * int64(10*time.Second))
		total += d.requests
	}
	wg.Wait()
	d, _ := a.decide(1 << 62)
	if total += d.requests; total != workers*each {
		t.Fatalf("%d observations counted, want %d", total, workers*each)
	}
}

func TestAdaptiveConfigErrors(t *testing.T) {
	ms := func(n int64) caddy.Duration { return caddy.Duration(n * int64(time.Millisecond)) }
	for _, tc := range []struct {
		name  string
		a     Adaptive
		start int64
		want  string
	}{
		{"min above max", Adaptive{Min: 600, Max: 500}, 500, "min 600 is above max 500"},
		{"start below min", Adaptive{Min: 600, Max: 900}, 500, "starts at the configured 500"},
		{"start above max", Adaptive{Max: 400}, 500, "starts at the configured 500"},
		{"max too large", Adaptive{Max: MaxConcurrency + 1}, 500, "max must be at most"},
		{"negative min", Adaptive{Min: -1}, 500, "min must be at least 1"},
		{"negative increase", Adaptive{Increase: -5}, 500, "increase must be at least 1"},
		{"decrease 1", Adaptive{Decrease: 1}, 500, "decrease must be strictly between 0 and 1"},
		{"decrease 1.5", Adaptive{Decrease: 1.5}, 500, "decrease must be strictly between 0 and 1"},
		{"negative decrease", Adaptive{Decrease: -0.5}, 500, "decrease must be strictly between 0 and 1"},
		{"interval under 1s", Adaptive{Interval: ms(500)}, 500, "interval must be from 1s to 1h"},
		{"interval over 1h", Adaptive{Interval: caddy.Duration(2 * time.Hour)}, 500, "interval must be from 1s to 1h"},
		{"one latency mark", Adaptive{LatencyP99Low: ms(200)}, 500, "latency_p99 needs both marks"},
		{"latency marks reversed", Adaptive{LatencyP99Low: ms(500), LatencyP99High: ms(200)}, 500, "low mark 500ms must be below the high mark 200ms"},
		{"latency marks equal", Adaptive{LatencyP99Low: ms(200), LatencyP99High: ms(200)}, 500, "must be below the high mark"},
		{"negative latency", Adaptive{LatencyP99Low: ms(-1), LatencyP99High: ms(200)}, 500, "must be positive"},
		{"error marks reversed", Adaptive{ErrorRateLow: 0.05, ErrorRateHigh: 0.01}, 500, "error_rate low mark 0.05 must be below the high mark 0.01"},
		{"one error mark", Adaptive{ErrorRateLow: 0.05}, 500, "error_rate marks must be above 0%"},
		{"error rate over 100%", Adaptive{ErrorRateLow: 0.5, ErrorRateHigh: 2}, 500, "at most 100%"},
	} {
		_, err := tc.a.config(tc.start, MaxConcurrency)
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "adaptive: ") {
			t.Errorf("%s: %v, want an error with %q", tc.name, err, tc.want)
		}
	}
	c, err := (&Adaptive{}).config(40, MaxConcurrency)
	if err != nil {
		t.Fatal(err)
	}
	if want := (aimdConfig{min: 1, max: 40, increase: 1, decrease: 0.7, interval: int64(10 * time.Second), errLow: 0.01, errHigh: 0.05}); c != want {
		t.Fatalf("defaults: %+v, want %+v", c, want)
	}
}

func BenchmarkAIMDObserve(b *testing.B) {
	cfg, _ := workedAdaptive.config(500, MaxConcurrency)
	a := newAIMD(cfg, 500, 0)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		lat := int64(time.Millisecond)
		for pb.Next() {
			a.observe(lat, false)
			_, _ = a.decide(0)
			lat += 1000
		}
	})
}
