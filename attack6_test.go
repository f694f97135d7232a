package sluice

import (
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// A budget's call is committed when its status is written: a 2xx whose
// body streams past reservation_ttl, while other requests of the key are
// decided, keeps its unit, for a status written by WriteHeader and for a
// body written without it.
func TestBudgetCommittedWhenStatusWritten(t *testing.T) {
	for _, tc := range []struct {
		name  string
		start func(http.ResponseWriter)
	}{
		{"WriteHeader", func(w http.ResponseWriter) { w.WriteHeader(http.StatusOK) }},
		{"Write", func(w http.ResponseWriter) { _, _ = w.Write([]byte("first tokens")) }},
		{"Flush", func(w http.ResponseWriter) { _ = http.NewResponseController(w).Flush() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var clock atomic.Int64
			clock.Store(fuzzStart)
			h := budgetHandler(t, "budget_stream_"+tc.name, `"max_events": 1, "window": "24h", "algorithm": "fixed_window", "charge_when": {"status_code": [2]}, "reservation_ttl": "30s"`, &clock)
			streaming, finish, done := make(chan struct{}), make(chan struct{}), make(chan struct{})
			go func() {
				defer close(done)
				w, r := benchRequest(t, "http://example.com/chat", "192.0.2.7:4242")
				_ = h.ServeHTTP(w, r, caddyhttp.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) error {
					tc.start(w)
					close(streaming)
					<-finish // the rest of the body, long after
					_, err := w.Write([]byte("last tokens"))
					return err
				}))
			}()
			<-streaming
			send := budgetSend(t, h, http.StatusOK)
			clock.Add(int64(time.Minute)) // past the reservation's deadline
			if code := send(); code != http.StatusServiceUnavailable {
				t.Fatalf("while the committed call streams past its reservation_ttl: %d, want 503", code)
			}
			close(finish)
			<-done
			if code := send(); code != http.StatusServiceUnavailable {
				t.Fatalf("after the stream ended: %d, want 503 (the call was charged)", code)
			}
		})
	}
}
