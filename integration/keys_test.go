package integration

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// 200 requests from one untrusted peer, each with a new
// X-Forwarded-For, are one client. Caddy's client_ip only reads that header
// from trusted proxies; here the peer (127.0.0.1) is not one.
func TestSpoofedForwardedForIsOneClient(t *testing.T) {
	tester := newTester(t, caddyfileServerWith(`	servers {
		trusted_proxies static 10.0.0.0/8
	}`, `	rate_limit {
		zone spoof {
			by ip
			rate 5/1h
		}
	}
	respond "ok"`), "caddyfile")
	passed := 0
	for i := 0; i < 200; i++ {
		xff := fmt.Sprintf("%d.%d.%d.%d", 1+i%200, i%250, (i*7)%250, 1+i%250)
		if code, _, _ := do(t, tester, "GET", "/", "X-Forwarded-For", xff); code == http.StatusOK {
			passed++
		}
	}
	if passed != 5 {
		t.Fatalf("%d of 200 spoofed requests passed; the limit of 5 must hold for the one real client", passed)
	}
}

// Behind a trusted proxy, the client is the address it forwards; IPv6
// addresses of one /64 share a bucket (one customer's network), and an IPv4-mapped
// address is its IPv4 address.
func TestTrustedProxyIPv6Slash64(t *testing.T) {
	tester := newTester(t, caddyfileServerWith(`	servers {
		trusted_proxies static 127.0.0.1/32
	}`, `	rate_limit {
		zone v6 {
			by ip
			rate 3/1h
		}
	}
	respond "ok"`), "caddyfile")
	xff := "X-Forwarded-For"
	expectN(t, tester, 1, http.StatusOK, "GET", "/", xff, "2001:db8:1:2::a")
	expectN(t, tester, 1, http.StatusOK, "GET", "/", xff, "2001:db8:1:2::b")
	expectN(t, tester, 1, http.StatusOK, "GET", "/", xff, "2001:db8:1:2:ffff:ffff:ffff:ffff")
	expect429(t, tester, 3599, 3600, "GET", "/", xff, "2001:DB8:1:2::c")
	// The next /64 is another customer.
	expectN(t, tester, 3, http.StatusOK, "GET", "/", xff, "2001:db8:1:3::1")
	// One IPv4 client, two spellings.
	expectN(t, tester, 2, http.StatusOK, "GET", "/", xff, "192.0.2.1")
	expectN(t, tester, 1, http.StatusOK, "GET", "/", xff, "::ffff:192.0.2.1")
	expect429(t, tester, 3599, 3600, "GET", "/", xff, "192.0.2.1")
}

// The OTP zone of docs/keys.md limits one phone number across its
// spellings, keys it by an HMAC (the number never reaches memory or logs),
// and refuses a request without a number with 400.
func TestOTPZone(t *testing.T) {
	t.Setenv("SLUICE_TEST_SECRET", "test-secret-of-enough-length")
	tester := newTester(t, caddyfileServer(`
	rate_limit /otp/send {
		zone otp {
			by json phone
			normalize phone BD
			hash {env.SLUICE_TEST_SECRET}
			missing deny
			rate 3/10m
			scope cooldown {
				rate 3/10s
			}
			scope ip {
				by ip
				rate 10/10m
			}
		}
	}
	handle_errors 429 {
		respond "zone={http.rate_limit.exceeded.name} scope={http.rate_limit.exceeded.scope} key={http.rate_limit.exceeded.key}" 429
	}
	respond "sent"`), "caddyfile")

	for _, spelling := range []string{"01712345678", "+8801712345678", "8801712345678"} {
		if code, body := post(t, tester, "/otp/send", "application/json", `{"phone": "`+spelling+`"}`); code != http.StatusOK {
			t.Fatalf("%s: %d %q", spelling, code, body)
		}
	}
	code, body := post(t, tester, "/otp/send", "application/json", `{"phone": "+880 1712-345678"}`)
	if code != http.StatusTooManyRequests || !strings.HasPrefix(body, "zone=otp scope= key=hmac:") || strings.Contains(body, "1712") {
		t.Fatalf("4th spelling: %d %q; want 429 from the zone's own limit with an HMAC key", code, body)
	}
	// Another number has its own quota (the IP scope still has room).
	if code, _ := post(t, tester, "/otp/send", "application/json", `{"phone": "01812345678"}`); code != http.StatusOK {
		t.Fatalf("another number: %d", code)
	}
	// No number, a number that is not one, or not JSON: 400, a Caddy error
	// that tells nothing of where the limit reads the number (the built-in
	// bodies, which say which way it was wrong, are in refusals_test.go).
	for _, bad := range []string{`{"mobile": "01712345678"}`, `{"phone": "hello"}`, `phone=01712345678`, `{"phone": "017", "phone": "018"}`} {
		if code, body := post(t, tester, "/otp/send", "application/json", bad); code != http.StatusBadRequest || strings.Contains(body, "phone") {
			t.Fatalf("body %s: %d %q; want 400 that does not show the key", bad, code, body)
		}
	}
}

