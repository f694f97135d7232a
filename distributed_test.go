package sluice

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/sluicehq/sluice/internal/fleet/fleettest"
)

type distClock struct{ now int64 }

func (c *distClock) get() int64                    { return c.now }
func (c *distClock) advance(d time.Duration)       { c.now += int64(d) }
func (c *distClock) time() time.Time               { return time.Unix(0, c.now) }
func (c *distClock) ago(d time.Duration) time.Time { return time.Unix(0, c.now-int64(d)) }

// provisionDist provisions a handler that syncs through s, on clock c.
func provisionDist(t testing.TB, config string, s *fleettest.Storage, c *distClock) *unitHandler {
	t.Helper()
	if _, _, err := provisionJSON([]byte(`{}`), c.get); err != nil {
		t.Fatal(err)
	}
	h, err := decodeHandler([]byte(config))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := caddy.NewContext(fuzzBase)
	if err := h.provision(ctx, &plan{Handler: h, now: c.get, distStorage: s}); err != nil {
		_ = h.Cleanup()
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Cleanup(); cancel() })
	return &unitHandler{h: h}
}

func admittedOf(u *unitHandler, n int) (ok int, last answer) {
	for range n {
		last = u.serve(context.Background(), nil)
		if last.passed {
			ok++
		}
	}
	return ok, last
}

// readPeers makes u read the other instances' files now.
func readPeers(t testing.TB, u *unitHandler) {
	t.Helper()
	if err := u.h.plan.fleet.m.Read(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// written writes u's counts now and returns the file.
func written(t testing.TB, u *unitHandler, s *fleettest.Storage) fleettest.State {
	t.Helper()
	if err := u.h.plan.fleet.m.Write(context.Background()); err != nil {
		t.Fatal(err)
	}
	id, err := caddy.InstanceID()
	if err != nil {
		t.Fatal(err)
	}
	return fleettest.Get(t, s, id.String())
}

// The intervals are long so that only the test's own reads and writes
// happen.
const distZone = `{"rate_limits": {"dist_a": {"key": "static", "max_events": 10, "window": "1m"}},
	"distributed": {"read_interval": "1h", "write_interval": "1h"}}`

func TestDistributedAddsOtherInstancesCounts(t *testing.T) {
	s, c := fleettest.NewStorage(), &distClock{now: fuzzStart}
	u := provisionDist(t, distZone, s, c)
	// Another instance admitted 7 of the key, the first 20 s ago.
	fleettest.Put(t, s, "peer-1", fleettest.State{Timestamp: c.ago(time.Second), Zones: map[string]map[string]fleettest.Value{
		"dist_a": {"static": {Count: 7, OldestEvent: c.ago(20 * time.Second)}, "other": {Count: 10}},
	}})
	readPeers(t, u)
	ok, last := admittedOf(u, 10)
	if ok != 3 || last.code != http.StatusTooManyRequests {
		t.Fatalf("admitted %d of 10 (last %d), want 3 then 429", ok, last.code)
	}
	// Room comes back when the peer's oldest event leaves the window.
	if got := last.header.Get("Retry-After"); got != "40" {
		t.Errorf("Retry-After %q, want 40", got)
	}
	// The denials took nothing here: once the peer's report is older than
	// the window, all 10 are this instance's again, less its own 3.
	c.advance(59500 * time.Millisecond)
	if ok, _ := admittedOf(u, 10); ok != 7 {
		t.Errorf("after the peer's report aged out: admitted %d, want 7", ok)
	}
}

// A shadow zone never denies: the others' counts do not make it.
func TestDistributedShadowZone(t *testing.T) {
	s, c := fleettest.NewStorage(), &distClock{now: fuzzStart}
	u := provisionDist(t, `{"rate_limits": {"dist_shadow": {"key": "static", "max_events": 10, "window": "1m", "shadow": true}},
	"distributed": {"read_interval": "1h", "write_interval": "1h"}}`, s, c)
	fleettest.Put(t, s, "peer", fleettest.State{Timestamp: c.time(), Zones: map[string]map[string]fleettest.Value{
		"dist_shadow": {"static": {Count: 10}},
	}})
	readPeers(t, u)
	if ok, _ := admittedOf(u, 5); ok != 5 {
		t.Errorf("admitted %d of 5 in a shadow zone, want 5", ok)
	}
}

// The file holds the store's counts: how many a key admitted in its
// window and when the first of them leaves it.
func TestDistributedWritesStoreCounts(t *testing.T) {
	s, c := fleettest.NewStorage(), &distClock{now: fuzzStart}
	u := provisionDist(t, distZone, s, c)
	admittedOf(u, 4)
	c.advance(10 * time.Second)
	admittedOf(u, 8) // 6 more pass, 2 denied
	st := written(t, u, s)
	got := st.Zones["dist_a"]["static"]
	if !st.Timestamp.Equal(c.time()) || got.Count != 10 || !got.OldestEvent.Equal(c.ago(10*time.Second)) {
		t.Errorf("wrote %v %+v, want count 10 at %v, oldest %v", st.Timestamp, got, c.time(), c.ago(10*time.Second))
	}
}

func TestDistributedOtherAlgorithms(t *testing.T) {
	for _, alg := range []string{"fixed_window", "sliding_window_counter"} {
		s, c := fleettest.NewStorage(), &distClock{now: fuzzStart}
		u := provisionDist(t, `{"rate_limits": {"dist_`+alg+`": {"key": "static", "algorithm": "`+alg+`", "max_events": 10, "window": "1m"}},
	"distributed": {"read_interval": "1h", "write_interval": "1h"}}`, s, c)
		fleettest.Put(t, s, "peer", fleettest.State{Timestamp: c.time(), Zones: map[string]map[string]fleettest.Value{
			"dist_" + alg: {"static": {Count: 6}},
		}})
		readPeers(t, u)
		if ok, _ := admittedOf(u, 10); ok != 4 {
			t.Errorf("%s: admitted %d, want 4", alg, ok)
		}
	}
}

// A fixed window's counts all leave at its end: a report taken before
// the boundary counts nothing after it, and this instance writes its
// counts dated so.
func TestDistributedFixedWindowBoundary(t *testing.T) {
	s, c := fleettest.NewStorage(), &distClock{now: int64(10 * time.Hour)} // on a minute boundary
	u := provisionDist(t, `{"rate_limits": {"dist_fixed": {"key": "static", "algorithm": "fixed_window", "max_events": 10, "window": "1m"}},
	"distributed": {"read_interval": "1h", "write_interval": "1h"}}`, s, c)
	fleettest.Put(t, s, "peer", fleettest.State{Timestamp: c.ago(time.Second), Zones: map[string]map[string]fleettest.Value{
		"dist_fixed": {"static": {Count: 10, OldestEvent: c.ago(time.Minute)}},
	}})
	readPeers(t, u)
	c.advance(15 * time.Second)
	if ok, _ := admittedOf(u, 4); ok != 4 {
		t.Fatalf("admitted %d, want 4: the peer's window ended", ok)
	}
	// Its 4 leave at the end of the window, 45 s from now.
	if got := written(t, u, s).Zones["dist_fixed"]["static"]; got.Count != 4 || !got.OldestEvent.Equal(c.ago(15*time.Second)) {
		t.Errorf("wrote %+v, want 4 dated %v", got, c.ago(15*time.Second))
	}
}

func TestDistributedRefusedConfigs(t *testing.T) {
	for _, tt := range []struct{ config, want string }{
		{`"algorithm": "token_bucket"`, `zone "z": algorithm: distributed shares counts`},
		{`"algorithm": "gcra"`, `algorithm`},
	} {
		err := validate(t, `{"handler": "rate_limit", "distributed": {}, "rate_limits": {"z": {"window": "1m", "max_events": 5, `+tt.config+`}}}`)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: error %v, want %q", tt.config, err, tt.want)
		}
	}
	for _, tt := range []struct{ opt, want string }{
		{`"distributed": {"read_interval": "1ms"}`, "distributed: read_interval must be at least 10ms"},
		{`"distributed": {"write_interval": "-1s"}`, "distributed: write_interval must be at least 10ms"},
		{`"distributed": {"purge_age": "-1s"}`, "distributed: purge_age must not be negative"},
		{`"distributed": {}, "backend": {"name": "redis"}`, "distributed: the backend already"},
	} {
		err := validate(t, `{"handler": "rate_limit", `+tt.opt+`, "rate_limits": {"z": {"window": "1m", "max_events": 5}}}`)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: error %v, want %q", tt.opt, err, tt.want)
		}
	}
}

