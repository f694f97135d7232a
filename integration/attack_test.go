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

// rawMultipart is a multipart/form-data body of parts given as their
// Content-Disposition and value, written by hand: mime/multipart cannot
// write the parameters these tests need.
func rawMultipart(parts ...string) ([]byte, string) {
	const boundary = "attackboundary"
	var sb strings.Builder
	for i := 0; i+1 < len(parts); i += 2 {
		fmt.Fprintf(&sb, "--%s\r\nContent-Disposition: %s\r\n\r\n%s\r\n", boundary, parts[i], parts[i+1])
	}
	fmt.Fprintf(&sb, "--%s--\r\n", boundary)
	return []byte(sb.String()), "multipart/form-data; boundary=" + boundary
}

// A part's name given twice, once as an RFC 2231 extended parameter, is
// read differently by each parser: Go's mime reads name*, Werkzeug (Flask)
// the last of the two, busboy (Express's multer) only the plain name. A
// part `name*=UTF-8”junk; name="phone"` holding the victim's number, next
// to a plain `phone` part holding a fresh number, was a fresh key each time
// for the limiter while Flask's request.form["phone"] (the first copy) and
// multer's req.body.phone read the victim: 20 of 20 passed a limit of 3,
// under any missing policy. RFC 7578 forbids extended parameters in
// form-data, so such a body is unreadable: all of them share one quota.
func TestMultipartExtendedNameIsUnreadable(t *testing.T) {
	tester := newTester(t, caddyfileServer(`
	rate_limit {
		zone attack_mp_deny {
			match {
				path /otp
			}
			by form phone
			normalize phone BD
			rate 3/1h
		}
		zone attack_mp_skip {
			match {
				path /otp-skip
			}
			by form phone
			normalize phone BD
			missing skip
			rate 3/1h
		}
	}
	respond "ok"`), "caddyfile")

	passed := map[string]int{}
	for i := 0; i < 20; i++ {
		body, ctype := rawMultipart(
			`form-data; name*=UTF-8''junk; name="phone"`, "01712345678",
			`form-data; name="phone"`, fmt.Sprintf("0171200%04d", i))
		if send(t, tester, "/otp", body, "Content-Type", ctype) == http.StatusOK {
			passed["/otp"]++
		}
		// Alone, the part has no phone for Go: skipped before.
		body, ctype = rawMultipart(fmt.Sprintf(`form-data; name="phone"; name*=UTF-8''junk%d`, i), "01712345678")
		if send(t, tester, "/otp-skip", body, "Content-Type", ctype) == http.StatusOK {
			passed["/otp-skip"]++
		}
	}
	for path, n := range passed {
		if n != 3 {
			t.Errorf("%s: %d of 20 bodies with an extended name parameter passed; want 3 (one shared quota)", path, n)
		}
	}
	// A plain multipart form is still read.
	body, ctype := multipartBody(t, "phone", "01812345678")
	for i, want := range []int{200, 200, 200, 429} {
		if code := send(t, tester, "/otp-skip", body, "Content-Type", ctype); code != want {
			t.Fatalf("plain multipart #%d: %d, want %d", i+1, code, want)
		}
	}
}

// Express (cookie-parser) and PHP ($_COOKIE) percent-decode cookie values,
// so `session=vic%74im` is the cookie "victim" to them, and each way of
// encoding its letters was a fresh key to the limiter: 10 of 10 reached an
// upstream that decodes as Express does. PHP also reads `+` as a space, and
// decodes and mangles cookie names as it does form fields, the first copy
// winning: `sess%69on=victim; session=junk<i>` is victim to PHP, and was
// junk<i>, a fresh key each time, to the limiter (10 of 10 passed).
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
		zone attack_cookie {
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
// is the victim's number. To the limiter the field was absent, so under
// `missing skip` 20 of 20 passed a limit of 3. A field given as an array is
// unreadable (as a JSON array is), never absent.
func TestArrayNamesAreNeverSkipped(t *testing.T) {
	tester := newTester(t, caddyfileServer(`
	rate_limit {
		zone attack_array_form {
			match {
				path /otp
			}
			by form phone
			normalize phone BD
			missing skip
			rate 3/1h
		}
		zone attack_array_query {
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
// any whitespace; RFC 9110 makes the scheme case-insensitive). Before,
// each spelling was a fresh quota: 3 + 5 requests passed a limit of 3.
func TestAuthorizationSpellingsShareAKey(t *testing.T) {
	tester := newTester(t, caddyfileServer(`
	rate_limit {
		zone attack_auth {
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

// A JSON body whose charset is spelled "utf8" is UTF-8 to every decoder:
// it is read, not refused as unreadable.
func TestJSONCharsetUTF8Spelling(t *testing.T) {
	tester := newTester(t, caddyfileServer(`
	rate_limit {
		zone attack_utf8 {
			by json user
			missing deny
			rate 2/1h
		}
	}
	respond "ok"`), "caddyfile")
	for i, want := range []int{http.StatusOK, http.StatusOK, http.StatusTooManyRequests} {
		if code, body := post(t, tester, "/", "application/json; charset=utf8", `{"user":"ann"}`); code != want {
			t.Fatalf("request %d: %d %q, want %d", i+1, code, body, want)
		}
	}
}