func TestMissingKeyPolicies(t *testing.T) {
	tester := newTester(t, caddyfileServer(`
	rate_limit {
		zone missing_shared {
			match {
				path /shared
			}
			by header X-User
			rate 2/1h
		}
		zone missing_skip {
			match {
				path /skip
			}
			by header X-User
			missing skip
			rate 2/1h
		}
	}
	respond "ok"`), "caddyfile")
	// Shared: every request without the header shares one quota.
	expectN(t, tester, 2, http.StatusOK, "GET", "/shared")
	expect429(t, tester, 3599, 3600, "GET", "/shared")
	expectN(t, tester, 2, http.StatusOK, "GET", "/shared", "X-User", "ann")
	// Skip: requests without the header are not limited at all.
	expectN(t, tester, 10, http.StatusOK, "GET", "/skip")
	expectN(t, tester, 2, http.StatusOK, "GET", "/skip", "X-User", "ann")
	expect429(t, tester, 3599, 3600, "GET", "/skip", "X-User", "ann")
}

// Known webhook senders (a payment provider's addresses) are not limited by the
// strict zone; a listed abuser is refused outright.
func TestAllowAndDenyLists(t *testing.T) {
	tester := newTester(t, caddyfileServer(`
	rate_limit {
		zone lists_allowed {
			match {
				path /hook
			}
			by ip
			rate 1/1h
			allow 127.0.0.0/8
		}
		zone lists_token {
			match {
				path /internal
			}
			by ip
			rate 1/1h
			allow_match {
				header X-Internal-Token secret-token
			}
		}
		zone lists_denied {
			match {
				path /blocked
			}
			by ip
			rate 100/1h
			deny 127.0.0.1 ::1
		}
	}
	handle_errors 403 {
		respond "denied by {http.rate_limit.denylisted.name}" 403
	}
	respond "ok"`), "caddyfile")
	expectN(t, tester, 20, http.StatusOK, "GET", "/hook")
	expectN(t, tester, 5, http.StatusOK, "GET", "/internal", "X-Internal-Token", "secret-token")
	expectN(t, tester, 1, http.StatusOK, "GET", "/internal")
	expect429(t, tester, 3599, 3600, "GET", "/internal", "X-Internal-Token", "wrong")
	code, _, body := do(t, tester, "GET", "/blocked")
	if code != http.StatusForbidden || body != "denied by lists_denied" {
		t.Fatalf("deny list: %d %q", code, body)
	}
}

