package sluice

import (
	"errors"
	"strings"

	"github.com/sluicehq/sluice/algorithms"
)

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

// optionOf is the option a check error is about. The checks name the
// option as users write it, first: "burst must be at least 1",
// "normalize[0]: …", "hash: …".
func optionOf(err error) string {
	if errors.Is(err, algorithms.ErrUnknown) {
		return "algorithm"
	}
	msg := err.Error()
	if i := strings.IndexAny(msg, " [:,"); i >= 0 {
		msg = msg[:i]
	}
	return msg
}
