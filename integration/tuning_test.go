package integration

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// tuningStart is 2026-03-02 09:00 UTC, when the example's hour begins.
const tuningStart = 1772442000

// writeTuningLog writes the access log of docs/tuning.md's example: an
// hour of a site whose API has 200 steady users, each calling it every 10
// to 29 seconds (a quarter of their requests are for static files, which
// the zone does not match); a scraper, 203.0.113.66, calling it five times
// a second from 09:20 to 09:30; and a burst: at 09:45 a newsletter sends
// 60 of the users back, who each make 25 calls in 20 seconds. Lines are in
// the order Caddy writes them, by the time each request ended.
func writeTuningLog(t *testing.T, path string) {
	t.Helper()
	type req struct {
		at     float64
		client string
		uri    string
	}
	var reqs []req
	for i := range 200 {
		client := fmt.Sprintf("198.51.100.%d", i+10)
		period := 10 + i%20
		for k, at := 0, i%period; at < 3600; k, at = k+1, at+period {
			uri := fmt.Sprintf("/api/items/%d", (i*7+k)%500)
			if k%4 == 3 {
				uri = "/static/app.js"
			}
			reqs = append(reqs, req{float64(at), client, uri})
		}
		if i < 60 {
			for j := range 25 {
				reqs = append(reqs, req{2700 + float64(j)*0.8 + float64(i)*0.01, client, fmt.Sprintf("/api/news/%d", j)})
			}
		}
	}
	for j := range 3000 {
		reqs = append(reqs, req{1200 + float64(j)*0.2 + 0.003, "203.0.113.66", fmt.Sprintf("/api/items/%d", j)})
	}
	slices.SortFunc(reqs, func(a, b req) int {
		switch {
		case a.at < b.at:
			return -1
		case a.at > b.at:
			return 1
		}
		return strings.Compare(a.client, b.client)
	})
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w := bufio.NewWriter(f)
	for _, r := range reqs {
		const dur = 0.004
		fmt.Fprintf(w, `{"level":"info","ts":%.6f,"logger":"http.log.access.log0","msg":"handled request","request":{"remote_ip":"%s","remote_port":"51000","client_ip":"%s","proto":"HTTP/2.0","method":"GET","host":"example.com","uri":"%s","headers":{"User-Agent":["Mozilla/5.0"],"Accept":["application/json"]},"tls":{"resumed":false,"version":772,"cipher_suite":4865,"proto":"h2","server_name":"example.com"}},"bytes_read":0,"user_id":"","duration":%.6f,"size":312,"status":200,"resp_headers":{"Server":["Caddy"],"Content-Type":["application/json"]}}`+"\n",
			float64(tuningStart)+r.at+dur, r.client, r.client, r.uri, dur)
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
}

// fencedBlocks returns the fenced blocks of a doc with their info string.
func fencedBlocks(t *testing.T, doc string) (blocks [][2]string) {
	t.Helper()
	b, err := os.ReadFile(doc)
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile("(?s)```([a-z]*)\n(.*?)```")
	for _, m := range re.FindAllStringSubmatch(string(b), -1) {
		blocks = append(blocks, [2]string{m[1], m[2]})
	}
	return blocks
}

// timing is the part of a replay's first line that changes run to run.
var timing = regexp.MustCompile(`, in [0-9.]+s\.`)

// The worked example of docs/tuning.md: its Caddyfile, run on the
// generated log, prints what the doc shows, number for number.
func TestDocsTuningExample(t *testing.T) {
	bin := binary(t)
	dir := t.TempDir()
	writeTuningLog(t, filepath.Join(dir, "access.log"))
	blocks := fencedBlocks(t, "../docs/tuning.md")
	ran := 0
	for _, b := range blocks {
		switch b[0] {
		case "caddyfile":
			if strings.Contains(b[1], "zone api") && !strings.Contains(b[1], "shadow") {
				if err := os.WriteFile(filepath.Join(dir, "Caddyfile"), []byte(b[1]), 0o600); err != nil {
					t.Fatal(err)
				}
			}
		case "console":
			cmdLine, want, _ := strings.Cut(b[1], "\n")
			args := strings.Fields(strings.TrimPrefix(cmdLine, "$ caddy "))
			cmd := exec.Command(bin, args...)
			cmd.Dir = dir
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("%s: %v\n%s", cmdLine, err, out)
			}
			got := strings.TrimRight(timing.ReplaceAllString(string(out), ", in Xs."), "\n")
			want = strings.TrimRight(timing.ReplaceAllString(want, ", in Xs."), "\n")
			if got != want {
				t.Errorf("%s printed:\n%s\ndocs/tuning.md shows:\n%s", cmdLine, got, want)
			}
			ran++
		}
	}
	if ran < 2 {
		t.Fatalf("docs/tuning.md has %d console examples, want simulate and recommend", ran)
	}
	if _, err := os.Stat(filepath.Join(dir, "report.html")); err != nil {
		t.Errorf("the example's --html wrote no page: %v", err)
	}
}
