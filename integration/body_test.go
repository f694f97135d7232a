package integration

import (
	"bytes"
	"compress/gzip"
	"crypto/rand"
	"crypto/sha256"
	le "encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
	"unicode/utf16"
)

// multipartBody is a multipart/form-data body with the given text fields,
// and its Content-Type.
func multipartBody(t *testing.T, fields ...string) ([]byte, string) {
	t.Helper()
	var buf bytes.Buffer
	w := multipart.NewWriter(&buf)
	for i := 0; i+1 < len(fields); i += 2 {
		if err := w.WriteField(fields[i], fields[i+1]); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes(), w.FormDataContentType()
}

func utf16LE(s string) []byte {
	var out []byte
	for _, u := range utf16.Encode([]rune(s)) {
		out = le.LittleEndian.AppendUint16(out, u)
	}
	return out
}

func gzipped(t *testing.T, s string) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	_, _ = zw.Write([]byte(s))
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// A JSON body sent as a form is not JSON: an application that reads
// `get_json(silent=True) or request.form` reads the form, and texts the
// number smuggled in it. Read as JSON, each such request would get a fresh
// key from the JSON it is not; they all share the quota of unreadable requests, even
// under `missing skip`. The same for a form key and a JSON body.
func TestBodyContentTypeDecidesParser(t *testing.T) {
	tester := newTester(t, caddyfileServer(`
	rate_limit {
		zone ctype_otp {
			match {
				path /otp
			}
			by json phone
			normalize phone BD
			rate 3/1h
		}
		zone ctype_otp_skip {
			match {
				path /otp-skip
			}
			by json phone
			normalize phone BD
			missing skip
			rate 3/1h
		}
		zone ctype_login {
			match {
				path /login
			}
			by form username
			missing skip
			rate 3/1h
		}
	}
	respond "ok"`), "caddyfile")

	for _, path := range []string{"/otp", "/otp-skip"} {
		passed := 0
		for i := 0; i < 20; i++ {
			body := fmt.Sprintf(`{"phone":"0171200%04d","x":"&phone=01712345678&"}`, i)
			if send(t, tester, path, []byte(body), "Content-Type", formType) == http.StatusOK {
				passed++
			}
		}
		if passed != 3 {
			t.Fatalf("%s: %d of 20 JSON bodies sent as forms passed; they must share one quota of 3", path, passed)
		}
	}
	passed := 0
	for i := 0; i < 20; i++ {
		body := fmt.Sprintf(`{"username":"victim","x":"&username=junk%d&"}`, i)
		if send(t, tester, "/login", []byte(body), "Content-Type", "application/json") == http.StatusOK {
			passed++
		}
	}
	if passed != 3 {
		t.Fatalf("%d of 20 JSON bodies read as forms passed; they must share one quota of 3", passed)
	}

	// JSON media types in any case, with parameters, and +json types are
	// JSON: one number, its own quota of 3.
	for _, ctype := range []string{"application/json", "Application/JSON; charset=UTF-8", "application/vnd.api+json"} {
		if code := send(t, tester, "/otp", []byte(`{"phone":"01812345678"}`), "Content-Type", ctype); code != http.StatusOK {
			t.Fatalf("%s: %d, want 200", ctype, code)
		}
	}
	if code := send(t, tester, "/otp", []byte(`{"phone":"+8801812345678"}`), "Content-Type", "application/json"); code != http.StatusTooManyRequests {
		t.Fatalf("4th request for one number: %d, want 429", code)
	}
	// Forms are read as forms, URL-encoded or multipart.
	mp, mpType := multipartBody(t, "username", "ann")
	for i := 0; i < 2; i++ {
		if code := send(t, tester, "/login", []byte("username=ann"), "Content-Type", formType); code != http.StatusOK {
			t.Fatalf("form: %d", code)
		}
	}
	if code := send(t, tester, "/login", mp, "Content-Type", mpType); code != http.StatusOK {
		t.Fatalf("multipart: %d", code)
	}
	if code := send(t, tester, "/login", mp, "Content-Type", mpType); code != http.StatusTooManyRequests {
		t.Fatalf("4th login of ann: %d, want 429", code)
	}
}

// A cost that cannot be read is refused, never 1: 20 requests of 1000
// tokens, each made unreadable a different way, against a budget of 1000.
func TestUnreadableCostIsRefused(t *testing.T) {
	tester := newTester(t, caddyfileServer(`
	rate_limit {
		zone cost_tokens {
			match {
				path /llm
			}
			key static
			rate 1000/1h
			algorithm token_bucket
			cost {http.request.body.json.tokens}
		}
		zone cost_header {
			match {
				path /header
			}
			key static
			rate 1000/1h
			algorithm token_bucket
			cost {http.request.header.X-Tokens}
		}
		zone cost_shadow {
			match {
				path /shadow
			}
			key static
			rate 1000/1h
			cost {http.request.body.json.tokens}
			shadow
		}
		body_limit 1KiB
	}
	respond "ok"`), "caddyfile")

	const ok = `{"tokens": 1000}`
	attacks := []struct {
		name   string
		body   []byte
		header []string
	}{
		{"duplicated field", []byte(`{"tokens": 1, "tokens": 1000}`), nil},
		{"field in two cases", []byte(`{"tokens": 1000, "TOKENS": 1}`), nil},
		{"byte order mark", append([]byte("\uFEFF"), ok...), nil},
		{"over body_limit", []byte(`{"tokens": 1000, "pad": "` + strings.Repeat("x", 2048) + `"}`), nil},
		{"text/plain", []byte(ok), []string{"Content-Type", "text/plain"}},
		{"no content type", []byte(ok), []string{}},
		{"form content type", []byte(ok), []string{"Content-Type", formType}},
		{"invalid JSON", []byte(`{"tokens": 1000,}`), nil},
		{"UTF-16", utf16LE(ok), nil},
		{"charset", []byte(ok), []string{"Content-Type", "application/json; charset=iso-8859-1"}},
		{"gzip", gzipped(t, ok), []string{"Content-Type", "application/json", "Content-Encoding", "gzip"}},
		{"array", []byte(`{"tokens": [1000]}`), nil},
		{"object", []byte(`{"tokens": {"n": 1000}}`), nil},
	}
	passed := 0
	for i := 0; i < 20; i++ {
		a := attacks[i%len(attacks)]
		header := a.header
		if header == nil {
			header = []string{"Content-Type", "application/json"}
		}
		switch code := send(t, tester, "/llm", a.body, header...); code {
		case http.StatusOK:
			passed++
		case http.StatusBadRequest:
		default:
			t.Fatalf("%s: %d, want 400", a.name, code)
		}
	}
	if passed != 0 {
		t.Fatalf("%d of 20 requests with an unreadable cost of 1000 passed, want 0 (each must get 400)", passed)
	}
	// A field absent from a readable body costs 1; the budget is intact.
	if code := send(t, tester, "/llm", []byte(`{"prompt": "hi"}`), "Content-Type", "application/json"); code != http.StatusOK {
		t.Fatalf("absent cost: %d, want 200", code)
	}
	if code := send(t, tester, "/llm", []byte(`{"tokens": 999}`), "Content-Type", "application/json"); code != http.StatusOK {
		t.Fatalf("999 tokens with 999 left: %d, want 200", code)
	}
	if code := send(t, tester, "/llm", []byte(`{"tokens": 1e0}`), "Content-Type", "application/json"); code != http.StatusTooManyRequests {
		t.Fatalf("1 token with none left: %d, want 429", code)
	}

	// A repeated header behind a cost is ambiguous: 400, not a cost of 1.
	for i := 0; i < 3; i++ {
		if code := send(t, tester, "/header", nil, "X-Tokens", "1000", "X-Tokens", "1"); code != http.StatusBadRequest {
			t.Fatalf("repeated cost header: %d, want 400", code)
		}
	}
	if code := send(t, tester, "/header", nil, "X-Tokens", "1000"); code != http.StatusOK {
		t.Fatalf("one cost header: %d, want 200", code)
	}
	// A shadow zone logs what it would refuse and refuses nothing.
	if code := send(t, tester, "/shadow", []byte(`{"tokens": 1, "tokens": 2}`), "Content-Type", "application/json"); code != http.StatusOK {
		t.Fatalf("shadow zone with an unreadable cost: %d, want 200", code)
	}
}

// badBody is the body that took 13 ms per lookup with a token-by-token
// decoder: 64 KiB of zeros in an array, then the key field.
func badBody() []byte {
	return []byte(`{"a":[` + strings.Repeat("0,", 32747) + `0],"phone":"01712345678"}`)
}

// A body read by eight limits and a cost is parsed once, in linear time:
// the fastest of 8 requests through the zone is within 25 ms of the fastest
// through a route that reads no body (a parse per limit costs over
// 8 × 13 ms). A machine too
// slow for that (the race detector, a loaded CI) is judged against itself:
// the eight limits cost less than 3 times what one limit reading the body
// costs (8 times, parsing it for each).
func TestBadBodyParsedOnceInLinearTime(t *testing.T) {
	var scopes strings.Builder
	for i := 0; i < 7; i++ {
		fmt.Fprintf(&scopes, "\t\t\tscope s%d {\n\t\t\t\trate %d/1h\n\t\t\t}\n", i, 10000+i)
	}
	tester := newTester(t, caddyfileServer(`
	rate_limit {
		zone parse_once {
			match {
				path /otp
			}
			by json phone
			cost {http.request.body.json.n}
			rate 10000/1h
`+scopes.String()+`		}
		zone parse_one {
			match {
				path /one
			}
			by json phone
			rate 10000/1h
		}
	}
	respond "ok"`), "caddyfile")
	body := badBody()
	if len(body) > 64<<10 {
		t.Fatalf("body of %d bytes is over the default body_limit", len(body))
	}
	fastest := func(path string) time.Duration {
		best := time.Hour
		for i := 0; i < 8; i++ {
			start := time.Now()
			if code := send(t, tester, path, body, "Content-Type", "application/json"); code != http.StatusOK {
				t.Fatalf("%s: %d", path, code)
			}
			best = min(best, time.Since(start))
		}
		return best
	}
	plain := fastest("/plain")
	limited := fastest("/otp")
	one := fastest("/one")
	t.Logf("fastest of 8: %v through the zone, %v through one limit, %v without", limited, one, plain)
	if extra, once := limited-plain, one-plain; extra > 25*time.Millisecond && extra > 3*once+5*time.Millisecond {
		t.Fatalf("a 64 KiB body through 8 limits took %v, %v more than without them, against %v more through one limit", limited, extra, once)
	}
}

// A body that cannot be read is not a body without the field: under
// `missing skip` such requests share one quota; only an absent field is
// skipped. Under `missing deny` they get 400.
func TestUnreadableBodyIsNeverSkipped(t *testing.T) {
	tester := newTester(t, caddyfileServer(`
	rate_limit {
		zone unread_skip {
			match {
				path /skip
			}
			by json phone
			missing skip
			rate 2/1h
		}
		zone unread_deny {
			match {
				path /deny
			}
			by json phone
			missing deny
			rate 100/1h
		}
		zone unread_refused {
			match {
				path /refused
			}
			by json phone
			normalize phone BD
			missing skip
			rate 2/1h
		}
		body_limit 1KiB
	}
	respond "ok"`), "caddyfile")
	jsonType := []string{"Content-Type", "application/json"}
	plain := func(doc string) []byte { return []byte(doc) }
	kinds := []struct {
		name   string
		doc    string // %s is the phone number
		encode func(doc string) []byte
		header []string
	}{
		{"byte order mark", `{"phone":"%s"}`, func(d string) []byte { return []byte("\uFEFF" + d) }, jsonType},
		{"UTF-16", `{"phone":"%s"}`, utf16LE, jsonType},
		{"UTF-16 charset", `{"phone":"%s"}`, utf16LE, []string{"Content-Type", "application/json; charset=utf-16le"}},
		{"gzip", `{"phone":"%s"}`, func(d string) []byte { return gzipped(t, d) }, []string{"Content-Type", "application/json", "Content-Encoding", "gzip"}},
		{"over body_limit", `{"phone":"%s","pad":"` + strings.Repeat("x", 2048) + `"}`, plain, jsonType},
		{"text/plain", `{"phone":"%s"}`, plain, []string{"Content-Type", "text/plain"}},
		{"invalid JSON", `{"phone":"%s",}`, plain, jsonType},
		{"invalid UTF-8", "{\"phone\":\"%s\xff\"}", plain, jsonType},
		{"array value", `{"phone":["%s"]}`, plain, jsonType},
		{"two Content-Types", `{"phone":"%s"}`, plain, []string{"Content-Type", "application/json", "Content-Type", "text/plain"}},
	}
	passed := 0
	for round := 0; round < 3; round++ {
		for i, k := range kinds {
			phone := fmt.Sprintf("0171%07d", round*100+i)
			body := k.encode(fmt.Sprintf(k.doc, phone))
			if send(t, tester, "/skip", body, k.header...) == http.StatusOK {
				passed++
			}
			if code := send(t, tester, "/deny", body, k.header...); code != http.StatusBadRequest {
				t.Fatalf("%s under missing deny: %d, want 400", k.name, code)
			}
		}
	}
	if passed != 2 {
		t.Fatalf("%d of %d unreadable bodies passed a skip zone of 2; they must share its quota", passed, 3*len(kinds))
	}
	// A value the normalizer refuses was sent: it is not absent either.
	passed = 0
	for i := 0; i < 6; i++ {
		body := fmt.Sprintf(`{"phone":"not a number %d"}`, i)
		if send(t, tester, "/refused", []byte(body), jsonType...) == http.StatusOK {
			passed++
		}
	}
	if passed != 2 {
		t.Fatalf("%d of 6 refused values passed a skip zone of 2; they must share its quota", passed)
	}
	// An absent field, or no body at all, is skipped.
	for i := 0; i < 5; i++ {
		if code := send(t, tester, "/skip", []byte(`{"email":"a@b.co"}`), jsonType...); code != http.StatusOK {
			t.Fatalf("absent field under skip: %d, want 200", code)
		}
		if code := send(t, tester, "/skip", nil); code != http.StatusOK {
			t.Fatalf("no body under skip: %d, want 200", code)
		}
	}
}

// JSON numbers are keyed by their value: every spelling of 42 (and the
// string "42") is one user.
func TestJSONNumberSpellingsShareAKey(t *testing.T) {
	tester := newTester(t, caddyfileServer(`
	rate_limit {
		zone numbers {
			by json user_id
			rate 3/1h
		}
	}
	respond "ok"`), "caddyfile")
	jsonType := []string{"Content-Type", "application/json"}
	id := func(v string) []byte { return []byte(`{"user_id": ` + v + `}`) }
	for _, v := range []string{"42", "42.0", "4.2e1"} {
		if code := send(t, tester, "/", id(v), jsonType...); code != http.StatusOK {
			t.Fatalf("%s: %d, want 200", v, code)
		}
	}
	for _, v := range []string{"420e-1", `"42"`, "42." + strings.Repeat("0", 5000), "0.42E+2", "4200000e-5"} {
		if code := send(t, tester, "/", id(v), jsonType...); code != http.StatusTooManyRequests {
			t.Fatalf("%.20s…: %d, want 429 (the 4th request of user 42)", v, code)
		}
	}
	if code := send(t, tester, "/", id("43"), jsonType...); code != http.StatusOK {
		t.Fatalf("user 43: %d, want 200", code)
	}
	// Huge exponents cost no time or memory, and all overflow to one key.
	start := time.Now()
	for i, v := range []string{"1e999999999", "1E+99999999999999999999", "2e400", "1e999999999"} {
		code := send(t, tester, "/", id(v), jsonType...)
		if want := map[bool]int{true: http.StatusOK, false: http.StatusTooManyRequests}[i < 3]; code != want {
			t.Fatalf("%s: %d, want %d", v, code, want)
		}
	}
	if elapsed := time.Since(start); elapsed > 2*time.Second {
		t.Fatalf("four huge exponents took %v", elapsed)
	}
}

// `by body <field>` reads the field from a JSON body or a form, as the
// Content-Type says: a login in any of them is one user. Any other type is
// unreadable: counted under one shared quota, never skipped.
func TestByBodyLoginAnyContentType(t *testing.T) {
	tester := newTester(t, caddyfileServer(`
	rate_limit {
		zone login_body {
			match {
				path /login
			}
			by body username
			normalize trim
			normalize lower
			rate 4/15m
		}
		zone login_body_skip {
			match {
				path /login-skip
			}
			by body username
			missing skip
			rate 2/15m
		}
	}
	respond "ok"`), "caddyfile")
	mp, mpType := multipartBody(t, "username", "RAKIB", "password", "x")
	spellings := []struct {
		name string
		body []byte
		ct   string
	}{
		{"JSON", []byte(`{"username": "Rakib", "password": "x"}`), "application/json"},
		{"form", []byte("username=rakib&password=x"), formType},
		{"multipart", mp, mpType},
		{"escaped JSON key", []byte(`{"us\u0065rname": " rakib "}`), "application/json; charset=utf-8"},
	}
	for _, s := range spellings {
		if code := send(t, tester, "/login", s.body, "Content-Type", s.ct); code != http.StatusOK {
			t.Fatalf("%s: %d, want 200", s.name, code)
		}
	}
	for _, s := range spellings {
		if code := send(t, tester, "/login", s.body, "Content-Type", s.ct); code != http.StatusTooManyRequests {
			t.Fatalf("%s after 4 attempts: %d, want 429", s.name, code)
		}
	}
	if code := send(t, tester, "/login", []byte("username=ann"), "Content-Type", formType); code != http.StatusOK {
		t.Fatalf("another user: %d, want 200", code)
	}
	// text/plain: whatever the application makes of it, it is not a
	// fresh key per request.
	for _, path := range []string{"/login", "/login-skip"} {
		passed := 0
		for i := 0; i < 10; i++ {
			body := fmt.Sprintf("username=victim%d", i)
			if send(t, tester, path, []byte(body), "Content-Type", "text/plain") == http.StatusOK {
				passed++
			}
		}
		if limit := map[string]int{"/login": 4, "/login-skip": 2}[path]; passed != limit {
			t.Fatalf("%s: %d of 10 text/plain logins passed, want %d (one shared quota)", path, passed, limit)
		}
	}
	for i := 0; i < 5; i++ {
		if code := send(t, tester, "/login-skip", []byte(`{"password": "x"}`), "Content-Type", "application/json"); code != http.StatusOK {
			t.Fatalf("absent username under skip: %d, want 200", code)
		}
	}
}

// A form field in another spelling that applications read as the field
// (ASP.NET ignores case, PHP reads "user.name" as "user_name") is the
// field, and two spellings of it are ambiguous: PHP keeps the last one,
// so "user_name=junkN&user.name=victim" is the victim there.
func TestFormFieldSpellingsDoNotBypass(t *testing.T) {
	tester := newTester(t, caddyfileServer(`
	rate_limit {
		zone form_spellings {
			by form user_name
			missing skip
			rate 2/1h
		}
	}
	respond "ok"`), "caddyfile")
	passed := 0
	for i := 0; i < 10; i++ {
		body := fmt.Sprintf("user_name=junk%d&user.name=victim", i)
		if send(t, tester, "/", []byte(body), "Content-Type", formType) == http.StatusOK {
			passed++
		}
	}
	if passed != 2 {
		t.Fatalf("%d of 10 requests naming the field twice passed; they must share one quota of 2", passed)
	}
	for i, body := range []string{"USER.NAME=ann", "user+name=ann", "user_name=ann"} {
		want := map[bool]int{true: http.StatusOK, false: http.StatusTooManyRequests}[i < 2]
		if code := send(t, tester, "/", []byte(body), "Content-Type", formType); code != want {
			t.Fatalf("%s: %d, want %d", body, code, want)
		}
	}
}

// body_limit has one cap, 16MiB, in JSON and in the Caddyfile: a JSON
// body_limit of 9e18 would let a 150 MiB body take RSS from 54 to 416 MB.
func TestBodyLimitCappedAlike(t *testing.T) {
	tester := newTester(t, jsonServer(okHandler, ""), "json")
	jsonCfg := func(limit string) string {
		return jsonServer(`{"handler": "rate_limit", "body_limit": `+limit+`, "rate_limits": {"cfg_body": {"key": "{http.request.body.json.user}", "window": "1m", "max_events": 2}}}, `+okHandler, "")
	}
	for _, limit := range []string{"9e18", "9000000000000000000", "1073741824", "16777217"} {
		if code, body := loadRaw(t, jsonCfg(limit)); code == http.StatusOK || !strings.Contains(body, "body_limit must be from 1 to 16777216 bytes (16MiB)") {
			t.Errorf("JSON body_limit %s: /load answered %d %q, want it refused naming the cap", limit, code, body)
		}
	}
	site := func(limit string) string {
		return caddyfileServer(`	rate_limit {
		body_limit ` + limit + `
		zone cfg_body_cf {
			by json user
			rate 2/1m
		}
	}
	respond "ok"`)
	}
	for _, limit := range []string{"1GiB", "16777217", "17MB"} {
		assertLoadError(t, site(limit), "caddyfile", "at most 16MiB (16777216 bytes)")
	}
	// At the cap, both load, and a field within the cap still keys.
	loadConfig(t, jsonCfg("16777216"), "json")
	loadConfig(t, site("16MiB"), "caddyfile")
	big := `{"user": "ann", "pad": "` + strings.Repeat("x", 1<<20) + `"}`
	for i := 0; i < 2; i++ {
		if code, _ := post(t, tester, "/", "application/json", big); code != http.StatusOK {
			t.Fatalf("request %d of a 1MiB body: %d", i+1, code)
		}
	}
	if code, _ := post(t, tester, "/", "application/json", big); code != http.StatusTooManyRequests {
		t.Fatalf("third request of the same user: %d, want 429", code)
	}
}

// A body-keyed zone hands the upstream the body it received, byte for
// byte, whether it read it all, or it was over the read limit.
func TestBodyReachesUpstreamUntouched(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		sum := sha256.Sum256(b)
		fmt.Fprintf(w, "%d %s %s", len(b), hex.EncodeToString(sum[:]), r.Header.Get("Content-Type"))
	}))
	defer upstream.Close()
	tester := newTester(t, caddyfileServer(`
	rate_limit {
		zone body_key {
			by json user.id
			rate 100/1m
		}
		zone form_key {
			match {
				path /form
			}
			by form email
			normalize email
			rate 100/1m
		}
	}
	reverse_proxy `+strings.TrimPrefix(upstream.URL, "http://")), "caddyfile")

	big := make([]byte, 200<<10)
	_, _ = rand.Read(big)
	bodies := []struct{ ctype, body string }{
		{"application/json", `{"user": {"id": 42}, "note": "héllo"}`},
		{"application/json", `{"user": {"id": 42}, "pad": "` + hex.EncodeToString(big) + `"}`},
		{"application/octet-stream", string(big)},
		{"application/x-www-form-urlencoded", "email=A%40B.co&x=1"},
	}
	for i, b := range bodies {
		path := "/json"
		if strings.Contains(b.ctype, "form") {
			path = "/form"
		}
		code, got := post(t, tester, path, b.ctype, b.body)
		sum := sha256.Sum256([]byte(b.body))
		want := fmt.Sprintf("%d %s %s", len(b.body), hex.EncodeToString(sum[:]), b.ctype)
		if code != http.StatusOK || got != want {
			t.Fatalf("body %d (%d bytes): upstream saw %q, want %q", i, len(b.body), got, want)
		}
	}
}

