package shed

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/latency"
)

const ms = int64(time.Millisecond)

// The shedding rule, priority > 5 − (load − 0.8) × 10, at the loads around
// each priority's edge. At a load of 1.1 the threshold is 3 and priorities
// above 2 are refused; priority 0 is never refused.
func TestShedRule(t *testing.T) {
	tests := []struct {
		inFlight, capacity int64
		shed               [5]bool // by priority 0…4
	}{
		{0, 10, [5]bool{}},
		{8, 10, [5]bool{}}, // load 0.8: threshold 0
		{9, 10, [5]bool{}}, // 0.9: threshold 1, priority > 4
		{10, 10, [5]bool{false, false, false, false, true}},   // 1.0: threshold 2
		{11, 10, [5]bool{false, false, false, true, true}},    // 1.1: threshold 3
		{12, 10, [5]bool{false, false, true, true, true}},     // 1.2: threshold 4
		{13, 10, [5]bool{false, true, true, true, true}},      // 1.3: threshold 5
		{15, 10, [5]bool{false, true, true, true, true}},      // 1.5: threshold 7
		{1 << 40, 10, [5]bool{false, true, true, true, true}}, // far beyond
		// The edges in a larger group: one request more or less.
		{900, 1000, [5]bool{}},
		{901, 1000, [5]bool{false, false, false, false, true}},
		{1100, 1000, [5]bool{false, false, false, true, true}},
		{1101, 1000, [5]bool{false, false, true, true, true}},
		{1200, 1000, [5]bool{false, false, true, true, true}},
		{1201, 1000, [5]bool{false, true, true, true, true}},
		{1, 1, [5]bool{false, false, false, false, true}},
	}
	for _, tt := range tests {
		for p, want := range tt.shed {
			if got := Sheds(tt.inFlight, tt.capacity, p); got != want {
				t.Errorf("%d in flight of %d, priority %d: shed %v, want %v", tt.inFlight, tt.capacity, p, got, want)
			}
		}
	}
}

// The rule written in floats, as it reads, sheds priority 2 at a load of
// exactly 1.1: (1.1 − 0.8) × 10 is 3.0000000000000004 in float64. The
// integer form keeps the threshold at 3.
func TestShedRuleIsExactAtTheEdges(t *testing.T) {
	floatSheds := func(inFlight, capacity int64, priority int) bool {
		load := float64(inFlight) / float64(capacity)
		if load < 0.8 {
			return false
		}
		return float64(priority) > 5-(load-0.8)*10
	}
	if !floatSheds(11, 10, 2) {
		t.Fatal("the float rule no longer misjudges 1.1: this test shows nothing")
	}
	if Sheds(11, 10, 2) {
		t.Fatal("priority 2 shed at load 1.1")
	}
	// Everywhere else the two agree.
	for capacity := int64(1); capacity <= 50; capacity++ {
		for inFlight := int64(0); inFlight <= 2*capacity; inFlight++ {
			for p := range 5 {
				edge := 10*inFlight-8*capacity == int64(5-p)*capacity // the threshold lands on p
				if got, f := Sheds(inFlight, capacity, p), floatSheds(inFlight, capacity, p) && p > 0; got != f && !edge {
					t.Errorf("%d/%d priority %d: integer rule %v, float rule %v", inFlight, capacity, p, got, f)
				}
			}
		}
	}
}

// The rule on latency alone, as the request count's: at a p99 of 1.1 ×
// the target, priorities 3 and 4 are shed and 0 to 2 kept; at 0.9 ×,
// nothing. In floats, 220ms ÷ 200ms makes priority 2 shed.
func TestShedLatencyRule(t *testing.T) {
	target := 200 * ms
	tests := []struct {
		p99  int64
		shed [5]bool
	}{
		{0, [5]bool{}},
		{180 * ms, [5]bool{}}, // 0.9
		{180*ms + 1, [5]bool{false, false, false, false, true}},
		{200 * ms, [5]bool{false, false, false, false, true}},                        // 1.0
		{220 * ms, [5]bool{false, false, false, true, true}},                         // 1.1
		{220*ms + 1, [5]bool{false, false, true, true, true}},                        // just above
		{240 * ms, [5]bool{false, false, true, true, true}},                          // 1.2
		{260*ms + 1, [5]bool{false, true, true, true, true}},                         // above 1.3
		{latency.Upper(latency.Buckets - 1), [5]bool{false, true, true, true, true}}, // the top bucket
	}
	for _, tt := range tests {
		for p, want := range tt.shed {
			if got := Sheds(tt.p99, target, p); got != want {
				t.Errorf("p99 %s for %s, priority %d: shed %v, want %v", time.Duration(tt.p99), time.Duration(target), p, got, want)
			}
		}
	}
	if load := float64(220*ms) / float64(target); !(2 > 5-(load-0.8)*10) {
		t.Fatal("the float rule no longer misjudges 1.1: this test shows less")
	}
	// The largest target and p99 do not overflow.
	if !Sheds(latency.Upper(latency.Buckets-1), int64(MaxLatencyTarget), 1) || Sheds(0, int64(MaxLatencyTarget), 4) {
		t.Fatal("the rule overflows at the bounds")
	}
}
