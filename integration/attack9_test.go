package integration

import (
	"bytes"
	"encoding/gob"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
)

// plantStateAt writes the file of instance id in storage dir as a peer
// whose report is dated at.
func plantStateAt(t *testing.T, dir, id string, at time.Time, zones map[string]map[string]mholtValue) string {
	t.Helper()
	var buf bytes.Buffer
	if err := gob.NewEncoder(&buf).Encode(mholtState{Timestamp: at, Zones: zones}); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "rate_limit", "instances", id+".rlstate")
	if err := os.MkdirAll(filepath.Dir(file), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	return file
}

func attack9DistSite(zone, dir string) string {
	return caddyfileServer(fmt.Sprintf(`	rate_limit {
		zone %s {
			key    {query.k}
			events 5
			window 1s
		}
		distributed {
			read_interval  50ms
			write_interval 50ms
		}
		storage file_system %s
	}
	respond "ok"`, zone, dir))
}

// A peer's report dated in the future (its clock, or a hostile file) is
// not counted: before, a report a day ahead kept the keys it lists denied
// for as long as the file stayed, with no window ever passing, and
// purge_age never deleted it either.
func TestAttack9FutureReportCountsNothing(t *testing.T) {
	dir := storageDir(t)
	far := map[string]map[string]mholtValue{"a9_future": {"victim": {Count: 100, OldestEvent: time.Now()}}}
	plantStateAt(t, dir, "ahead-a-day", time.Now().Add(24*time.Hour), far)
	plantStateAt(t, dir, "year-3000", time.Date(3000, 1, 1, 0, 0, 0, 0, time.UTC),
		map[string]map[string]mholtValue{"a9_future": {"victim3000": {Count: 100, OldestEvent: time.Date(3000, 1, 1, 0, 0, 0, 0, time.UTC)}}})
	// A peer a little ahead (within a window) still counts.
	plantStateAt(t, dir, "ahead-a-bit", time.Now().Add(200*time.Millisecond),
		map[string]map[string]mholtValue{"a9_future": {"near": {Count: 100}}})
	tester := newTester(t, attack9DistSite("a9_future", dir), "caddyfile")
	// The first read may still be under way under the race detector: the
	// load waits for it at most a second.
	for deadline := time.Now().Add(time.Second); ; time.Sleep(20 * time.Millisecond) {
		code, _, _ := do(t, tester, "GET", "/?k=near")
		if code == http.StatusTooManyRequests {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a peer 200ms ahead with 100 counted: %d, want 429", code)
		}
	}
	time.Sleep(1500 * time.Millisecond) // more than a window
	for _, k := range []string{"victim", "victim3000"} {
		if code, ra, _ := do(t, tester, "GET", "/?k="+k); code != http.StatusOK {
			t.Fatalf("key %s, listed by a peer dated in the future, a window later: %d (Retry-After %s), want 200", k, code, ra)
		}
	}
	if code, _, _ := do(t, tester, "GET", "/?k=near"); code != http.StatusOK {
		t.Fatalf("the peer 200ms ahead, after its window: %d, want 200", code)
	}
}

