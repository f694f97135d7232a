package keys

import (
	"errors"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// A query parameter is ambiguous when the raw query gives it more than
// once, splitting on "&" and ";" and decoding names, or once where Go's
// URL.Query (and so Caddy's placeholder) does not read it.
func TestQueryAmbiguous(t *testing.T) {
	for _, tt := range []struct {
		raw       string
		ambiguous bool
	}{
		{"user=a", false},
		{"user=a&x=1", false},
		{"x=1;y=2&user=a", false},
		{"us%65r=a", false},
		{"user=a%3Bb", false},
		{"user=a+b&x=%zz", false},
		{"", false},
		{"x=1", false},
		{"users=a&use=b&user%3Dx=1", false},
		{"user=a&user=b", true},
		{"user=r1&user=victim;x=1", true},
		{"user=victim;x=1", true},
		{"x=1;user=victim", true},
		{"user=a;user=b", true},
		{"us%65r=a&user=b", true},
		{"us%65r=victim;x=1", true},
		{"u%73er=a;b", true},
		{"User=a&user=b", true},
		{"USER=victim", true},
		{"user=victim%zz", true},
		{"us%zzer=a&user=b", false},
		{"user=a&user", true},
		{"user&x=1", false},
		{"user=a&user=a", true},
		{"+user=victim", true},
		{"%20%20user=victim&user=a", true},
		{"user+=a&user=b", false},
		{"user[]=victim", true},
		{"user[0]=victim", true},
		{"USER%5B%5D=victim", true},
		{"user[a][b]=victim&x=1", true},
		{"users[]=a&x[user]=b&user=c", false},
	} {
		if got := queryAmbiguous(tt.raw, "user"); got != tt.ambiguous {
			t.Errorf("?%s: ambiguous %v, want %v", tt.raw, got, tt.ambiguous)
		}
	}
	// Names with spaces: "+" is a space, as Go reads it.
	if queryAmbiguous("first+name=a", "first name") || !queryAmbiguous("first+name=a&first%20name=b", "first name") {
		t.Error("a name with a space")
	}
}

// Through a Keyer: a query parameter given in a ";" pair is never a key of
// its own, and never the empty value that "missing skip" would skip.
func TestKeyerQuerySemicolonPairs(t *testing.T) {
	k, err := NewKeyer("{http.request.uri.query.user}", Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{"user=r1&user=victim;x=1", "user=victim;x=1", "USER=victim", "us%65r=r1&user=victim"} {
		r := httptest.NewRequest("GET", "/?"+q, nil)
		repl := caddy.NewReplacer()
		repl.Set("http.request.uri.query.user", strings.Join(r.URL.Query()["user"], ","))
		key, err := k.Key(r, repl, nil)
		if !errors.Is(err, ErrAmbiguous) || !errors.Is(err, ErrMissing) || key != "" {
			t.Errorf("?%s: key %q, error %v; want the shared key and ErrAmbiguous", q, key, err)
		}
	}
	r := httptest.NewRequest("GET", "/?user=r1", nil)
	repl := caddy.NewReplacer()
	repl.Set("http.request.uri.query.user", "r1")
	if key, err := k.Key(r, repl, nil); err != nil || key != "r1" {
		t.Errorf("plain query: %q, %v", key, err)
	}
}

// Whatever the query, a parameter Go reads twice is ambiguous, and adding
// another copy of a parameter Go reads once (after "&" or ";", in any
// case) makes it ambiguous.
func FuzzQueryAmbiguous(f *testing.F) {
	for _, s := range []string{"user=a", "user=r1&user=victim;x=1", "us%65r=a", "a=1;b", "user=%zz", "&&;;", "user"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		got := queryAmbiguous(raw, "user")
		vals, _ := url.ParseQuery(raw)
		if len(vals["user"]) > 1 && !got {
			t.Fatalf("?%s: Go reads user %d times, not ambiguous", raw, len(vals["user"]))
		}
		if len(vals["user"]) == 1 && !got {
			for _, more := range []string{"&user=x", ";user=x", "&USER=x", "&us%65r=x"} {
				if !queryAmbiguous(raw+more, "user") {
					t.Fatalf("?%s%s: not ambiguous", raw, more)
				}
			}
		}
	})
}

// Checking a query costs no allocation unless a name is encoded (Go's
// URL.Query would build a map of every parameter per request).
func TestQueryAmbiguousAllocs(t *testing.T) {
	raw := "user=ann&page=2&sort=asc&filter=a%20b;x=1"
	if n := testing.AllocsPerRun(100, func() { queryAmbiguous(raw, "user") }); n != 0 {
		t.Errorf("%v allocations per query", n)
	}
}

// A key longer than MaxKeyLen is stored as its digest; a short key that
// spells that digest is hashed as well, so it cannot share the long key's
// quota.
func TestKeySpellingADigestIsNotTheLongKey(t *testing.T) {
	k, err := NewKeyer("{http.request.header.X-Key}", Options{})
	if err != nil {
		t.Fatal(err)
	}
	keyOf := func(v string) string {
		r := httptest.NewRequest("GET", "/", nil)
		r.Header.Set("X-Key", v)
		repl := caddy.NewReplacer()
		repl.Set("http.request.header.X-Key", v)
		key, err := k.Key(r, repl, nil)
		if err != nil {
			t.Fatal(err)
		}
		return key
	}
	long := keyOf(strings.Repeat("v", MaxKeyLen+1))
	if !strings.HasPrefix(long, "sha256:") {
		t.Fatalf("long key stored as %q", long)
	}
	if forged := keyOf(long); forged == long {
		t.Fatalf("the literal %q is the long key's bucket", long)
	}
	if plain := keyOf("victim"); plain != "victim" {
		t.Fatalf("a plain key became %q", plain)
	}
}

// A key that is one placeholder's value is that value: a client address
// already in canonical form is used as it is, without a copy, and any
// other spelling of it is rewritten.
func TestKeyOfOnePlaceholder(t *testing.T) {
	k, err := NewKeyer("{http.vars.client_ip}", Options{IPv6Prefix: 64})
	if err != nil {
		t.Fatal(err)
	}
	r := httptest.NewRequest("GET", "/", nil)
	for ip, want := range map[string]string{
		"192.0.2.7":           "192.0.2.7",
		"::ffff:192.0.2.7":    "192.0.2.7",
		"2001:db8::7":         "2001:db8::/64",
		"2001:DB8:0:0:1::7":   "2001:db8::/64",
		"not an address":      "not an address",
		"fe80::1%eth0":        "fe80::1%eth0",
		"0000:0000::ffff:1.2": "0000:0000::ffff:1.2",
	} {
		repl := caddy.NewReplacer()
		repl.Set("http.vars.client_ip", ip)
		if key, err := k.Key(r, repl, nil); err != nil || key != want {
			t.Errorf("%q: key %q, %v; want %q", ip, key, err, want)
		}
	}
	if raceEnabled {
		return
	}
	repl := caddy.NewReplacer()
	repl.Set("http.vars.client_ip", "192.0.2.7")
	if n := testing.AllocsPerRun(100, func() { _, _ = k.Key(r, repl, nil) }); n != 0 {
		t.Errorf("%v allocations per key", n)
	}
	two, err := NewKeyer("ip:{http.vars.client_ip}", Options{})
	if err != nil {
		t.Fatal(err)
	}
	if key, err := two.Key(r, repl, nil); err != nil || key != "ip:192.0.2.7" {
		t.Errorf("a key of two parts: %q, %v", key, err)
	}
}

func queryAmbiguous(raw, name string) bool {
	_, ambiguous := queryValue(raw, name)
	return ambiguous
}

// The value queryValue takes from the raw query is the one Go's URL.Query
// (Caddy's placeholder) reads, whenever the parameter is not ambiguous.
func FuzzQueryValueIsGoValue(f *testing.F) {
	for _, s := range []string{"user=a", "user=a%20b+c", "x=1&user=", "user", "us%65r=a", "user=%zz", "a=1;b&user=v"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		v, ambiguous := queryValue(raw, "user")
		if want := (&url.URL{RawQuery: raw}).Query().Get("user"); !ambiguous && v != want {
			t.Fatalf("?%s: value %q, Go reads %q", raw, v, want)
		}
	})
}

