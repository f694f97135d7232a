package tarpit

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/algorithms"
)

// A hold longer than the wait answers a wait of 0: Retry-After 1, never a
// negative or stale number.
func TestElapse(t *testing.T) {
	out := []algorithms.Result{
		{RetryAfter: int64(30 * time.Second), ResetAfter: int64(40 * time.Second)},
		{RetryAfter: int64(5 * time.Second), ResetAfter: int64(5 * time.Second)},
		{RetryAfter: algorithms.Never, ResetAfter: int64(time.Hour)},
	}
	Elapse(out, int64(10*time.Second))
	want := []algorithms.Result{
		{RetryAfter: int64(20 * time.Second), ResetAfter: int64(30 * time.Second)},
		{},
		{RetryAfter: algorithms.Never, ResetAfter: int64(time.Hour - 10*time.Second)},
	}
	for i := range out {
		if out[i] != want[i] {
			t.Errorf("result %d: %+v, want %+v", i, out[i], want[i])
		}
	}
}

// A tarpit holds at most its max, and all of them together at most the
// ceiling; a released place is taken again.
func TestTake(t *testing.T) {
	saved := Ceiling()
	defer SetCeiling(saved)
	a, b := New(int64(time.Second), 2), New(int64(time.Second), 5)
	SetCeiling(HeldAll() + 3)
	for i, want := range []bool{true, true, false} {
		if got := a.Take(); got != want {
			t.Fatalf("take %d of a tarpit of max 2: %v, want %v", i+1, got, want)
		}
	}
	for i, want := range []bool{true, false} {
		if got := b.Take(); got != want {
			t.Fatalf("take %d under a ceiling of 3 with 2 held: %v, want %v", i+1, got, want)
		}
	}
	if a.Held() != 2 || b.Held() != 1 {
		t.Fatalf("held %d and %d, want 2 and 1", a.Held(), b.Held())
	}
	a.Release()
	if !b.Take() || b.Held() != 2 {
		t.Fatal("a released place was not taken again")
	}
	a.Release()
	b.Release()
	b.Release()
	if a.Held() != 0 || b.Held() != 0 {
		t.Fatalf("held %d and %d after release, want 0", a.Held(), b.Held())
	}
}

// A hold lasts between half and all of the tarpit.
func TestDelay(t *testing.T) {
	tp := New(int64(4*time.Second), 1)
	if lo, hi := tp.Delay(0), tp.Delay(0.999999); lo != 2*time.Second || hi > 4*time.Second || hi < 3999*time.Millisecond {
		t.Fatalf("delays %v to %v, want 2s to 4s", lo, hi)
	}
}

// Stop lets held denials go and can be called more than once.
func TestStop(t *testing.T) {
	tp := New(int64(time.Second), 1)
	tp.Stop()
	tp.Stop()
	select {
	case <-tp.Done():
	default:
		t.Fatal("Done is not closed after Stop")
	}
	var none *Tarpit
	none.Stop()
}
