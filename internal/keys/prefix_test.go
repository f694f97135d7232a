package keys

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/caddyserver/caddy/v2"
)

func keyOf(t *testing.T, template string, opts Options, vars map[string]any) (string, error) {
	t.Helper()
	k, err := NewKeyer(template, opts)
	if err != nil {
		t.Fatal(err)
	}
	repl := caddy.NewEmptyReplacer()
	for name, v := range vars {
		repl.Set(name, v)
	}
	return k.Key(nil, repl, nil)
}

// The cases of mholt/caddy-ratelimit's network-prefix behaviour, which
// Sluice keeps for configs written for it, plus what it adds: the
// canonical form of every address, and prefixes inside composite keys.
func TestIPPrefixes(t *testing.T) {
	tests := []struct {
		name     string
		template string
		ip       string
		v4, v6   int
		want     string
	}{
		{"v6 /64", "{ip}", "2001:db8:1234:5678:9abc:def0:1234:5678", 0, 64, "2001:db8:1234:5678::/64"},
		{"v6 /64 all ones", "{ip}", "2001:db8:1234:5678:ffff:ffff:ffff:ffff", 0, 64, "2001:db8:1234:5678::/64"},
		{"v6 /64 short form", "{ip}", "2001:db8:1234:5678::1", 0, 64, "2001:db8:1234:5678::/64"},
		{"v6 /48", "{ip}", "2001:db8:1234:5678::1", 0, 48, "2001:db8:1234::/48"},
		{"v6 /128", "{ip}", "2001:db8:1234:5678::1", 0, 128, "2001:db8:1234:5678::1/128"},
		{"v4 /24", "{ip}", "192.168.1.100", 24, 0, "192.168.1.0/24"},
		{"v4 /8", "{ip}", "10.0.0.50", 8, 0, "10.0.0.0/8"},
		{"v4 /32", "{ip}", "172.16.5.4", 32, 0, "172.16.5.4/32"},
		{"v6 key uses v6 prefix", "{ip}", "2001:db8::1", 24, 64, "2001:db8::/64"},
		{"v4 key uses v4 prefix", "{ip}", "192.168.1.100", 24, 64, "192.168.1.0/24"},
		{"v4 prefix off", "{ip}", "192.168.1.100", 0, 64, "192.168.1.100"},
		{"v6 prefix off", "{ip}", "2001:db8::1", 24, 0, "2001:db8::1"},
		{"both off", "{ip}", "2001:db8::1", 0, 0, "2001:db8::1"},
		{"mapped v4 counts as v4", "{ip}", "::ffff:192.168.1.100", 24, 64, "192.168.1.0/24"},
		{"mapped v4 without prefix", "{ip}", "::ffff:192.168.1.100", 0, 0, "192.168.1.100"},
		{"upper-case v6 canonical", "{ip}", "2001:DB8:0:0::1", 0, 0, "2001:db8::1"},
		{"not an ip", "{ip}", "static", 0, 64, "static"},
		{"ip with port is not an ip", "{ip}", "192.168.1.100:80", 24, 64, "192.168.1.100:80"},
		{"zoned v6 left alone", "{ip}", "fe80::1%eth0", 24, 64, "fe80::1%eth0"},
		{"malformed: three parts", "{ip}", "1.2.3", 24, 64, "1.2.3"},
		{"malformed: five parts", "{ip}", "1.2.3.4.5", 24, 64, "1.2.3.4.5"},
		{"malformed: octet too big", "{ip}", "1.2.3.256", 24, 64, "1.2.3.256"},
		{"malformed: leading zeros", "{ip}", "010.1.2.3", 24, 64, "010.1.2.3"},
		{"malformed: bad hex", "{ip}", "2001:db8::g", 24, 64, "2001:db8::g"},
		{"malformed: brackets", "{ip}", "[2001:db8::1]", 24, 64, "[2001:db8::1]"},
		{"malformed: two ::", "{ip}", "2001::db8::1", 24, 64, "2001::db8::1"},
		{"composite key", "login:{ip}", "192.168.1.100", 24, 64, "login:192.168.1.0/24"},
		{"composite v6", "{ip}|api", "2001:db8:1:2:3:4:5:6", 24, 64, "2001:db8:1:2::/64|api"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := keyOf(t, tt.template, Options{IPv4Prefix: tt.v4, IPv6Prefix: tt.v6}, map[string]any{"ip": tt.ip})
			if err != nil || got != tt.want {
				t.Errorf("key %q = %q (%v), want %q", tt.ip, got, err, tt.want)
			}
		})
	}
}

func TestTemplate(t *testing.T) {
	tests := []struct {
		template string
		vars     map[string]any
		want     string
		missing  bool
	}{
		{"static", nil, "static", false},
		{"", nil, "", false},
		{"{a}:{b}", map[string]any{"a": "x", "b": "y"}, "x:y", false},
		{"{a}:{b}", map[string]any{"a": "x"}, "x:", true},
		{`\{a\}`, map[string]any{"a": "x"}, "{a}", false},
		{"{unclosed", nil, "{unclosed", false},
		{"{env.SLUICE_TEST_UNSET_VAR}", nil, "", true},
	}
	for _, tt := range tests {
		got, err := keyOf(t, tt.template, Options{}, tt.vars)
		if got != tt.want || (err != nil) != tt.missing {
			t.Errorf("%q → %q, %v; want %q, missing=%v", tt.template, got, err, tt.want, tt.missing)
		}
	}
	if _, err := ParseTemplate("a{}b"); err == nil {
		t.Error("empty placeholder accepted")
	}
}

