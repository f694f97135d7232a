package integration

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dunglas/httpsfv"
)

// sfItem is one item of a RateLimit or RateLimit-Policy field, parsed back
// with the structured-field parser.
type sfItem struct {
	name   string
	params map[string]any
}

func parseSFList(t *testing.T, h http.Header, field string) []sfItem {
	t.Helper()
	values := h.Values(field)
	if len(values) == 0 {
		return nil
	}
	list, err := httpsfv.UnmarshalList(values)
	if err != nil {
		t.Fatalf("%s: %q is not a structured-field list: %v", field, values, err)
	}
	var items []sfItem
	for _, m := range list {
		it, ok := m.(httpsfv.Item)
		if !ok {
			t.Fatalf("%s: %q holds an inner list", field, values)
		}
		name, ok := it.Value.(string)
		if !ok {
			t.Fatalf("%s: %q: item %v is not a String", field, values, it.Value)
		}
		p := map[string]any{}
		for _, k := range it.Params.Names() {
			p[k], _ = it.Params.Get(k)
		}
		items = append(items, sfItem{name, p})
	}
	return items
}

func intParam(t *testing.T, it sfItem, k string) int64 {
	t.Helper()
	v, ok := it.params[k].(int64)
	if !ok {
		t.Fatalf("item %q: parameter %s is %#v, want an Integer", it.name, k, it.params[k])
	}
	return v
}

// rateLimit is the one item of the RateLimit field.
func rateLimit(t *testing.T, r response) sfItem {
	t.Helper()
	items := parseSFList(t, r.header, "RateLimit")
	if len(items) != 1 {
		t.Fatalf("RateLimit: %q, want one item", r.header.Values("RateLimit"))
	}
	return items[0]
}

// Every algorithm sends its quota, window, remaining units and reset time
// as the draft's structured fields and as X-RateLimit-*, on allowed and
// denied responses, and on a denial t is Retry-After.
func TestRateLimitHeadersEveryAlgorithm(t *testing.T) {
	type want struct {
		q, w       int64
		tLo, tHi   int64 // t after the first request
		raLo, raHi int64 // Retry-After of the denial
	}
	cases := map[string]struct {
		opts string
		want
	}{
		// 4 per 8 s: one event leaves the window 8 s after it happened.
		"sliding_window": {"", want{4, 8, 8, 8, 7, 8}},
		// The counter's reset and retry depend on where in its window the
		// test falls.
		"sliding_window_counter": {"algorithm sliding_window_counter", want{4, 8, 1, 16, 1, 16}},
		"fixed_window":           {"algorithm fixed_window", want{4, 8, 1, 8, 1, 8}},
		// A token every 2 s: one used comes back in 2 s; w is the time the
		// whole bucket takes to refill.
		"token_bucket": {"algorithm token_bucket", want{4, 8, 2, 2, 1, 2}},
		"gcra":         {"algorithm gcra", want{4, 8, 2, 2, 1, 2}},
		"leaky_bucket": {"algorithm leaky_bucket", want{4, 8, 2, 2, 1, 2}},
		// A bucket of 2 at 4 per 8 s is full again 4 s after it is empty.
		"token_bucket_burst": {"algorithm token_bucket\n\t\t\tburst 2", want{2, 4, 2, 2, 1, 2}},
	}
	site := "\trate_limit {\n\t\theaders both\n"
	for name, c := range cases {
		site += "\t\tzone hdr_alg_" + name + " {\n\t\t\tmatch {\n\t\t\t\tpath /" + name + "\n\t\t\t}\n\t\t\tkey static\n\t\t\trate 4/8s\n\t\t\t" + c.opts + "\n\t\t}\n"
	}
	tester := newTester(t, caddyfileServer(site+"\t}\n\trespond \"ok\""), "caddyfile")

	for name, c := range cases {
		zone := "hdr_alg_" + name
		for i := int64(1); i <= c.q+1; i++ {
			r := fetch(t, tester, "GET", "/"+name)
			allowed := i <= c.q
			if allowed != (r.code == http.StatusOK) || !allowed && r.code != http.StatusTooManyRequests {
				t.Fatalf("%s #%d: status %d", name, i, r.code)
			}
			policy := parseSFList(t, r.header, "RateLimit-Policy")
			if len(policy) != 1 || policy[0].name != zone || intParam(t, policy[0], "q") != c.q || intParam(t, policy[0], "w") != c.w || len(policy[0].params) != 2 {
				t.Fatalf("%s #%d: RateLimit-Policy %q, want %q;q=%d;w=%d", name, i, r.header.Get("RateLimit-Policy"), zone, c.q, c.w)
			}
			rl := rateLimit(t, r)
			remaining, reset := intParam(t, rl, "r"), intParam(t, rl, "t")
			if rl.name != zone || remaining != max(c.q-i, 0) {
				t.Fatalf("%s #%d: RateLimit %q, want %q with r=%d", name, i, r.header.Get("RateLimit"), zone, max(c.q-i, 0))
			}
			switch {
			case i == 1 && (reset < c.tLo || reset > c.tHi):
				t.Fatalf("%s #1: t=%d, want %d to %d", name, reset, c.tLo, c.tHi)
			case !allowed:
				ra, err := strconv.ParseInt(r.header.Get("Retry-After"), 10, 64)
				if err != nil || ra < c.raLo || ra > c.raHi || reset != ra {
					t.Fatalf("%s denied: Retry-After %q, t=%d; want t = Retry-After, from %d to %d", name, r.header.Get("Retry-After"), reset, c.raLo, c.raHi)
				}
			}
			legacy := []string{strconv.FormatInt(c.q, 10), strconv.FormatInt(remaining, 10), strconv.FormatInt(reset, 10)}
			got := []string{r.header.Get("X-RateLimit-Limit"), r.header.Get("X-RateLimit-Remaining"), r.header.Get("X-RateLimit-Reset")}
			if strings.Join(got, " ") != strings.Join(legacy, " ") {
				t.Fatalf("%s #%d: X-RateLimit-Limit, -Remaining, -Reset = %q, want %q", name, i, got, legacy)
			}
		}
	}
}

