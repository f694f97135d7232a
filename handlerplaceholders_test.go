package sluice

import (
	"net/http"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// A key or cost that reads a placeholder only an earlier handler sets is
// warned about once, at the first request that has it empty, however many
// requests and limits follow; placeholders Caddy sets itself, and values an
// earlier handler did set, are not.
func TestWarnsOnceForPlaceholdersSetByEarlierHandlers(t *testing.T) {
	auth := func(r *http.Request, repl *caddy.Replacer) { repl.Set("http.auth.user.id", "ann") }
	userVar := func(r *http.Request, _ *caddy.Replacer) { caddyhttp.SetVar(r.Context(), "user", "ann") }
	none := func(*http.Request, *caddy.Replacer) {}
	tests := []struct {
		name     string
		config   string
		requests []func(*http.Request, *caddy.Replacer)
		want     []string // placeholder and part of each warning
	}{
		{"auth key before basic_auth", `{"rate_limits": {"w1": {"key": "{http.auth.user.id}", "max_events": 100, "window": "1m"}}}`,
			[]func(*http.Request, *caddy.Replacer){none, none, none, none, none}, []string{"{http.auth.user.id} key"}},
		{"zone and scope share one warning", `{"rate_limits": {"w2": {"key": "user:{http.auth.user.id}", "max_events": 100, "window": "1m", "scopes": {"daily": {"max_events": 1000, "window": "24h"}}}}}`,
			[]func(*http.Request, *caddy.Replacer){none, none, none}, []string{"{http.auth.user.id} key"}},
		{"auth set by an earlier handler", `{"rate_limits": {"w3": {"key": "{http.auth.user.id}", "max_events": 100, "window": "1m"}}}`,
			[]func(*http.Request, *caddy.Replacer){auth, auth, auth}, nil},
		{"a var set, then not", `{"rate_limits": {"w4": {"key": "{http.vars.user}", "max_events": 100, "window": "1m"}}}`,
			[]func(*http.Request, *caddy.Replacer){userVar, userVar, none, none, userVar, none}, []string{"{http.vars.user} key"}},
		{"client_ip is Caddy's own", `{"rate_limits": {"w5": {"key": "{http.vars.client_ip}|{http.vars.trusted_proxy}", "max_events": 100, "window": "1m"}}}`,
			[]func(*http.Request, *caddy.Replacer){none, none}, nil},
		{"cost from a var", `{"rate_limits": {"w6": {"key": "{http.vars.client_ip}", "max_events": 100, "window": "1m", "cost": "{http.vars.tokens}"}}}`,
			[]func(*http.Request, *caddy.Replacer){none, none, none}, []string{"{http.vars.tokens} cost"}},
		{"key missing for another reason", `{"rate_limits": {"w7": {"key": "{http.request.header.X-Team}/{http.auth.user.id}", "max_events": 100, "window": "1m"}}}`,
			[]func(*http.Request, *caddy.Replacer){auth, auth}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, cleanup, err := provisionJSON([]byte(tt.config), nil)
			if err != nil {
				t.Fatal(err)
			}
			defer cleanup()
			core, logs := observer.New(zapcore.WarnLevel)
			h.plan.logger = zap.New(core)
			for i, setup := range tt.requests {
				if got := serveWith(h, setup); !strings.HasPrefix(got, "200") {
					t.Fatalf("request %d: %s", i+1, got)
				}
			}
			var got []string
			for _, e := range logs.All() {
				fields := e.ContextMap()
				got = append(got, fields["placeholder"].(string)+" "+fields["in"].(string))
				if fields["placeholder"] == "{http.auth.user.id}" && !strings.Contains(e.Message, "order rate_limit after basic_auth") {
					t.Errorf("the warning does not name the order line that fixes it: %s", e.Message)
				}
				if !strings.Contains(e.Message, "route { … }") {
					t.Errorf("the warning does not name route { … }: %s", e.Message)
				}
			}
			if strings.Join(got, ",") != strings.Join(tt.want, ",") {
				t.Fatalf("warnings %q, want %q", got, tt.want)
			}
		})
	}
}
