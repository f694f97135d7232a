// Package integration drives Sluice through a real Caddy: in-process with
// caddytest, and as the binary that `go build ./cmd/caddy` produces.
package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddytest"
	_ "github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/testport"
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
// consecutive loopback ports no other test process takes (internal/testport).
func envPort(name string, n int) int {
	if p, err := strconv.Atoi(os.Getenv(name)); err == nil && p > 0 && p < 65535 {
		return p
	}
	p, err := testport.Free(n, false)
	if err != nil {
		panic("integration: " + err.Error())
	}
	return p
}

// withPorts rewrites a config written for the default ports (admin 2999,
// HTTP 9080 and 9081) to the ports in use, binding loopback only (a
// Caddyfile's sites through default_bind, from its http_port line). A
// default port is rewritten only as a whole number: an upstream's
// ephemeral port (127.0.0.1:49081) or a port this already wrote (19080)
// stays as it is, so that a config may pass through here twice.
func withPorts(cfg string) string {
	return defaultPorts.ReplaceAllStringFunc(cfg, func(m string) string {
		switch m {
		case "localhost:2999":
			return adminAddr
		case `"listen": [":9080"]`:
			return `"listen": ["127.0.0.1:` + strconv.Itoa(httpPort) + `"]`
		case "http_port 9080":
			return "http_port " + strconv.Itoa(httpPort) + "\n\tdefault_bind 127.0.0.1"
		case "9080":
			return strconv.Itoa(httpPort)
		}
		return strconv.Itoa(httpPort + 1)
	})
}

var defaultPorts = regexp.MustCompile(`\blocalhost:2999\b|"listen": \[":9080"\]|\bhttp_port 9080\b|\b908[01]\b`)

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

// newTester loads cfg (of kind "json" or a config adapter's name) into the
// in-process Caddy, started by caddytest on the first call, after a config
// without zones (see unloadZones).
func newTester(t *testing.T, cfg, kind string) *caddytest.Tester {
	t.Helper()
	tester := caddytest.NewTester(t).WithDefaultOverrides(caddytest.Config{AdminPort: adminPort, TestRequestTimeout: 30 * time.Second})
	tester.Client.Transport = testerTransport
	if !caddyStarted {
		// caddytest's load marks the test failed and goes on when the
		// config is refused: stop here instead, where the cause is logged.
		failed := t.Failed()
		tester.InitServer(withPorts(cfg), kind)
		caddyStarted = true
		if !failed && t.Failed() {
			t.FailNow()
		}
		settle(t, 1)
		return tester
	}
	unloadZones(t)
	loadConfig(t, cfg, kind)
	return tester
}

var (
	// caddyStarted is whether caddytest started the in-process Caddy.
	// Later configs are loaded here rather than by caddytest, which sends
	// its /load once and, when it finds no admin API (a connection reset
	// by an admin server on its way out), starts a second Caddy in the
	// process.
	caddyStarted bool
	// testerTransport is the transport of every test's caddytest client,
	// shared so that settle can drop their idle connections.
	testerTransport = caddytest.CreateTestingTransport()
)

// unloadZones loads a config without zones into the running Caddy, so
// that the test about to start has fresh state however often it runs in
// one process (go test -count=N): zones of one name keep their state
// across configs, and Caddy does not even reload a config that is
// unchanged. It returns once the previous test's sites stopped listening.
func unloadZones(t *testing.T) {
	t.Helper()
	loadConfigAllowing(t, `{"admin": {"listen": "`+adminAddr+`"}}`, "json", 0)
}

// loadConfig loads cfg (of kind "json" or a config adapter's name) into
// the running Caddy, as a reload: the zones it keeps keep their state.
func loadConfig(t testing.TB, cfg, kind string) {
	t.Helper()
	loadConfigAllowing(t, cfg, kind, 1)
}

func loadConfigAllowing(t testing.TB, cfg, kind string, httpListeners int) {
	t.Helper()
	ctype := "application/json"
	if kind != "json" {
		ctype = "text/" + kind
	}
	if code, out := adminSend(t, "http://"+adminAddr, "POST", "/load", ctype, withPorts(cfg)); code != http.StatusOK {
		t.Fatalf("POST /load: %d %s", code, out)
	}
	settle(t, httpListeners)
}

