package sluice

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

func TestCheckOutcome(t *testing.T) {
	for _, tc := range []struct {
		name string
		l    Limit
		want string
	}{
		{"status", Limit{CountWhen: &caddyhttp.ResponseMatcher{StatusCode: []int{401, 4}}}, ""},
		{"header", Limit{ResetWhen: &caddyhttp.ResponseMatcher{Headers: http.Header{"X-Login": {"ok"}}}}, ""},
		{"empty", Limit{CountWhen: &caddyhttp.ResponseMatcher{}}, "count_when: give a status or a header"},
		{"empty status list", Limit{ResetWhen: &caddyhttp.ResponseMatcher{StatusCode: []int{}}}, "reset_when: status needs at least one code"},
		{"class 6", Limit{CountWhen: &caddyhttp.ResponseMatcher{StatusCode: []int{6}}}, "count_when: status 6 is neither"},
		{"code 99", Limit{CountWhen: &caddyhttp.ResponseMatcher{StatusCode: []int{99}}}, "count_when: status 99 is neither"},
		{"negative", Limit{ResetWhen: &caddyhttp.ResponseMatcher{StatusCode: []int{-200}}}, "reset_when: status -200"},
		{"lease", Limit{Lease: 5, ResetWhen: &caddyhttp.ResponseMatcher{StatusCode: []int{2}}}, "count_when and reset_when cannot be used with lease"},
		{"queue", Limit{MaxDelay: 1, CountWhen: &caddyhttp.ResponseMatcher{StatusCode: []int{401}}}, "count_when cannot be used with max_delay"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.l.checkOutcome()
			switch {
			case tc.want == "" && err != nil:
				t.Fatal(err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("error %v, want %q", err, tc.want)
			}
		})
	}
}

// outcomeCases are requests through a login limit, against the same limit
// counting every request: the response is 401 (kept) or 200 (given back).
func outcomeCases() []struct {
	name, countWhen string
	status          int
} {
	return []struct {
		name, countWhen string
		status          int
	}{
		{"every_request", "", http.StatusUnauthorized},
		{"count_when/counted", `, "count_when": {"status_code": [401]}`, http.StatusUnauthorized},
		{"count_when/given_back", `, "count_when": {"status_code": [401]}`, http.StatusOK},
		{"reset_when/reset", `, "count_when": {"status_code": [401]}, "reset_when": {"status_code": [2]}`, http.StatusOK},
	}
}

func outcomeSend(tb testing.TB, name, countWhen string, status int) func() {
	tb.Helper()
	cfg := `{"rate_limits": {"hot_outcome_` + strings.ReplaceAll(name, "/", "_") + `": {"key": "{http.vars.client_ip}", "max_events": 100, "window": "1m", "algorithm": "token_bucket"` + countWhen + `}}}`
	return hotSend(tb, cfg, caddyhttp.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) error {
		w.WriteHeader(status)
		return nil
	}))
}

// BenchmarkOutcomeServeHTTP is what counting by the response adds to a
// request on an existing key (memory store, next handler writes a status).
//
//	go test -run '^$' -bench OutcomeServeHTTP -benchmem .
func BenchmarkOutcomeServeHTTP(b *testing.B) {
	for _, c := range outcomeCases() {
		benchSend(b, c.name, func(tb testing.TB) func() { return outcomeSend(tb, c.name, c.countWhen, c.status) })
	}
}

// A request a limit settles by its response allocates one value, the
// writer that watches the status; a reset may allocate in the store.
func TestOutcomeAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool drops values at random under the race detector")
	}
	for _, c := range outcomeCases()[:3] {
		t.Run(c.name, func(t *testing.T) {
			send := outcomeSend(t, c.name, c.countWhen, c.status)
			send()
			want := 1.0
			if c.countWhen == "" {
				want = 0
			}
			if got := testing.AllocsPerRun(200, send); got > want {
				t.Fatalf("%v allocations per request, want at most %v", got, want)
			}
		})
	}
}

// A client that left before the status was written does not know the
// outcome, and neither does the limit: whatever status a handler writes
// to nobody (the proxy's 499), or none, the unit stays taken and nothing
// is cleared.
func TestOutcomeClientLeft(t *testing.T) {
	for _, tc := range []struct {
		name  string
		write func(w http.ResponseWriter) error
	}{
		{"proxy writes 499", func(w http.ResponseWriter) error { w.WriteHeader(499); return nil }},
		{"error 499", func(http.ResponseWriter) error { return caddyhttp.Error(499, context.Canceled) }},
		{"reset status to nobody", func(w http.ResponseWriter) error { w.WriteHeader(200); return nil }},
		{"nothing", func(http.ResponseWriter) error { return nil }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := `{"rate_limits": {"outcome_left_` + strings.ReplaceAll(tc.name, " ", "_") + `": {"key": "{http.vars.client_ip}", "max_events": 2, "window": "1m", "count_when": {"status_code": [2]}, "reset_when": {"status_code": [200]}}}}`
			h, cleanup, err := provisionJSON([]byte(cfg), nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(cleanup)
			for i := range 3 {
				w, r := benchRequest(t, "http://example.com/send", "192.0.2.9:4242")
				ctx, cancel := context.WithCancel(r.Context())
				r = r.WithContext(ctx)
				reached := false
				next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) error {
					reached = true
					cancel() // the client hangs up while the application works
					return tc.write(w)
				})
				_ = h.ServeHTTP(w, r, next)
				cancel()
				if want := i < 2; reached != want {
					t.Fatalf("request %d reached the application: %v, want %v", i+1, reached, want)
				}
			}
		})
	}
}

// The header fields count_when and reset_when match are those of the
// response as it was written: a handler around this one may remove some
// on their way out (header -Field), after which they are gone from the
// map the limit would otherwise look at once the response is over.
func TestOutcomeHeaderAsWritten(t *testing.T) {
	cfg := `{"rate_limits": {"outcome_header_as_written": {"key": "{http.vars.client_ip}", "max_events": 2, "window": "1m", "count_when": {"headers": {"X-Login-Result": ["failed"]}}}}}`
	h, cleanup, err := provisionJSON([]byte(cfg), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cleanup)
	for i := range 3 {
		w, r := benchRequest(t, "http://example.com/login", "192.0.2.10:4242")
		reached := false
		next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) error {
			reached = true
			w.Header().Set("X-Login-Result", "failed")
			w.WriteHeader(http.StatusOK)
			w.Header().Del("X-Login-Result") // as header -X-Login-Result does on the way out
			return nil
		})
		if err := h.ServeHTTP(w, r, next); err != nil && i < 2 {
			t.Fatal(err)
		}
		if want := i < 2; reached != want {
			t.Fatalf("failure %d reached the application: %v, want %v", i+1, reached, want)
		}
	}
}