// A key read straight from a header a client controls gets a warning at
// load time that names the safe placeholder.
func TestBinaryWarnsOnForwardedForKey(t *testing.T) {
	cfg := ":0\nrate_limit {\n\tzone spoofable {\n\t\tkey {header.X-Forwarded-For}\n\t\trate 10/1m\n\t}\n}\n"
	file := filepath.Join(t.TempDir(), "Caddyfile")
	if err := os.WriteFile(file, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := runCaddy(t, "validate", "--config", file, "--adapter", "caddyfile")
	if err != nil || !strings.Contains(out, "a rate limit key reads a header any client can set") || !strings.Contains(out, "{client_ip}") {
		t.Fatalf("caddy validate: %v\n%s", err, out)
	}
	if !bytes.Contains([]byte(out), []byte(`"zone":"spoofable"`)) {
		t.Fatalf("the warning does not name the zone:\n%s", out)
	}
}

// URL and method variants must not split a limit. One zone
// is bound to the route (its matcher covers every spelling, its key is not
// the path); the other keys on the normalized path.
func TestPathAndMethodVariantsShareALimit(t *testing.T) {
	tester := newTester(t, caddyfileServer(`
	rate_limit {
		zone route_login {
			match {
				method POST PUT
				path /login /login/
			}
			by ip
			rate 4/1h
		}
		zone by_path {
			match {
				path /api/*
			}
			by path
			rate 3/1h
		}
	}
	respond "ok"`), "caddyfile")
	expectN(t, tester, 1, http.StatusOK, "POST", "/login")
	expectN(t, tester, 1, http.StatusOK, "POST", "/login/")
	expectN(t, tester, 1, http.StatusOK, "PUT", "/login")
	expectN(t, tester, 1, http.StatusOK, "PUT", "/LOGIN/")
	expect429(t, tester, 3599, 3600, "POST", "/login")

	expectN(t, tester, 1, http.StatusOK, "GET", "/api/v1/x")
	expectN(t, tester, 1, http.StatusOK, "GET", "/api/v1/x/")
	expectN(t, tester, 1, http.StatusOK, "GET", "/api//v1/%78")
	expect429(t, tester, 3599, 3600, "GET", "/API/v1/./x")
	expectN(t, tester, 3, http.StatusOK, "GET", "/api/v1/y")
}

// A header or JSON key given twice cannot step around a limit: the
// application may read the other copy ("X-Api-Key: victim" plus
// "X-Api-Key: junkN", keyed by one copy, would pass every time).
func TestRepeatedIdentifiersDoNotBypass(t *testing.T) {
	tester := newTester(t, caddyfileServer(`
	rate_limit {
		zone repeat_header {
			match {
				path /api
			}
			by header X-Api-Key
			missing skip
			rate 2/1h
		}
		zone repeat_json {
			match {
				path /otp
			}
			by json phone
			normalize phone BD
			missing deny
			rate 1/1h
		}
	}
	respond "ok"`), "caddyfile")
	passed := 0
	for i := 0; i < 6; i++ {
		req, _ := http.NewRequest("GET", httpBase+"/api", nil)
		req.Header.Add("X-Api-Key", "victim")
		req.Header.Add("X-Api-Key", fmt.Sprintf("junk%d", i))
		resp, err := tester.Client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			passed++
		}
	}
	if passed > 2 {
		t.Fatalf("%d of 6 requests with a repeated key header passed; they must share one quota of 2", passed)
	}
	if code, _ := post(t, tester, "/otp", "application/json", `{"phone": "01712345678"}`); code != http.StatusOK {
		t.Fatalf("first OTP: %d", code)
	}
	for i := 0; i < 3; i++ {
		body := fmt.Sprintf(`{"phone": "0171234567%d", "PHONE": "01712345678"}`, i)
		if code, _ := post(t, tester, "/otp", "application/json", body); code != http.StatusBadRequest {
			t.Fatalf("two spellings of the phone key: %d, want 400", code)
		}
	}
}

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

