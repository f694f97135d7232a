package integration

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddytest"
	"github.com/sluicehq/sluice/internal/redistest"
)

// adminConfig is a handler with zone name (3 per hour per X-User, lower
// cased, on backend), a scope counting the client address, and a body
// that a reload changes.
func adminConfig(name, backend, body string) string {
	return jsonServer(`{
		"handler": "rate_limit",`+backend+`
		"rate_limits": {"`+name+`": {
			"key": "{http.request.header.X-User}", "normalize": [{"name": "lower"}],
			"window": "1h", "max_events": 3,
			"scopes": {"ip": {"key": "{http.vars.client_ip}", "window": "1h", "max_events": 100}}
		}}
	}, {"handler": "static_response", "status_code": 200, "body": "`+body+`"}`, "")
}

// adminCall calls the admin API and returns the status and body.
func adminCall(t *testing.T, method, path string) (int, string) {
	t.Helper()
	return adminSend(t, "http://"+adminAddr, method, path, "", "")
}

type adminLimit struct {
	Zone, Scope, Key string
	Limit, Remaining int64
	ResetAfter       float64 `json:"reset_after"`
	RetryAfter       float64 `json:"retry_after"`
}

// keyOp calls a key operation that must succeed and returns its limits.
func keyOp(t *testing.T, method, path string) []adminLimit {
	t.Helper()
	code, body := adminCall(t, method, path)
	if code != http.StatusOK {
		t.Fatalf("%s %s: %d %s", method, path, code, body)
	}
	var v struct{ Limits []adminLimit }
	if err := json.Unmarshal([]byte(body), &v); err != nil {
		t.Fatalf("%s %s: %v in %s", method, path, err, body)
	}
	return v.Limits
}

func remaining(t *testing.T, name, key string) int64 {
	t.Helper()
	ls := keyOp(t, "GET", "/rate_limit/zones/"+name+"/keys/"+key)
	if len(ls) != 1 || ls[0].Scope != "" || ls[0].Key != strings.ToLower(key) {
		t.Fatalf("inspect %s: %+v, want the own limit of key %q only", key, ls, strings.ToLower(key))
	}
	return ls[0].Remaining
}

