package keys

import (
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
)

// request is a POST with a JSON body (or none) and extra headers, read as
// the handler reads it.
func request(t *testing.T, body string, header ...string) (*http.Request, *caddy.Replacer, *Body) {
	t.Helper()
	r, _ := http.NewRequest("POST", "/?q=1&q=2&one=1", strings.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		r.Header.Add(header[i], header[i+1])
	}
	repl := caddy.NewEmptyReplacer()
	for name, vals := range r.Header {
		repl.Set("http.request.header."+name, strings.Join(vals, ","))
	}
	repl.Set("http.request.uri.query.q", "1")
	repl.Set("http.request.uri.query.one", "1")
	return r, repl, ReadBody(r, 1024, nil)
}

// Expand, as costs use it: absent values are empty, values given twice or
// unreadable are errors.
func TestTemplateExpand(t *testing.T) {
	tests := []struct {
		name, tmpl, body string
		header           []string
		want             string
		err              error
	}{
		{"body field", "{http.request.body.json.n}", `{"n": 5}`, nil, "5", nil},
		{"canonical number", "{http.request.body.json.n}", `{"n": 5e2}`, nil, "500", nil},
		{"absent field", "{http.request.body.json.n}", `{"m": 5}`, nil, "", nil},
		{"null field", "n={http.request.body.json.n}", `{"n": null}`, nil, "n=", nil},
		{"no body", "{http.request.body.json.n}", ``, nil, "", nil},
		{"duplicated field", "{http.request.body.json.n}", `{"n": 1, "N": 1000}`, nil, "", ErrAmbiguous},
		{"invalid JSON", "{http.request.body.json.n}", `{"n": 1000,}`, nil, "", ErrUnreadable},
		{"BOM", "{http.request.body.json.n}", "\uFEFF{\"n\": 1000}", nil, "", ErrUnreadable},
		{"array", "{http.request.body.json.n}", `{"n": [1000]}`, nil, "", ErrUnreadable},
		{"wrong type", "{http.request.body.json.n}", `{"n": 1000}`, []string{"Content-Type", "text/plain"}, "", ErrUnreadable},
		{"header", "{http.request.header.X-N}", ``, []string{"X-N", "7"}, "7", nil},
		{"absent header", "{http.request.header.X-N}", ``, nil, "", nil},
		{"repeated header", "{http.request.header.X-N}", ``, []string{"X-N", "7", "X-N", "1000"}, "", ErrAmbiguous},
		{"repeated query", "{http.request.uri.query.q}", ``, nil, "", ErrAmbiguous},
		{"query", "{http.request.uri.query.one}", ``, nil, "1", nil},
		{"absent then unreadable", "{http.request.header.X-N}{http.request.body.json.n}", `[`, nil, "", ErrUnreadable},
	}
	for _, tt := range tests {
		r, repl, body := request(t, tt.body, tt.header...)
		if tt.header != nil && tt.header[0] == "Content-Type" {
			r.Header.Del("Content-Type")
			r.Header.Set("Content-Type", tt.header[1])
			body = ReadBody(r, 1024, nil)
		}
		tmpl, err := ParseTemplate(tt.tmpl)
		if err != nil {
			t.Fatal(err)
		}
		got, err := tmpl.Expand(r, repl, body)
		if got != tt.want || (tt.err == nil) != (err == nil) || tt.err != nil && !errors.Is(err, tt.err) {
			t.Errorf("%s: %q, %v; want %q, %v", tt.name, got, err, tt.want, tt.err)
		}
	}
}

// A key's error says whether it may be skipped: only when every value
// missing is absent. A value a normalizer refuses, or that normalizes to
// nothing, was sent, and is not absent.
func TestKeyMissingKinds(t *testing.T) {
	lower, _ := NewNormalizer(NormLower, "", false)
	trim, _ := NewNormalizer(NormTrim, "", false)
	phone, _ := NewNormalizer(NormPhone, "BD", false)
	tests := []struct {
		name, tmpl, body string
		norms            []Normalizer
		want             string
		err              error // nil: no error
	}{
		{"found", "{http.request.body.field.user}", `{"user": "Ann"}`, []Normalizer{lower}, "ann", nil},
		{"absent", "{http.request.body.field.user}", `{}`, nil, "", ErrAbsent},
		{"empty string", "{http.request.body.field.user}", `{"user": ""}`, nil, "", ErrAbsent},
		{"absent header", "{http.request.header.X-User}", `{}`, nil, "", ErrAbsent},
		{"absent, then ambiguous", "{http.request.header.X-User}:{http.request.body.json.user}", `{"user": 1, "user": 2}`, nil, ":", ErrAmbiguous},
		{"ambiguous, then absent", "{http.request.body.json.user}:{http.request.header.X-User}", `{"user": 1, "user": 2}`, nil, ":", ErrAmbiguous},
		{"absent, then unreadable", "{http.request.header.X-User}:{http.request.body.json.user}", `{"user": [1]}`, nil, ":", ErrUnreadable},
		{"refused by a normalizer", "{http.request.body.json.user}", `{"user": "hello"}`, []Normalizer{phone}, "", ErrMissing},
		{"blank after trimming", "{http.request.body.json.user}", `{"user": "  "}`, []Normalizer{trim}, "", ErrMissing},
	}
	for _, tt := range tests {
		r, repl, body := request(t, tt.body)
		k, err := NewKeyer(tt.tmpl, Options{Normalizers: tt.norms})
		if err != nil {
			t.Fatal(err)
		}
		got, err := k.Key(r, repl, body)
		if got != tt.want || (tt.err == nil) != (err == nil) || tt.err != nil && !errors.Is(err, tt.err) {
			t.Errorf("%s: %q, %v; want %q, %v", tt.name, got, err, tt.want, tt.err)
		}
		if absent := errors.Is(err, ErrAbsent); absent != (tt.err == ErrAbsent) {
			t.Errorf("%s: skippable %v, want %v (%v)", tt.name, absent, !absent, err)
		}
	}
}

func TestBodyPlaceholderNames(t *testing.T) {
	for _, bad := range []string{"{http.request.body.json.}", "{http.request.body.field.}", "{http.request.body.form.}", "{http.request.body.json.a..b}", "{http.request.body.field..a}", "{http.request.body.json.a.}"} {
		if _, err := ParseTemplate(bad); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
	for _, good := range []string{"{http.request.body.json.a.0.b}", "{http.request.body.form.a..b}", "{http.request.body.field.user}", "{http.request.body}"} {
		if _, err := ParseTemplate(good); err != nil {
			t.Errorf("%s: %v", good, err)
		}
	}
	if tmpl, _ := ParseTemplate("{http.request.body.field.user}"); !tmpl.NeedsBody() {
		t.Error("a field placeholder needs the body")
	}
	if tmpl, _ := ParseTemplate("{http.request.body}"); tmpl.NeedsBody() {
		t.Error("Caddy's own body placeholder is not a field")
	}
}
