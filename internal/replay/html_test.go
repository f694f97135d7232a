package replay

import (
	"bytes"
	"context"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// sampleReport is a replay's report of a steady key, a busy one and a
// burst of denials, on a 10/1m limit.
func sampleReport() (*Report, *Recommendation) {
	plan := &Plan{Zones: map[string]*ZoneInfo{"api": {Name: "api", Limits: []*LimitInfo{{Zone: "api", Algorithm: "sliding_window", MaxEvents: 10, Window: 60e9}}}}}
	ls := newLimitStats("api", "", 60e9, 10/60e9)
	const start = int64(1_800_000_000e9)
	for i := range 600 {
		at := start + int64(i)*6e9 // one a 6 s for an hour
		ls.observe("steady", 1, true, at)
		if i >= 200 && i < 260 {
			for j := range 5 {
				ls.observe("busy", 1, j < 2, at+int64(j)*1e8)
			}
		}
	}
	res := &Result{Files: []string{"access.log"}, Entries: 900, Lines: 900, First: start, Last: start + 3600e9, Limits: []*LimitStats{ls}, Refused: map[int]int64{}}
	rep := NewReport(plan, res)
	rec := &Recommendation{Report: rep, Rule: RuleP99x3, Limits: []LimitRec{{
		Zone: "api", Algorithm: "sliding_window", Configured: "10/1m", Window: "1m", Requests: ls.Requests, Keys: 2,
		Peaks: ls.Peaks(), PeakValues: ls.PeakValues(), Timeline: rep.Limits[0].Timeline, Proposed: 30,
		Candidates: []Candidate{{Rule: RuleP99x3, MaxEvents: 30, Rate: "30/1m", Chosen: true, TopDenied: []string{}}},
	}}, Blocks: []ZoneBlock{{Zone: "api", Format: "caddyfile", Text: "zone api {\n\trate 30/1m\n}"}}}
	return rep, rec
}

func TestHTMLIsSelfContained(t *testing.T) {
	rep, rec := sampleReport()
	for name, write := range map[string]func(*bytes.Buffer) error{
		"simulate":  func(b *bytes.Buffer) error { return WriteSimulateHTML(b, rep) },
		"recommend": func(b *bytes.Buffer) error { return WriteRecommendHTML(b, rec) },
	} {
		var b bytes.Buffer
		if err := write(&b); err != nil {
			t.Fatal(err)
		}
		page := b.String()
		for _, banned := range []string{"<script", "http://", "https://", "@import", "url(", "<link", "<img"} {
			if strings.Contains(page, banned) {
				t.Errorf("%s: the page has %q", name, banned)
			}
		}
		want := []string{`<svg id="timeline-zone-api"`, `<svg id="distribution-zone-api"`, `class="limit"`}
		if name == "simulate" {
			want = append(want, "<td>busy</td>") // the most denied keys
		} else {
			want = append(want, "rate 30/1m") // the block to paste
		}
		for _, want := range want {
			if !strings.Contains(page, want) {
				t.Errorf("%s: the page lacks %q", name, want)
			}
		}
	}
}

// chromium finds Debian's chromium: with CI=true its absence fails the
// test, elsewhere it is skipped, saying so.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("chromium is not installed (apt-get install chromium): the HTML report cannot be checked in a browser")
	}
	t.Skip("SKIPPED: chromium is not installed (apt-get install chromium): the HTML report is not checked in a browser")
	return ""
}

func runChromium(t *testing.T, bin string, args ...string) (stdout, stderr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	base := []string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
		"--disable-component-update", "--disable-sync", "--no-first-run", "--user-data-dir=" + t.TempDir(),
		"--enable-logging=stderr", "--v=0"}
	cmd := exec.CommandContext(ctx, bin, append(base, args...)...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("chromium %v: %v\n%s", args, err, errb.String())
	}
	return out.String(), errb.String()
}

// The page renders in a real browser with no console message, and the
// screenshot shows the charts: the would-deny bars and the limit's line.
func TestHTMLRendersInChromium(t *testing.T) {
	bin := chromium(t)
	_, rec := sampleReport()
	var b bytes.Buffer
	if err := WriteRecommendHTML(&b, rec); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	page := filepath.Join(dir, "report.html")
	if err := os.WriteFile(page, b.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	dom, logs := runChromium(t, bin, "--dump-dom", "file://"+page)
	if !strings.Contains(dom, `id="timeline-zone-api"`) || !strings.Contains(dom, `id="distribution-zone-api"`) {
		t.Fatalf("the DOM lacks the charts:\n%.2000s", dom)
	}
	for _, line := range strings.Split(logs, "\n") {
		if strings.Contains(line, "CONSOLE") || strings.Contains(line, "Uncaught") || strings.Contains(line, "Refused to") {
			t.Errorf("console: %s", line)
		}
	}
	shot := filepath.Join(dir, "shot.png")
	runChromium(t, bin, "--window-size=1100,900", "--screenshot="+shot, "file://"+page)
	f, err := os.Open(shot)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatal(err)
	}
	var red, blue int
	bounds := img.Bounds()
	for y := bounds.Min.Y; y < bounds.Max.Y; y++ {
		for x := bounds.Min.X; x < bounds.Max.X; x++ {
			r, g, bl, _ := img.At(x, y).RGBA()
			r, g, bl = r>>8, g>>8, bl>>8
			switch {
			case near(r, 0xd6) && near(g, 0x27) && near(bl, 0x28):
				red++
			case near(r, 0x1f) && near(g, 0x77) && near(bl, 0xb4):
				blue++
			}
		}
	}
	// The denial bars cover thousands of pixels, the limit's line (3 px
	// by ~146) hundreds.
	if red < 1000 || blue < 300 {
		t.Fatalf("the screenshot shows %d pixels of denials and %d of the limit's line", red, blue)
	}
}

func near(v, want uint32) bool { return v+12 >= want && v <= want+12 }
