package integration

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// A sliding window's refund comes after its events have left the window
// (a slow response that count_when does not count); a reload then makes
// the window longer. The events that had left are gone: the new window
// admits its whole limit. Before, the memory store kept them through the
// refund and counted them again under the longer window (3 of 5 passed);
// Redis had let the key expire.
func TestDiffLogRefundAfterWindowThenLongerWindow(t *testing.T) {
	outcomeBackends(t, func(t *testing.T, backend, prefix string) {
		up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/slow" {
				time.Sleep(600 * time.Millisecond) // past the 300ms window
				w.WriteHeader(http.StatusOK)
				return
			}
			w.WriteHeader(http.StatusUnauthorized)
		}))
		t.Cleanup(up.Close)
		site := func(rate string) string {
			return caddyfileServer(fmt.Sprintf(`
	rate_limit {
		%s
		zone %sdiff_logrefund {
			by ip
			rate %s
			algorithm sliding_window
			count_when status 401
		}
	}
	reverse_proxy %s`, backend, prefix, rate, strings.TrimPrefix(up.URL, "http://")))
		}
		tester := newTester(t, site("5/300ms"), "caddyfile")
		expectN(t, tester, 2, http.StatusUnauthorized, "GET", "/fail") // counted
		expectN(t, tester, 1, http.StatusOK, "GET", "/slow")           // given back after the window
		adminRequest(t, "POST", "/load", "text/caddyfile", withPorts(site("5/1h")))
		expectN(t, tester, 5, http.StatusUnauthorized, "GET", "/fail")
		if code, _, _ := do(t, tester, "GET", "/fail"); code != http.StatusTooManyRequests {
			t.Fatalf("sixth request under 5/1h: status %d, want 429", code)
		}
	})
}
