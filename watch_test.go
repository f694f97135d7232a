package sluice

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// The status the outcome is settled by: the first final status written, a
// body or a flush without one (200), else the handlers' error's.
func TestWatcherOutcomeStatus(t *testing.T) {
	for _, tc := range []struct {
		name  string
		write func(w http.ResponseWriter)
		err   error
		want  int
	}{
		{"written", func(w http.ResponseWriter) { w.WriteHeader(401) }, nil, 401},
		{"early hints first", func(w http.ResponseWriter) { w.WriteHeader(103); w.WriteHeader(403) }, nil, 403},
		{"switching protocols", func(w http.ResponseWriter) { w.WriteHeader(101) }, nil, 101},
		{"second header ignored", func(w http.ResponseWriter) { w.WriteHeader(200); w.WriteHeader(500) }, nil, 200},
		{"body only", func(w http.ResponseWriter) { w.Write([]byte("x")) }, nil, 200},
		{"read from", func(w http.ResponseWriter) { _, _ = w.(*watcher).ReadFrom(strings.NewReader("body")) }, nil, 200},
		{"flushed", func(w http.ResponseWriter) { http.NewResponseController(w).Flush() }, nil, 200},
		{"nothing", func(http.ResponseWriter) {}, nil, 200},
		{"handler error", func(http.ResponseWriter) {}, caddyhttp.Error(502, errors.New("dial")), 502},
		{"wrapped handler error", func(http.ResponseWriter) {}, errors.Join(errors.New("x"), caddyhttp.Error(504, nil)), 504},
		{"plain error", func(http.ResponseWriter) {}, errors.New("boom"), 500},
		{"written before an error", func(w http.ResponseWriter) { w.WriteHeader(401) }, errors.New("late"), 401},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			o := &watcher{ResponseWriterWrapper: caddyhttp.ResponseWriterWrapper{ResponseWriter: rec}, outcome: true}
			tc.write(o)
			if got := o.finalStatus(tc.err); got != tc.want {
				t.Fatalf("status %d, want %d", got, tc.want)
			}
		})
	}
}
