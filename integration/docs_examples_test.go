package integration

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// docBlock is one fenced code block of the documentation, or a whole
// example file.
type docBlock struct {
	where string // file:line
	lang  string
	text  string
}

// docBlocks returns the caddyfile and json blocks of README.md and
// docs/, and Caddyfile.example.
func docBlocks(t *testing.T) []docBlock {
	t.Helper()
	files := []string{"../README.md"}
	err := filepath.WalkDir("../docs", func(path string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(path, ".md") {
			files = append(files, path)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	var blocks []docBlock
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(string(data), "\n")
		for i := 0; i < len(lines); i++ {
			lang, ok := strings.CutPrefix(lines[i], "```")
			if !ok || (lang != "caddyfile" && lang != "json") {
				continue
			}
			start := i
			var body []string
			for i++; i < len(lines) && !strings.HasPrefix(lines[i], "```"); i++ {
				body = append(body, lines[i])
			}
			blocks = append(blocks, docBlock{where: f + ":" + strconv.Itoa(start+1), lang: lang, text: strings.Join(body, "\n")})
		}
	}
	example, err := os.ReadFile("../Caddyfile.example")
	if err != nil {
		t.Fatal(err)
	}
	return append(blocks, docBlock{where: "../Caddyfile.example", lang: "caddyfile", text: string(example)})
}

var (
	bareClientKey = regexp.MustCompile(`(?m)^\s*key\s+\{(client_ip|http\.vars\.client_ip|remote_host|http\.request\.remote\.host)\}\s*(#.*)?$`)
	pathLine      = regexp.MustCompile(`(?m)^\s*path\s+([^#\n]+)`)
	// placeholderSyntax finds the <name> slots of a syntax summary.
	placeholderSyntax = regexp.MustCompile(`<[a-z_]+>`)
)

// The examples teach the safe way: clients by `by ip` (IPv6 per /64),
// trusted_proxies only with trusted_proxies_strict, and exact routes
// matched in every spelling Caddy passes on.
func TestDocsExamplesAreSafe(t *testing.T) {
	for _, b := range docBlocks(t) {
		if b.lang == "json" {
			if strings.Contains(b.text, `"key": "{http.vars.client_ip}"`) && !strings.Contains(b.text, `"ipv6_prefix"`) {
				t.Errorf("%s: a key on the client address without ipv6_prefix counts each IPv6 address alone", b.where)
			}
			continue
		}
		if m := bareClientKey.FindString(b.text); m != "" {
			t.Errorf("%s: %q counts each IPv6 address alone: write `by ip`", b.where, strings.TrimSpace(m))
		}
		if strings.Contains(b.text, "trusted_proxies ") && !strings.Contains(b.text, "trusted_proxies_strict") {
			t.Errorf("%s: trusted_proxies without trusted_proxies_strict", b.where)
		}
		patterns := map[string]bool{}
		for _, m := range pathLine.FindAllStringSubmatch(b.text, -1) {
			for _, p := range strings.Fields(m[1]) {
				patterns[p] = true
			}
		}
		for p := range patterns {
			if strings.Contains(p, "*") || strings.HasSuffix(p, "/") {
				continue
			}
			for _, variant := range []string{p + "/", p + ";*", p + "/;*"} {
				if !patterns[variant] {
					t.Errorf("%s: path %s is matched without %s", b.where, p, variant)
				}
			}
		}
	}
}

// Every Caddyfile example validates with the built binary: complete files
// as they are, a lone zone or rate_limit block inside a site.
func TestDocsExamplesValidate(t *testing.T) {
	bin := binary(t)
	dir := t.TempDir()
	for i, b := range docBlocks(t) {
		if b.lang != "caddyfile" {
			continue
		}
		if placeholderSyntax.MatchString(b.text) {
			continue // the syntax summary, not an example
		}
		cfg := b.text
		switch firstWord(cfg) {
		case "zone":
			cfg = ":8080 {\n\trate_limit {\n" + cfg + "\n\t}\n\trespond ok\n}\n"
		case "rate_limit":
			cfg = ":8080 {\n" + cfg + "\n\trespond ok\n}\n"
		}
		if !hasSite(cfg) {
			cfg += "\n:8080 {\n\trespond ok\n}\n"
		}
		file := filepath.Join(dir, "Caddyfile"+strconv.Itoa(i))
		if err := os.WriteFile(file, []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(bin, "validate", "--adapter", "caddyfile", "--config", file)
		cmd.Env = append(os.Environ(), "SLUICE_KEY_SECRET=an-example-secret-of-32-bytes!!!", "INTERNAL_TOKEN=t")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("%s does not validate: %v\n%s\n--- config:\n%s", b.where, err, out, cfg)
		}
	}
}

func firstWord(s string) string {
	for _, line := range strings.Split(s, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		return strings.Fields(line)[0]
	}
	return ""
}

// hasSite reports whether a Caddyfile has a site block after its global
// options.
func hasSite(cfg string) bool {
	depth, sawGlobal := 0, false
	for _, line := range strings.Split(cfg, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if depth == 0 && line != "{" && sawGlobal {
			return true
		}
		if depth == 0 && line == "{" {
			sawGlobal = true
		}
		depth += strings.Count(line, "{") - strings.Count(line, "}")
	}
	return !sawGlobal
}

// docSite returns the documented Caddyfile that contains marker, made to
// run here: served on the test ports, answering "ok" instead of proxying.
func docSite(t *testing.T, file, marker string) string {
	t.Helper()
	for _, b := range docBlocks(t) {
		if !strings.HasPrefix(b.where, file+":") || !strings.Contains(b.text, marker) {
			continue
		}
		site := regexp.MustCompile(`(?m)^[a-z0-9.]+\.example\.com \{`).ReplaceAllString(b.text, ":9080 {")
		site = strings.ReplaceAll(site, "reverse_proxy localhost:9000", "respond \"ok\"")
		globals := "{\n\tskip_install_trust\n\tadmin localhost:2999\n\thttp_port 9080\n}\n"
		if firstWord(site) == "{" {
			site = strings.Replace(site, "{\n", "{\n\tskip_install_trust\n\tadmin localhost:2999\n\thttp_port 9080\n", 1)
			return site
		}
		return globals + site
	}
	t.Fatalf("no caddyfile block in %s contains %q", file, marker)
	return ""
}

// docText is the text of the caddyfile block of file that contains
// marker, as written.
func docText(t *testing.T, file, marker string) string {
	t.Helper()
	for _, b := range docBlocks(t) {
		if strings.HasPrefix(b.where, file+":") && b.lang == "caddyfile" && strings.Contains(b.text, marker) {
			return b.text
		}
	}
	t.Fatalf("no caddyfile block in %s contains %q", file, marker)
	return ""
}

// The login example of docs/keys.md, as written: one username in every
// spelling of the route, posted as a form or as JSON, shares its 5
// attempts.
func TestDocsLoginExample(t *testing.T) {
	t.Setenv("SLUICE_KEY_SECRET", "an-example-secret-of-32-bytes!!!")
	tester := newTester(t, docSite(t, "../docs/keys.md", "by body username"), "caddyfile")
	for _, path := range []string{"/login", "/login/", "/login;a", "/login%2F", "/Login;jsessionid=1"} {
		ctype, body := "application/x-www-form-urlencoded", "username=rakib&password=x"
		if path == "/login/" {
			ctype, body = "application/json", `{"username": "Rakib", "password": "x"}`
		}
		if code, body := post(t, tester, path, ctype, body); code != http.StatusOK {
			t.Fatalf("POST %s: %d %q", path, code, body)
		}
	}
	if code, _ := post(t, tester, "/login/;a", "application/x-www-form-urlencoded", "username=RAKIB&password=x"); code != http.StatusTooManyRequests {
		t.Fatalf("6th attempt for one user: %d, want 429", code)
	}
}

// The OTP example of docs/keys.md, as written: once a code went to a
// number, its one-minute cooldown holds for every spelling of the number
// sent to every spelling of the route.
func TestDocsOTPExample(t *testing.T) {
	t.Setenv("SLUICE_KEY_SECRET", "an-example-secret-of-32-bytes!!!")
	tester := newTester(t, docSite(t, "../docs/keys.md", "zone otp_send {\n\t\t\tmatch"), "caddyfile")
	send := func(path, phone string) (int, string) {
		return post(t, tester, path, "application/json", `{"phone":"`+phone+`"}`)
	}
	if code, body := send("/otp/send", "01712345678"); code != http.StatusOK {
		t.Fatalf("first code: %d %q", code, body)
	}
	for _, s := range []struct{ path, phone string }{
		{"/otp/send/", "+8801712345678"},
		{"/otp/send;x=1", "8801712345678"},
		{"/otp/send%2F", "+880 1712-345678"},
		{"/OTP/send/;x", "01712345678"},
	} {
		if code, body := send(s.path, s.phone); code != http.StatusTooManyRequests || !strings.Contains(body, `"retry_after":60`) {
			t.Fatalf("POST %s %s within the cooldown: %d %q, want 429 with retry_after 60", s.path, s.phone, code, body)
		}
	}
	if code, body := send("/otp/send", "01812345678"); code != http.StatusOK {
		t.Fatalf("another number: %d %q", code, body)
	}
	if code, _ := send("/otp/send", "not a number"); code != http.StatusBadRequest {
		t.Fatalf("no valid number: %d, want 400", code)
	}
}

// Every JSON block of the documentation loads into a running Caddy: a
// handler as it is, a zone's fields inside a zone. (The Caddyfile blocks
// are validated by TestDocsExamplesValidate.)
func TestDocsJSONBlocksLoad(t *testing.T) {
	newTester(t, jsonServer(okHandler, ""), "json")
	n := 0
	for _, b := range docBlocks(t) {
		if b.lang != "json" {
			continue
		}
		handler := b.text
		if !strings.Contains(b.text, `"handler"`) {
			handler = `{"handler": "rate_limit", "rate_limits": {"doc_json": ` + b.text + `}}`
			if !strings.Contains(b.text, `"key"`) {
				handler = strings.Replace(handler, `"doc_json": {`, `"doc_json": {"key": "{http.request.header.X-Api-Key}",`, 1)
			}
		}
		t.Run(b.where, func(t *testing.T) {
			adminRequest(t, "POST", "/load", "application/json", jsonServer(handler+`, `+okHandler, ""))
		})
		n++
	}
	if n < 3 {
		t.Fatalf("%d JSON blocks found in the documentation, want at least 3", n)
	}
}

// The Cloudflare options of docs/keys.md: the header counts only from a
// trusted peer, and then each address it names is its own client.
func TestDocsCloudflareClientIP(t *testing.T) {
	var globals string
	for _, b := range docBlocks(t) {
		if strings.HasPrefix(b.where, "../docs/keys.md:") && strings.Contains(b.text, "CF-Connecting-IP") {
			globals = strings.TrimSuffix(strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(b.text), "{")), "}")
		}
	}
	if globals == "" {
		t.Fatal("no Cloudflare block in docs/keys.md")
	}
	site := `	rate_limit {
		zone seeds_cf {
			by ip
			rate 2/1h
		}
	}
	respond "ok"`
	// The test's peer, 127.0.0.1, is not Cloudflare: its header is ignored.
	tester := newTester(t, caddyfileServerWith(globals, site), "caddyfile")
	for i := range 200 {
		want := 200
		if i >= 2 {
			want = 429
		}
		if r := fetch(t, tester, "GET", "/", "CF-Connecting-IP", fmt.Sprintf("198.51.100.%d", i%250)); r.code != want {
			t.Fatalf("untrusted peer, request #%d: %d, want %d", i+1, r.code, want)
		}
	}
	// The peer in the trusted ranges: each address is a client.
	tester = newTester(t, caddyfileServerWith(strings.Replace(globals, "173.245.48.0/20", "127.0.0.1/32", 1), site), "caddyfile")
	for _, ip := range []string{"198.51.100.1", "198.51.100.2", "2001:db8:1:2::1"} {
		expectN(t, tester, 2, 200, "GET", "/", "CF-Connecting-IP", ip)
	}
	expect429(t, tester, 3599, 3600, "GET", "/", "CF-Connecting-IP", "198.51.100.1", "X-Forwarded-For", "203.0.113.9")
	expect429(t, tester, 3599, 3600, "GET", "/", "CF-Connecting-IP", "2001:db8:1:2::ffff")
}