// With the default order, rate_limit runs before basic_auth, so
// {http.auth.user.id} is empty for every request and all users share one
// quota: that is warned about once, naming the order line that fixes it.
// With the order fixed, each user has a quota of their own and nothing is
// warned about.
func TestAuthKeyBeforeBasicAuthWarnsOnce(t *testing.T) {
	const (
		annHash = "$2a$04$UAqEEEUk9QCx3IP5YIAOOef3LQ8cEdoAD9ImU1pdlqEOTK8GCbLDq" // ann-password
		bobHash = "$2a$04$yUKIUvBo9pg60hbZxiV3eePg7Rfnea2Lh1Xltu/SsR0piJdtzB6ta" // bob-password
	)
	ann := []string{"Authorization", "Basic " + base64.StdEncoding.EncodeToString([]byte("ann:ann-password"))}
	bob := []string{"Authorization", "Basic " + base64.StdEncoding.EncodeToString([]byte("bob:bob-password"))}
	run := func(t *testing.T, zone, order string) (annOK, bobOK, warnings int) {
		logFile := filepath.Join(t.TempDir(), "caddy.log")
		tester := newTester(t, caddyfileServerWith(order+`
	log {
		output file `+logFile+`
		format json
		level WARN
	}`, `	rate_limit {
		zone `+zone+` {
			key {http.auth.user.id}
			rate 3/1h
		}
	}
	basic_auth {
		ann `+annHash+`
		bob `+bobHash+`
	}
	respond "ok"`), "caddyfile")
		annOK = countOK(t, tester, 4, ann...)
		bobOK = countOK(t, tester, 4, bob...)
		logs, err := os.ReadFile(logFile)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(logs), "\n") {
			if strings.Contains(line, `"placeholder":"{http.auth.user.id}"`) {
				warnings++
				if !strings.Contains(line, "order rate_limit after basic_auth") || !strings.Contains(line, `"zone":"`+zone+`"`) {
					t.Errorf("the warning does not name the zone and the order line that fixes it: %s", line)
				}
			}
		}
		return annOK, bobOK, warnings
	}
	t.Run("default order", func(t *testing.T) {
		annOK, bobOK, warnings := run(t, "cfg_auth_default", "")
		if annOK+bobOK != 3 {
			t.Errorf("ann got %d and bob %d of 4 through: expected one quota of 3 shared by both", annOK, bobOK)
		}
		if warnings != 1 {
			t.Errorf("%d warnings about {http.auth.user.id}, want exactly 1", warnings)
		}
	})
	t.Run("order fixed", func(t *testing.T) {
		annOK, bobOK, warnings := run(t, "cfg_auth_ordered", "\torder rate_limit after basic_auth")
		if annOK != 3 || bobOK != 3 {
			t.Errorf("ann got %d and bob %d of 4 through: expected 3 each", annOK, bobOK)
		}
		if warnings != 0 {
			t.Errorf("%d warnings about {http.auth.user.id}, want none", warnings)
		}
	})
}

// A query of more than 10,000 parameters is one Go (and so Caddy's
// placeholder) reads nothing of, while the application may read all of
// it: the key is still the parameter's value, never an absent key that
// "missing skip" would let through.
func TestQueryKeyBeyondGoParameterLimit(t *testing.T) {
	tester := newTester(t, jsonServer(`{
		"handler": "rate_limit",
		"rate_limits": {"hotpath_query": {"key": "{http.request.uri.query.user}", "missing": "skip", "window": "1h", "max_events": 1}}
	}, `+okHandler, ""), "json")
	// 10,000 empty pairs: Go counts the separators.
	padded := "/?" + strings.Repeat("&", 10000) + "user=victim"
	for i, want := range []int{http.StatusOK, http.StatusTooManyRequests} {
		if code, _, _ := do(t, tester, "GET", padded); code != want {
			t.Fatalf("padded query #%d: status %d, want %d", i+1, code, want)
		}
	}
	expect429(t, tester, 3599, 3600, "GET", "/?user=victim")
	expectN(t, tester, 2, http.StatusOK, "GET", "/?other=1")
}