// Handlers of one process sharing a storage write one file.
func TestDistributedHandlersWriteOneFile(t *testing.T) {
	s, c := fleettest.NewStorage(), &distClock{now: fuzzStart}
	a := provisionDist(t, distZone, s, c)
	b := provisionDist(t, `{"rate_limits": {"dist_b": {"key": "static", "max_events": 10, "window": "1m"}},
	"distributed": {"read_interval": "1h", "write_interval": "1h"}}`, s, c)
	admittedOf(a, 1)
	admittedOf(b, 2)
	if st := written(t, a, s); st.Zones["dist_a"]["static"].Count != 1 || st.Zones["dist_b"]["static"].Count != 2 {
		t.Errorf("wrote %+v, want both handlers' zones", st.Zones)
	}
}

// A reload joins the running sync: the keys the old config noted are still
// written, and the others' counts still count.
func TestDistributedReloadKeepsSyncing(t *testing.T) {
	s, c := fleettest.NewStorage(), &distClock{now: fuzzStart}
	old := provisionDist(t, distZone, s, c)
	admittedOf(old, 3)
	fleettest.Put(t, s, "peer", fleettest.State{Timestamp: c.time(), Zones: map[string]map[string]fleettest.Value{
		"dist_a": {"static": {Count: 7}},
	}})
	readPeers(t, old)
	reloaded := provisionDist(t, `{"rate_limits": {"dist_a": {"key": "static", "max_events": 20, "window": "1m"}},
	"distributed": {"read_interval": "2h", "write_interval": "2h"}}`, s, c)
	_ = old.h.Cleanup()
	if got := written(t, reloaded, s).Zones["dist_a"]["static"].Count; got != 3 {
		t.Errorf("written after the reload: %d, want the 3 of the old config", got)
	}
	if ok, _ := admittedOf(reloaded, 20); ok != 10 {
		t.Errorf("admitted %d after the reload, want 20 − 3 − 7 = 10", ok)
	}
}
