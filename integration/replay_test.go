package integration

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// replayZones are the zones of the live-versus-replay test: each
// algorithm on 4 per 2 seconds, keyed by user, and a zone whose user
// limit has an IP and a global scope beside it.
var replayZones = []struct{ path, body string }{
	{"sw", "rate 4/2s\n\t\t\talgorithm sliding_window"},
	{"swc", "rate 4/2s\n\t\t\talgorithm sliding_window_counter"},
	{"fw", "rate 4/2s\n\t\t\talgorithm fixed_window"},
	{"tb", "rate 4/2s\n\t\t\talgorithm token_bucket"},
	{"gcra", "rate 4/2s\n\t\t\talgorithm gcra"},
	{"lb", "rate 4/2s\n\t\t\talgorithm leaky_bucket"},
	{"scoped", "rate 4/2s\n\t\t\tscope per_ip {\n\t\t\t\tkey {client_ip}\n\t\t\t\trate 6/2s\n\t\t\t}\n\t\t\tscope everyone {\n\t\t\t\tkey global\n\t\t\t\trate 9/2s\n\t\t\t}"},
}

// replaySite is a site whose rate_limit zones front a fake upstream, with
// its JSON access log in logFile.
func replaySite(upstream, logFile string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "\tlog {\n\t\toutput file %s\n\t\tformat json\n\t}\n\trate_limit {\n", logFile)
	for _, z := range replayZones {
		fmt.Fprintf(&b, "\t\tzone %s {\n\t\t\tmatch {\n\t\t\t\tpath /%s\n\t\t\t}\n\t\t\tkey {header.X-User}\n\t\t\t%s\n\t\t}\n", z.path, z.path, z.body)
	}
	fmt.Fprintf(&b, "\t}\n\treverse_proxy %s\n", upstream)
	return b.String()
}

// replayGaps are the pauses between a zone's bursts. Each partial pause
// is an odd number of quarter seconds after a pause that refilled every
// bucket: a bucket holds k+½ tokens when the next burst comes and a
// sliding log's events are more than half a second from leaving, so that no decision
// rests on when within a few milliseconds a request came.
var replayGaps = []time.Duration{2600 * time.Millisecond, 1250 * time.Millisecond, 2600 * time.Millisecond, 750 * time.Millisecond, 2600 * time.Millisecond, 1250 * time.Millisecond}

// replayBurst is who sends each request of a burst: u0 more than its
// limit, u1 within it.
var replayBurst = []string{"u0", "u0", "u1", "u0", "u0", "u1", "u0", "u0"}

// A request sequence sent to a live Caddy on a real clock, and the access
// log that Caddy wrote replayed by `caddy rate-limit simulate`, get the
// same answer for every request: for each of the six algorithms and for a
// zone whose limit has scopes.
//
// Caddy logs when a request ended and how long it took, to the
// microsecond, a few microseconds after it decided: on a machine loaded
// enough to stretch that to milliseconds, a request that came within them
// of the moment a bucket refills can be decided either way. Such a run is
// tried again (three times at most); a replay that is wrong is wrong every
// time.
func TestSimulateMatchesLiveCaddy(t *testing.T) {
	binary(t) // built before the clock starts
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok")
	}))
	defer upstream.Close()
	for attempt := 1; attempt <= 3; attempt++ {
		differ, summary := liveAgainstReplay(t, upstream.URL)
		if t.Failed() {
			return
		}
		if differ == 0 {
			t.Logf("attempt %d:\n%s", attempt, summary)
			return
		}
		t.Logf("attempt %d: %d requests replayed differently:\n%s", attempt, differ, summary)
	}
	t.Fatal("the replay differed from the live decisions in three runs")
}