// Express (cookie-parser) and PHP ($_COOKIE) percent-decode cookie values,
// so `session=vic%74im` is the cookie "victim" to them: a limiter that keys
// the raw value gives each way of encoding its letters a fresh key, and 10
// of 10 would reach an upstream that decodes as Express does. PHP also reads `+` as a space, and
// decodes and mangles cookie names as it does form fields, the first copy
// winning: `sess%69on=victim; session=junk<i>` is victim to PHP, and
// junk<i>, a fresh key each time, to a limiter that reads the last copy
// (10 of 10 would pass).
func TestCookieValueSpellingsShareAKey(t *testing.T) {
	var mu sync.Mutex
	victim := 0
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := r.Cookie("session")
		if err != nil {
			return
		}
		// cookie-parser: decodeURIComponent, the raw value when that fails.
		v, err := url.PathUnescape(c.Value)
		if err != nil {
			v = c.Value
		}
		if v == "victim" {
			mu.Lock()
			victim++
			mu.Unlock()
		}
	}))
	defer upstream.Close()
	tester := newTester(t, caddyfileServer(`
	rate_limit {
		zone cookie_spelling {
			by cookie session
			rate 3/1h
		}
	}
	reverse_proxy `+strings.TrimPrefix(upstream.URL, "http://")), "caddyfile")
	get := func(cookie string) int {
		code, _, _ := do(t, tester, "GET", "/", "Cookie", cookie)
		return code
	}
	spellings := []string{"victim", "%76ictim", "v%69ctim", "vi%63tim", "vic%74im", "vict%69m", "victi%6d", "victi%6D", "%76%69ctim", "%76%69%63%74%69%6D"}
	got := map[int]int{}
	for _, s := range spellings {
		got[get("session="+s)]++
	}
	if got[http.StatusOK] != 3 || victim != 3 {
		t.Fatalf("%d spellings of one cookie value: %v, %d reached the upstream as victim; want 3 (one key)", len(spellings), got, victim)
	}
	// Another value is another key; "+" and %20 are one PHP value.
	for i, c := range []string{"session=a+b", "session=a%20b", "session=a%2Bb"} {
		if code := get(c); code != http.StatusOK {
			t.Fatalf("%s (#%d of its key): %d, want 200", c, i+1, code)
		}
	}
	if code := get("session=a+b"); code != http.StatusTooManyRequests {
		t.Fatalf("a fourth spelling of \"a b\": %d, want 429", code)
	}
	passed := 0
	for i := 0; i < 10; i++ {
		if get(fmt.Sprintf("sess%%69on=victim2; session=junk%d", i)) == http.StatusOK {
			passed++
		}
	}
	if passed != 3 {
		t.Fatalf("%d of 10 requests with the cookie name in two spellings passed; want 3 (one shared quota)", passed)
	}
}

// PHP, Rack and Express (qs, with extended forms and queries) read
// `phone[]=…` and `key[0]=…` as an array named phone or key, and
// JavaScript reads a one-element array as its element: `${req.body.phone}`
// is the victim's number. Read as absent, the field would let 20 of 20
// through a limit of 3 under `missing skip`. A field given as an array is
// unreadable (as a JSON array is), never absent.
func TestArrayNamesAreNeverSkipped(t *testing.T) {
	tester := newTester(t, caddyfileServer(`
	rate_limit {
		zone array_form {
			match {
				path /otp
			}
			by form phone
			normalize phone BD
			missing skip
			rate 3/1h
		}
		zone array_query {
			match {
				path /api
			}
			by query key
			missing skip
			rate 3/1h
		}
	}
	respond "ok"`), "caddyfile")

	forms := []string{"phone[]=01712345678", "phone[0]=01712345678", "phone%5B%5D=01712345678", "phone[]=01712345678&x=1"}
	queries := []string{"key[]=victim", "key[0]=victim", "key%5B%5D=victim", "key[a]=victim"}
	passed := map[string]int{}
	for i := 0; i < 20; i++ {
		if code, _ := post(t, tester, "/otp", formType, forms[i%len(forms)]); code == http.StatusOK {
			passed["form"]++
		}
		if code, _, _ := do(t, tester, "GET", "/api?"+queries[i%len(queries)]); code == http.StatusOK {
			passed["query"]++
		}
	}
	for kind, n := range passed {
		if n != 3 {
			t.Errorf("%s: %d of 20 fields given as arrays passed; want 3 (one shared quota)", kind, n)
		}
	}
	// A field without brackets is still its own key, and absent is skipped.
	for i, want := range []int{200, 200, 200, 429} {
		if code, _ := post(t, tester, "/otp", formType, "phone=01812345678"); code != want {
			t.Fatalf("phone=01812345678 #%d: %d, want %d", i+1, code, want)
		}
		if code, _, _ := do(t, tester, "GET", "/api?key=ann"); code != want {
			t.Fatalf("?key=ann #%d: %d, want %d", i+1, code, want)
		}
	}
	if code, _, _ := do(t, tester, "GET", "/api?other=1"); code != http.StatusOK {
		t.Fatalf("no key: %d, want 200 (skipped)", code)
	}
}

