package algorithms

import "math/bits"

// mulDivCeil is mulDiv rounded up.
func mulDivCeil(a, b, c int64) int64 {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi >= uint64(c) {
		return MaxSpan
	}
	q, r := bits.Div64(hi, lo, uint64(c))
	if r != 0 {
		q++
	}
	if q > uint64(MaxSpan) {
		return MaxSpan
	}
	return int64(q)
}

// mulDiv returns a*b/c rounded down, for non-negative a, b and positive c,
// without overflowing in the product; it saturates at MaxSpan.
func mulDiv(a, b, c int64) int64 {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi >= uint64(c) {
		return MaxSpan
	}
	q, _ := bits.Div64(hi, lo, uint64(c))
	if q > uint64(MaxSpan) {
		return MaxSpan
	}
	return int64(q)
}

// floorDiv returns ⌊x/d⌋ for 0 ≤ x and d > 0, given inv = 1/d: a float
// multiply and one correction instead of a 64-bit division, which costs more
// than the rest of a decision. Past 2^50 the float may be off by more than
// one, so it divides.
func floorDiv(x, d int64, inv float64) int64 {
	if x >= 1<<50 {
		return x / d
	}
	q := int64(float64(x) * inv)
	if q*d > x {
		q--
	} else if (q+1)*d <= x {
		q++
	}
	return q
}
