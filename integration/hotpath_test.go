package integration

import (
	"net/http"
	"testing"
)

// The placeholders of decided requests hold their numbers whether they are
// small (taken from a table made once) or large (converted per request),
// and a 429 is a Caddy error without an error ID or trace: error routes
// see the status and the zone, and {http.error.id} is empty.
func TestDecisionPlaceholdersSmallAndLarge(t *testing.T) {
	const numbers = `{"handler": "headers", "response": {"set": {
		"X-Zone": ["{http.rate_limit.zone}"],
		"X-Limit": ["{http.rate_limit.limit}"],
		"X-Remaining": ["{http.rate_limit.remaining}"],
		"X-Reset": ["{http.rate_limit.reset}"]}}}`
	tester := newTester(t, jsonServer(`{
		"handler": "rate_limit",
		"rate_limits": {"hotpath_numbers": {"key": "static", "cost": "{http.request.header.X-Cost}", "window": "2h", "max_events": 5000}}
	}, `+numbers+`, `+okHandler, `[{"handle": [{"handler": "static_response", "status_code": "{http.error.status_code}",
		"body": "id={http.error.id} trace={http.error.trace} zone={http.rate_limit.exceeded.name} key={http.rate_limit.exceeded.key} retry={http.rate_limit.exceeded.retry_after} remaining={http.rate_limit.remaining} limit={http.rate_limit.limit}"}]}]`), "json")

	for _, step := range []struct {
		cost, limit, remaining, reset string
	}{
		{"1", "5000", "4999", "7200"},   // beyond the table
		{"4000", "5000", "999", "7200"}, // a limit beyond it, a count within it
		{"999", "5000", "0", "7200"},
	} {
		req, _ := http.NewRequest("GET", httpBase+"/", nil)
		req.Header.Set("X-Cost", step.cost)
		resp, err := tester.Client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		h := resp.Header
		if resp.StatusCode != http.StatusOK || h.Get("X-Zone") != "hotpath_numbers" || h.Get("X-Limit") != step.limit || h.Get("X-Remaining") != step.remaining || h.Get("X-Reset") != step.reset {
			t.Fatalf("cost %s: %d zone=%q limit=%q remaining=%q reset=%q; want 200 hotpath_numbers %s %s %s", step.cost, resp.StatusCode,
				h.Get("X-Zone"), h.Get("X-Limit"), h.Get("X-Remaining"), h.Get("X-Reset"), step.limit, step.remaining, step.reset)
		}
	}
	code, ra, body := do(t, tester, "GET", "/", "X-Cost", "1")
	const want = "id= trace= zone=hotpath_numbers key=static retry=7200 remaining=0 limit=5000"
	if code != http.StatusTooManyRequests || ra != "7200" || body != want {
		t.Fatalf("over the limit: %d, Retry-After %q, %q; want 429, 7200, %q", code, ra, body, want)
	}
}
