package integration

import "testing"

// Options that would do nothing are refused when the config loads, naming
// the option (and, from a Caddyfile, its line), rather than accepted and
// ignored: a zone-level max_delay on a zone of scopes looked like a queue
// and was none.
func TestNoOpOptionsAreRefused(t *testing.T) {
	scopes := `"scopes": {"ip": {"key": "{http.vars.client_ip}", "window": "1m", "max_events": 1, "algorithm": "leaky_bucket"}}`
	tests := []struct{ name, cfg, kind, want string }{
		{"max_delay on a zone of scopes", jsonServer(`{"handler": "rate_limit", "rate_limits": {"noop_delay": {"max_delay": "1s", `+scopes+`}}}`, ""), "json",
			`zone \"noop_delay\": max_delay would do nothing on a zone without a rate of its own (only scopes)`},
		{"max_keys on a zone of scopes", jsonServer(`{"handler": "rate_limit", "rate_limits": {"noop_keys": {"max_keys": 100, `+scopes+`}}}`, ""), "json",
			`zone \"noop_keys\": max_keys would do nothing on a zone without a rate of its own`},
		{"missing on a static key", jsonServer(`{"handler": "rate_limit", "rate_limits": {"noop_missing": {"key": "all", "missing": "deny", "window": "1m", "max_events": 5}}}`, ""), "json",
			`zone \"noop_missing\": missing would do nothing: the key \"all\" has no placeholder`},
		{"body_limit without a body field", jsonServer(`{"handler": "rate_limit", "body_limit": 1024, "rate_limits": {"noop_body": {"key": "{http.vars.client_ip}", "window": "1m", "max_events": 5}}}`, ""), "json",
			`body_limit would do nothing: no key or cost reads the request body`},
		{"Caddyfile max_delay on a zone of scopes", caddyfileServer(`
	rate_limit {
		zone noop_cf {
			scope ip {
				by ip
				rate 1/s
				algorithm leaky_bucket
			}
			max_delay 2s
		}
	}
	respond ok`), "caddyfile", `zone \"noop_cf\": max_delay would do nothing on a zone without a rate of its own (only scopes): set max_events and window, or move it into a scope, at Caddyfile:17`},
	}
	// The error comes back inside the admin API's JSON: quotes are escaped.
	// Lines count the default_bind line withPorts adds to the globals.
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { assertLoadError(t, tt.cfg, tt.kind, tt.want) })
	}
}

// Durations in errors are written as a config writes them ("24h", "500000h"),
// not as Go prints them ("24h0m0s") nor in nanoseconds.
func TestDurationsInErrorsAsWritten(t *testing.T) {
	tests := []struct{ name, cfg, kind, want string }{
		{"queue past 73 years", jsonServer(`{"handler": "rate_limit", "rate_limits": {"dur_queue": {"key": "{http.vars.client_ip}", "window": "500000h", "max_events": 1, "algorithm": "leaky_bucket", "max_delay": "400000h"}}}`, ""), "json",
			`zone \"dur_queue\": max_delay 400000h + interval 500000h exceeds 73 years`},
		{"no window", jsonServer(`{"handler": "rate_limit", "rate_limits": {"dur_window": {"key": "{http.vars.client_ip}", "max_events": 1}}}`, ""), "json",
			`zone \"dur_window\": window must be positive, got 0s`},
		{"Caddyfile sweep_interval", caddyfileServer(`
	rate_limit {
		sweep_interval -25h
		zone dur_sweep {
			by ip
			rate 1/s
		}
	}
	respond ok`), "caddyfile", `invalid sweep_interval \"-25h\": must be positive (0 is the default, 1m), at Caddyfile:11`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { assertLoadError(t, tt.cfg, tt.kind, tt.want) })
	}
}