// liveAgainstReplay sends the sequence to a fresh config, replays its log
// and returns how many requests were decided differently, with a summary.
func liveAgainstReplay(t *testing.T, upstream string) (int, string) {
	dir := t.TempDir()
	logFile := filepath.Join(dir, "access.log")
	cfg := caddyfileServer(replaySite(upstream, logFile))
	newTester(t, cfg, "caddyfile")
	client := &http.Client{Timeout: 30 * time.Second}

	var mu sync.Mutex
	live := map[string]int{} // uri → status
	longest := map[string]time.Duration{}
	var wg sync.WaitGroup
	for _, z := range replayZones {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n := 0
			for round := 0; round <= len(replayGaps); round++ {
				if round > 0 {
					time.Sleep(replayGaps[round-1])
				}
				began := time.Now()
				for _, user := range replayBurst {
					n++
					uri := fmt.Sprintf("/%s?n=%d", z.path, n)
					req, _ := http.NewRequest("GET", httpBase+uri, nil)
					req.Header.Set("X-User", user)
					resp, err := client.Do(req)
					if err != nil {
						t.Error(err)
						return
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					mu.Lock()
					live[uri] = resp.StatusCode
					mu.Unlock()
				}
				mu.Lock()
				longest[z.path] = max(longest[z.path], time.Since(began))
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		return 0, ""
	}
	// Caddy writes a request's line once it has answered it.
	deadline := time.Now().Add(30 * time.Second)
	for countLines(t, logFile) < len(live) && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	unloadZones(t)

	cfgFile := filepath.Join(dir, "Caddyfile")
	if err := os.WriteFile(cfgFile, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	decisions := filepath.Join(dir, "decisions.jsonl")
	out, err := runCaddy(t, "rate-limit", "simulate", "--config", cfgFile, "--log", logFile, "--decisions", decisions)
	if err != nil {
		t.Fatalf("simulate: %v\n%s", err, out)
	}
	replayed := map[string]int{}
	f, err := os.Open(decisions)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var d struct {
			URI    string
			Status int
		}
		if err := json.Unmarshal(sc.Bytes(), &d); err != nil {
			t.Fatal(err)
		}
		replayed[d.URI] = d.Status
	}
	if len(replayed) != len(live) {
		t.Fatalf("replayed %d requests, sent %d\n%s", len(replayed), len(live), out)
	}
	var summary strings.Builder
	total := 0
	for _, z := range replayZones {
		var allowed, denied int
		var differ []string
		for uri, code := range live {
			if !strings.HasPrefix(uri, "/"+z.path+"?") {
				continue
			}
			if code == http.StatusOK {
				allowed++
			} else {
				denied++
			}
			if replayed[uri] != code {
				differ = append(differ, fmt.Sprintf("%s live %d replayed %d", uri, code, replayed[uri]))
			}
		}
		slices.Sort(differ)
		total += len(differ)
		fmt.Fprintf(&summary, "zone %s: %d allowed, %d denied live, %d replayed differently %v (longest burst %s)\n",
			z.path, allowed, denied, len(differ), differ, longest[z.path].Round(time.Millisecond))
		if allowed == 0 || denied == 0 {
			t.Errorf("zone %s: %d allowed and %d denied: the sequence tests nothing", z.path, allowed, denied)
		}
	}
	return total, summary.String()
}

func countLines(t *testing.T, file string) int {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		return 0
	}
	return strings.Count(string(b), "\n")
}

// replayCaddyfile is a config for the command tests: one zone on the
// client, one that reads the body.
const replayCaddyfile = `:8080 {
	log {
		format json
	}
	rate_limit {
		zone api {
			by ip
			rate 2/1m
		}
		zone login {
			match {
				path /login
			}
			by json email
			rate 5/15m
		}
	}
	respond "ok"
}
`

func replayLine(sec int, uri string) string {
	return fmt.Sprintf(`{"level":"info","ts":%d.000500,"logger":"http.log.access.log0","msg":"handled request","request":{"remote_ip":"198.51.100.7","remote_port":"4000","client_ip":"198.51.100.7","proto":"HTTP/1.1","method":"GET","host":"example.com","uri":%q,"headers":{}},"duration":0.0005,"status":200,"resp_headers":{}}`, 1_800_000_000+sec, uri)
}

func writeFiles(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// Through the built binary: the text and JSON reports, a malformed line
// named by its number, a zone that cannot be replayed named with why.
func TestSimulateCommand(t *testing.T) {
	dir := writeFiles(t, map[string]string{
		"Caddyfile": replayCaddyfile,
		"access.log": strings.Join([]string{
			replayLine(0, "/a"), replayLine(1, "/b"), `{"ts":1800000002,"logger":"http.log.access.log0","request":`, replayLine(3, "/c"), replayLine(4, "/d"),
		}, "\n") + "\n",
	})
	out, err := runCaddy(t, "rate-limit", "simulate", "--config", filepath.Join(dir, "Caddyfile"), "--log", filepath.Join(dir, "access.log"))
	if err != nil {
		t.Fatalf("simulate: %v\n%s", err, out)
	}
	for _, want := range []string{
		"Replayed 4 requests of 5 lines in 1 file(s)",
		"Passed 2, refused 2 × 429.",
		"Malformed lines: 1 (not replayed):",
		"access.log:3: not JSON",
		`NOT REPLAYED: zone "login": key {http.request.body.json.email}: the request body is not in an access log.`,
		"api   -      enforce  2/1m",
		"most denied: 198.51.100.7 (2 of 4)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("simulate output lacks %q:\n%s", want, out)
		}
	}
	out, err = runCaddy(t, "rate-limit", "simulate", "--json", "--config", filepath.Join(dir, "Caddyfile"), "--log", filepath.Join(dir, "access.log"))
	if err != nil {
		t.Fatalf("simulate --json: %v\n%s", err, out)
	}
	var rep struct {
		Requests       int64
		Malformed      int64
		MalformedLines []struct{ Line int64 } `json:"malformed_lines"`
		Limits         []struct {
			Zone       string
			Denied     int64
			DeniedKeys int `json:"denied_keys"`
		}
		NotReplayed []struct{ Zone, Reason string } `json:"not_replayed"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	if rep.Requests != 4 || rep.Malformed != 1 || rep.MalformedLines[0].Line != 3 || len(rep.Limits) != 1 || rep.Limits[0].Denied != 2 || rep.NotReplayed[0].Zone != "login" {
		t.Fatalf("report %+v", rep)
	}
}

func TestSimulateCommandRefusesWhatItCannotReplay(t *testing.T) {
	dir := writeFiles(t, map[string]string{
		"Caddyfile":  replayCaddyfile,
		"common.log": `198.51.100.7 - - [10/Oct/2026:13:55:36 +0000] "GET / HTTP/1.1" 200 2326` + "\n",
		"access.log": replayLine(0, "/") + "\n",
		"body.json":  `{"apps": {"http": {"servers": {"s": {"routes": [{"handle": [{"handler": "rate_limit", "rate_limits": {"login": {"key": "{http.request.body.json.email}", "max_events": 5, "window": "15m"}}}]}]}}}}}`,
	})
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"simulate", "--config", "Caddyfile", "--log", "common.log"}, `common.log:1: line 1 is not a JSON object (it starts "198.51.100.7 - - [10/Oct/2026:13:55:36 +0000] \"GET / HTTP/1."); expected Caddy's JSON access log`},
		{[]string{"simulate", "--config", "body.json", "--log", "access.log"}, `no zone of this config can be replayed from an access log:` + "\n" + `  zone "login": key {http.request.body.json.email}: the request body is not in an access log`},
		{[]string{"recommend", "--config", "Caddyfile", "--log", "-"}, "recommend reads the logs twice: give files, not standard input"},
		{[]string{"recommend", "--config", "Caddyfile", "--log", "access.log", "--rule", "p95"}, `unknown rule "p95": want p99x3, p999 or max`},
		{[]string{"simulate", "--config", "Caddyfile", "--log", "missing.log"}, "missing.log: no such file or directory"},
	} {
		cmd := exec.Command(binary(t), append([]string{"rate-limit"}, tt.args...)...)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		if err == nil || !strings.Contains(string(out), tt.want) {
			t.Errorf("%v: err %v, output lacks %q:\n%s", tt.args, err, tt.want, out)
		}
	}
}
