package replay

import (
	"compress/gzip"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// caddyLine is a line as Caddy 2.11 writes it, with the request arriving
// at arrival (Unix ns) and taking dur ns.
func caddyLine(arrival, dur int64, uri, user string) string {
	end := arrival + dur
	return fmt.Sprintf(`{"level":"info","ts":%d.%09d,"logger":"http.log.access.log0","msg":"handled request","request":{"remote_ip":"127.0.0.1","remote_port":"48092","client_ip":"203.0.113.7","proto":"HTTP/1.1","method":"GET","host":"example.com","uri":%q,"headers":{"X-User":[%q],"Accept":["*/*"]}},"bytes_read":0,"user_id":"","duration":%d.%09d,"size":2,"status":200,"resp_headers":{"Server":["Caddy"]}}`,
		end/1e9, end%1e9, uri, user, dur/1e9, dur%1e9)
}

func writeLog(t *testing.T, name string, lines []string, gz bool) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	body := strings.Join(lines, "\n") + "\n"
	if gz {
		zw := gzip.NewWriter(f)
		zw.Write([]byte(body))
		zw.Close()
	} else {
		f.WriteString(body)
	}
	return path
}

func TestParseEntryReadsCaddysLine(t *testing.T) {
	line := `{"level":"info","ts":1796163987.923163,"logger":"http.log.access.log0","msg":"handled request","request":{"remote_ip":"127.0.0.1","remote_port":"48092","client_ip":"10.0.0.9","proto":"HTTP/2.0","method":"POST","host":"127.0.0.1:55381","uri":"/a?b=\u00e9\"","headers":{"X-User":["u0","u1"],"User-Agent":["x\\y"]},"tls":{"resumed":false,"version":772,"cipher_suite":4865,"proto":"h2","server_name":"example.com","ech":false}},"bytes_read":0,"user_id":"alice","duration":0.000118441,"size":2,"status":401,"resp_headers":{"Retry-After":["3"]}}`
	for _, sc := range []*scanner{nil, {intern: map[string]string{}}} {
		var e Entry
		if err := parseEntry(sc, []byte(line), &e); err != nil {
			t.Fatal(err)
		}
		if e.End != 1796163987923163000 || e.Arrival != 1796163987923163000-118441 {
			t.Errorf("end %d arrival %d", e.End, e.Arrival)
		}
		if e.Method != "POST" || e.URI != `/a?b=é"` || e.Client != "10.0.0.9" || e.UserID != "alice" || e.Status != 401 || e.Proto != "HTTP/2.0" {
			t.Errorf("entry %+v", e)
		}
		if got := e.Header["X-User"]; len(got) != 2 || got[1] != "u1" || e.Header.Get("User-Agent") != `x\y` {
			t.Errorf("headers %v", e.Header)
		}
		if e.TLS == nil || e.TLS.Version != 772 || e.TLS.ServerName != "example.com" || e.TLS.Proto != "h2" {
			t.Errorf("tls %+v", e.TLS)
		}
		if !refusedLive(&e) || e.RespHeader().Get("Retry-After") != "3" {
			t.Errorf("response headers %s", e.respRaw)
		}
	}
}

func TestDecimalNanosIsExact(t *testing.T) {
	for in, want := range map[string]int64{"1796163987.923163": 1796163987923163000, "0.000118441": 118441, "5": 5e9, "1.5": 1_500_000_000, "2.1234567891": 2_123456789} {
		if got, err := decimalNanos(in); err != nil || got != want {
			t.Errorf("%s: %d %v, want %d", in, got, err, want)
		}
	}
}

func drain(t *testing.T, m *Merger) []*Entry {
	t.Helper()
	var out []*Entry
	for {
		e, err := m.Next()
		if err != nil {
			t.Fatal(err)
		}
		if e == nil {
			return out
		}
		out = append(out, e)
	}
}

