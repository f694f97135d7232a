package sluice

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
	latencyParts      = 5
	latencyPart       = 2 * time.Second
	latencyWindowSpan = latencyParts * latencyPart
	// latencyRefresh is how stale the p99 a shedding check reads may
	// be: working it out reads every bucket of the window (2,720
	// counters), so it is done at most this often, by whichever request
	// first finds it stale. A divisor of latencyPart, so that a part
	// leaves the window at a refresh.
	latencyRefresh = 100 * time.Millisecond
)

// latencyWindow is the p99 latency of the requests that finished over the
// last 8 to 10 seconds. It reads no clock: callers pass the time (ns on
// the monotonic clock), so a test feeds it latencies and instants.
//
// Adding a latency is an atomic addition to one of the fixed buckets of
// the current part (the histogram adaptive limits use, 6.25% wide), and,
// once per part (every 2 s), the clearing of the part that leaves the
// window, under a lock. Reading the p99 is an atomic load, and every
// 100 ms the work of summing the parts, by one caller under a TryLock
// (the others read the p99 of a moment before).
type latencyWindow struct {
	parts [latencyParts]latencyPartHist

	mu sync.Mutex // clearing a part; summing the window
	// p99 is the window's at the last refresh (0 without a request in
	// it); fresh is when it must be worked out again.
	p99, fresh atomic.Int64
}

type latencyPartHist struct {
	// epoch is the part of time (now ÷ latencyPart) whose requests the
	// histogram counts.
	epoch atomic.Int64
	hist  latencyHistogram
}

// add records a request that finished at now after ns.
func (w *latencyWindow) add(ns, now int64) {
	e := now / int64(latencyPart)
	p := &w.parts[e%latencyParts]
	if p.epoch.Load() != e && !w.turn(p, e) {
		return
	}
	p.hist.add(ns)
}

// turn gives part p to epoch e, emptied; false when p already counts a
// later epoch (the caller's clock read was overtaken: its request is
// older than the window's, and left out).
func (w *latencyWindow) turn(p *latencyPartHist, e int64) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch cur := p.epoch.Load(); {
	case cur > e:
		return false
	case cur < e:
		p.hist.reset()
		p.epoch.Store(e)
	}
	return true
}

// p99At is the p99 latency (ns) of the requests in the window at now,
// rounded up to its bucket's upper bound; 0 when none finished in it.
func (w *latencyWindow) p99At(now int64) int64 {
	if now >= w.fresh.Load() && w.mu.TryLock() {
		if now >= w.fresh.Load() {
			_, p99 := w.sum(now)
			w.p99.Store(p99)
			w.fresh.Store((now/int64(latencyRefresh) + 1) * int64(latencyRefresh))
		}
		w.mu.Unlock()
	}
	return w.p99.Load()
}

// sum counts the requests of the parts in the window at now, and works out
// their p99. The counts are summed on the stack (4 kB, not escaping):
// nothing is allocated.
func (w *latencyWindow) sum(now int64) (n, p99 int64) {
	e := now / int64(latencyPart)
	var counts [histBuckets]uint64
	for i := range w.parts {
		p := &w.parts[i]
		if ep := p.epoch.Load(); ep > e-latencyParts && ep <= e {
			n += p.hist.sumInto(&counts)
		}
	}
	return n, histP99(&counts, n)
}

// latencyHistogram counts latencies in buckets of about 6% width (16 per
// power of two of microseconds), from 1 µs to about 19 hours: 544 counters,
// whatever the traffic, and a p99 rounded up by at most 6.25%.
type latencyHistogram struct {
	counts [histBuckets]atomic.Uint64
}

const (
	histSubBits  = 4 // 16 buckets per power of two
	histSub      = 1 << histSubBits
	histMaxShift = 32 // the top bucket row: values up to 2^37 µs
	histBuckets  = (histMaxShift + 2) * histSub
)

// histBucket is the bucket of a latency of us microseconds: exact below
// 32 µs, then the top five bits of the value.
func histBucket(us uint64) int {
	if us < 2*histSub {
		return int(us)
	}
	shift := bits.Len64(us) - (histSubBits + 1)
	if shift > histMaxShift {
		return histBuckets - 1
	}
	return shift*histSub + int(us>>shift)
}

// histUpper is the largest latency, in ns, that bucket i holds.
func histUpper(i int) int64 {
	if i < 2*histSub {
		return int64(i+1)*1000 - 1
	}
	shift := i/histSub - 1
	m := int64(i%histSub + histSub)
	return ((m+1)<<shift)*1000 - 1
}

func (h *latencyHistogram) add(ns int64) {
	us := uint64(max(ns, 0)) / 1000
	h.counts[histBucket(us)].Add(1)
}

// drain empties the histogram and returns how many latencies it held and
// their 99th percentile (the upper bound of its bucket, in ns). Each
// observation is counted by exactly one drain, even one added meanwhile.
func (h *latencyHistogram) drain() (n, p99 int64) {
	var counts [histBuckets]uint64
	for i := range h.counts {
		counts[i] = h.counts[i].Swap(0)
		n += int64(counts[i])
	}
	return n, histP99(&counts, n)
}

// sumInto adds the histogram's counts to counts, leaving it as it is, and
// returns how many latencies it holds.
func (h *latencyHistogram) sumInto(counts *[histBuckets]uint64) (n int64) {
	for i := range h.counts {
		c := h.counts[i].Load()
		counts[i] += c
		n += int64(c)
	}
	return n
}

// reset empties the histogram. An observation added meanwhile may be kept
// or lost.
func (h *latencyHistogram) reset() {
	for i := range h.counts {
		h.counts[i].Store(0)
	}
}

// histP99 is the 99th percentile of the n latencies counted in counts: the
// upper bound of its bucket, in ns; 0 when n is 0.
func histP99(counts *[histBuckets]uint64, n int64) int64 {
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
			return histUpper(i)
		}
	}
	return histUpper(histBuckets - 1)
}
