package integration

import (
	"bytes"
	"encoding/gob"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"
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
// them, where each admitted its own limit (20 in all) when distributed was
// ignored. Each instance reaches the other's counts within write_interval
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
