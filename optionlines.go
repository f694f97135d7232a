package sluice

import (
	"errors"
	"fmt"

	"github.com/sluicehq/sluice/algorithms"
)

// optionError is a config error about one option. The checks that know
// which option is at fault say so (Option, as the JSON names it); the
// Caddyfile adapter, which still knows the line each option came from,
// adds File and Line. Its message is Err's, followed by the place when
// there is one.
type optionError struct {
	Option string
	File   string
	Line   int
	Err    error
}

func (e *optionError) Error() string {
	if e.Line == 0 {
		return e.Err.Error()
	}
	return fmt.Sprintf("%v, at %s:%d", e.Err, e.File, e.Line)
}

func (e *optionError) Unwrap() error { return e.Err }

// optionErrorf is an error about opt.
func optionErrorf(opt, format string, args ...any) error {
	return &optionError{Option: opt, Err: fmt.Errorf(format, args...)}
}

// optionErr is err, about opt; nil when err is nil.
func optionErr(opt string, err error) error {
	if err == nil {
		return nil
	}
	return &optionError{Option: opt, Err: err}
}

// optionOf is the option a check error is about: the outermost one that
// names it (a tier's error inside the tiers table is about tiers); ""
// when none does.
func optionOf(err error) string {
	var oe *optionError
	if errors.As(err, &oe) {
		return oe.Option
	}
	var fe *algorithms.FieldError
	if errors.As(err, &fe) {
		return fe.Field
	}
	return ""
}

// optionLines are the Caddyfile options that may set what a limit's check
// names, so that its error points at the line that set the value: a
// window comes from `window` or `rate`, a key from `key` or `by`.
var optionLines = map[string][]string{
	"max_events": {"events", "rate"},
	"window":     {"window", "rate"},
	"key":        {"key", "by"},
	"cost_min":   {"cost"}, // cost <expr> min <n>
}

// optionLine is the line of the option that err (from Limit.check) is
// about, or the block's line when no single option set it.
func (p *limitParser) optionLine(err error) int {
	opt := optionOf(err)
	names, ok := optionLines[opt]
	if !ok {
		names = []string{opt}
	}
	for _, n := range names {
		if line, ok := p.lines[n]; ok {
			return line
		}
	}
	return p.line
}