// The five layers of the OTP example of docs/keys.md, each at its number:
// 10 codes per address, 40 per /24, 500 a minute for the service.
func TestDocsOTPExampleLayers(t *testing.T) {
	t.Setenv("SLUICE_KEY_SECRET", recipeSecret)
	site := docSite(t, "../docs/keys.md", "zone otp_send {\n\t\t\tmatch")
	// The test's peer stands for the load balancer the example trusts.
	tester := newTester(t, strings.Replace(site, "trusted_proxies static 10.0.0.0/8", "trusted_proxies static 127.0.0.1/32", 1), "caddyfile")
	next := 0
	send := func(ip string) (int, string) {
		next++
		return post(t, tester, "/otp/send", "application/json", fmt.Sprintf(`{"phone":"0171%07d"}`, next), "X-Forwarded-For", ip)
	}
	// The service's bucket refills from its first code on: a loaded
	// machine takes seconds for the 40 before the flood.
	start := time.Now()
	for i := range 10 {
		if code, body := send("198.51.100.1"); code != 200 {
			t.Fatalf("address's code #%d: %d %q", i+1, code, body)
		}
	}
	if code, body := send("198.51.100.1"); code != 429 || !strings.Contains(body, `"retry_after":600`) {
		t.Fatalf("address's 11th code: %d %q, want 429 with retry_after 600", code, body)
	}
	for _, ip := range []string{"198.51.100.2", "198.51.100.3", "198.51.100.4"} {
		for i := range 10 {
			if code, body := send(ip); code != 200 {
				t.Fatalf("%s code #%d: %d %q", ip, i+1, code, body)
			}
		}
	}
	if code, body := send("198.51.100.5"); code != 429 || !strings.Contains(body, `"retry_after":6`) {
		t.Fatalf("the /24's 41st code: %d %q, want 429 with retry_after about 600", code, body)
	}
	// The service's ceiling: 500 a minute in bursts of 500, from addresses
	// of many networks (40 of it were sent above).
	allowed := 40
	for n := 0; ; n++ {
		code, body := send(fmt.Sprintf("203.0.%d.%d", n/40, 1+n%40/10))
		if code == 429 {
			if !strings.Contains(body, `"retry_after":1}`) {
				t.Fatalf("over the ceiling: %q, want retry_after 1", body)
			}
			break
		}
		if code != 200 || n > 1000 {
			t.Fatalf("code #%d: %d %q", allowed+1, code, body)
		}
		allowed++
	}
	if elapsed := time.Since(start).Seconds(); allowed < 500 || float64(allowed) > 500+500.0/60*elapsed+1 {
		t.Fatalf("the service sent %d codes in %.1fs before its ceiling, want 500 plus the refill", allowed, elapsed)
	}
}
