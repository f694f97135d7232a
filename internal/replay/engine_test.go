package replay_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig"

	"github.com/sluicehq/sluice/internal/replay"
)

// logLine is an access log line of a request to host+uri from client
// arriving at sec seconds, answered status.
func logLine(sec float64, host, uri, client string, status int, hdr map[string]string) string {
	h := map[string][]string{"Accept": {"*/*"}}
	for k, v := range hdr {
		h[k] = []string{v}
	}
	hj, _ := json.Marshal(h)
	resp := `{"Server":["Caddy"]}`
	if status == 429 {
		resp = `{"Server":["Caddy"],"Retry-After":["1"]}`
	}
	return fmt.Sprintf(`{"level":"info","ts":%.6f,"logger":"http.log.access.log0","msg":"handled request","request":{"remote_ip":"10.0.0.1","remote_port":"5000","client_ip":%q,"proto":"HTTP/1.1","method":"POST","host":%q,"uri":%q,"headers":%s},"bytes_read":0,"user_id":"","duration":0.001,"size":2,"status":%d,"resp_headers":%s}`,
		1_800_000_000+sec+0.001, client, host, uri, hj, status, resp)
}

func plan(t *testing.T, caddyfile string) *replay.Plan {
	t.Helper()
	cfg, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(caddyfile), nil)
	if err != nil {
		t.Fatal(err)
	}
	p, err := replay.PrepareConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func logFile(t *testing.T, lines []string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "access.log")
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// A zone sees only the requests that reach its handler (site, handle
// block), and a limit that counts by the response counts by the log's
// status.
func TestReplayHonoursRoutesAndLoggedStatus(t *testing.T) {
	p := plan(t, `{
	auto_https off
}
http://example.com {
	log
	handle /login {
		rate_limit {
			zone login {
				key {client_ip}
				rate 3/1m
				count_when status 401
			}
		}
		reverse_proxy 10.0.0.2:80
	}
	respond "other"
}
http://other.example {
	respond "nothing limited"
}
`)
	var lines []string
	// Successes are given back: the fourth failure is the first request
	// denied (counting every request, the fourth request would be).
	for i, status := range []int{401, 200, 401, 200, 401, 401} {
		lines = append(lines, logLine(float64(i), "example.com", "/login", "198.51.100.1", status, nil))
	}
	lines = append(lines,
		logLine(10, "example.com", "/elsewhere", "198.51.100.1", 200, nil),
		logLine(11, "other.example", "/login", "198.51.100.1", 200, nil))
	var dec bytes.Buffer
	res, err := replay.Replay(p, p.JSON, replay.Options{Logs: []string{logFile(t, lines)}, Decisions: &dec}, false)
	if err != nil {
		t.Fatal(err)
	}
	ls := res.Limit("login", "")
	if ls == nil || ls.Requests != 6 || ls.Denied != 1 || res.Passed != 7 || res.Refused[429] != 1 || res.RefusedBy["login"] != 1 {
		t.Fatalf("limit %+v; passed %d refused %v by %v", ls, res.Passed, res.Refused, res.RefusedBy)
	}
	var statuses []int
	for _, line := range strings.Split(strings.TrimSpace(dec.String()), "\n") {
		var d replay.Decision
		if err := json.Unmarshal([]byte(line), &d); err != nil {
			t.Fatal(err)
		}
		statuses = append(statuses, d.Status)
	}
	if fmt.Sprint(statuses) != "[401 200 401 200 401 429 200 200]" {
		t.Fatalf("decisions %v", statuses)
	}
}

// A shadow zone denies nothing and reports what it would have denied; a
// key read from a header the log lacks is said.
func TestReplayShadowZoneAndAbsentHeader(t *testing.T) {
	p := plan(t, `:80 {
	log
	rate_limit {
		zone api {
			key {header.X-Api-Key}
			rate 1/1m
			shadow
		}
	}
	respond "ok"
}
`)
	var lines []string
	for i := range 4 {
		lines = append(lines, logLine(float64(i), "h", "/", "198.51.100.1", 200, map[string]string{"X-Api-Key": "k1"}))
	}
	lines = append(lines, logLine(5, "h", "/", "198.51.100.1", 200, nil))
	res, err := replay.Replay(p, p.JSON, replay.Options{Logs: []string{logFile(t, lines)}}, true)
	if err != nil {
		t.Fatal(err)
	}
	ls := res.Limit("api", "")
	if res.Passed != 5 || ls.Denied != 3 || !ls.Shadow || ls.Absent["X-Api-Key"] != 1 || ls.Keys() != 2 {
		t.Fatalf("passed %d, limit %+v", res.Passed, ls)
	}
	var text bytes.Buffer
	rep := replay.NewReport(p, res)
	if err := rep.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"api   -      shadow  1/1m", "3 (60.00%)", "1 of its requests have no X-Api-Key in the log", "most denied: k1 (3 of 4)"} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, text.String())
		}
	}
}

// A line that is JSON but not a request Caddy could have served (a URI
// that does not parse) is counted as malformed with its line number.
func TestReplayCountsUnreplayableLines(t *testing.T) {
	p := plan(t, ":80 {\n\tlog\n\trate_limit {\n\t\tzone z {\n\t\t\tkey global\n\t\t\trate 5/1m\n\t\t}\n\t}\n}\n")
	lines := []string{logLine(0, "h", "/", "a", 200, nil), logLine(1, "h", "http://[::1/", "a", 200, nil)}
	res, err := replay.Replay(p, p.JSON, replay.Options{Logs: []string{logFile(t, lines)}}, false)
	if err != nil {
		t.Fatal(err)
	}
	if res.Malformed != 1 || res.MalformedExamples[0].Line != 2 || res.Limit("z", "").Requests != 1 {
		t.Fatalf("malformed %d %+v", res.Malformed, res.MalformedExamples)
	}
}
