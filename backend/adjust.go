package backend

// Adjustable is implemented by the limit handles of stores that can change
// a limit's max_events while it runs, without a reload: an adaptive limit
// moves it every interval. The window of the policy stays as registered.
//
// No key's state is rewritten. A window algorithm's state counts events,
// and the new limit is a threshold compared with the count. A bucket's
// state is a time (when it is full again), and its burst moves with the
// rate so that the bucket's depth in time stays (algorithms.Adapted).
type Adjustable interface {
	// SetMaxEvents makes the limit allow n events per window from its next
	// decision on, in this process (each instance of a fleet adjusts its
	// own handle). n must be valid for the limit's algorithm.
	SetMaxEvents(n int64) error
	// CanAdjust reports whether SetMaxEvents can work on this limit.
	CanAdjust() bool
}