// adminSend sends one request to the admin API at base and returns its
// status and body. Caddy replaces its admin server on every config change
// and stops the old one in the background, after answering: both listen
// on the port for a moment (SO_REUSEPORT), and a connection the kernel
// queued for the old one is reset, unanswered, when its listener closes.
// Such a request never reached Caddy, so it is sent again.
func adminSend(t testing.TB, base, method, path, contentType, body string) (int, string) {
	t.Helper()
	var err error
	for range 20 {
		req, rerr := http.NewRequest(method, base+path, strings.NewReader(body))
		if rerr != nil {
			t.Fatal(rerr)
		}
		req.Close = true // never reuse a connection to an admin server that may be on its way out
		if contentType != "" {
			req.Header.Set("Content-Type", contentType)
		}
		var resp *http.Response
		if resp, err = http.DefaultClient.Do(req); err == nil {
			out, rerr := io.ReadAll(resp.Body)
			resp.Body.Close()
			if rerr != nil { // answered: the request was handled, do not send it twice
				t.Fatalf("%s %s: reading the answer: %v", method, path, rerr)
			}
			return resp.StatusCode, string(out)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%s %s: %v", method, path, err)
	return 0, ""
}

// settle waits, after a config change, until the old config's servers
// stopped listening: the admin port and the HTTP ports keep at most one
// listener each, and the HTTP ports at most httpListeners. Caddy starts
// the new servers before it stops the old ones, and stops them in the
// background, the old and new sharing each port meanwhile: a request sent
// then may be answered by the old config, or reset when the old listener
// closes with the connection still in its queue. Idle client connections,
// all to old servers now, are dropped so that no request is sent on one
// as the old server closes it.
func settle(t testing.TB, httpListeners int) {
	t.Helper()
	waitListeners(t, map[int]int{adminPort: 1, httpPort: httpListeners, httpPort + 1: httpListeners})
	http.DefaultClient.CloseIdleConnections()
	testerTransport.CloseIdleConnections()
	slotClient.CloseIdleConnections()
}

// waitListeners waits until each port of most has at most that many
// listening sockets.
func waitListeners(t testing.TB, most map[int]int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		got, ok := listeners(most)
		if !ok {
			return // no /proc/net/tcp: nothing to wait on
		}
		busy := ""
		for port, n := range most {
			if got[port] > n {
				busy += fmt.Sprintf(" port %d has %d listeners, want at most %d;", port, got[port], n)
			}
		}
		if busy == "" {
			return
		}
		if time.Now().After(deadline) {
			// Another process listening on the port (SO_REUSEPORT lets
			// processes of one user share it) stays too.
			t.Fatalf("30s after a config change:%s the old servers never closed", busy)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// listeners counts the listening TCP sockets on each port of ports, from
// /proc/net/tcp and tcp6; ok is false without them (not Linux). The kernel
// lists listening sockets first: reading stops at the first other one,
// before the thousands of connections a flood leaves in TIME_WAIT.
func listeners(ports map[int]int) (map[int]int, bool) {
	got := map[int]int{}
	for _, name := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		f, err := os.Open(name)
		if err != nil {
			return nil, false
		}
		sc := bufio.NewScanner(f)
		sc.Scan() // the header
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) < 4 || fields[3] != "0A" { // TCP_LISTEN
				break
			}
			_, hexPort, _ := strings.Cut(fields[1], ":")
			if port, err := strconv.ParseUint(hexPort, 16, 16); err == nil {
				if _, ok := ports[int(port)]; ok {
					got[int(port)]++
				}
			}
		}
		f.Close()
	}
	return got, true
}

// waitInLine waits until n requests of the in-process Caddy wait in the
// line of a concurrency queue (in memory or shared through Redis). Nothing
// a client sees tells that a request got in line, or left it when its
// client went away: the requests' goroutines are looked for in this
// process's stacks instead.
func waitInLine(t *testing.T, n int, what string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := inLine()
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d requests in line after 10s, want %d", what, got, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func inLine() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	count := 0
	for g := range strings.SplitSeq(string(buf), "\n\n") {
		// The functions a request waits in for its slot, in this
		// process and in a backend's shared slots.
		if strings.Contains(g, "internal/conc.(*Local).Await(") || strings.Contains(g, "internal/conc.(*Shared).await(") {
			count++
		}
	}
	return count
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
// A config change returns once the old config's servers are gone.
func adminRequest(t *testing.T, method, path, contentType, body string) string {
	t.Helper()
	code, out := adminSend(t, "http://"+adminAddr, method, path, contentType, body)
	if method != http.MethodGet && (strings.HasPrefix(path, "/load") || strings.HasPrefix(path, "/config")) {
		settle(t, 1)
	}
	if code != http.StatusOK {
		t.Fatalf("%s %s: %d %s", method, path, code, out)
	}
	return out
}

// assertLoadError checks that cfg (of kind "json" or a config adapter's
// name) is refused, with an error containing want, without a running Caddy
// or HTTP: the config is adapted and provisioned (caddy.Validate, as
// `caddy validate` does), and the error is written as the admin API's /load
// answers it (JSON, quotes escaped), so a want reads the same either way.
func assertLoadError(t *testing.T, cfg, kind, want string) {
	t.Helper()
	body := []byte(withPorts(cfg))
	var apiErr caddy.APIError
	if kind != "json" {
		adapted, warnings, err := caddyconfig.GetAdapter(kind).Adapt(body, nil)
		if err != nil {
			apiErr = caddy.APIError{Err: fmt.Errorf("adapting config using %s adapter: %v", kind, err), Warnings: warnings}
		}
		body = adapted
		apiErr.Warnings = warnings
	}
	if apiErr.Err == nil {
		var c caddy.Config
		err := caddy.StrictUnmarshalJSON(body, &c)
		if err == nil {
			err = caddy.Validate(&c)
		}
		if err == nil {
			t.Fatalf("config loaded, want an error containing %q", want)
		}
		apiErr.Err = fmt.Errorf("loading config: %v", err)
	}
	apiErr.Message = apiErr.Err.Error()
	var out strings.Builder
	if err := json.NewEncoder(&out).Encode(apiErr); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), want) {
		t.Fatalf("load error %q does not contain %q", out.String(), want)
	}
}

