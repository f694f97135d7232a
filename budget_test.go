package sluice

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
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

// budgetHandler provisions one zone of cfg (its JSON fields after the key)
// on the memory store, with a clock the test moves.
func budgetHandler(tb testing.TB, name, fields string, clock *atomic.Int64) *Handler {
	tb.Helper()
	h, cleanup, err := provisionJSON([]byte(`{"respond": "json", "rate_limits": {"`+name+`": {"key": "sms", `+fields+`}}}`), clock.Load)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(cleanup)
	return h
}

// budgetSend returns a function that sends one request through h to a
// next handler answering status.
func budgetSend(tb testing.TB, h *Handler, status int) func() int {
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) error {
		w.WriteHeader(status)
		return nil
	})
	return func() int {
		_, r := benchRequest(tb, "http://example.com/sms", "192.0.2.7:4242")
		rec := httptest.NewRecorder()
		if err := h.ServeHTTP(rec, r, next); err != nil {
			tb.Fatal(err)
		}
		return rec.Code
	}
}

// A reservation whose request never ends (a hijacked connection) comes
// back after reservation_ttl on the memory store too; when the request
// ends at last, its release gives nothing back twice.
func TestBudgetUnsettledRequestExpires(t *testing.T) {
	var clock atomic.Int64
	clock.Store(fuzzStart)
	h := budgetHandler(t, "budget_unsettled", `"max_events": 1, "window": "24h", "charge_when": {"status_code": [2]}, "reservation_ttl": "30s"`, &clock)
	release := make(chan struct{})
	reached := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		w, r := benchRequest(t, "http://example.com/ws", "192.0.2.7:4242")
		_ = h.ServeHTTP(w, r, caddyhttp.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) error {
			close(reached)
			<-release // the connection is held open
			w.WriteHeader(http.StatusBadGateway)
			return nil
		}))
	}()
	<-reached
	send := budgetSend(t, h, http.StatusOK)
	if code := send(); code != http.StatusServiceUnavailable {
		t.Fatalf("while the first request holds the budget: %d, want 503", code)
	}
	clock.Add(int64(30*time.Second) - 1)
	if code := send(); code != http.StatusServiceUnavailable {
		t.Fatalf("just before the reservation expires: %d, want 503", code)
	}
	clock.Add(1)
	if code := send(); code != http.StatusOK {
		t.Fatalf("once the reservation expired: %d, want 200", code)
	}
	close(release)
	<-done
	if code := send(); code != http.StatusServiceUnavailable {
		t.Fatalf("after the late release: %d, want 503 (it gave back a unit it no longer held)", code)
	}
}

// A client that hangs up while a budget's call is under way settles
// nothing by leaving: the call goes on with a context the client's
// departure does not cancel, and the status it gets settles the
// reservation (a 2xx commits, a 502 releases). Without a status (the
// proxy's 499 once the call is given up, or an error) the reservation is
// kept until it expires, never released early. The call is given up when
// the reservation expires (the timer the test fires).
func TestBudgetClientLeftSettledByAnswer(t *testing.T) {
	for _, tc := range []struct {
		name string
		// answer is what the call does once its client left: write a
		// status, or wait for the call to be given up and then write
		// one (0: none) and return err.
		status  int
		givenUp bool
		err     error
		want    int // the next send, before the reservation expires
	}{
		{"2xx commits", http.StatusOK, false, nil, http.StatusServiceUnavailable},
		{"502 releases", http.StatusBadGateway, false, nil, http.StatusOK},
		{"given up, the proxy's 499", statusClientClosed, true, nil, http.StatusServiceUnavailable},
		{"given up, no status", 0, true, caddyhttp.Error(http.StatusBadGateway, context.Canceled), http.StatusServiceUnavailable},
		{"error without a status", 0, false, caddyhttp.Error(http.StatusBadGateway, io.ErrUnexpectedEOF), http.StatusServiceUnavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var clock atomic.Int64
			clock.Store(fuzzStart)
			h := budgetHandler(t, "budget_left_"+strings.ReplaceAll(tc.name, " ", "_"), `"max_events": 1, "window": "24h", "charge_when": {"status_code": [2]}, "reservation_ttl": "30s"`, &clock)
			timers := make(chan *fakeTimer, 1)
			h.plan.newTimer = func(d time.Duration) (<-chan time.Time, func() bool) {
				ft := &fakeTimer{d: d, fire: make(chan time.Time, 1)}
				timers <- ft
				return ft.fire, func() bool { return !ft.stopped.Swap(true) }
			}
			_, r := benchRequest(t, "http://example.com/sms", "192.0.2.7:4242")
			ctx, leave := context.WithCancel(r.Context())
			defer leave()
			r = r.WithContext(ctx)
			err := h.ServeHTTP(httptest.NewRecorder(), r, caddyhttp.HandlerFunc(func(w http.ResponseWriter, call *http.Request) error {
				leave() // the client hangs up while the upstream works
				if call.Context().Err() != nil {
					t.Error("the call's context was cancelled when its client left")
					return nil
				}
				ft := <-timers
				if ft.d != 30*time.Second {
					t.Errorf("the call of a client that left is given up after %v, want the reservation_ttl of 30s", ft.d)
				}
				if tc.givenUp {
					ft.fire <- time.Time{} // the clock stays: the reservation is still open in the store
					<-call.Context().Done()
				}
				if tc.status != 0 {
					w.WriteHeader(tc.status)
				}
				return tc.err
			}))
			if err != tc.err && !t.Failed() {
				t.Fatalf("ServeHTTP: %v, want %v", err, tc.err)
			}
			send := budgetSend(t, h, http.StatusOK)
			if code := send(); code != tc.want {
				t.Fatalf("the next send: %d, want %d", code, tc.want)
			}
			if tc.want == http.StatusOK {
				return
			}
			clock.Add(int64(30*time.Second) - 1)
			if code := send(); code != tc.want {
				t.Fatalf("just before the reservation expires: %d, want %d", code, tc.want)
			}
			clock.Add(1)
			want := http.StatusOK
			if tc.status == http.StatusOK {
				want = http.StatusServiceUnavailable // committed: it never comes back
			}
			if code := send(); code != want {
				t.Fatalf("once the reservation expired: %d, want %d", code, want)
			}
		})
	}
}