func TestMalformedLinesCountedWithTheirNumbers(t *testing.T) {
	const base = int64(1_800_000_000e9)
	path := writeLog(t, "access.log", []string{
		caddyLine(base, 1e6, "/1", "u"),
		`{"level":"info","ts":1800000000.5,"logger":"http.log.access.log0","request":`,
		``,
		`{"level":"info","ts":1800000001,"logger":"tls","msg":"certificate obtained"}`,
		`not json at all`,
		`{"level":"info","ts":"yesterday","logger":"http.log.access","request":{"method":"GET","uri":"/"}}`,
		caddyLine(base+2e9, 1e6, "/2", "u"),
	}, false)
	m, err := NewMerger([]string{path}, 0)
	if err != nil {
		t.Fatal(err)
	}
	got := drain(t, m)
	lines, entries, other, malformed, examples := m.Counts()
	if len(got) != 2 || lines != 6 || entries != 2 || other != 1 || malformed != 3 {
		t.Fatalf("entries %d; counts lines %d entries %d other %d malformed %d", len(got), lines, entries, other, malformed)
	}
	var at []int64
	for _, e := range examples {
		at = append(at, e.Line)
	}
	if fmt.Sprint(at) != "[2 5 6]" || !strings.Contains(examples[2].Error, "ts") {
		t.Fatalf("malformed lines %+v", examples)
	}
}

func TestOtherLogFormatsRefused(t *testing.T) {
	for name, line := range map[string]string{
		"common":  `203.0.113.7 - - [10/Oct/2026:13:55:36 +0000] "GET / HTTP/1.1" 200 2326`,
		"console": "2026/10/10 13:55:36.000\tINFO\thttp.log.access.log0\thandled request\t{\"request\": {}}",
	} {
		m, err := NewMerger([]string{writeLog(t, name+".log", []string{line}, false)}, 0)
		if err != nil {
			t.Fatal(err)
		}
		_, err = m.Next()
		var fe *FormatError
		if !errors.As(err, &fe) || fe.Line != 1 || !strings.Contains(err.Error(), "expected Caddy's JSON access log") {
			t.Errorf("%s: %v", name, err)
		}
		if name == "console" && !strings.Contains(err.Error(), "format json") {
			t.Errorf("console: %v", err)
		}
	}
	// JSON of other loggers only.
	m, _ := NewMerger([]string{writeLog(t, "caddy.log", []string{`{"level":"info","ts":1,"logger":"tls","msg":"x"}`}, false)}, 0)
	if _, err := m.Next(); err == nil || !strings.Contains(err.Error(), "no access log entry") {
		t.Errorf("other loggers: %v", err)
	}
}

// Files are merged by arrival (ts - duration), a gzip'd one too; a
// request slower than the reorder window comes late, at the time of the
// one before it.
func TestMergeOrdersByArrival(t *testing.T) {
	const base = int64(1_800_000_000e9)
	a := writeLog(t, "a.log", []string{
		caddyLine(base+0, 1e6, "/a0", "u"),
		caddyLine(base+5e8, 3e9, "/slow", "u"), // arrives at 0.5 s, logged at 3.5 s
		caddyLine(base+4e9, 1e6, "/a4", "u"),
	}, false)
	b := writeLog(t, "b.log.gz", []string{
		caddyLine(base+1e9, 1e6, "/b1", "u"),
		caddyLine(base+2e9, 1e6, "/b2", "u"),
		caddyLine(base+30e9, 20e9, "/late", "u"), // arrives at 10 s after /a4's line was decided
		caddyLine(base+31e9, 1e6, "/b31", "u"),
	}, true)
	m, err := NewMerger([]string{a, b}, DefaultReorder)
	if err != nil {
		t.Fatal(err)
	}
	m.maxHeld = 100
	var order []string
	for _, e := range drain(t, m) {
		order = append(order, e.URI)
	}
	if got := strings.Join(order, " "); got != "/a0 /slow /b1 /b2 /a4 /late /b31" {
		t.Fatalf("order %s", got)
	}
	if m.Late != 0 {
		t.Fatalf("late %d", m.Late)
	}
	// A 1 s window: /slow (3 s) is late, decided at /b1's time.
	m, _ = NewMerger([]string{a, b}, 1e9)
	got := drain(t, m)
	order = nil
	for _, e := range got {
		order = append(order, e.URI)
	}
	if m.Late < 1 || !strings.Contains(strings.Join(order, " "), "/b2 /slow") && !strings.Contains(strings.Join(order, " "), "/b1 /slow") {
		t.Fatalf("order %v, late %d", order, m.Late)
	}
	for i := 1; i < len(got); i++ {
		if got[i].At < got[i-1].At {
			t.Fatalf("decided out of order: %v", order)
		}
	}
}
