package aimd

import (
	"sync"
	"testing"
	"time"
)

// worked is the adaptive block of the worked example: min 50, max 2000,
// +10, ×0.7, every 10 s, p99 marks 200 ms and 500 ms, error-rate marks 1%
// and 5%.
var worked = Config{
	Min: 50, Max: 2000, Increase: 10, Decrease: 0.7, Interval: int64(10 * time.Second),
	LatLow: int64(200 * time.Millisecond), LatHigh: int64(500 * time.Millisecond),
	ErrLow: 0.01, ErrHigh: 0.05,
}

// The five cycles of the worked AIMD example: a limit of 500 grows by 10
// twice while the p99 is 120 ms and 140 ms, falls to 364 when it reaches
// 610 ms, and grows again at 180 ms and 160 ms.
func TestAIMDFiveCycles(t *testing.T) {
	cfg := worked
	const interval = int64(10 * time.Second)
	a := New(cfg, 500, 0)
	cycles := []struct {
		p99        time.Duration
		before, to int64
		Verdict    Verdict
	}{
		{120 * time.Millisecond, 500, 510, Grow},
		{140 * time.Millisecond, 510, 520, Grow},
		{610 * time.Millisecond, 520, 364, Shrink},
		{180 * time.Millisecond, 364, 374, Grow},
		{160 * time.Millisecond, 374, 384, Grow},
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
			a.Observe(int64(lat), j%200 == 7)
		}
		if _, ok := a.Decide(now + interval - 1); ok {
			t.Fatalf("cycle %d: decided before the interval ended", i+1)
		}
		d, ok := a.Decide(now + interval)
		if !ok {
			t.Fatalf("cycle %d: no Decision at the end of the interval", i+1)
		}
		if d.From != c.before || d.To != c.to || d.Verdict != c.Verdict || a.Current() != c.to {
			t.Errorf("cycle %d (p99 %v): %d → %d (%v), want %d → %d", i+1, c.p99, d.From, d.To, d.Verdict, c.before, c.to)
		}
		if d.Requests != 1000 || d.Errors != 5 {
			t.Errorf("cycle %d: %d requests, %d errors, want 1000 and 5", i+1, d.Requests, d.Errors)
		}
		if lo, hi := int64(c.p99), int64(c.p99)*1065/1000; d.P99 < lo || d.P99 > hi {
			t.Errorf("cycle %d: p99 %v, want %v to 6.25%% above", i+1, time.Duration(d.P99), c.p99)
		}
	}
}

func TestAIMDVerdicts(t *testing.T) {
	cfg := worked
	ms := int64(time.Millisecond)
	for _, tc := range []struct {
		name                  string
		requests, errors, lat int64
		want                  Verdict
	}{
		{"no traffic holds", 0, 0, 0, Hold},
		{"fast and clean grows", 100, 0, 100 * ms, Grow},
		{"between the latency marks holds", 100, 0, 300 * ms, Hold},
		{"at the low latency mark holds", 100, 0, 200 * ms, Hold},
		{"at the high latency mark holds", 100, 0, 500 * ms, Hold},
		{"slow shrinks", 100, 0, 501 * ms, Shrink},
		{"fast with errors between the marks holds", 100, 2, 10 * ms, Hold},
		{"fast with errors above the high mark shrinks", 100, 6, 10 * ms, Shrink},
		{"every request failed shrinks", 3, 3, 10 * ms, Shrink},
		{"one request of 1,000 failed grows", 1000, 1, 10 * ms, Grow},
	} {
		if got := cfg.judge(tc.requests, tc.errors, tc.lat); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}

	// Without latency marks, only errors count.
	errOnly := Config{Min: 1, Max: 10, Increase: 1, Decrease: 0.7, Interval: int64(10 * time.Second), ErrLow: 0.01, ErrHigh: 0.05}
	if v := errOnly.judge(100, 0, int64(time.Hour)); v != Grow {
		t.Errorf("errors only, an hour of latency: %v, want grow", v)
	}
}

func TestAIMDBounds(t *testing.T) {
	cfg := Config{Min: 50, Max: 2000, Increase: 10, Decrease: 0.7}
	for _, tc := range []struct {
		limit int64
		v     Verdict
		want  int64
	}{
		{1995, Grow, 2000},
		{2000, Grow, 2000},
		{60, Shrink, 50},
		{50, Shrink, 50},
		{500, Hold, 500},
	} {
		if got := cfg.next(tc.limit, tc.v); got != tc.want {
			t.Errorf("%d after %v: %d, want %d", tc.limit, tc.v, got, tc.want)
		}
	}
	// A decrease that rounds back to the limit still takes one off.
	gentle := Config{Min: 1, Max: 10, Increase: 1, Decrease: 0.9}
	if got := gentle.next(2, Shrink); got != 1 {
		t.Errorf("2 × 0.9: %d, want 1", got)
	}
	// An increase larger than the room left stops at max, without
	// overflowing.
	huge := Config{Min: 1, Max: 100, Increase: 1 << 62}
	if got := huge.next(99, Grow); got != 100 {
		t.Errorf("99 + 2^62 within 100: %d", got)
	}
}

// A quiet spell is no evidence: the limit holds, and the interval after it
// starts with the first decision, not at the planned end.
func TestAIMDNoTraffic(t *testing.T) {
	cfg := worked
	a := New(cfg, 500, 0)
	s := int64(time.Second)
	if d, ok := a.Decide(100 * s); !ok || d.Verdict != Hold || a.Current() != 500 {
		t.Fatalf("after 100 s without requests: %+v %v, limit %d", d, ok, a.Current())
	}
	a.Observe(int64(time.Millisecond), false)
	if _, ok := a.Decide(105 * s); ok {
		t.Fatal("decided 5 s into a 10 s interval")
	}
	if d, ok := a.Decide(110 * s); !ok || d.To != 510 {
		t.Fatalf("at 110 s: %+v %v, want 510", d, ok)
	}
}

// Observations made while another goroutine decides are each counted once.
func TestAIMDConcurrentObservations(t *testing.T) {
	cfg := worked
	a := New(cfg, 500, 0)
	var wg sync.WaitGroup
	const workers, each = 4, 5000
	for range workers {
		wg.Go(func() {
			for range each {
				a.Observe(int64(time.Millisecond), false)
			}
		})
	}
	var total int64
	for i := int64(1); i <= 50; i++ {
		d, _ := a.Decide(i * int64(10*time.Second))
		total += d.Requests
	}
	wg.Wait()
	d, _ := a.Decide(1 << 62)
	if total += d.Requests; total != workers*each {
		t.Fatalf("%d observations counted, want %d", total, workers*each)
	}
}

func BenchmarkAIMDObserve(b *testing.B) {
	cfg := worked
	a := New(cfg, 500, 0)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		lat := int64(time.Millisecond)
		for pb.Next() {
			a.Observe(lat, false)
			_, _ = a.Decide(0)
			lat += 1000
		}
	})
}