// send posts body with the given headers (a Content-Type among them, or
// none) and returns the status.
func send(t *testing.T, tester *caddytest.Tester, path string, body []byte, header ...string) int {
	t.Helper()
	req, _ := http.NewRequest("POST", httpBase+path, bytes.NewReader(body))
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Add(header[i], header[i+1])
	}
	resp, err := tester.Client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

const formType = "application/x-www-form-urlencoded"

// loadRaw posts cfg to the admin API's /load and returns the status and
// the error it gives (or the body).
func loadRaw(t *testing.T, cfg string) (int, string) {
	t.Helper()
	code, out := adminSend(t, "http://"+adminAddr, "POST", "/load", "application/json", withPorts(cfg))
	settle(t, 1)
	var e struct{ Error string }
	if json.Unmarshal([]byte(out), &e) == nil && e.Error != "" {
		return code, e.Error
	}
	return code, out
}

// countOK sends n requests and counts the 200s.
func countOK(t *testing.T, tester *caddytest.Tester, n int, header ...string) int {
	t.Helper()
	passed := 0
	for i := 0; i < n; i++ {
		if code, _, _ := do(t, tester, "GET", "/", header...); code == http.StatusOK {
			passed++
		}
	}
	return passed
}

// within waits for ch, failing the test rather than hanging it. The
// deadline is far beyond what anything waited for takes, even on a loaded
// machine: it only bounds a test that would hang.
func within(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(30 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
}

func get(ctx context.Context, header ...string) (*http.Response, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, httpBase+"/", nil)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	return resp, err
}

