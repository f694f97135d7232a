package sluice

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

const concConfig = `{"rate_limits": {
	"cc": {"key": "static", "max_events": 100, "window": "1m", "concurrency": 1}}}`

// A request the cap refuses gets 503 with Retry-After, its rate unit
// goes back, and the slot is freed whether next returns, errs or panics.
func TestConcurrencyHandler(t *testing.T) {
	u := newUnitHandler(t, concConfig, byZone(nil))
	c := u.h.plan.zones[0].limits[0].conc
	serve := func(next caddyhttp.Handler) (int, http.Header, error) {
		r := httptest.NewRequest(http.MethodGet, "http://example.com/", nil)
		w := httptest.NewRecorder()
		r = caddyhttp.PrepareRequest(r, caddy.NewReplacer(), w, &caddyhttp.Server{})
		err := u.h.ServeHTTP(w, r, next)
		if he, ok := errors.AsType[caddyhttp.HandlerError](err); ok {
			return he.StatusCode, w.Header(), err
		}
		return w.Code, w.Header(), err
	}
	inside := caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error {
		code, hdr, _ := serve(okHandler)
		if code != http.StatusServiceUnavailable || hdr.Get("Retry-After") != "1" {
			t.Errorf("a second request in flight got %d, Retry-After %q; want 503, 1", code, hdr.Get("Retry-After"))
		}
		return nil
	})
	if code, _, err := serve(inside); code != http.StatusOK || err != nil {
		t.Fatalf("first request: %d %v", code, err)
	}
	if len(u.store.refunds) != 1 {
		t.Fatalf("%d refunds, want the refused request's rate unit given back", len(u.store.refunds))
	}
	if _, _, err := serve(caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error {
		return errors.New("upstream failed")
	})); err == nil {
		t.Fatal("the error was lost")
	}
	func() {
		defer func() { _ = recover() }()
		_, _, _ = serve(caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { panic("boom") }))
	}()
	if c.Size() != 0 {
		t.Fatalf("a slot was leaked: %d keys in flight", c.Size())
	}
	if code, _, _ := serve(okHandler); code != http.StatusOK {
		t.Fatalf("after an error and a panic, a request got %d", code)
	}
}
