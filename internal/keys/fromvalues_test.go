package keys

import (
	"net/http/httptest"
	"testing"

	"github.com/caddyserver/caddy/v2"
)

// TestFromValuesMatchesKey: the key built from a raw value is the key a
// request carrying that value gets, through prefixes, normalizers and
// hashing.
func TestFromValuesMatchesKey(t *testing.T) {
	email, err := NewNormalizer("email", "", true)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, tmpl string
		opts       Options
		value      string // sent in the X-Id header
		raw        string // what an operator types
	}{
		{"ip prefix", "{http.request.header.X-Id}", Options{IPv6Prefix: 64}, "2001:db8::1", "2001:DB8:0:0:ffff::9"},
		{"email hashed", "login:{http.request.header.X-Id}", Options{Normalizers: []Normalizer{email}, Secret: []byte("0123456789abcdef")}, "alice@example.com", "Alice+promo@Example.COM"},
		{"long key", "{http.request.header.X-Id}", Options{}, string(make([]byte, 300)) + "x", string(make([]byte, 300)) + "x"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			k, err := NewKeyer(tc.tmpl, tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			r := httptest.NewRequest("GET", "/", nil)
			r.Header.Set("X-Id", tc.value)
			repl := caddy.NewReplacer()
			repl.Map(func(key string) (any, bool) {
				if key == "http.request.header.X-Id" {
					return r.Header.Get("X-Id"), true
				}
				return nil, false
			})
			want, err := k.Key(r, repl, nil)
			if err != nil {
				t.Fatal(err)
			}
			got, err := k.FromValues([]string{tc.raw})
			if err != nil {
				t.Fatal(err)
			}
			if got != want {
				t.Fatalf("FromValues(%q) = %q, the request's key is %q", tc.raw, got, want)
			}
		})
	}
}

func TestFromValuesRefuses(t *testing.T) {
	k, err := NewKeyer("{http.request.header.A}:{http.request.header.B}", Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := k.FromValues([]string{"a"}); err == nil {
		t.Fatal("one value for two placeholders was accepted")
	}
	if _, err := k.FromValues([]string{"a", ""}); err == nil {
		t.Fatal("an empty value was accepted")
	}
	if got, err := k.FromValues([]string{"a", "b"}); err != nil || got != "a:b" {
		t.Fatalf("got %q, %v; want a:b", got, err)
	}
}
