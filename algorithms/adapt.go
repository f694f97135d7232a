package algorithms

// Adapted is p with max_events n, as an adaptive limit moves it while the
// limit runs; the window stays.
//
// For the bucket algorithms the burst moves in proportion: burst × n ÷
// max_events, rounded down, at least 1. The bucket's depth in time,
// burst × window ÷ max_events, then stays what it was configured to (to
// within one interval), and so each key's state can stay as it is: a
// bucket's and a queue's state is a time (when the bucket is full again,
// the queue's next free slot), which means the same thing at any rate. A
// change keeps the share of the bucket a key has used, in time: half
// empty before, half empty after. Nothing is rewritten, so every store
// and every instance of a fleet agrees, whatever limit each is at.
//
// What that guarantees, at any number of changes: each unit a key is
// admitted moves its state on by the interval of the rate in force, and an
// admission leaves it at most the bucket's depth ahead of the clock. Over
// any span of time, a key is admitted at most (span + depth) ÷ the
// smallest interval in force during it: what the fastest of those rates
// allows with the burst in proportion. A lowered rate never gives a free
// burst (a key that had used its bucket has used the smaller one too),
// and the state never holds more than the depth, as configured.
//
// A queue (leaky_bucket with max_delay) keeps max_delay: it holds
// max_delay ÷ the new interval + 1 requests, and the slots it gave out
// keep their times.
func Adapted(alg string, p Policy, n int64) Policy {
	q := p
	q.Limit = n
	queue := alg == NameLeakyBucket && p.MaxDelay > 0 // sized by max_delay, not a burst
	if KindOf(alg) == KindBucket && !queue && n != p.Limit && p.Limit > 0 {
		q.Burst = max(1, mulDiv(p.burst(), n, p.Limit))
	}
	return q
}
