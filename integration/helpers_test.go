// Package integration drives Sluice through a real Caddy: in-process with
// caddytest, and as the binary that `go build ./cmd/caddy` produces.
package integration

import (
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddytest"

	_ "github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
)

// The ports of the in-process Caddy: free loopback ports picked when the
// test binary starts, so that several test runs (several checkouts) share a
// machine. SLUICE_TEST_ADMIN_PORT and SLUICE_TEST_HTTP_PORT fix them
// instead. The HTTP port's successor is used too, by tests that need a
// second site. caddytest needs the admin port before Caddy starts, so it
// cannot be Caddy's own choice (port 0).
var (
	adminPort = envPort("SLUICE_TEST_ADMIN_PORT", 1)
	httpPort  = envPort("SLUICE_TEST_HTTP_PORT", 2)
	adminAddr = "localhost:" + strconv.Itoa(adminPort)
	httpBase  = "http://localhost:" + strconv.Itoa(httpPort)
)

// envPort is the port the variable name sets, or the first of n
// consecutive free loopback ports.
func envPort(name string, n int) int {
	if p, err := strconv.Atoi(os.Getenv(name)); err == nil && p > 0 && p < 65535 {
		return p
	}
	for range 100 {
		if p, ok := freePorts(n); ok {
			return p
		}
	}
	panic("integration: no free loopback ports")
}

// freePorts finds n consecutive free loopback ports and returns the first.
// They are picked below the kernel's ephemeral range: a port from that
// range (what listening on port 0 gives) is free when picked, but any
// outgoing connection of the tests (to Redis, to Caddy itself) may take it
// as its local port before a Caddy listens on it ("address already in
// use").
func freePorts(n int) (int, bool) {
	low := redistest.EphemeralLow()
	if low < 10000+n {
		return 0, false
	}
	first := 10000 + rand.IntN(low-10000-n)
	for p := first; p < first+n; p++ {
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			return 0, false
		}
		defer l.Close()
	}
	return first, true
}

// withPorts rewrites a config written for the default ports (admin 2999,
// HTTP 9080 and 9081) to the ports in use, binding loopback only (a
// Caddyfile's sites through default_bind, from its http_port line).
func withPorts(cfg string) string {
	return strings.NewReplacer(
		"localhost:2999", adminAddr,
		"\"listen\": [\":9080\"]", "\"listen\": [\"127.0.0.1:"+strconv.Itoa(httpPort)+"\"]",
		"http_port 9080", "http_port "+strconv.Itoa(httpPort)+"\n\tdefault_bind 127.0.0.1",
		"localhost:9080", "localhost:"+strconv.Itoa(httpPort),
		"9080", strconv.Itoa(httpPort),
		"9081", strconv.Itoa(httpPort+1),
	).Replace(cfg)
}

// jsonServer wraps handlers in a config that serves them on :9080 with the
// admin API where caddytest expects it. errors, when not empty, are the
// server's error routes.
func jsonServer(handlers string, errorRoutes string) string {
	cfg := `{
	"admin": {"listen": "` + adminAddr + `"},
	"logging": {"logs": {"default": {"level": "ERROR"}}},
	"apps": {"http": {"http_port": 9080, "servers": {"srv": {
		"listen": [":9080"],
		"metrics": {},
		"routes": [{"handle": [` + handlers + `]}]`
	if errorRoutes != "" {
		cfg += `,
		"errors": {"routes": ` + errorRoutes + `}`
	}
	return withPorts(cfg + `
	}}}}
}`)
}

// caddyfileServer is a Caddyfile serving site on :9080 with the admin API
// where caddytest expects it.
func caddyfileServer(site string) string { return caddyfileServerWith("", site) }

// caddyfileServerWith adds global options (such as a servers block).
func caddyfileServerWith(globals, site string) string {
	return withPorts(`{
	skip_install_trust
	admin localhost:2999
	http_port 9080
` + globals + `
}
:9080 {
` + site + `
}`)
}

// okHandler answers 200 "ok" behind the rate limiter.
const okHandler = `{"handler": "static_response", "status_code": 200, "body": "ok"}`

func newTester(t *testing.T, cfg, kind string) *caddytest.Tester {
	t.Helper()
	tester := caddytest.NewTester(t).WithDefaultOverrides(caddytest.Config{AdminPort: adminPort})
	unloadZones(t)
	tester.InitServer(withPorts(cfg), kind)
	return tester
}

// unloadZones loads a config without zones into the running Caddy, if one
// runs, so that the test about to start has fresh state however often it
// runs in one process (go test -count=N): zones of one name keep their
// state across configs, and Caddy does not even reload a config that is
// unchanged.
func unloadZones(t *testing.T) {
	t.Helper()
	resp, err := http.Get("http://" + adminAddr + "/config/")
	if err != nil {
		return // Caddy is not running yet: caddytest starts it, empty
	}
	resp.Body.Close()
	adminRequest(t, "POST", "/load", "application/json", `{"admin": {"listen": "`+adminAddr+`"}}`)
}

// do sends a request and returns status, Retry-After and body.
func do(t *testing.T, tester *caddytest.Tester, method, path string, header ...string) (int, string, string) {
	t.Helper()
	r := fetch(t, tester, method, path, header...)
	return r.code, r.header.Get("Retry-After"), r.body
}

// expectN sends n requests that must all get status want.
func expectN(t *testing.T, tester *caddytest.Tester, n, want int, method, path string, header ...string) {
	t.Helper()
	for i := 0; i < n; i++ {
		if got, _, body := do(t, tester, method, path, header...); got != want {
			t.Fatalf("%s %s #%d: status %d (%q), want %d", method, path, i+1, got, body, want)
		}
	}
}

// expect429 sends one request that must be denied with a Retry-After in
// [lo, hi] seconds.
func expect429(t *testing.T, tester *caddytest.Tester, lo, hi int, method, path string, header ...string) string {
	t.Helper()
	code, ra, body := do(t, tester, method, path, header...)
	if code != http.StatusTooManyRequests {
		t.Fatalf("%s %s: status %d (%q), want 429", method, path, code, body)
	}
	secs, err := strconv.Atoi(ra)
	if err != nil || secs < lo || secs > hi {
		t.Fatalf("%s %s: Retry-After %q, want whole seconds in [%d, %d]", method, path, ra, lo, hi)
	}
	return body
}

// adminRequest calls the admin API and fails the test on an error status.
func adminRequest(t *testing.T, method, path, contentType, body string) string {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+adminAddr+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Close = true // a /load replaces the admin server: never reuse a connection to it
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s %s: %d %s", method, path, resp.StatusCode, out)
	}
	return string(out)
}

// assertLoadError loads cfg (of kind "json" or "caddyfile") into the
// in-process Caddy, on the ports in use, and requires it to be refused with
// an error containing want.
func assertLoadError(t *testing.T, cfg, kind, want string) {
	t.Helper()
	newTester(t, jsonServer(okHandler, ""), "json") // a running Caddy to load into
	ctype := "application/json"
	if kind == "caddyfile" {
		ctype = "text/caddyfile"
	}
	req, err := http.NewRequest("POST", "http://"+adminAddr+"/load", strings.NewReader(withPorts(cfg)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", ctype)
	req.Close = true
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	if resp.StatusCode == http.StatusOK {
		t.Fatalf("config loaded, want an error containing %q", want)
	}
	if !strings.Contains(string(out), want) {
		t.Fatalf("load error %q does not contain %q", out, want)
	}
}
