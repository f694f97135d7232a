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

// fleetMember runs a Caddy binary serving one distributed zone of 10 per
// minute on /limited, syncing through dir every 100ms; each has its own
// data directory, hence its own instance id.
func fleetMember(t *testing.T, httpPort, adminPort int, dir, distributed string) string {
	t.Helper()
	cfg := fmt.Sprintf(`{
	admin localhost:%d
	auto_https off
	default_bind 127.0.0.1
}
:%d {
	rate_limit {
		zone dist_fleet {
			match {
				path /limited
			}
			key    {query.k}
			events 10
			window 1m
		}
		distributed {
%s
		}
		storage file_system %s
	}
	respond "ok"
}`, adminPort, httpPort, distributed, dir)
	home := t.TempDir()
	file := filepath.Join(home, "Caddyfile")
	if err := os.WriteFile(file, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	startCaddy(t, file, "XDG_DATA_HOME="+filepath.Join(home, "data"), "XDG_CONFIG_HOME="+filepath.Join(home, "config"))
	base := fmt.Sprintf("http://127.0.0.1:%d", httpPort)
	waitUp(t, base+"/")
	return base
}

// storageDir is a directory for the Caddy storage a distributed sync
// writes to. The in-process Caddy keeps a test's config until the next
// test loads its own: it is unloaded when the test ends, before the
// directory is removed, and the unload returns once the sync stopped.
func storageDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	t.Cleanup(func() {
		if caddyStarted {
			unloadZones(t)
		}
	})
	return dir
}

