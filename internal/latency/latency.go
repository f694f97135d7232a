// Package latency measures how long requests take: a fixed-bucket histogram
// (lock-free, allocation-free, a p99 within 6.25%) and a rolling window of
// them that gives the p99 of the last 8 to 10 seconds. Callers pass the
// time, so tests feed latencies and instants.
package latency

import (
	"math/bits"
	"sync"
	"sync/atomic"
	"time"
)

// The window a shedding group's p99 latency is taken over: five parts of
// two seconds, the current one and the four before it, so between 8 and
// 10 seconds of finished requests. Parts, rather than one histogram
// emptied every 10 seconds, so that the p99 does not fall to nothing at
// each turn of the window while the upstream is still slow: the oldest
// two seconds leave at a time.
const (
	Parts      = 5
	Part       = 2 * time.Second
	WindowSpan = Parts * Part
	// Refresh is how stale the p99 a shedding check reads may
	// be: working it out reads every bucket of the window (2,720
	// counters), so it is done at most this often, by whichever request
	// first finds it stale. A divisor of Part, so that a part
	// leaves the window at a refresh.
	Refresh = 100 * time.Millisecond
)

// Window is the p99 latency of the requests that finished over the
// last 8 to 10 seconds. It reads no clock: callers pass the time (ns on
// the monotonic clock), so a test feeds it latencies and instants.
//
// Adding a latency is an atomic addition to one of the fixed buckets of
// the current part (the histogram adaptive limits use, 6.25% wide), and,
// once per part (every 2 s), the clearing of the part that leaves the
// window, under a lock. Reading the p99 is an atomic load, and every
// 100 ms the work of summing the parts, by one caller under a TryLock
// (the others read the p99 of a moment before).
type Window struct {
	parts [Parts]partHist

	mu sync.Mutex // clearing a part; summing the window
	// p99 is the window's at the last refresh (0 without a request in
	// it); fresh is when it must be worked out again.
	p99, fresh atomic.Int64
}

type partHist struct {
	// epoch is the part of time (now ÷ Part) whose requests the
	// histogram counts.
	epoch atomic.Int64
	hist  Histogram
}

// Add records a request that finished at now after ns.
func (w *Window) Add(ns, now int64) {
	e := now / int64(Part)
	p := &w.parts[e%Parts]
	if p.epoch.Load() != e && !w.turn(p, e) {
		return
	}
	p.hist.Add(ns)
}

// turn gives part p to epoch e, emptied; false when p already counts a
// later epoch (the caller's clock read was overtaken: its request is
// older than the window's, and left out).
func (w *Window) turn(p *partHist, e int64) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch cur := p.epoch.Load(); {
	case cur > e:
		return false
	case cur < e:
		p.hist.Reset()
		p.epoch.Store(e)
	}
	return true
}

// Last is the p99 worked out at the last refresh, read without the clock:
// it may be up to Refresh stale, or older after a quiet spell.
func (w *Window) Last() int64 { return w.p99.Load() }

// P99At is the p99 latency (ns) of the requests in the window at now,
// rounded up to its bucket's upper bound; 0 when none finished in it.
func (w *Window) P99At(now int64) int64 {
	if now >= w.fresh.Load() && w.mu.TryLock() {
		if now >= w.fresh.Load() {
			_, p99 := w.Sum(now)
			w.p99.Store(p99)
			w.fresh.Store((now/int64(Refresh) + 1) * int64(Refresh))
		}
		w.mu.Unlock()
	}
	return w.p99.Load()
}

// Sum counts the requests of the parts in the window at now, and works out
// their p99. The counts are summed on the stack (4 kB, not escaping):
// nothing is allocated.
func (w *Window) Sum(now int64) (n, p99 int64) {
	e := now / int64(Part)
	var counts [Buckets]uint64
	for i := range w.parts {
		p := &w.parts[i]
		if ep := p.epoch.Load(); ep > e-Parts && ep <= e {
			n += p.hist.SumInto(&counts)
		}
	}
	return n, P99(&counts, n)
}

// Histogram counts latencies in buckets of about 6% width (16 per
// power of two of microseconds), from 1 µs to about 19 hours: 544 counters,
// whatever the traffic, and a p99 rounded up by at most 6.25%.
type Histogram struct {
	counts [Buckets]atomic.Uint64
}

const (
	histSubBits  = 4 // 16 buckets per power of two
	histSub      = 1 << histSubBits
	histMaxShift = 32 // the top bucket row: values up to 2^37 µs
	Buckets      = (histMaxShift + 2) * histSub
)

// Bucket is the bucket of a latency of us microseconds: exact below
// 32 µs, then the top five bits of the value.
func Bucket(us uint64) int {
	if us < 2*histSub {
		return int(us)
	}
	shift := bits.Len64(us) - (histSubBits + 1)
	if shift > histMaxShift {
		return Buckets - 1
	}
	return shift*histSub + int(us>>shift)
}

// Upper is the largest latency, in ns, that bucket i holds.
func Upper(i int) int64 {
	if i < 2*histSub {
		return int64(i+1)*1000 - 1
	}
	shift := i/histSub - 1
	m := int64(i%histSub + histSub)
	return ((m+1)<<shift)*1000 - 1
}

func (h *Histogram) Add(ns int64) {
	us := uint64(max(ns, 0)) / 1000
	h.counts[Bucket(us)].Add(1)
}

// Drain empties the histogram and returns how many latencies it held and
// their 99th percentile (the upper bound of its bucket, in ns). Each
// observation is counted by exactly one drain, even one added meanwhile.
func (h *Histogram) Drain() (n, p99 int64) {
	var counts [Buckets]uint64
	for i := range h.counts {
		counts[i] = h.counts[i].Swap(0)
		n += int64(counts[i])
	}
	return n, P99(&counts, n)
}

// SumInto adds the histogram's counts to counts, leaving it as it is, and
// returns how many latencies it holds.
func (h *Histogram) SumInto(counts *[Buckets]uint64) (n int64) {
	for i := range h.counts {
		c := h.counts[i].Load()
		counts[i] += c
		n += int64(c)
	}
	return n
}

// Reset empties the histogram. An observation added meanwhile may be kept
// or lost.
func (h *Histogram) Reset() {
	for i := range h.counts {
		h.counts[i].Store(0)
	}
}

// P99 is the 99th percentile of the n latencies counted in counts: the
// upper bound of its bucket, in ns; 0 when n is 0.
func P99(counts *[Buckets]uint64, n int64) int64 {
	if n <= 0 {
		return 0
	}
	// The smallest latency that at least 99% of the requests did not
	// exceed: the ⌈0.99·n⌉-th in order.
	rank := (99*n + 99) / 100
	var seen int64
	for i, c := range counts {
		seen += int64(c)
		if seen >= rank {
			return Upper(i)
		}
	}
	return Upper(Buckets - 1)
}