// eventuallyOK sends requests until one is served. A client may read its
// whole response a moment before the handler returns and frees its slot.
func eventuallyOK(t *testing.T, what string, header ...string) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		resp, err := get(context.Background(), header...)
		if err == nil && resp.StatusCode == http.StatusOK {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v %v", what, resp, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// response is one answer: status, headers, body.
type response struct {
	code   int
	header http.Header
	body   string
}

func fetch(t *testing.T, tester *caddytest.Tester, method, path string, header ...string) response {
	t.Helper()
	req, err := http.NewRequest(method, httpBase+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := tester.Client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return response{resp.StatusCode, resp.Header, string(body)}
}

// freshZone is a zone name no earlier run of a test in this process used:
// zones of one name share their state, and a queue left full by one run
// would change the next (go test -count=20).
func freshZone(prefix string) string {
	return fmt.Sprintf("%s_%d", prefix, zoneRuns.Add(1))
}

func grep(text, word string) string {
	var out []string
	for _, line := range strings.Split(text, "\n") {
		if strings.Contains(line, word) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}

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

// status sends GET / to base with the header pairs and returns the status
// (0 on a transport error).
func status(ctx context.Context, base string, header ...string) int {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/", nil)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := slotClient.Do(req)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// metricLine is the value of the series written exactly as series (name
// and labels) on a /metrics page, or -1 when it is not there.
func metricLine(page, series string) float64 {
	for _, line := range strings.Split(page, "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			if f, err := strconv.ParseFloat(v, 64); err == nil {
				return f
			}
		}
	}
	return -1
}

// eventually polls cond every 10 ms for up to 10 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}

// untilMidnightUTC waits out the end of the UTC day when it is less than
// margin away, so that a test of day-long fixed windows runs inside one
// window, and returns the seconds left in the day.
func untilMidnightUTC(margin time.Duration) time.Duration {
	now := time.Now().UTC()
	left := now.Truncate(24 * time.Hour).Add(24 * time.Hour).Sub(now)
	if left < margin {
		time.Sleep(left + 100*time.Millisecond)
		left = 24*time.Hour - 100*time.Millisecond
	}
	return left
}

// flood sends perKey requests of the given cost (header X-Cost) for each of
// n keys (prefix + index, header X-Key), from workers goroutines over
// kept-alive connections; every request must pass.
func flood(t *testing.T, path, prefix string, n, perKey int, cost string, workers int) {
	t.Helper()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: workers}, Timeout: 10 * time.Second}
	var next atomic.Int64
	var failed atomic.Value
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1)
				if i > int64(n) {
					return
				}
				for j := 0; j < perKey; j++ {
					req, _ := http.NewRequest("GET", httpBase+path, nil)
					req.Header.Set("X-Key", fmt.Sprint(prefix, i))
					req.Header.Set("X-Cost", cost)
					resp, err := client.Do(req)
					if err != nil {
						failed.Store(err.Error())
						return
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != http.StatusOK {
						failed.Store(fmt.Sprintf("%s %s%d #%d: status %d", path, prefix, i, j+1, resp.StatusCode))
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	if msg := failed.Load(); msg != nil {
		t.Fatal(msg)
	}
}

// metricValue reads the value of name{scope="",zone=zone} from a /metrics
// page; -1 when it is absent.
func metricValue(page, name, zone string) float64 {
	prefix := fmt.Sprintf(`%s{scope="",zone=%q} `, name, zone)
	for _, line := range strings.Split(page, "\n") {
		if v, ok := strings.CutPrefix(line, prefix); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err == nil {
				return f
			}
		}
	}
	return -1
}

// count sends n requests and counts the answers by status.
func count(t *testing.T, tester *caddytest.Tester, n int, header ...string) map[int]int {
	t.Helper()
	got := map[int]int{}
	for range n {
		got[fetch(t, tester, "GET", "/", header...).code]++
	}
	return got
}

// grepLines returns the lines of text that hold both a and b.
func grepLines(text, a, b string) string {
	var out []string
	for line := range strings.SplitSeq(text, "\n") {
		if strings.Contains(line, a) && strings.Contains(line, b) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}

// A default port inside a longer number is not rewritten: an upstream on
// an ephemeral port such as 49081 stays where it is, and so does a port
// holding 9080 that withPorts already wrote (a config passes twice when a
// test builds it with jsonServer and loads it with newTester).
func TestWithPortsRewritesWholePortsOnly(t *testing.T) {
	defer func(p int) { httpPort = p }(httpPort)
	httpPort = 19080
	cfg := "{\n\thttp_port 9080\n}\n:9080 {\n\treverse_proxy 127.0.0.1:49081 127.0.0.1:39080\n}\n:9081 {\n}"
	want := "{\n\thttp_port 19080\n\tdefault_bind 127.0.0.1\n}\n:19080 {\n\treverse_proxy 127.0.0.1:49081 127.0.0.1:39080\n}\n:19081 {\n}"
	once := withPorts(cfg)
	if once != want {
		t.Fatalf("withPorts:\n%s\nwant:\n%s", once, want)
	}
	if twice := withPorts(once); twice != once {
		t.Fatalf("withPorts twice:\n%s\nwant:\n%s", twice, once)
	}
}

// postFull posts body and returns the whole answer.
func postFull(t *testing.T, tester *caddytest.Tester, path, body string, header ...string) response {
	t.Helper()
	req, err := http.NewRequest("POST", httpBase+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := tester.Client.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return response{resp.StatusCode, resp.Header, string(out)}
}

// wantStatus fails unless r has status code and, when lo > 0, a
// Retry-After in [lo, hi] seconds.
func wantStatus(t *testing.T, what string, r response, code, lo, hi int) {
	t.Helper()
	if r.code != code {
		t.Fatalf("%s: %d %q, want %d", what, r.code, r.body, code)
	}
	if lo == 0 {
		return
	}
	ra, err := strconv.Atoi(r.header.Get("Retry-After"))
	if err != nil || ra < lo || ra > hi {
		t.Fatalf("%s: Retry-After %q, want [%d, %d]", what, r.header.Get("Retry-After"), lo, hi)
	}
}
