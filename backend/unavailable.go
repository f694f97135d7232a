package backend

import (
	"errors"
	"time"
)

// ErrUnavailable is what a Store's error matches (errors.Is) when the store
// cannot decide now: its server is unreachable, too slow, or a circuit
// breaker stopped calling it. The handler then applies each zone's fail
// policy; other errors (a request the store cannot understand) are not
// the store's absence and are answered as internal errors.
var ErrUnavailable = errors.New("rate limit backend unavailable")

// UnavailableError is an ErrUnavailable with the store's guess of when
// calling it again may help.
type UnavailableError struct {
	// Err is the failure (a network error, a timeout, an open breaker).
	Err error
	// RetryAfter is how long the store will not try its server again (an
	// open breaker's remaining time); 0 when it tries on the next request.
	RetryAfter time.Duration
}

func (e *UnavailableError) Error() string {
	if e.Err == nil {
		return ErrUnavailable.Error()
	}
	return ErrUnavailable.Error() + ": " + e.Err.Error()
}

// Unwrap makes the error match both ErrUnavailable and its cause.
func (e *UnavailableError) Unwrap() []error { return []error{ErrUnavailable, e.Err} }
