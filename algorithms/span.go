package algorithms

import (
	"strings"
	"time"
)

// FormatSpan writes a span of ns nanoseconds as a user writes a duration
// in a config: "1m", "1h30m", "500ms", "24h", never "1m0s" or
// "60000000000ns". The result parses back with time.ParseDuration (and
// Caddy's, which adds days) to the same span.
func FormatSpan(ns int64) string {
	s := time.Duration(ns).String()
	// Duration.String writes every unit from the largest down to seconds:
	// drop the zero tail ("1h0m0s" is "1h", "1h30m0s" is "1h30m").
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}
