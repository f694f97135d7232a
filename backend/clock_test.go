package backend

import (
	"testing"
	"time"
)

// SystemNow follows the wall clock it started from.
func TestSystemNow(t *testing.T) {
	before := time.Now().UnixNano()
	now := SystemNow()
	after := time.Now().UnixNano()
	// The monotonic and wall clocks may drift apart a little while the
	// process runs; a millisecond is far beyond what a test run sees.
	if now < before-int64(time.Millisecond) || now > after+int64(time.Millisecond) {
		t.Fatalf("SystemNow %d outside [%d, %d]", now, before, after)
	}
}

func BenchmarkSystemNow(b *testing.B) {
	for b.Loop() {
		_ = SystemNow()
	}
}

func BenchmarkTimeNow(b *testing.B) {
	for b.Loop() {
		_ = time.Now().UnixNano()
	}
}