func TestHashing(t *testing.T) {
	secret := []byte("0123456789abcdef0123456789abcdef")
	a, _ := keyOf(t, "{p}", Options{Secret: secret}, map[string]any{"p": "+8801712345678"})
	b, _ := keyOf(t, "{p}", Options{Secret: secret}, map[string]any{"p": "+8801712345678"})
	c, _ := keyOf(t, "{p}", Options{Secret: []byte("another secret, another key....")}, map[string]any{"p": "+8801712345678"})
	if a != b || a == c || len(a) != len("hmac:")+43 || a[:5] != "hmac:" {
		t.Fatalf("hmac keys %q %q %q", a, b, c)
	}
	long := make([]byte, MaxKeyLen+1)
	for i := range long {
		long[i] = 'x'
	}
	k, _ := keyOf(t, "{v}", Options{}, map[string]any{"v": string(long)})
	if len(k) != len("sha256:")+43 {
		t.Fatalf("a %d-byte key was kept as %q", len(long), k)
	}
	k, _ = keyOf(t, "{v}", Options{}, map[string]any{"v": string(long[:MaxKeyLen])})
	if len(k) != MaxKeyLen {
		t.Fatalf("a key of exactly %d bytes was changed", MaxKeyLen)
	}
}

// A header, query parameter or cookie given twice is ambiguous: Caddy
// would join or pick, the application might read the other copy.
func TestRepeatedValuesAreAmbiguous(t *testing.T) {
	r := httptest.NewRequest("GET", "/?k=a&k=b&one=x", nil)
	r.Header.Add("X-Api-Key", "victim")
	r.Header.Add("X-Api-Key", "junk")
	r.Header.Set("X-Single", "ok")
	r.AddCookie(&http.Cookie{Name: "s", Value: "1"})
	r.AddCookie(&http.Cookie{Name: "s", Value: "2"})
	repl := caddy.NewReplacer()
	for name, v := range map[string]string{"http.request.header.X-Api-Key": "victim,junk", "http.request.header.X-Single": "ok", "http.request.uri.query.k": "a", "http.request.uri.query.one": "x", "http.request.cookie.s": "1"} {
		repl.Set(name, v)
	}
	for _, tt := range []struct {
		tmpl      string
		ambiguous bool
	}{
		{"{http.request.header.X-Api-Key}", true},
		{"{http.request.header.x-api-key}", true},
		{"{http.request.header.X-Single}", false},
		{"{http.request.uri.query.k}", true},
		{"{http.request.uri.query.one}", false},
		{"{http.request.cookie.s}", true},
	} {
		k, _ := NewKeyer(tt.tmpl, Options{})
		_, err := k.Key(r, repl, nil)
		if got := errors.Is(err, ErrAmbiguous); got != tt.ambiguous || (tt.ambiguous && !errors.Is(err, ErrMissing)) {
			t.Errorf("%s: error %v, want ambiguous=%v", tt.tmpl, err, tt.ambiguous)
		}
	}
}

// Cookies as Express and PHP read them: the value percent-decoded ("+" a
// space, for PHP), the name decoded, mangled and compared as PHP and
// ASP.NET do. One identity is one key; a second spelling of the name is
// ambiguous, and so is a spelling Caddy does not read.
func TestCookieSpellings(t *testing.T) {
	key := func(cookie string) (string, error) {
		r := httptest.NewRequest("GET", "/", nil)
		r.Header.Set("Cookie", cookie)
		repl := caddy.NewReplacer()
		if c, err := r.Cookie("session"); err == nil {
			repl.Set("http.request.cookie.session", c.Value)
		}
		k, _ := NewKeyer("{http.request.cookie.session}", Options{})
		return k.Key(r, repl, nil)
	}
	for _, c := range []string{"session=victim", "session=vic%74im", "session=%76%69%63%74%69%6D", `session="vi%63tim"`, "other=1; session=victim"} {
		if k, err := key(c); k != "victim" || err != nil {
			t.Errorf("%s: key %q, %v; want victim", c, k, err)
		}
	}
	for c, want := range map[string]string{"session=a+b": "a b", "session=a%20b": "a b", "session=a%2Bb": "a b", "session=100%": "100%", "session=%C0%AF": "%C0%AF", "session=%2576": "%76"} {
		if k, err := key(c); k != want || err != nil {
			t.Errorf("%s: key %q, %v; want %q", c, k, err, want)
		}
	}
	for _, c := range []string{"session=a; session=b", "sess%69on=victim; session=junk", "sess%69on=victim", "Session=victim", "SESSION=a; session=b"} {
		if _, err := key(c); !errors.Is(err, ErrAmbiguous) {
			t.Errorf("%s: %v, want ambiguous", c, err)
		}
	}
	if _, err := key("sessions=a; xsession=b"); !errors.Is(err, ErrAbsent) {
		t.Errorf("other cookies only: %v, want absent", err)
	}
}
