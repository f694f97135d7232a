package integration

import (
	"net/http"
	"testing"
)

// A refusal's placeholders are the refusal's own, even when an earlier
// rate_limit handler of the same request allowed it and set the decision
// placeholders first: an error page reports the zone that denied, its
// numbers and its key, never the earlier zone's.
func TestRefusalPlaceholdersAfterAnAllowedHandler(t *testing.T) {
	tester := newTester(t, caddyfileServer(`
	route {
		rate_limit {
			zone deny_ph_first {
				key static
				rate 100/1h
			}
		}
		rate_limit {
			zone deny_ph_second {
				key {http.request.header.X-User}
				rate 1/1h
			}
		}
		respond "ok"
	}
	handle_errors {
		respond "{http.rate_limit.zone} {http.rate_limit.limit} {http.rate_limit.remaining} {http.rate_limit.exceeded.name} {http.rate_limit.exceeded.key} {http.rate_limit.reason} {http.rate_limit.exceeded.retry_after}"
	}`), "caddyfile")

	expectN(t, tester, 1, http.StatusOK, "GET", "/", "X-User", "alice")
	code, retry, body := do(t, tester, "GET", "/", "X-User", "alice")
	if code != http.StatusTooManyRequests {
		t.Fatalf("status %d, want 429", code)
	}
	if want := "deny_ph_second 1 0 deny_ph_second alice rate_limit_exceeded " + retry; body != want {
		t.Fatalf("error page %q, want %q", body, want)
	}
}