// A query of more parameters than Go reads (10,000) still gives the value
// the application reads: Caddy's placeholder is empty for every parameter
// of it, which "missing skip" would skip.
func TestQueryValueBeyondGoLimit(t *testing.T) {
	raw := strings.Repeat("a=1&", 10000) + "user=victim"
	if len((&url.URL{RawQuery: raw}).Query()) != 0 {
		t.Skip("this Go reads queries of more than 10,000 parameters")
	}
	if v, ambiguous := queryValue(raw, "user"); ambiguous || v != "victim" {
		t.Fatalf("value %q, ambiguous %v; want victim", v, ambiguous)
	}
}

// BenchmarkKey builds a key as a request does, through Caddy's replacer.
//
//	go test -run '^$' -bench BenchmarkKey -benchmem ./keys/
func BenchmarkKey(b *testing.B) {
	for _, bc := range []struct{ name, template, target string }{
		{"client_ip", "{http.vars.client_ip}", "/"},
		{"query", "{http.request.uri.query.user}", "/search?q=caddy&page=2&user=alice&lang=en"},
		{"query_missing", "{http.request.uri.query.user}", "/search?q=caddy&page=2&lang=en"},
		{"header_missing", "{http.request.header.X-User}", "/"},
	} {
		b.Run(bc.name, func(b *testing.B) {
			k, err := NewKeyer(bc.template, Options{IPv6Prefix: 64})
			if err != nil {
				b.Fatal(err)
			}
			r := httptest.NewRequest("GET", bc.target, nil)
			w := httptest.NewRecorder()
			r = caddyhttp.PrepareRequest(r, caddy.NewReplacer(), w, &caddyhttp.Server{})
			repl := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
			b.ReportAllocs()
			for b.Loop() {
				_, _ = k.Key(r, repl, nil)
			}
		})
	}
}

// A vars placeholder is read from the request's variables directly; the
// value is the one Caddy's replacer gives, whatever its type.
func TestVarsPlaceholderAsCaddyReadsIt(t *testing.T) {
	k, err := NewKeyer("{http.vars.who}", Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []any{"alice", 42, 3.5, true, []byte("bytes")} {
		r := httptest.NewRequest("GET", "/", nil)
		repl := caddy.NewReplacer()
		r = caddyhttp.PrepareRequest(r, repl, httptest.NewRecorder(), &caddyhttp.Server{})
		caddyhttp.SetVar(r.Context(), "who", v)
		want, _ := repl.GetString("http.vars.who")
		if key, err := k.Key(r, repl, nil); err != nil || key != want || want == "" {
			t.Errorf("%#v: key %q, %v; Caddy reads %q", v, key, err, want)
		}
	}
}
