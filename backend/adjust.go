package backend

// Adjustable is implemented by the limit handles of stores that can change
// a limit's max_events while it runs, without a reload: an adaptive limit
// moves it every interval. The window of the policy stays as registered.
//
// Only the algorithms whose state counts events (sliding_window,
// sliding_window_counter, fixed_window) can: the limit is then a threshold
// compared with the count, and a new one applies to every key at once
// without rewriting any state. A bucket's state is a time measured in the
// emission interval window ÷ max_events, which a change of max_events must
// rewrite for every key, as a reload does; SetMaxEvents refuses it.
type Adjustable interface {
	// SetMaxEvents makes the limit allow n events per window from its next
	// decision on, in this process (each instance of a fleet adjusts its
	// own handle). n must be valid for the limit's algorithm.
	SetMaxEvents(n int64) error
	// CanAdjust reports whether SetMaxEvents can work on this limit.
	CanAdjust() bool
}
