package sluice

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// A config whose limits take the short collect path answers every request
// as the full path does: status, headers and the rate_limit placeholders,
// over a sequence that fills and denies.
func TestShortPathServesAsTheFullPath(t *testing.T) {
	names := []string{"reason", "limit", "remaining", "reset", "zone", "exceeded.key", "exceeded.name", "exceeded.retry_after", "exceeded.scope"}
	for _, c := range []struct{ name, config string }{
		{"headers both", `{"headers": "both", "rate_limits": {"%s": {"key": "{http.request.header.X-User}", "max_events": 3, "window": "1m", "cost": 0,
			"scopes": {"day": {"max_events": 4, "window": "24h"}}}}}`},
		{"cost 2 leaky max_delay", `{"headers": "both", "rate_limits": {"%s": {"key": "{http.request.header.X-User}", "max_events": 4, "window": "1m", "cost": 2, "algorithm": "leaky_bucket", "max_delay": "0s"}}}`},
		{"missing deny", `{"rate_limits": {"%s": {"key": "{http.request.header.X-User}", "missing": "deny", "max_events": 2, "window": "1m", "status": 403}}}`},
		{"missing skip with shadow", `{"headers": "draft", "rate_limits": {"%s": {"key": "{http.request.header.X-User}", "missing": "skip", "max_events": 2, "window": "1m",
			"scopes": {"all": {"key": "global", "max_events": 3, "window": "1m"}}}, "%[1]s_shadow": {"key": "{http.request.header.X-User}", "shadow": true, "missing": "deny", "max_events": 1, "window": "1m"}}}`},
		{"sliding, hash", `{"headers": "both", "rate_limits": {"%s": {"key": "{http.request.header.X-User}", "hash": "0123456789abcdef0123", "algorithm": "sliding_window", "max_events": 2, "window": "1m"}}}`},
	} {
		t.Run(c.name, func(t *testing.T) {
			run := func(zone string, extras bool) []string {
				cfg := fmt.Sprintf(c.config, zone)
				h, cleanup, err := provisionJSON([]byte(cfg), func() int64 { return fuzzStart })
				if err != nil {
					t.Fatal(err)
				}
				defer cleanup()
				for _, z := range h.plan.zones {
					for _, l := range z.keyed {
						if l.extras {
							t.Fatalf("%s has extras", l.displayName())
						}
						l.extras = extras
					}
				}
				var out []string
				for i, user := range []string{"a", "a", "", "a", "b", "a", "", "a", "b", "b", "b"} {
					r := httptest.NewRequest(http.MethodGet, "http://example.com/", nil)
					r.RemoteAddr = "192.0.2.7:4242"
					if user != "" {
						r.Header.Set("X-User", user)
					}
					w := httptest.NewRecorder()
					repl := caddy.NewReplacer()
					r = caddyhttp.PrepareRequest(r, repl, w, &caddyhttp.Server{})
					r = r.WithContext(context.WithValue(r.Context(), caddy.ReplacerCtxKey, repl))
					err := h.ServeHTTP(w, r, caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error { return nil }))
					line := fmt.Sprintf("%d: err %v code %d hdr %v", i, err, w.Code, w.Header())
					for _, n := range names {
						v, _ := repl.GetString("http.rate_limit." + n)
						line += " " + n + "=" + v
					}
					out = append(out, strings.ReplaceAll(line, zone, "Z"))
				}
				return out
			}
			short := run("sp_short_"+strings.ReplaceAll(c.name, " ", "_"), false)
			full := run("sp_full_"+strings.ReplaceAll(c.name, " ", "_"), true)
			for i := range short {
				if short[i] != full[i] {
					t.Errorf("short %s\nfull  %s", short[i], full[i])
				}
			}
		})
	}
}