// A huge peer file must not hold up the load of a config: the first read
// is waited for at most a second. Before, the load decoded every peer file
// first, whatever it took (8 files of a million keys: several seconds).
func TestAttack9HugePeerFileDoesNotHoldLoad(t *testing.T) {
	dir := storageDir(t)
	// Under the race detector decoding is some ten times slower: 8 files
	// of a million keys took over 60 s to read in the background, so it
	// gets files of 256k keys, which still take far more than the second
	// a load waits for them (and a load of its own is slower: 2.1 s seen).
	n, most := 1<<20, 3*time.Second
	if raceEnabled {
		n, most = 1<<18, 5*time.Second
	}
	keys := make(map[string]mholtValue, n)
	for i := range n {
		keys[strconv.Itoa(i)] = mholtValue{Count: 1}
	}
	keys["7"] = mholtValue{Count: 1000}
	first := plantStateAt(t, dir, "huge-0", time.Now(), map[string]map[string]mholtValue{"a9_huge": keys})
	data, err := os.ReadFile(first)
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i < 8; i++ {
		if err := os.WriteFile(filepath.Join(filepath.Dir(first), fmt.Sprintf("huge-%d.rlstate", i)), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	site := caddyfileServer(fmt.Sprintf(`	rate_limit {
		zone a9_huge {
			key    {query.k}
			events 1000
			window 1m
		}
		distributed {
			read_interval  1m
			write_interval 1m
		}
		storage file_system %s
	}
	respond "ok"`, dir))
	start := time.Now()
	tester := newTester(t, site, "caddyfile")
	took := time.Since(start)
	t.Logf("8 peer files of %d bytes: the load took %s", len(data), took)
	if took > most {
		t.Fatalf("the load took %s, want at most about a second beyond the config's own work", took)
	}
	expectN(t, tester, 1, http.StatusOK, "GET", "/?k=fresh")
	// The keys of the files still count once they are read (8 × 1000 of key 7).
	deadline := time.Now().Add(60 * time.Second)
	for {
		code, _, _ := do(t, tester, "GET", "/?k=7")
		if code == http.StatusTooManyRequests {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the peers' 8,000 units of key 7 were never counted")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// 50 reloads of a distributed config leave no sync loop behind.
func TestAttack9ReloadsLeakNoGoroutine(t *testing.T) {
	dir := storageDir(t)
	tester := newTester(t, attack9DistSite("a9_reload", dir), "caddyfile")
	expectN(t, tester, 1, http.StatusOK, "GET", "/?k=x")
	time.Sleep(200 * time.Millisecond)
	before := runtime.NumGoroutine()
	for i := range 50 {
		tester.InitServer(strings.Replace(attack9DistSite("a9_reload", dir), `respond "ok"`, fmt.Sprintf(`respond "ok %d"`, i), 1), "caddyfile")
	}
	expectN(t, tester, 1, http.StatusOK, "GET", "/?k=x")
	time.Sleep(500 * time.Millisecond)
	after := runtime.NumGoroutine()
	t.Logf("goroutines: %d before 50 reloads, %d after", before, after)
	if after > before+10 {
		t.Fatalf("goroutines: %d before 50 reloads, %d after", before, after)
	}
}

// Instances started from a copy of one data directory share its instance
// id, so they write one file: the counts another process wrote there are
// counted. Before, the file was skipped as this instance's own, and the
// fleet shared nothing, silently.
func TestAttack9TwinInstanceIDCounts(t *testing.T) {
	dir := storageDir(t)
	id, err := caddy.InstanceID()
	if err != nil {
		t.Fatal(err)
	}
	site := caddyfileServer(fmt.Sprintf(`	rate_limit {
		zone a9_twin {
			key    {query.k}
			events 5
			window 1m
		}
		distributed {
			read_interval  50ms
			write_interval 1h
		}
		storage file_system %s
	}
	respond "ok"`, dir))
	tester := newTester(t, site, "caddyfile")
	plantStateAt(t, dir, id.String(), time.Now(), map[string]map[string]mholtValue{"a9_twin": {"shared": {Count: 100}}})
	time.Sleep(300 * time.Millisecond) // a few reads
	if code, _, _ := do(t, tester, "GET", "/?k=shared"); code != http.StatusTooManyRequests {
		t.Fatalf("with 100 counted by a twin of this instance id: %d, want 429", code)
	}
	expectN(t, tester, 5, http.StatusOK, "GET", "/?k=other")
}

// A storage that cannot be read or written logs its failure once, not
// at every interval: at 10ms, before, 190 error lines a second.
func TestAttack9UnwritableStorageLogsOnce(t *testing.T) {
	dir := storageDir(t)
	file := filepath.Join(dir, "a-file")
	if err := os.WriteFile(file, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	logFile := filepath.Join(dir, "caddy.log")
	cfg := caddyfileServerWith(fmt.Sprintf("\tlog {\n\t\toutput file %s\n\t}", logFile), fmt.Sprintf(`	rate_limit {
		zone a9_unwritable {
			key    {query.k}
			events 5
			window 1m
		}
		distributed {
			read_interval  10ms
			write_interval 10ms
		}
		storage file_system %s
	}
	respond "ok"`, filepath.Join(file, "sub")))
	tester := newTester(t, cfg, "caddyfile")
	expectN(t, tester, 3, http.StatusOK, "GET", "/?k=a")
	time.Sleep(time.Second)
	unloadZones(t)
	data, err := os.ReadFile(logFile)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Count(string(data), `"msg":"distributed: `)
	t.Logf("%d lines about the sync in a second", lines)
	if lines == 0 || lines > 4 {
		t.Fatalf("%d log lines about the failing sync in a second at 10ms, want 1 to 4", lines)
	}
}

// Without purge_age, the files of instances gone pile up; they report
// nothing a zone still counts, so they are not loaded at every read.
// Before, 80 stale files of 100,000 keys were decoded at each read, and a
// live peer's count took seconds to be read.
func TestAttack9StaleFilesAreNotReadAgain(t *testing.T) {
	dir := storageDir(t)
	keys := make(map[string]mholtValue, 100_000)
	for i := range 100_000 {
		keys[strconv.Itoa(i)] = mholtValue{Count: 1}
	}
	old := time.Now().Add(-3 * time.Hour)
	first := plantStateAt(t, dir, "gone-0", old, map[string]map[string]mholtValue{"a9_stale": keys})
	data, err := os.ReadFile(first)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 80 {
		file := filepath.Join(filepath.Dir(first), fmt.Sprintf("gone-%d.rlstate", i))
		if err := os.WriteFile(file, data, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(file, old, old); err != nil {
			t.Fatal(err)
		}
	}
	site := caddyfileServer(fmt.Sprintf(`	rate_limit {
		zone a9_stale {
			key    {query.k}
			events 1000
			window 1m
		}
		distributed {
			read_interval  20ms
			write_interval 1s
		}
		storage file_system %s
	}
	respond "ok"`, dir))
	tester := newTester(t, site, "caddyfile")
	time.Sleep(500 * time.Millisecond)
	var took time.Duration
	for probe := range 3 {
		key := fmt.Sprintf("live%d", probe)
		plantStateAt(t, dir, key, time.Now(), map[string]map[string]mholtValue{"a9_stale": {key: {Count: 5000}}})
		start := time.Now()
		for {
			code, _, _ := do(t, tester, "GET", "/?k="+key)
			if code == http.StatusTooManyRequests {
				break
			}
			if time.Since(start) > 30*time.Second {
				t.Fatal("the live peer's count was never read")
			}
			time.Sleep(10 * time.Millisecond)
		}
		took += time.Since(start)
		time.Sleep(time.Duration(probe+1) * 150 * time.Millisecond) // at another point of a read
	}
	t.Logf("a live peer's count was read in %s on average beside 80 stale files", took/3)
	if took/3 > 300*time.Millisecond {
		t.Fatalf("a live peer's count took %s on average to be read, want well under a second at read_interval 20ms", took/3)
	}
}