// testAdminAPI runs the operator's workflow on a zone through a real Caddy:
// inspecting does not consume, a grant gives back exactly N, a reset
// unblocks at once, a reload keeps what the API sees, bad input is refused.
func testAdminAPI(t *testing.T, name, backend string) *caddytest.Tester {
	tester := newTester(t, adminConfig(name, backend, "v1"), "json")
	user := []string{"X-User", "Bob"}
	expectN(t, tester, 1, http.StatusOK, "GET", "/", user...)
	for range 5 {
		if got := remaining(t, name, "BOB"); got != 2 {
			t.Fatalf("inspect: %d remaining, want 2", got)
		}
	}
	expectN(t, tester, 2, http.StatusOK, "GET", "/", user...) // inspecting took nothing
	expect429(t, tester, 3599, 3600, "GET", "/", user...)
	if ls := keyOp(t, "GET", "/rate_limit/zones/"+name+"/keys/bob"); ls[0].Remaining != 0 || ls[0].RetryAfter < 3599 || ls[0].RetryAfter > 3600 {
		t.Fatalf("spent key: %+v, want 0 remaining and retry_after ≈ 3600", ls[0])
	}

	if ls := keyOp(t, "POST", "/rate_limit/zones/"+name+"/keys/Bob/grant?units=2"); ls[0].Remaining != 2 {
		t.Fatalf("grant 2: %+v", ls)
	}
	expectN(t, tester, 2, http.StatusOK, "GET", "/", user...)
	expect429(t, tester, 3599, 3600, "GET", "/", user...)

	// A reload (a new body) keeps the state the API sees and changes.
	loadConfig(t, withPorts(adminConfig(name, backend, "v2")), "json")
	if got := remaining(t, name, "bob"); got != 0 {
		t.Fatalf("after a reload: %d remaining, want 0 (state kept)", got)
	}
	if ls := keyOp(t, "DELETE", "/rate_limit/zones/"+name+"/keys/bob"); ls[0].Remaining != 3 || ls[0].ResetAfter != 0 {
		t.Fatalf("reset: %+v, want a fresh key", ls)
	}
	expectN(t, tester, 3, http.StatusOK, "GET", "/", user...)
	expect429(t, tester, 3599, 3600, "GET", "/", user...)

	// The scope counts the client address: named, it is inspected alone.
	if ls := keyOp(t, "GET", "/rate_limit/zones/"+name+"/keys/127.0.0.1?scope=ip"); len(ls) != 1 || ls[0].Scope != "ip" || ls[0].Remaining != 100-8 {
		t.Fatalf("scope ip: %+v, want 92 of 100 left after 8 admitted requests (denied ones charge no limit)", ls)
	}
	// The final form is used as given.
	if ls := keyOp(t, "GET", "/rate_limit/zones/"+name+"/keys/BOB?form=final"); ls[0].Remaining != 3 {
		t.Fatalf("final form BOB (never normalized, never seen): %+v", ls)
	}

	for _, tc := range []struct {
		method, path string
		want         int
	}{
		{"GET", "/rate_limit/zones/no_such_zone/keys/bob", 404},
		{"GET", "/rate_limit/zones/" + name + "/keys/bob?scope=nope", 404},
		{"GET", "/rate_limit/nothing", 404},
		{"POST", "/rate_limit/zones/" + name + "/keys/bob/grant?units=0", 400},
		{"POST", "/rate_limit/zones/" + name + "/keys/bob/grant?units=-3", 400},
		{"POST", "/rate_limit/zones/" + name + "/keys/bob/grant?units=1e3", 400},
		{"POST", "/rate_limit/zones/" + name + "/keys/bob/grant?units=99999999999999999999", 400},
		{"POST", "/rate_limit/zones/" + name + "/keys/bob/grant?units=1&units=2", 400},
		{"POST", "/rate_limit/zones/" + name + "/keys/bob/grant", 400},
		{"GET", "/rate_limit/zones/" + name + "/keys/bob?units=2", 400},
		{"GET", "/rate_limit/zones/" + name + "/keys/bob?form=hashed", 400},
		{"GET", "/rate_limit/zones/" + name + "/keys/bob?zone=x", 400},
		{"GET", "/rate_limit/zones/" + name + "/keys/", 400},
		{"GET", "/rate_limit/zones/" + name + "/keys/not-an-ip?scope=ip", 200},
		{"PUT", "/rate_limit/zones/" + name + "/keys/bob", 405},
		{"GET", "/rate_limit/zones/" + name + "/keys/bob/grant?units=1", 405},
		{"DELETE", "/rate_limit/zones", 405},
	} {
		code, body := adminCall(t, tc.method, tc.path)
		if code != tc.want {
			t.Errorf("%s %s: %d %s, want %d", tc.method, tc.path, code, body, tc.want)
		}
		if code >= 400 {
			var e struct{ Error string }
			if json.Unmarshal([]byte(body), &e) != nil || e.Error == "" {
				t.Errorf("%s %s: body %q is not a JSON error", tc.method, tc.path, body)
			}
		}
	}
	// The failed grants gave nothing.
	expect429(t, tester, 3599, 3600, "GET", "/", user...)
	return tester
}

func TestAdminAPIMemory(t *testing.T) {
	testAdminAPI(t, "admin_mem", "")
}

func TestAdminAPIRedis(t *testing.T) {
	redis := redistest.Standalone(t, "")
	testAdminAPI(t, "admin_redis", fmt.Sprintf(`"backend": {"name": "redis", "addresses": [%q], "key_prefix": "admintest:", "timeout": "2s"},`, redis.Addr))
}

// TestAdminZonesList: every zone and scope, with its policy and counters.
func TestAdminZonesList(t *testing.T) {
	zone := freshZone("admin_list") // its counters are the process's (go test -count=N)
	tester := newTester(t, adminConfig(zone, "", "v1"), "json")
	expectN(t, tester, 3, http.StatusOK, "GET", "/", "X-User", "Ann")
	expect429(t, tester, 3599, 3600, "GET", "/", "X-User", "Ann")
	code, body := adminCall(t, "GET", "/rate_limit/zones")
	if code != http.StatusOK {
		t.Fatalf("zones: %d %s", code, body)
	}
	var v struct {
		Zones []struct {
			Name, Backend string
			Limits        []struct {
				Scope, Algorithm   string
				MaxEvents          int64 `json:"max_events"`
				Keys               *int64
				Requests, Declined float64
			}
		}
	}
	if err := json.Unmarshal([]byte(body), &v); err != nil {
		t.Fatal(err)
	}
	for _, z := range v.Zones {
		if z.Name != zone {
			continue
		}
		if z.Backend != "memory" || len(z.Limits) != 2 {
			t.Fatalf("zone: %+v", z)
		}
		own := z.Limits[0]
		if own.Scope != "" || own.Algorithm != "sliding_window" || own.MaxEvents != 3 || own.Keys == nil || *own.Keys != 1 || own.Requests != 4 || own.Declined != 1 {
			t.Fatalf("own limit: %+v (keys %v), want 3 per hour, 1 key, 4 requests, 1 declined", own, own.Keys)
		}
		return
	}
	t.Fatalf("zone %s not listed: %s", zone, body)
}

