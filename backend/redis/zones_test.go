package redis

import (
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/algorithms"
)

// The spans in checkExact's errors are written as a config writes them.
func TestCheckExactWritesDurations(t *testing.T) {
	tests := []struct {
		alg  string
		p    algorithms.Policy
		want string
	}{
		{algorithms.NameSlidingWindow, algorithms.Policy{Limit: 1, Window: int64(1300 * time.Hour)}, "window 1300h is longer than the redis backend computes exactly"},
		{algorithms.NameLeakyBucket, algorithms.Policy{Limit: 1, Window: int64(time.Hour), MaxDelay: int64(1300 * time.Hour)}, "max_delay 1300h plus the interval 1h is longer"},
		{algorithms.NameTokenBucket, algorithms.Policy{Limit: 1, Window: int64(90 * time.Minute), Burst: 1000}, "burst 1000 × interval 1h30m is longer"},
	}
	for _, tt := range tests {
		err := checkExact(tt.alg, tt.p)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s %v: error %v, want one containing %q", tt.alg, tt.p, err, tt.want)
		}
	}
}
