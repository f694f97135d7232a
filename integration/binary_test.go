package integration

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testport"
)

const caddyBinEnv = "SLUICE_TEST_CADDY"

var (
	buildOnce sync.Once
	caddyBin  string
	buildErr  error
)

// binary builds ./cmd/caddy once per test run, the way the README says,
// and with -race when this test binary has it: the packages are then the
// ones the test build just compiled (Caddy and its standard modules, over a
// thousand), and only the link is new. Without it, `go test -race ./...`
// compiled Caddy a second time, without the race detector.
//
// SLUICE_TEST_CADDY names a binary built so already, for test processes
// that run at once (make test): each would build its own.
func binary(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs the caddy binary")
	}
	buildOnce.Do(func() {
		if caddyBin = os.Getenv(caddyBinEnv); caddyBin != "" {
			return
		}
		dir, err := os.MkdirTemp("", "sluice-bin")
		if err != nil {
			buildErr = err
			return
		}
		caddyBin = filepath.Join(dir, "caddy")
		args := []string{"build", "-o", caddyBin}
		if raceEnabled {
			args = append(args, "-race")
		}
		out, err := exec.Command("go", append(args, "../cmd/caddy")...).CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build ./cmd/caddy: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return caddyBin
}

func runCaddy(t *testing.T, args ...string) (string, error) {
	t.Helper()
	out, err := exec.Command(binary(t), args...).CombinedOutput()
	return string(out), err
}

// freePort is a loopback port no other test process takes (see
// internal/testport).
func freePort(t *testing.T) int {
	t.Helper()
	p, err := testport.Free(1, false)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestBinaryListsModule(t *testing.T) {
	out, err := runCaddy(t, "list-modules")
	if err != nil || !strings.Contains(out, "http.handlers.rate_limit") {
		t.Fatalf("list-modules: %v\n%s", err, out)
	}
}

func TestBinaryValidatesExample(t *testing.T) {
	out, err := runCaddy(t, "validate", "--config", "../Caddyfile.example", "--adapter", "caddyfile")
	if err != nil {
		t.Fatalf("caddy validate Caddyfile.example: %v\n%s", err, out)
	}
}

// Config errors surface at `caddy validate`, naming the zone and field.
func TestBinaryValidateRejects(t *testing.T) {
	tests := []struct{ zone, want string }{
		{`"window": "1m", "max_events": 0`, `zone "login": max_events must be at least 1, got 0`},
		{`"window": "0s", "max_events": 5`, `zone "login": window must be positive`},
		{`"window": "1m", "max_events": 5, "algorithm": "token_bucket", "burst": -2`, `zone "login": burst must be at least 1, got -2`},
		{`"window": "1m", "max_events": 5, "algorithm": "fastest"`, `zone "login": unknown algorithm "fastest"`},
		{`"window": "1m", "max_events": 5, "ipv6_prefix": 200`, `zone "login": ipv6_prefix must be between 0 and 128, got 200`},
	}
	for _, tt := range tests {
		cfg := `{"apps": {"http": {"servers": {"s": {"listen": [":0"], "routes": [{"handle": [{"handler": "rate_limit", "rate_limits": {"login": {` + tt.zone + `}}}]}]}}}}}`
		file := filepath.Join(t.TempDir(), "caddy.json")
		if err := os.WriteFile(file, []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
		out, err := runCaddy(t, "validate", "--config", file)
		// The error is logged as JSON, with its quotes escaped.
		out = strings.ReplaceAll(out, `\"`, `"`)
		if err == nil || !strings.Contains(out, tt.want) {
			t.Errorf("caddy validate: err=%v, output lacks %q:\n%s", err, tt.want, out)
		}
	}
}

func TestBinaryAdaptsExample(t *testing.T) {
	out, err := runCaddy(t, "adapt", "--config", "../Caddyfile.example")
	if err != nil {
		t.Fatalf("caddy adapt: %v\n%s", err, out)
	}
	var cfg map[string]any
	if err := json.Unmarshal([]byte(out[strings.Index(out, "{"):]), &cfg); err != nil {
		t.Fatalf("adapt output is not JSON: %v", err)
	}
	if !strings.Contains(out, `"handler":"rate_limit"`) || !strings.Contains(out, `"max_events":5`) {
		t.Fatalf("adapted JSON lacks the rate_limit handler:\n%s", out)
	}
}

// The quick start: Caddy runs Caddyfile.example and limits as it says.
func TestBinaryRunsExample(t *testing.T) {
	example, err := os.ReadFile("../Caddyfile.example")
	if err != nil {
		t.Fatal(err)
	}
	httpPort, adminPort := freePort(t), freePort(t)
	cfg := strings.NewReplacer(
		"localhost:2019", "localhost:"+strconv.Itoa(adminPort),
		"8080", strconv.Itoa(httpPort),
		"auto_https off", "auto_https off\n\tdefault_bind 127.0.0.1", // loopback only
	).Replace(string(example))
	file := filepath.Join(t.TempDir(), "Caddyfile")
	if err := os.WriteFile(file, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	startCaddy(t, file)
	base := fmt.Sprintf("http://127.0.0.1:%d", httpPort)
	waitUp(t, base+"/")

	get := func(method, path string) (int, http.Header, string) {
		req, _ := http.NewRequest(method, base+path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header, string(body)
	}
	for i := 0; i < 5; i++ {
		if code, _, body := get("GET", "/api/items"); code != 200 {
			t.Fatalf("request %d: %d %q", i+1, code, body)
		}
	}
	code, hdr, body := get("GET", "/api/items")
	if code != 429 || hdr.Get("Retry-After") != "10" || hdr.Get("Content-Type") != "application/json" {
		t.Fatalf("6th request: %d Retry-After=%q Content-Type=%q", code, hdr.Get("Retry-After"), hdr.Get("Content-Type"))
	}
	var page struct {
		Error      string `json:"error"`
		Zone       string `json:"zone"`
		RetryAfter int    `json:"retry_after"`
	}
	if err := json.Unmarshal([]byte(body), &page); err != nil || page.Zone != "api_per_client" || page.RetryAfter != 10 {
		t.Fatalf("429 body %q: %+v %v", body, page, err)
	}
	// Spellings of the login route that some upstream reads as /login share
	// the zone's 3 attempts.
	for _, path := range []string{"/login", "/login/", "/login;a"} {
		if code, _, _ := get("POST", path); code != 200 {
			t.Fatalf("login at %s: %d", path, code)
		}
	}
	code, hdr, _ = get("POST", "/login%2F")
	ra, _ := strconv.Atoi(hdr.Get("Retry-After"))
	if code != 429 || ra < 60 || ra > 66 {
		t.Fatalf("4th login: %d Retry-After %q, want 429 with 60–66 (jitter 0.1)", code, hdr.Get("Retry-After"))
	}
	if code, _, _ := get("GET", "/login"); code != 200 {
		t.Fatalf("GET /login is not in the login zone, got %d", code)
	}
}

func waitUp(t *testing.T, url string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%s did not come up", url)
}

// startCaddy runs the built binary on a config file until the test ends,
// with env added to its environment; a failed test shows its output. It
// returns the process, for tests that kill it.
func startCaddy(t *testing.T, file string, env ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(binary(t), "run", "--config", file)
	cmd.Env = append(os.Environ(), env...)
	startCaddyCmd(t, cmd, file)
	return cmd
}

// startCaddyCmd starts cmd, a Caddy running file, until the test ends,
// and returns its output, which grows while Caddy runs.
func startCaddyCmd(t *testing.T, cmd *exec.Cmd, file string) *lockedBuilder {
	t.Helper()
	logs := &lockedBuilder{}
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("caddy output (%s):\n%s", file, logs.String())
		}
	})
	return logs
}

type lockedBuilder struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuilder) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuilder) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
