package sluice

import "strconv"

// smallInts are the whole numbers below 4096 as placeholder values and as
// text. A placeholder holds an interface value, and converting an int64
// above 255 to one allocates; counts, limits and seconds (68 minutes) are
// mostly below 4096, so setting them from this table allocates nothing.
var smallInts = func() *[4096]struct {
	value any
	text  string
} {
	t := new([4096]struct {
		value any
		text  string
	})
	for i := range t {
		t[i].value = int64(i)
		t[i].text = strconv.Itoa(i)
	}
	return t
}()

// intValue is n as a placeholder value (an int64).
func intValue(n int64) any {
	if uint64(n) < uint64(len(smallInts)) {
		return smallInts[n].value
	}
	return n
}

// intText is n in decimal.
func intText(n int64) string {
	if uint64(n) < uint64(len(smallInts)) {
		return smallInts[n].text
	}
	return strconv.FormatInt(n, 10)
}
