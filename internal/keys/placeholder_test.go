package keys

import (
	"strings"
	"testing"
)

func TestCheckPlaceholder(t *testing.T) {
	for _, name := range []string{
		"http.request.header.X-API-Key", "http.request.cookie.session", "http.request.uri.query.user",
		"http.request.uri.path", "http.request.uri.path.2", "http.request.host.labels.0",
		"http.request.remote.host", "http.request.remote.host/24", "http.vars.client_ip", "http.vars.anything",
		"http.auth.user.id", "http.reverse_proxy.upstream.address", "http.response.header.X-Tokens-Used",
		"http.response.trailer.X-Tokens-Used", "http.request.body.json.user.id", "http.request.body.form.email",
		"http.request.body.field.user", "http.request.body.size", "http.request.method", "http.request.tls.client.fingerprint",
		"env.PLAN", "http.regexp.name.1", "http.matchers.file.relative", "time.now.year", "system.hostname",
		// Another module's, or a map's destination.
		"geoip2.country_code", "rl_cost", "completely.unrelated.name",
	} {
		if err := CheckPlaceholder(name); err != nil {
			t.Errorf("{%s}: %v", name, err)
		}
	}
	for _, tt := range []struct{ name, want string }{
		{"http.request.heder.X-API-Key", "did you mean {http.request.header.X-API-Key}?"},
		{"http.requests.header.X-User", "did you mean {http.request.header.X-User}?"},
		{"http.request.uri.qeury.user", "did you mean {http.request.uri.query.user}?"},
		{"http.var.client_ip", "did you mean {http.vars.client_ip}?"},
		{"http.request.remote_host", "did you mean {http.request.remote.host}?"},
		{"http.request.metod", "did you mean {http.request.method}?"},
		{"http.request.header.", "names no field"},
		{"http.request.host.labels.x", "unknown placeholder"},
		{"client_ip", "write {http.vars.client_ip}"},
		{"header.X-User", "write {http.request.header.X-User}"},
		{"http.completely.unrelated", "no Caddy module or Sluice sets it"},
		{"htp.request.header.X-User", "did you mean {http.request.header.X-User}?"},
	} {
		err := CheckPlaceholder(tt.name)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("{%s}: %v, want %q in it", tt.name, err, tt.want)
		}
	}
}

func TestCheckTemplate(t *testing.T) {
	for _, tt := range []struct{ tmpl, want string }{
		{"{http.request.header.X-API-Key}", ""},
		{"user:{http.vars.client_ip}:{http.request.header.X-User}", ""},
		{`\{literal\}`, ""},
		{"static", ""},
		{"{http.request.header.X-API-Key", "has no closing }"},
		{"a:{http.vars.client_ip}:{oops", "the { at byte 25 has no closing }"},
		{"{http.request.heder.X-API-Key}", "did you mean {http.request.header.X-API-Key}?"},
	} {
		tmpl, err := ParseTemplate(tt.tmpl)
		if err == nil {
			err = CheckTemplate(tmpl)
		}
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("%q: %v", tt.tmpl, err)
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("%q: %v, want %q in it", tt.tmpl, err, tt.want)
		}
	}
}