// Several zones and scopes: every enforcing limit is in RateLimit-Policy,
// RateLimit reports the closest to denying, and a zone with headers none
// (a login) is in no field; when it is the one that denies, no RateLimit
// is sent at all.
func TestRateLimitHeadersSeveralZonesHideOne(t *testing.T) {
	tester := newTester(t, caddyfileServer(`
	rate_limit {
		headers draft
		zone hdr_multi_api {
			key static
			rate 10/1m
			algorithm token_bucket
			scope per_ip {
				by ip
				rate 6/1m
			}
		}
		zone hdr_multi_login {
			match {
				path /login
			}
			key static
			rate 2/1m
			headers none
		}
		zone hdr_multi_shadow {
			key static
			rate 1/1h
			shadow
		}
	}
	respond "ok"`), "caddyfile")

	wantPolicy := `"hdr_multi_api";q=10;w=60, "hdr_multi_api.per_ip";q=6;w=60`
	check := func(r response, code int, rl string) {
		t.Helper()
		if r.code != code {
			t.Fatalf("status %d, want %d", r.code, code)
		}
		// Re-serialized by the library: the field is what the draft says.
		list, err := httpsfv.UnmarshalList(r.header.Values("RateLimit-Policy"))
		if err != nil {
			t.Fatal(err)
		}
		if s, _ := httpsfv.Marshal(list); s != wantPolicy {
			t.Fatalf("RateLimit-Policy %q, want %q", s, wantPolicy)
		}
		if got := r.header.Get("RateLimit"); got != rl {
			t.Fatalf("RateLimit %q, want %q", got, rl)
		}
		for k, v := range r.header {
			if strings.Contains(strings.Join(v, ","), "login") || strings.Contains(strings.Join(v, ","), "shadow") {
				t.Fatalf("header %s: %q names a hidden or shadow zone", k, v)
			}
		}
	}
	// The per-IP scope has 5 of 6 left, the zone 9 of 10: the scope is
	// closer to denying. Its sliding window is whole again 60 s after its
	// newest event.
	check(fetch(t, tester, "GET", "/x"), 200, `"hdr_multi_api.per_ip";r=5;t=60`)
	check(fetch(t, tester, "GET", "/login"), 200, `"hdr_multi_api.per_ip";r=4;t=60`)
	check(fetch(t, tester, "GET", "/login"), 200, `"hdr_multi_api.per_ip";r=3;t=60`)
	// The login zone denies: Retry-After is its wait; the policies are
	// sent, but no RateLimit: the other limits' numbers would tell a
	// client reading them that it has quota left.
	r := fetch(t, tester, "GET", "/login")
	if ra, _ := strconv.Atoi(r.header.Get("Retry-After")); ra < 59 || ra > 60 {
		t.Fatalf("login denial: Retry-After %q", r.header.Get("Retry-After"))
	}
	check(r, 429, "")
	check(fetch(t, tester, "GET", "/x"), 200, `"hdr_multi_api.per_ip";r=2;t=60`)
	check(fetch(t, tester, "GET", "/x"), 200, `"hdr_multi_api.per_ip";r=1;t=60`)
	// The token bucket of the zone is now the closer: 4 of 10 left after
	// the scope's 6 (and it refills a token every 6 s).
	check(fetch(t, tester, "GET", "/x"), 200, `"hdr_multi_api.per_ip";r=0;t=60`)
	// The scope denies: t is its Retry-After, the time until its oldest
	// event leaves the window.
	r = fetch(t, tester, "GET", "/x")
	check(r, 429, `"hdr_multi_api.per_ip";r=0;t=`+r.header.Get("Retry-After"))
	if ra, _ := strconv.Atoi(r.header.Get("Retry-After")); ra < 59 || ra > 60 {
		t.Fatalf("scope denial: Retry-After %q, want 60", r.header.Get("Retry-After"))
	}
}

