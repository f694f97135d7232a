package integration

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
)

// zoneServer starts Caddy with one rate_limit zone in front of handler and
// returns a function that GETs a path and answers the status.
func zoneServer(t *testing.T, zone, handler string) func(path string) int {
	t.Helper()
	tester := newTester(t, caddyfileServer(`
	rate_limit {
		`+zone+`
	}
	`+handler), "caddyfile")
	return func(path string) int {
		code, _, _ := do(t, tester, "GET", path)
		return code
	}
}

// statuses sends one GET per path and counts the answers by status.
func statuses(t *testing.T, do func(path string) int, paths []string) map[int]int {
	t.Helper()
	n := map[int]int{}
	for _, p := range paths {
		c := do(p)
		t.Logf("%q: %d", p, c)
		n[c]++
	}
	return n
}

// Every spelling of one mailbox shares its quota, and an address with an
// invisible character is refused (400 under missing deny), never a fresh
// key: a mail server delivers all of these to rakib@gmail.com.
func TestEmailSpellingsShareOneQuota(t *testing.T) {
	send := zoneServer(t, `zone norm_email {
			by query email
			normalize email
			missing deny
			rate 3/1h
		}`, `respond "sent"`)
	get := func(email string) int { return send("/?email=" + url.QueryEscape(email)) }
	spellings := []string{
		"rakib@gmail.com", "rakib(1)@gmail.com", "rakib((2)x)@gmail.com", "rakib@(3)gmail.com",
		"<rakib@gmail.com>", "Rakib <rakib@gmail.com>", "\"rakib\"@gmail.com", "\"Rakib\" <\"rakib\"(4)@gmail.com>",
		"rakib @ gmail.com", "RAKIB@GMAIL.COM.", "rakib@gmail(5).com",
	}
	got := statuses(t, get, spellings)
	if got[http.StatusOK] != 3 || got[http.StatusTooManyRequests] != len(spellings)-3 {
		t.Fatalf("%d spellings of one mailbox: %v; want 3 admitted, the rest 429", len(spellings), got)
	}
	// The same for an internationalized domain, in both its forms.
	idn := []string{"u@exämple.com", "u@xn--exmple-cua.com", "u@EXÄMPLE.com", "U@XN--EXMPLE-CUA.COM."}
	if got := statuses(t, get, idn); got[http.StatusOK] != 3 || got[http.StatusTooManyRequests] != 1 {
		t.Fatalf("U-label and A-label spellings: %v; want 3 admitted, 1 denied", got)
	}
	refused := []string{
		"rakib\x00@gmail.com", "ra\u00adkib@gmail.com", "rakib\u200b@gmail.com", "\ufeffrakib@gmail.com",
		"rakib\u202e@gmail.com", "rakib@gma\u200dil.com", "a@b@gmail.com", "\"a@b\"@gmail.com", "rakib@[192.0.2.1]",
	}
	if got := statuses(t, get, refused); got[http.StatusBadRequest] != len(refused) {
		t.Fatalf("addresses with invisible characters or several @: %v; want all %d refused with 400", got, len(refused))
	}
}

// A path normalized by `normalize path` is resolved like Caddy and the
// upstream resolve it: a decoded "?" does not cut it, ";params" do not
// count, and a trailing dot or space (which Windows servers drop) is
// refused rather than made a fresh key.
func TestPathSpellingsShareOneQuota(t *testing.T) {
	seen := map[string]int{}
	var mu sync.Mutex
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen[r.URL.Path]++
		mu.Unlock()
	}))
	defer upstream.Close()
	get := zoneServer(t, `zone norm_path {
			by path
			missing deny
			rate 3/1h
		}`, "reverse_proxy "+strings.TrimPrefix(upstream.URL, "http://"))
	var attack []string
	for i := 1; i <= 6; i++ {
		attack = append(attack, fmt.Sprintf("/p%d%%3F/../api/login", i))
	}
	got := statuses(t, get, attack)
	if got[http.StatusOK] != 3 || got[http.StatusTooManyRequests] != 3 {
		t.Fatalf("/pN%%3F/../api/login: %v; want 3 admitted, 3 denied", got)
	}
	// The upstream saw /pN?/../api/login: the path its router cleans to
	// /api/login, not a path cut at the "?".
	for p, n := range seen {
		if !strings.HasSuffix(p, "/../api/login") || !strings.Contains(p, "?") {
			t.Errorf("upstream saw %q (%d times)", p, n)
		}
	}
	// Every other spelling of /api/login is the same key, now denied.
	more := []string{"/api/login;a", "/api;x/login", "/api/x/..;/login", "/API/%6Cogin", "/api%2Flogin", "/api%252Flogin", "/api//login/"}
	if got := statuses(t, get, more); got[http.StatusTooManyRequests] != len(more) {
		t.Fatalf("other spellings of /api/login: %v; want all %d denied", got, len(more))
	}
	refused := []string{"/api/login.", "/api/login..", "/api/login%20", "/api/login%2E", "/api/login%00", "/api%5Clogin", "/api/login%0A", "/%C0%AE%C0%AE/api/login", "/api/login%E2%80%8B"}
	if got := statuses(t, get, refused); got[http.StatusBadRequest] != len(refused) {
		t.Fatalf("trailing dots and spaces, NUL, backslash, overlong UTF-8: %v; want all %d refused", got, len(refused))
	}
}

