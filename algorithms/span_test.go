package algorithms

import (
	"math"
	"testing"
	"time"
)

func TestFormatSpan(t *testing.T) {
	tests := []struct {
		ns   int64
		want string
	}{
		{0, "0s"},
		{1, "1ns"},
		{int64(500 * time.Millisecond), "500ms"},
		{int64(time.Second), "1s"},
		{int64(90 * time.Second), "1m30s"},
		{int64(time.Minute), "1m"},
		{int64(10 * time.Minute), "10m"},
		{int64(time.Hour), "1h"},
		{int64(90 * time.Minute), "1h30m"},
		{int64(time.Hour + time.Second), "1h0m1s"},
		{int64(24 * time.Hour), "24h"},
		{int64(500000 * time.Hour), "500000h"},
		{int64(time.Minute + 500*time.Millisecond), "1m0.5s"},
		{-int64(time.Minute), "-1m"},
		{MaxSpan, "640511h56m49.213693952s"},
		{math.MaxInt64, "2562047h47m16.854775807s"},
	}
	for _, tt := range tests {
		got := FormatSpan(tt.ns)
		if got != tt.want {
			t.Errorf("FormatSpan(%d) = %q, want %q", tt.ns, got, tt.want)
		}
		if d, err := time.ParseDuration(got); err != nil || int64(d) != tt.ns {
			t.Errorf("FormatSpan(%d) = %q parses back as %v, %v", tt.ns, got, d, err)
		}
	}
}
