package replay

import (
	"cmp"
	"math"
	"slices"
	"strings"
)

// LimitStats is what one limit (a zone's own, or a scope) decided in a
// replay.
type LimitStats struct {
	Zone, Scope string
	Shadow      bool
	Requests    int64 // decided by this limit
	Denied      int64 // of them, denied (or would be, in a shadow zone)
	Units       int64 // cost units asked for
	// Unknown counts requests this limit admitted whose response the log
	// does not have (the live server refused them), for a limit that
	// reads the response.
	Unknown int64
	// Absent counts, per header field the key reads, the requests that
	// had none.
	Absent map[string]int64

	keys    map[string]*keyStat
	minutes map[int64]*[2]int64 // minute (Unix) → requests, denied

	// window and rate of the per-key measures (peaks): 0 when off.
	window int64
	rate   float64 // units per ns
}

// keyStat is one key's counts, and with peaks its busiest window.
type keyStat struct {
	requests, denied, units int64
	// The key's events of the last window (times, and costs when not all
	// 1), for its peak: the most units it asked for in any window.
	times []int64
	costs []int64
	head  int
	sum   int64
	peak  int64
	// The backlog of a bucket draining at the limit's rate: its largest
	// value is the burst the key needs at that rate.
	backlog float64
	last    int64
	burst   float64
}

func newLimitStats(zone, scope string, window int64, rate float64) *LimitStats {
	return &LimitStats{Zone: zone, Scope: scope, keys: map[string]*keyStat{}, minutes: map[int64]*[2]int64{}, window: window, rate: rate, Absent: map[string]int64{}}
}

func (s *LimitStats) observe(key string, cost int64, allowed bool, now int64) {
	s.Requests++
	s.Units += cost
	k := s.keys[key]
	if k == nil {
		k = &keyStat{}
		s.keys[key] = k
	}
	k.requests++
	k.units += cost
	m := s.minutes[floorDiv(now, 60e9)]
	if m == nil {
		m = new([2]int64)
		s.minutes[floorDiv(now, 60e9)] = m
	}
	m[0]++
	if !allowed {
		s.Denied++
		k.denied++
		m[1]++
	}
	if s.window > 0 {
		k.measure(now, cost, s.window, s.rate)
	}
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}

// measure adds an event to the key's window and backlog.
func (k *keyStat) measure(now, cost, window int64, rate float64) {
	for k.head < len(k.times) && k.times[k.head] <= now-window {
		if k.costs != nil {
			k.sum -= k.costs[k.head]
		} else {
			k.sum--
		}
		k.head++
	}
	if k.head > 64 && k.head*2 > len(k.times) {
		n := copy(k.times, k.times[k.head:])
		k.times = k.times[:n]
		if k.costs != nil {
			copy(k.costs, k.costs[k.head:])
			k.costs = k.costs[:n]
		}
		k.head = 0
	}
	if cost != 1 && k.costs == nil {
		k.costs = make([]int64, len(k.times), cap(k.times))
		for i := range k.costs {
			k.costs[i] = 1
		}
	}
	k.times = append(k.times, now)
	if k.costs != nil {
		k.costs = append(k.costs, cost)
	}
	k.sum += cost
	k.peak = max(k.peak, k.sum)
	if k.requests > 1 {
		k.backlog = max(k.backlog-rate*float64(now-k.last), 0)
	}
	k.backlog += float64(cost)
	k.last = now
	k.burst = max(k.burst, k.backlog)
}

// Keys is how many distinct keys the limit saw.
func (s *LimitStats) Keys() int { return len(s.keys) }

// DeniedKeys is how many keys it denied at least once.
func (s *LimitStats) DeniedKeys() int {
	n := 0
	for _, k := range s.keys {
		if k.denied > 0 {
			n++
		}
	}
	return n
}

// KeyCount is one key's requests and denials.
type KeyCount struct {
	Key      string `json:"key"`
	Requests int64  `json:"requests"`
	Denied   int64  `json:"denied"`
}

// TopDenied are the n keys denied most, most first.
func (s *LimitStats) TopDenied(n int) []KeyCount {
	var out []KeyCount
	for key, k := range s.keys {
		if k.denied > 0 {
			out = append(out, KeyCount{key, k.requests, k.denied})
		}
	}
	slices.SortFunc(out, func(a, b KeyCount) int {
		return cmp.Or(cmp.Compare(b.Denied, a.Denied), cmp.Compare(b.Requests, a.Requests), strings.Compare(a.Key, b.Key))
	})
	return out[:min(n, len(out))]
}

// TopClients are the n keys that asked most, most first.
func (s *LimitStats) TopClients(n int) []KeyCount {
	out := make([]KeyCount, 0, len(s.keys))
	for key, k := range s.keys {
		out = append(out, KeyCount{key, k.requests, k.denied})
	}
	slices.SortFunc(out, func(a, b KeyCount) int {
		return cmp.Or(cmp.Compare(b.Requests, a.Requests), strings.Compare(a.Key, b.Key))
	})
	return out[:min(n, len(out))]
}