// `by header Authorization` keys the credentials, not their spelling: the
// scheme in any case and any spaces before the token are one client, as
// the servers that accept them read them (passport-http-bearer splits on
// any whitespace; RFC 9110 makes the scheme case-insensitive). Keyed by
// spelling, each would be a fresh quota: 3 + 5 requests would pass a limit
// of 3.
func TestAuthorizationSpellingsShareAKey(t *testing.T) {
	tester := newTester(t, caddyfileServer(`
	rate_limit {
		zone auth_spelling {
			by header Authorization
			rate 3/1h
		}
	}
	respond "ok"`), "caddyfile")
	passed := 0
	for _, auth := range []string{"Bearer tok609", "bearer tok609", "BEARER tok609", "Bearer  tok609", "bEarer tok609", "Bearer\ttok609", " Bearer tok609"} {
		if code, _, _ := do(t, tester, "GET", "/", "Authorization", auth); code == http.StatusOK {
			passed++
		}
	}
	if passed != 3 {
		t.Fatalf("%d of 7 spellings of one token passed a limit of 3", passed)
	}
	if code, _, _ := do(t, tester, "GET", "/", "Authorization", "Bearer TOK609"); code != http.StatusOK {
		t.Fatalf("another token (tokens are case-sensitive): %d, want 200", code)
	}
}

// A query parameter given twice is ambiguous: it counts under the missing
// policy's shared quota (with the empty value), never as a fresh key per
// combination, which is what Caddy's joined value "a,b" made it in mholt's.
func TestRepeatedValueSharesTheMissingQuota(t *testing.T) {
	tester := newTester(t, caddyfileServer(`	rate_limit {
		zone repeated_value {
			key    {http.request.uri.query.u}
			events 2
			window 1m
		}
	}
	respond "ok"`), "caddyfile")
	expectN(t, tester, 1, http.StatusOK, "GET", "/?u=a&u=b")
	expectN(t, tester, 1, http.StatusOK, "GET", "/?u=c&u=d")
	expect429(t, tester, 59, 60, "GET", "/?u=e&u=f")
	expect429(t, tester, 59, 60, "GET", "/?u=")
	expect429(t, tester, 59, 60, "GET", "/")
	expectN(t, tester, 2, http.StatusOK, "GET", "/?u=a")
	expect429(t, tester, 59, 60, "GET", "/?u=a")
}

// A zone whose requests all lack their key (a client that lost its header,
// a key template that reads the wrong field) is refused with 400 by
// `missing deny`, and no request is decided: `caddy rate-limit report`
// must not call that "no traffic yet".
func TestReportFlagsMissingKeys(t *testing.T) {
	zone := freshZone("report_nokey") // Prometheus counters are the process's
	tester := newTester(t, jsonServer(`{
		"handler": "rate_limit",
		"rate_limits": {"`+zone+`": {"key": "{http.request.header.X-Api-Key}", "missing": "deny", "window": "1m", "max_events": 10}}
	}, `+okHandler, ""), "json")
	expectN(t, tester, 3, http.StatusBadRequest, "GET", "/")
	out, err := runCaddy(t, "rate-limit", "report", "--metrics", "http://"+adminAddr+"/metrics", "--address", adminAddr)
	if err != nil {
		t.Fatalf("report: %v\n%s", err, out)
	}
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, zone+" ") {
			if !strings.Contains(line, "CHECK: 3 requests without a usable key") {
				t.Fatalf("report line %q, want the 3 requests without a key flagged", line)
			}
			return
		}
	}
	t.Fatalf("zone %s not in the report:\n%s", zone, out)
}
