package sluice

import (
	"strconv"
	"testing"
)

// Numbers in the table and beyond it are the same int64 values and the
// same text.
func TestIntValueAndText(t *testing.T) {
	for _, n := range []int64{0, 1, 255, 256, 4095, 4096, 7200, -1, -4096, 1 << 62} {
		if v, ok := intValue(n).(int64); !ok || v != n {
			t.Errorf("intValue(%d) = %#v", n, intValue(n))
		}
		if got := intText(n); got != strconv.FormatInt(n, 10) {
			t.Errorf("intText(%d) = %q", n, got)
		}
	}
}
