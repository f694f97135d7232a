package latency

import (
	"testing"
	"time"
)

// windowCount is how many latencies the window holds at now.
const ms = int64(time.Millisecond)

func windowCount(w *Window, now int64) int64 {
	n, _ := w.Sum(now)
	return n
}

// The window's p99 covers the last 8 to 10 seconds: a slow spell stays in
// it while steady traffic crosses the parts' edges, and leaves it whole
// two seconds at a time once it is older than the window.
func TestLatencyWindowRolls(t *testing.T) {
	var w Window
	start := int64(100 * time.Second) // the start of a part
	if got := w.P99At(start); got != 0 {
		t.Fatalf("empty window: p99 %d, want 0", got)
	}
	// One request a 10 ms step: 300 ms for the first two seconds, then
	// 10 ms for eight.
	now := start
	for ; now < start+2000*ms; now += 10 * ms {
		w.Add(300*ms, now)
	}
	slow := w.P99At(now)
	if slow < 300*ms || slow > 300*ms*17/16 {
		t.Fatalf("p99 of 300 ms requests: %s", time.Duration(slow))
	}
	for ; now < start+10000*ms; now += 10 * ms {
		w.Add(10*ms, now)
		// The slow fifth of the window is above the 99th percentile
		// all along, parts' edges included.
		if got := w.P99At(now); got != slow {
			t.Fatalf("at %s: p99 %s, want the slow spell's %s", time.Duration(now-start), time.Duration(got), time.Duration(slow))
		}
	}
	// At 10 s the slow spell's part leaves the window: the rest were fast.
	if got := w.P99At(now); got < 10*ms || got > 11*ms {
		t.Fatalf("at %s, once the slow part left: p99 %s, want about 10ms", time.Duration(now-start), time.Duration(got))
	}
	if n := windowCount(&w, now); n != 800 {
		t.Fatalf("the window holds %d requests at 10 s, want the last 8 s's 800", n)
	}
	// Without traffic the fast parts leave too, and the p99 is 0.
	if got := w.P99At(now + 8000*ms - 1); got == 0 {
		t.Fatal("p99 0 while the last part is still in the window")
	}
	if got := w.P99At(now + 8000*ms); got != 0 {
		t.Fatalf("p99 %s once every request is older than the window, want 0", time.Duration(got))
	}
}

// The p99 read by the shedding check is worked out again at most every
// 100 ms: in between, a read is an atomic load.
func TestLatencyWindowRefresh(t *testing.T) {
	var w Window
	now := int64(50 * time.Second)
	w.Add(100*ms, now)
	first := w.P99At(now)
	w.Add(900*ms, now+1) // a tenth of a second later, one in two is slow
	if got := w.P99At(now + 99*ms); got != first {
		t.Fatalf("read within 100 ms of the last refresh: %s, want the %s read then", time.Duration(got), time.Duration(first))
	}
	if got := w.P99At(now + 100*ms); got < 900*ms {
		t.Fatalf("read at the next refresh: %s, want the slow request's 900ms", time.Duration(got))
	}
}

// A clock read that another request overtook across a whole window (its
// part was given to a later epoch) loses its latency rather than putting
// it among the newer ones.
func TestLatencyWindowLateAdd(t *testing.T) {
	var w Window
	now := int64(200 * time.Second)
	w.Add(5*ms, now)
	w.Add(999*ms, now-int64(WindowSpan)) // same part, an older epoch
	if n := windowCount(&w, now); n != 1 {
		t.Fatalf("window holds %d, want 1", n)
	}
}

// One very slow request is the p99 of a window of fewer than 100 (the
// ⌈0.99·n⌉-th of n is the slowest), and only 1% of one of 100 or more;
// handlers that answer at once read under a microsecond.
func TestLatencyWindowOneSlowRequest(t *testing.T) {
	for _, tt := range []struct {
		fast int
		want int64 // the p99's least value
	}{
		{0, 30 * int64(time.Second)},
		{98, 30 * int64(time.Second)},
		{99, 5 * ms},
		{1000, 5 * ms},
	} {
		var w Window
		now := int64(800 * time.Second)
		for range tt.fast {
			w.Add(5*ms, now)
		}
		w.Add(30*int64(time.Second), now)
		if got := w.P99At(now); got < tt.want || got > tt.want*17/16 {
			t.Errorf("one 30 s request among %d of 5 ms: p99 %s, want %s", tt.fast, time.Duration(got), time.Duration(tt.want))
		}
	}
	var w Window
	w.Add(0, 0)
	w.Add(-5, 0) // a clock step back reads as 0
	if got := w.P99At(0); got != 999 {
		t.Fatalf("requests of no time: p99 %dns, want 999 (the first bucket's bound)", got)
	}
}

func TestLatencyHistogram(t *testing.T) {
	// Every bucket's upper bound is below the next bucket's lower bound,
	// and a value lands in a bucket whose bound is at most 6.25% above.
	prev := int64(-1)
	for i := range Buckets {
		up := Upper(i)
		if up <= prev {
			t.Fatalf("bucket %d ends at %d, not after bucket %d (%d)", i, up, i-1, prev)
		}
		prev = up
	}
	for _, ns := range []int64{0, 999, 1000, 31_999, 32_000, 120_000_000, 610_000_000, int64(time.Hour), 1 << 62} {
		i := Bucket(uint64(ns) / 1000)
		up := Upper(i)
		if ns < int64(time.Hour) && (up < ns || float64(up) > float64(ns)*1.0625+1000) {
			t.Errorf("%d ns: bucket %d up to %d", ns, i, up)
		}
	}
	var h Histogram
	for i := range 1000 {
		h.Add(int64(i+1) * int64(time.Millisecond)) // 1 ms … 1 s
	}
	n, p99 := h.Drain()
	if n != 1000 || p99 < int64(990*time.Millisecond) || p99 > int64(990*time.Millisecond)*1065/1000 {
		t.Fatalf("1 ms … 1 s: n %d p99 %v, want 990 ms", n, time.Duration(p99))
	}
	if n, _ := h.Drain(); n != 0 {
		t.Fatalf("drained twice: %d", n)
	}
}