// A Bangladeshi number typed in Bengali digits is the number it spells:
// one key with its ASCII and international spellings, in every script.
func TestPhoneDigitsOfEveryScript(t *testing.T) {
	send := zoneServer(t, `zone norm_phone {
			by query phone
			normalize phone BD
			missing deny
			rate 4/1h
		}`, `respond "sent"`)
	get := func(phone string) int { return send("/?phone=" + url.QueryEscape(phone)) }
	scripts := []string{
		"০১৭১২৩৪৫৬৭৮",    // Bengali
		"01712345678",    // ASCII
		"+8801712345678", // international
		"٠١٧١٢٣٤٥٦٧٨",    // Arabic-Indic
	}
	if got := statuses(t, get, scripts); got[http.StatusOK] != 4 {
		t.Fatalf("one number in four scripts: %v; want 4 admitted", got)
	}
	more := []string{"+৮৮০ ১৭১২-৩৪৫৬৭৮", "०१७१२३४५६७८", "۰۱۷۱۲۳۴۵۶۷۸", "０１７１２３４５６７８", "๐๑๗๑๒๓๔๕๖๗๘"}
	if got := statuses(t, get, more); got[http.StatusTooManyRequests] != len(more) {
		t.Fatalf("the same number in other scripts: %v; want all %d denied", got, len(more))
	}
	refused := []string{"0171\u200b2345678", "০১৭১\u200c২৩৪৫৬৭৮", "01712\u2060345678", "\ufeff01712345678", "0171\u00ad2345678"}
	if got := statuses(t, get, refused); got[http.StatusBadRequest] != len(refused) {
		t.Fatalf("invisible characters inside a number: %v; want all %d refused", got, len(refused))
	}
}

// A query parameter hidden in a ";" pair is ambiguous: Caddy's
// placeholder (Go's URL.Query) skips the pair, an application that splits
// on ";" reads it. Here the upstream is such an application and counts
// how often it was asked about the victim.
func TestQuerySemicolonPairsAreAmbiguous(t *testing.T) {
	var mu sync.Mutex
	victim := 0
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		user := ""
		for _, pair := range strings.FieldsFunc(r.URL.RawQuery, func(c rune) bool { return c == '&' || c == ';' }) {
			if k, v, _ := strings.Cut(pair, "="); strings.EqualFold(k, "user") || k == "us%65r" {
				user = v // the last copy wins, as in PHP and Rack
			}
		}
		if user == "victim" {
			mu.Lock()
			victim++
			mu.Unlock()
		}
	}))
	defer upstream.Close()
	get := zoneServer(t, `zone norm_query {
			key {http.request.uri.query.user}
			missing skip
			rate 2/1h
		}`, "reverse_proxy "+strings.TrimPrefix(upstream.URL, "http://"))
	var attack []string
	for i := 0; i < 5; i++ {
		attack = append(attack,
			fmt.Sprintf("/?user=r%d&user=victim;x=1", i), // Caddy reads r<i>, the app victim
			fmt.Sprintf("/?user=victim;x=%d", i),         // Caddy reads nothing: skipped before
			fmt.Sprintf("/?us%%65r=r%d&user=victim", i),  // two copies, one name encoded
			fmt.Sprintf("/?USER=victim&x=%d", i),         // another case
		)
	}
	got := statuses(t, get, attack)
	if got[http.StatusOK] != 2 || victim != 2 {
		t.Fatalf("%d requests for the victim through ; pairs: %v, %d reached the upstream as victim; want 2 (one shared quota)", len(attack), got, victim)
	}
	// A plain parameter is still a key of its own.
	if code := get("/?user=ann"); code != http.StatusOK {
		t.Fatalf("?user=ann: %d", code)
	}
}
