package algorithms

// What the tests read of the state, and nothing else does.

// Tokens returns the exact (fractional) number of tokens in s at now.
func (b *bucket) Tokens(s Bucket, now int64) float64 {
	d := b.debt(s, now)
	return float64(b.capacity-d) / float64(b.interval)
}

// Estimate returns the estimated count of the sliding window at now.
func (a *SlidingCounter) Estimate(s Counter, now int64) int64 { return a.estimate(s, now) }

// Len returns the number of events held and their total units.
func (l *Log) Len() (events int, units int64) {
	if l == nil {
		return 0, 0
	}
	return l.n, l.sum
}