// A zone that hashes its keys sends the HMAC as the partition key; one that
// does not never sends its key. The default sends no field at all, as
// mholt/caddy-ratelimit does.
func TestRateLimitHeadersPartitionKeyAndDefault(t *testing.T) {
	t.Setenv("SLUICE_TEST_PK_SECRET", "a-secret-of-enough-length")
	tester := newTester(t, caddyfileServer(`
	rate_limit /hashed {
		headers draft
		zone hdr_pk_hashed {
			by header X-User
			hash {env.SLUICE_TEST_PK_SECRET}
			rate 5/1m
		}
	}
	rate_limit /plain {
		headers draft
		zone hdr_pk_plain {
			by header X-User
			rate 5/1m
		}
	}
	rate_limit /default {
		zone hdr_pk_default {
			key static
			rate 1/1m
		}
	}
	respond "ok"`), "caddyfile")

	pk := func(user string) []byte {
		r := fetch(t, tester, "GET", "/hashed", "X-User", user)
		for _, field := range []string{"RateLimit-Policy", "RateLimit"} {
			items := parseSFList(t, r.header, field)
			if len(items) != 1 {
				t.Fatalf("%s: %q", field, r.header.Values(field))
			}
			b, ok := items[0].params["pk"].([]byte)
			if !ok || len(b) != 32 {
				t.Fatalf("%s: %q, want a 32-byte partition key", field, r.header.Values(field))
			}
			if field == "RateLimit" {
				return b
			}
		}
		return nil
	}
	alice, alice2, bob := pk("alice"), pk("alice"), pk("bob")
	if string(alice) != string(alice2) || string(alice) == string(bob) {
		t.Fatalf("partition keys: alice %x, alice again %x, bob %x", alice, alice2, bob)
	}
	r := fetch(t, tester, "GET", "/plain", "X-User", "carol")
	if h := r.header.Get("RateLimit-Policy") + r.header.Get("RateLimit"); strings.Contains(h, ";pk=") || strings.Contains(h, "carol") {
		t.Fatalf("an unhashed key must not be sent: %q", h)
	}
	for i := 0; i < 2; i++ {
		r := fetch(t, tester, "GET", "/default")
		for k := range r.header {
			if strings.Contains(strings.ToLower(k), "ratelimit") {
				t.Fatalf("default (headers none), status %d: header %s sent", r.code, k)
			}
		}
	}
}

// The fields go out spelled as the draft and the older convention spell
// them (RateLimit-Policy, not Go's canonical Ratelimit-Policy).
func TestRateLimitHeaderNamesAsSpelled(t *testing.T) {
	newTester(t, caddyfileServer(`
	rate_limit {
		headers both
		zone hdr_spelling {
			key static
			rate 10/1m
		}
	}
	@hidden path /hidden
	header @hidden -RateLimit*
	header @hidden -X-RateLimit-*
	respond "ok"`), "caddyfile")
	head := func(path string) string {
		conn, err := net.Dial("tcp", strings.TrimPrefix(httpBase, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n", path)
		conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		raw, _ := io.ReadAll(conn)
		h, _, _ := strings.Cut(string(raw), "\r\n\r\n")
		return h
	}
	names := []string{"RateLimit-Policy", "RateLimit", "X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset"}
	h := head("/")
	for _, name := range names {
		if !strings.Contains(h, "\r\n"+name+": ") {
			t.Errorf("no field spelled %q in\n%s", name, h)
		}
	}
	// Caddy's wildcard deletes, which ignore case, still remove them.
	if h := head("/hidden"); strings.Contains(strings.ToLower(h), "ratelimit") {
		t.Errorf("header -RateLimit* left a field:\n%s", h)
	}
}