// TestRateLimitCommand drives the admin API with the built caddy binary's
// rate-limit subcommand, against the in-process Caddy.
func TestRateLimitCommand(t *testing.T) {
	tester := newTester(t, adminConfig("admin_cli", "", "v1"), "json")
	expectN(t, tester, 3, http.StatusOK, "GET", "/", "X-User", "Cli")
	run := func(want string, args ...string) {
		t.Helper()
		out, err := runCaddy(t, append([]string{"rate-limit"}, append(args, "--address", adminAddr)...)...)
		if err != nil || !strings.Contains(out, want) {
			t.Fatalf("caddy rate-limit %v: %v\n%s\nwant %q in it", args, err, out, want)
		}
	}
	run("0 of 3", "inspect", "admin_cli", "CLI")
	run("97 of 100", "inspect", "admin_cli", "127.0.0.1", "--scope", "ip")
	run("1 of 3", "grant", "admin_cli", "cli", "1")
	expectN(t, tester, 1, http.StatusOK, "GET", "/", "X-User", "Cli")
	expect429(t, tester, 1, 3600, "GET", "/", "X-User", "Cli") // the binary may take a while to build
	run("3 of 3", "reset", "admin_cli", "cli")
	expectN(t, tester, 3, http.StatusOK, "GET", "/", "X-User", "Cli")
	run("admin_cli", "zones")
	run(`"remaining": 0`, "inspect", "admin_cli", "cli", "--json")
	if out, err := runCaddy(t, "rate-limit", "inspect", "no_such_zone", "x", "--address", adminAddr); err == nil || !strings.Contains(out, "404") {
		t.Fatalf("unknown zone: %v\n%s", err, out)
	}
	run("admin_cli", "report", "--metrics", "http://"+adminAddr+"/metrics")

	// With --config, the admin address comes from the file's admin
	// option; only the answer is printed, on stdout, and nothing on
	// stderr (loading the config the way caddy's own commands do logs
	// it at info level there).
	dir := t.TempDir()
	files := map[string]string{
		"Caddyfile":   "{\n\tadmin " + adminAddr + "\n}\n:0 {\n\trespond ok\n}\n",
		"caddy.json":  `{"admin": {"listen": "` + adminAddr + `"}}`,
		"x.caddyfile": "{\n\tadmin " + adminAddr + "\n}\n",
	}
	for name, body := range files {
		file := filepath.Join(dir, name)
		if err := os.WriteFile(file, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		for _, args := range [][]string{{"zones"}, {"inspect", "admin_cli", "cli"}, {"report", "--metrics", "http://" + adminAddr + "/metrics"}} {
			cmd := exec.Command(binary(t), append(append([]string{"rate-limit"}, args...), "--config", file)...)
			var stdout, stderr strings.Builder
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			if err := cmd.Run(); err != nil || !strings.Contains(stdout.String(), "admin_cli") && !strings.Contains(stdout.String(), "of 3") {
				t.Fatalf("caddy rate-limit %v --config %s: %v\nstdout: %s\nstderr: %s", args, name, err, stdout.String(), stderr.String())
			}
			if stderr.Len() > 0 {
				t.Errorf("caddy rate-limit %v --config %s wrote on stderr:\n%s", args, name, stderr.String())
			}
		}
	}
}

// TestAdminOddNames: a zone name and a key holding "/", spaces and
// percent signs reach the right zone and key when escaped; the path key is
// normalized as the zone does.
func TestAdminOddNames(t *testing.T) {
	tester := newTester(t, jsonServer(`{
		"handler": "rate_limit",
		"rate_limits": {"admin odd/zone%": {"key": "{http.request.uri.path}", "normalize": [{"name": "path"}], "window": "1h", "max_events": 2}}
	}, `+okHandler, ""), "json")
	expectN(t, tester, 2, http.StatusOK, "GET", "/api/x")
	expect429(t, tester, 3599, 3600, "GET", "/api/./x")
	base := "/rate_limit/zones/" + url.PathEscape("admin odd/zone%") + "/keys/"
	if ls := keyOp(t, "GET", base+url.PathEscape("/api/y/../x")); ls[0].Remaining != 0 || ls[0].Key != "/api/x" {
		t.Fatalf("path key: %+v", ls)
	}
	if ls := keyOp(t, "DELETE", base+url.PathEscape("/api/x")); ls[0].Remaining != 2 {
		t.Fatalf("reset: %+v", ls)
	}
	expectN(t, tester, 2, http.StatusOK, "GET", "/api/x")
}

// TestAdminResetReachesEverySite: two sites name one zone on Redis, each
// with a store and an over-limit cache of its own. A reset through the API
// unblocks the key on both at once: the store that did not reset forgets
// the denial it remembered.
func TestAdminResetReachesEverySite(t *testing.T) {
	redis := redistest.Standalone(t, "")
	handler := `{"handler": "rate_limit",
		"backend": {"name": "redis", "addresses": ["` + redis.Addr + `"], "key_prefix": "admin-sites:", "timeout": "2s"},
		"rate_limits": {"admin_shared": {"key": "{http.request.header.X-User}", "window": "1h", "max_events": 3}}
	}, ` + okHandler
	cfg := withPorts(`{
	"admin": {"listen": "` + adminAddr + `"},
	"logging": {"logs": {"default": {"level": "ERROR"}}},
	"apps": {"http": {"http_port": 9080, "servers": {
		"a": {"listen": [":9080"], "routes": [{"handle": [` + handler + `]}]},
		"b": {"listen": ["127.0.0.1:9081"], "routes": [{"handle": [` + handler + `]}]}
	}}}
}`)
	tester := newTester(t, cfg, "json")
	siteB := strings.Replace(httpBase, fmt.Sprint(httpPort), fmt.Sprint(httpPort+1), 1)
	get := func(base string) int {
		t.Helper()
		req, _ := http.NewRequest("GET", base+"/", nil)
		req.Header.Set("X-User", "u")
		resp, err := tester.Client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for i := range 3 {
		if code := get(httpBase); code != http.StatusOK {
			t.Fatalf("request %d: %d", i+1, code)
		}
	}
	// Both sites are refused, and both stores' caches learn it.
	for range 2 {
		if a, b := get(httpBase), get(siteB); a != http.StatusTooManyRequests || b != http.StatusTooManyRequests {
			t.Fatalf("over the limit: site a %d, site b %d; want 429 from both", a, b)
		}
	}
	keyOp(t, "DELETE", "/rate_limit/zones/admin_shared/keys/u")
	if a, b := get(httpBase), get(siteB); a != http.StatusOK || b != http.StatusOK {
		t.Fatalf("after a reset: site a %d, site b %d; want 200 from both", a, b)
	}
}

// Requests without a usable key share one bucket ("missing shared"). No
// key names it, so the admin API and the command name it as /missing: an
// operator can inspect it, give it units and unblock its clients as for
// any key, without touching the keys of named clients.
func TestAdminMissingBucket(t *testing.T) {
	name := freshZone("admin_missing")
	tester := newTester(t, adminConfig(name, "", "v1"), "json")
	expectN(t, tester, 3, http.StatusOK, "GET", "/")
	expect429(t, tester, 3599, 3600, "GET", "/")
	expectN(t, tester, 1, http.StatusOK, "GET", "/", "X-User", "bob")

	ls := keyOp(t, "GET", "/rate_limit/zones/"+name+"/missing")
	if len(ls) != 1 || ls[0].Scope != "" || ls[0].Key != "" || ls[0].Remaining != 0 {
		t.Fatalf("inspect missing: %+v, want the own limit's empty key, spent", ls)
	}
	if ls := keyOp(t, "POST", "/rate_limit/zones/"+name+"/missing/grant?units=1"); ls[0].Remaining != 1 {
		t.Fatalf("grant 1 to missing: %+v", ls)
	}
	expectN(t, tester, 1, http.StatusOK, "GET", "/")
	expect429(t, tester, 3599, 3600, "GET", "/")

	out, err := runCaddy(t, "rate-limit", "reset", name, "--missing", "--address", adminAddr)
	if err != nil || !strings.Contains(out, "3 of 3") {
		t.Fatalf("caddy rate-limit reset %s --missing: %v\n%s", name, err, out)
	}
	expectN(t, tester, 3, http.StatusOK, "GET", "/")
	expect429(t, tester, 3599, 3600, "GET", "/")
	if got := remaining(t, name, "bob"); got != 2 {
		t.Fatalf("bob: %d remaining, want 2: the keyless bucket is not his", got)
	}

	for _, tc := range []struct {
		method, path string
		want         int
	}{
		{"GET", "/rate_limit/zones/" + name + "/missing?form=final", 400},
		{"GET", "/rate_limit/zones/" + name + "/missing?scope=nope", 404},
		{"PUT", "/rate_limit/zones/" + name + "/missing", 405},
		{"GET", "/rate_limit/zones/no_such_zone/missing", 404},
	} {
		if code, body := adminCall(t, tc.method, tc.path); code != tc.want {
			t.Errorf("%s %s: %d %s, want %d", tc.method, tc.path, code, body, tc.want)
		}
	}
}

// A zone whose key is a constant is never missing: naming its keyless
// bucket is an error, not an empty answer.
func TestAdminMissingConstantKey(t *testing.T) {
	name := freshZone("admin_missing_const")
	newTester(t, jsonServer(`{"handler": "rate_limit", "rate_limits": {"`+name+`": {
		"key": "static", "window": "1h", "max_events": 3}}}, `+okHandler, ""), "json")
	if code, body := adminCall(t, "GET", "/rate_limit/zones/"+name+"/missing"); code != http.StatusBadRequest || !strings.Contains(body, "constant") {
		t.Fatalf("missing of a constant key: %d %s, want 400", code, body)
	}
}

// The admin API takes the methods it names, spelled in full: a request
// whose method is a fragment of one ("ST", "POS", "G") is a 405 and
// changes nothing.
func TestAdminMethodsExact(t *testing.T) {
	tester := newTester(t, jsonServer(`{
		"handler": "rate_limit",
		"rate_limits": {"a3_methods": {"key": "{http.request.header.X-User}", "window": "1h", "max_events": 3}}
	}, `+okHandler, ""), "json")
	expectN(t, tester, 3, http.StatusOK, "GET", "/", "X-User", "m")
	base := "/rate_limit/zones/a3_methods/keys/m"
	for _, m := range []string{"ST", "POS", "P", "OST"} {
		if code, body := adminCall(t, m, base+"/grant?units=2"); code != http.StatusMethodNotAllowed {
			t.Errorf("%s .../grant: %d %s, want 405", m, code, body)
		}
	}
	for _, m := range []string{"G", "ET", "DEL", "E"} {
		if code, body := adminCall(t, m, base); code != http.StatusMethodNotAllowed {
			t.Errorf("%s .../keys/m: %d %s, want 405", m, code, body)
		}
	}
	if ls := keyOp(t, "GET", base); ls[0].Remaining != 0 {
		t.Fatalf("after the refused methods: %+v, want nothing given back", ls)
	}
}

// The command reaches the keys "." and "..": as path segments an HTTP
// client or server would resolve them away (and the command would ask for
// another endpoint).
func TestRateLimitCommandDotKeys(t *testing.T) {
	tester := newTester(t, jsonServer(`{
		"handler": "rate_limit",
		"rate_limits": {"a3_dots": {"key": "{http.request.header.X-User}", "window": "1h", "max_events": 3}}
	}, `+okHandler, ""), "json")
	for _, k := range []string{".", ".."} {
		expectN(t, tester, 3, http.StatusOK, "GET", "/", "X-User", k)
		for _, args := range [][]string{
			{"inspect", "a3_dots", k},
			{"grant", "a3_dots", k, "1"},
			{"reset", "a3_dots", k},
		} {
			out, err := runCaddy(t, append(append([]string{"rate-limit"}, args...), "--address", adminAddr)...)
			if err != nil || !strings.Contains(out, "a3_dots") {
				t.Fatalf("caddy rate-limit %v: %v\n%s", args, err, out)
			}
		}
		expectN(t, tester, 3, http.StatusOK, "GET", "/", "X-User", k)
	}
}
