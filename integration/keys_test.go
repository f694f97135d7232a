package integration

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddytest"
)

func post(t *testing.T, tester *caddytest.Tester, path, contentType, body string, header ...string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("POST", httpBase+path, strings.NewReader(body))
	req.Header.Set("Content-Type", contentType)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := tester.Client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(out)
}

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
	// bodies, which say which way it was wrong, are in contract_test.go).
	for _, bad := range []string{`{"mobile": "01712345678"}`, `{"phone": "hello"}`, `phone=01712345678`, `{"phone": "017", "phone": "018"}`} {
		if code, body := post(t, tester, "/otp/send", "application/json", bad); code != http.StatusBadRequest || strings.Contains(body, "phone") {
			t.Fatalf("body %s: %d %q; want 400 that does not show the key", bad, code, body)
		}
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
// "X-Api-Key: junkN" once passed every time).
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

// Two zones of one name in one config with different rates are refused
// at load (accepted, which rate applied to both changed from run to run).
func TestSameZoneNameTwoRatesRefused(t *testing.T) {
	assertLoadError(t, `{
	skip_install_trust
	admin localhost:2999
	http_port 9080
	https_port 9443
}
:9080 {
	rate_limit {
		zone twice {
			key {remote_host}
			rate 2/1h
		}
	}
	respond "a"
}
:9081 {
	rate_limit {
		zone twice {
			key {remote_host}
			rate 100/1h
		}
	}
	respond "b"
}`, "caddyfile", "defined twice in this config")
}