func fleetStatus(t *testing.T, url string) int {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// waitFiles waits until n instances have written their counts to dir.
func waitFiles(t *testing.T, dir string, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		files, _ := filepath.Glob(filepath.Join(dir, "rate_limit", "instances", "*.rlstate"))
		if len(files) >= n {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("fewer than %d instances wrote their counts to %s", n, dir)
}

// Two instances sharing a storage admit about the zone's limit between
// them, where each would admit its own limit (20 in all) if distributed
// were ignored. Each instance reaches the other's counts within write_interval
// + read_interval (200ms); requests come every 150ms, alternating, so each
// instance's requests are 300ms apart: by then it has read every request
// the other admitted but the last one. The fleet can overshoot by what the
// other admitted since its last sync: at most 1 here, 2 allowed for a
// slow machine.
func TestDistributedFleetSharesLimit(t *testing.T) {
	dir := storageDir(t)
	conf := "\t\t\tread_interval 100ms\n\t\t\twrite_interval 100ms"
	a := fleetMember(t, freePort(t), freePort(t), dir, conf)
	b := fleetMember(t, freePort(t), freePort(t), dir, conf)
	waitFiles(t, dir, 2)
	time.Sleep(300 * time.Millisecond) // both have read the other's file

	admitted := map[string]int{}
	for i := range 30 {
		base := a
		if i%2 == 1 {
			base = b
		}
		if fleetStatus(t, base+"/limited?k=paced") == http.StatusOK {
			admitted[base]++
		}
		time.Sleep(150 * time.Millisecond)
	}
	total := admitted[a] + admitted[b]
	t.Logf("admitted %d of 30 (%d + %d)", total, admitted[a], admitted[b])
	if total < 10 || total > 12 {
		t.Fatalf("the fleet admitted %d of 30, want 10 to 12 (10 per minute across both)", total)
	}
	// Both now deny: the key is used up fleet-wide.
	if sa, sb := fleetStatus(t, a+"/limited?k=paced"), fleetStatus(t, b+"/limited?k=paced"); sa != http.StatusTooManyRequests || sb != http.StatusTooManyRequests {
		t.Fatalf("after the fleet's limit: %d and %d, want 429 from both", sa, sb)
	}

	// A burst faster than a sync is decided by each instance on its own
	// count and what it last read: the fleet admits at most one limit per
	// instance, as mholt/caddy-ratelimit's does.
	burst := 0
	for i := range 30 {
		base := a
		if i%2 == 1 {
			base = b
		}
		if fleetStatus(t, base+"/limited?k=burst") == http.StatusOK {
			burst++
		}
	}
	t.Logf("a burst of 30 admitted %d", burst)
	if burst < 10 || burst > 20 {
		t.Fatalf("a burst of 30 admitted %d, want 10 to 20", burst)
	}
}

// The shapes of mholt/caddy-ratelimit's state file, which Sluice reads
// and writes, so a fleet can mix both modules.
type mholtValue struct {
	Count       int
	OldestEvent time.Time
}

type mholtState struct {
	Timestamp time.Time
	Zones     map[string]map[string]mholtValue
}

// plantState writes, in storage dir, the file of instance id as it
// reports zones now, and returns its path.
func plantState(t *testing.T, dir, id string, zones map[string]map[string]mholtValue) string {
	t.Helper()
	var buf bytes.Buffer
	if err := gob.NewEncoder(&buf).Encode(mholtState{Timestamp: time.Now(), Zones: zones}); err != nil {
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

// A file left by an instance that stopped counts until purge_age deletes
// it; it is read in mholt/caddy-ratelimit's format.
func TestDistributedPurgeAgeDropsDeadInstance(t *testing.T) {
	dir := storageDir(t)
	a := fleetMember(t, freePort(t), freePort(t), dir, "\t\t\tread_interval 100ms\n\t\t\twrite_interval 100ms\n\t\t\tpurge_age 2s")
	// Planted once the instance runs: its report is 2 s old (purge_age)
	// 2 s after this, however long the instance took to start.
	dead := plantState(t, dir, "dead-instance", map[string]map[string]mholtValue{
		"dist_fleet": {"dead": {Count: 10, OldestEvent: time.Now()}},
	})
	// Read within a read_interval: a few tries, fewer than the 10 the
	// key may spend here on its own.
	got := 0
	for range 5 {
		if got = fleetStatus(t, a+"/limited?k=dead"); got == http.StatusTooManyRequests {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if got != http.StatusTooManyRequests {
		t.Fatalf("with the dead instance's 10 counted: %d, want 429", got)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(dead); os.IsNotExist(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the dead instance's file was not purged")
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond)
	if got := fleetStatus(t, a+"/limited?k=dead"); got != http.StatusOK {
		t.Fatalf("after purge_age: %d, want 200", got)
	}
}

// In one Caddy: the other instances' counts apply from the first request,
// and a reload keeps the sync running under the new config.
func TestDistributedReloadKeepsSync(t *testing.T) {
	dir := storageDir(t)
	peer := plantState(t, dir, "peer", map[string]map[string]mholtValue{
		"dist_reload": {"static": {Count: 8}},
	})
	site := func(events int) string {
		return caddyfileServer(fmt.Sprintf(`	rate_limit {
		zone dist_reload {
			key    static
			events %d
			window 1m
		}
		distributed {
			read_interval  50ms
			write_interval 50ms
		}
		storage file_system %s
	}
	respond "ok"`, events, dir))
	}
	tester := newTester(t, site(10), "caddyfile")
	expectN(t, tester, 2, http.StatusOK, "GET", "/")
	expect429(t, tester, 50, 60, "GET", "/")

	tester.InitServer(site(12), "caddyfile")
	// 12 − the peer's 8 − this instance's 2.
	expectN(t, tester, 2, http.StatusOK, "GET", "/")
	expect429(t, tester, 50, 60, "GET", "/")
	// This instance's counts are still written after the reload.
	deadline := time.Now().Add(5 * time.Second)
	for {
		files, _ := filepath.Glob(filepath.Join(dir, "rate_limit", "instances", "*.rlstate"))
		var st mholtState
		for _, f := range files {
			if data, err := os.ReadFile(f); f != peer && err == nil {
				_ = gob.NewDecoder(bytes.NewReader(data)).Decode(&st)
			}
		}
		if st.Zones["dist_reload"]["static"].Count == 4 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the reload, this instance's file says %+v, want the 4 admitted", st.Zones)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

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

func distributedSite(zone, dir string) string {
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
// not counted: counted, a report a day ahead would keep the keys it lists
// denied for as long as the file stays, with no window ever passing, and
// purge_age would never delete it either.
func TestDistributedFutureReportCountsNothing(t *testing.T) {
	dir := storageDir(t)
	far := map[string]map[string]mholtValue{"a9_future": {"victim": {Count: 100, OldestEvent: time.Now()}}}
	plantStateAt(t, dir, "ahead-a-day", time.Now().Add(24*time.Hour), far)
	plantStateAt(t, dir, "year-3000", time.Date(3000, 1, 1, 0, 0, 0, 0, time.UTC),
		map[string]map[string]mholtValue{"a9_future": {"victim3000": {Count: 100, OldestEvent: time.Date(3000, 1, 1, 0, 0, 0, 0, time.UTC)}}})
	// A peer a little ahead (within a window) still counts.
	plantStateAt(t, dir, "ahead-a-bit", time.Now().Add(200*time.Millisecond),
		map[string]map[string]mholtValue{"a9_future": {"near": {Count: 100}}})
	tester := newTester(t, distributedSite("a9_future", dir), "caddyfile")
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
// is waited for at most a second, where decoding every peer file first
// takes whatever it takes (8 files of a million keys: several seconds).
func TestDistributedHugePeerFileDoesNotHoldLoad(t *testing.T) {
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
func TestDistributedReloadsLeakNoGoroutine(t *testing.T) {
	dir := storageDir(t)
	tester := newTester(t, distributedSite("a9_reload", dir), "caddyfile")
	expectN(t, tester, 1, http.StatusOK, "GET", "/?k=x")
	time.Sleep(200 * time.Millisecond)
	before := runtime.NumGoroutine()
	for i := range 50 {
		tester.InitServer(strings.Replace(distributedSite("a9_reload", dir), `respond "ok"`, fmt.Sprintf(`respond "ok %d"`, i), 1), "caddyfile")
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
// counted. Skipped as this instance's own, the file would leave the fleet
// sharing nothing, silently.
func TestDistributedTwinInstanceIDCounts(t *testing.T) {
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
// at every interval (at 10ms, a line per interval is 190 error lines a
// second).
func TestDistributedUnwritableStorageLogsOnce(t *testing.T) {
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
// Decoded at each read, 80 stale files of 100,000 keys would make a live
// peer's count take seconds to be read.
func TestDistributedStaleFilesAreNotReadAgain(t *testing.T) {
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