// A cost read from the body: the units the request says it uses.
func TestCostFromBody(t *testing.T) {
	tester := newTester(t, caddyfileServer(`
	rate_limit {
		zone body_cost {
			key static
			rate 10/1h
			algorithm token_bucket
			cost {http.request.body.json.n}
		}
	}
	respond "ok"`), "caddyfile")
	if code, _ := post(t, tester, "/", "application/json", `{"n": 5}`); code != http.StatusOK {
		t.Fatalf("cost 5: %d", code)
	}
	if code, _ := post(t, tester, "/", "application/json", `{"n": 6}`); code != http.StatusTooManyRequests {
		t.Fatalf("cost 6 with 5 left: %d, want 429", code)
	}
	if code, _ := post(t, tester, "/", "application/json", `{"n": "abc"}`); code != http.StatusBadRequest {
		t.Fatalf("cost abc: %d, want 400", code)
	}
	if code, _ := post(t, tester, "/", "application/json", `{"n": 5}`); code != http.StatusOK {
		t.Fatalf("cost 5 with 5 left: %d", code)
	}
}

// rawMultipart is a multipart/form-data body of parts given as their
// Content-Disposition and value, written by hand: mime/multipart cannot
// write the parameters these tests need.
func rawMultipart(parts ...string) ([]byte, string) {
	const boundary = "formboundary"
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
// to a plain `phone` part holding a fresh number, would be a fresh key each
// time to a limiter that reads it as Go does, while Flask's
// request.form["phone"] (the first copy) and multer's req.body.phone read
// the victim: 20 of 20 would pass a limit of 3, under any missing policy. RFC 7578 forbids extended parameters in
// form-data, so such a body is unreadable: all of them share one quota.
func TestMultipartExtendedNameIsUnreadable(t *testing.T) {
	tester := newTester(t, caddyfileServer(`
	rate_limit {
		zone multipart_deny {
			match {
				path /otp
			}
			by form phone
			normalize phone BD
			rate 3/1h
		}
		zone multipart_skip {
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

// A JSON body whose charset is spelled "utf8" is UTF-8 to every decoder:
// it is read, not refused as unreadable.
func TestJSONCharsetUTF8Spelling(t *testing.T) {
	tester := newTester(t, caddyfileServer(`
	rate_limit {
		zone json_utf8 {
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