// A call answered before its client left goes on streaming while the
// client stays; once the client leaves, nobody reads the rest, and the
// call is ended at once.
func TestBudgetAnsweredCallEndsWhenClientLeaves(t *testing.T) {
	var clock atomic.Int64
	clock.Store(fuzzStart)
	h := budgetHandler(t, "budget_answered_left", `"max_events": 1, "window": "24h", "charge_when": {"status_code": [2]}`, &clock)
	_, r := benchRequest(t, "http://example.com/sms", "192.0.2.7:4242")
	ctx, leave := context.WithCancel(r.Context())
	defer leave()
	r = r.WithContext(ctx)
	err := h.ServeHTTP(httptest.NewRecorder(), r, caddyhttp.HandlerFunc(func(w http.ResponseWriter, call *http.Request) error {
		w.WriteHeader(http.StatusOK)
		if call.Context().Err() != nil {
			t.Error("the call's context was cancelled with its client still there")
		}
		leave()
		<-call.Context().Done() // the test would time out if it never ended
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	if code := budgetSend(t, h, http.StatusOK)(); code != http.StatusServiceUnavailable {
		t.Fatalf("after the committed call: %d, want 503", code)
	}
}

// A spent budget's answer says the service's budget is spent, in every
// format, with the 503 of a server that cannot now.
func TestBudgetRefusalBodies(t *testing.T) {
	for _, tc := range []struct{ respond, want string }{
		{"json", `{"error":{"code":"budget_exhausted","message":"The service's budget for this is spent; this is not a limit on you. Retry in 86400 seconds.","retry_after":86400,"zone":"budget_bodies_json"}}`},
		{"problem", `"title":"Temporary Reduced Capacity","status":503,"detail":"The service's budget for this is spent; this is not a limit on you. Retry in 86400 seconds."`},
		{"text", "The service's budget for this is spent; this is not a limit on you. Retry in 86400 seconds.\n"},
	} {
		t.Run(tc.respond, func(t *testing.T) {
			var clock atomic.Int64
			clock.Store(1_767_225_600e9) // midnight UTC
			h, cleanup, err := provisionJSON([]byte(`{"respond": "`+tc.respond+`", "rate_limits": {"budget_bodies_`+tc.respond+`": {"key": "sms", "max_events": 1, "window": "24h", "algorithm": "fixed_window", "align": "day", "charge_when": {"status_code": [2]}}}}`), clock.Load)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(cleanup)
			send := budgetSend(t, h, http.StatusOK)
			send()
			next := caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error {
				t.Fatal("a spent budget reached the upstream")
				return nil
			})
			_, r := benchRequest(t, "http://example.com/sms", "192.0.2.7:4242")
			rec := httptest.NewRecorder()
			if err := h.ServeHTTP(rec, r, next); err != nil {
				t.Fatal(err)
			}
			if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") != "86400" || !strings.Contains(rec.Body.String(), tc.want) {
				t.Fatalf("%d, Retry-After %q, %q; want 503, 86400 and %q", rec.Code, rec.Header().Get("Retry-After"), rec.Body.String(), tc.want)
			}
		})
	}
}

// budgetCases are one request through the same zone, without and with
// charge_when (committed or released), and with a calendar window.
func budgetCases() []struct{ name, fields string } {
	const base = `"max_events": 1000000000000, "window": "24h", "algorithm": "fixed_window"`
	return []struct{ name, fields string }{
		{"plain", base},
		{"charge_when", base + `, "charge_when": {"status_code": [2]}`},
		{"align_day", base + `, "align": "day", "timezone": "Asia/Dhaka"`},
	}
}

// BenchmarkBudgetServeHTTP is what a spend budget adds to a request
// (memory store; the next handler answers 200, which commits, or 502,
// which releases).
//
//	go test -run '^$' -bench BudgetServeHTTP -benchmem .
func BenchmarkBudgetServeHTTP(b *testing.B) {
	for _, c := range budgetCases() {
		for _, status := range []int{http.StatusOK, http.StatusBadGateway} {
			if c.name != "charge_when" && status != http.StatusOK {
				continue
			}
			b.Run(c.name+"/"+http.StatusText(status), func(b *testing.B) {
				var clock atomic.Int64
				clock.Store(fuzzStart)
				h := budgetHandler(b, "bench_"+c.name, c.fields, &clock)
				next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) error {
					w.WriteHeader(status)
					return nil
				})
				w, r := benchRequest(b, "http://example.com/sms", "192.0.2.7:4242")
				b.ReportAllocs()
				for b.Loop() {
					if err := h.ServeHTTP(w, r, next); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