// Minute is one minute's counts.
type Minute struct {
	Start    int64 `json:"start"` // Unix seconds
	Requests int64 `json:"requests"`
	Denied   int64 `json:"denied"`
}

// WorstMinute is the minute with the most denials (the earliest of
// equals); ok is false when nothing was denied.
func (s *LimitStats) WorstMinute() (Minute, bool) {
	var best Minute
	found := false
	for m, c := range s.minutes {
		if c[1] == 0 {
			continue
		}
		if !found || c[1] > best.Denied || c[1] == best.Denied && m*60 < best.Start {
			best = Minute{Start: m * 60, Requests: c[0], Denied: c[1]}
			found = true
		}
	}
	return best, found
}

// Timeline is a limit's requests and denials over [from, to) (Unix
// minutes) in bins of equal length.
type Timeline struct {
	Start      int64   `json:"start"` // Unix seconds
	BinSeconds int64   `json:"bin_seconds"`
	Requests   []int64 `json:"requests"`
	Denied     []int64 `json:"denied"`
}

// Timeline bins the limit's minutes from minute from to minute to
// (exclusive) into at most bins bins.
func (s *LimitStats) Timeline(from, to int64, bins int) Timeline {
	span := max(to-from, 1)
	per := (span + int64(bins) - 1) / int64(bins)
	n := int((span + per - 1) / per)
	t := Timeline{Start: from * 60, BinSeconds: per * 60, Requests: make([]int64, n), Denied: make([]int64, n)}
	for m, c := range s.minutes {
		i := int((m - from) / per)
		if i < 0 || i >= n {
			continue
		}
		t.Requests[i] += c[0]
		t.Denied[i] += c[1]
	}
	return t
}

// Sparkline draws counts as a line of block characters, the highest bin
// full; an empty bin is a space only when the whole line is empty.
func Sparkline(counts []int64) string {
	const blocks = "▁▂▃▄▅▆▇█"
	runes := []rune(blocks)
	var most int64
	for _, c := range counts {
		most = max(most, c)
	}
	var b strings.Builder
	for _, c := range counts {
		switch {
		case most == 0:
			b.WriteRune(' ')
		case c == 0:
			b.WriteRune(runes[0])
		default:
			// 1 … most map onto the 7 blocks above the lowest, so a
			// single denial still shows.
			i := 1 + int(math.Ceil(float64(c)*6/float64(most)))
			b.WriteRune(runes[min(i, 7)])
		}
	}
	return b.String()
}

// Distribution is the spread of one measure over a limit's keys.
type Distribution struct {
	Keys int   `json:"keys"`
	P50  int64 `json:"p50"`
	P90  int64 `json:"p90"`
	P99  int64 `json:"p99"`
	P999 int64 `json:"p99_9"`
	Max  int64 `json:"max"`
}

// Percentile is the nearest-rank percentile p (0 < p ≤ 100) of sorted
// values: the smallest value that at least p% of them do not exceed.
func Percentile(sorted []int64, p float64) int64 {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	return sorted[min(max(rank, 1), len(sorted))-1]
}

func distribution(values []int64) Distribution {
	slices.Sort(values)
	d := Distribution{Keys: len(values)}
	if len(values) == 0 {
		return d
	}
	d.P50, d.P90, d.P99, d.P999 = Percentile(values, 50), Percentile(values, 90), Percentile(values, 99), Percentile(values, 99.9)
	d.Max = values[len(values)-1]
	return d
}

// Peaks is the distribution of each key's peak: the most units it asked
// for in any window of the limit's length.
func (s *LimitStats) Peaks() Distribution {
	values := make([]int64, 0, len(s.keys))
	for _, k := range s.keys {
		values = append(values, k.peak)
	}
	return distribution(values)
}

// PeakValues are the keys' peaks, sorted.
func (s *LimitStats) PeakValues() []int64 {
	values := make([]int64, 0, len(s.keys))
	for _, k := range s.keys {
		values = append(values, k.peak)
	}
	slices.Sort(values)
	return values
}

// Bursts is the distribution of the burst each key needs at the limit's
// rate: the largest backlog its requests build in a bucket that drains
// at max_events per window, the capacity under which a token bucket or
// GCRA of that rate would never deny it.
func (s *LimitStats) Bursts() Distribution {
	values := make([]int64, 0, len(s.keys))
	for _, k := range s.keys {
		values = append(values, int64(math.Ceil(k.burst-1e-9)))
	}
	return distribution(values)
}

// KeyDenied reports whether key was denied at least once.
func (s *LimitStats) KeyDenied(key string) bool {
	k := s.keys[key]
	return k != nil && k.denied > 0
}
