package algorithms

import "fmt"

// FieldError is a config error about one field, named as configs write it
// (max_events, window, burst, max_delay, algorithm, align, timezone), so
// that a config adapter can point at the line that set it without reading
// the message. Its message is Err's.
type FieldError struct {
	Field string
	Err   error
}

func (e *FieldError) Error() string { return e.Err.Error() }
func (e *FieldError) Unwrap() error { return e.Err }

func fieldErrorf(field, format string, args ...any) error {
	return &FieldError{Field: field, Err: fmt.Errorf(format, args...)}
}
