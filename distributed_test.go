package sluice

import (
	"bytes"
	"context"
	"encoding/gob"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"path"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/certmagic"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// memStorage is a certmagic.Storage in a map.
type memStorage struct {
	mu    sync.Mutex
	files map[string][]byte
	times map[string]time.Time
}

func newMemStorage() *memStorage {
	return &memStorage{files: map[string][]byte{}, times: map[string]time.Time{}}
}

func (m *memStorage) Lock(context.Context, string) error   { return nil }
func (m *memStorage) Unlock(context.Context, string) error { return nil }
func (m *memStorage) Store(_ context.Context, key string, v []byte) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.files[key] = bytes.Clone(v)
	m.times[key] = time.Now()
	return nil
}
func (m *memStorage) Load(_ context.Context, key string) ([]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	v, ok := m.files[key]
	if !ok {
		return nil, fs.ErrNotExist
	}
	return bytes.Clone(v), nil
}
func (m *memStorage) Delete(_ context.Context, key string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.files, key)
	return nil
}
func (m *memStorage) Exists(_ context.Context, key string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, ok := m.files[key]
	return ok
}
func (m *memStorage) List(_ context.Context, prefix string, _ bool) ([]string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for k := range m.files {
		if strings.HasPrefix(k, prefix+"/") {
			out = append(out, k)
		}
	}
	if len(out) == 0 {
		return nil, fs.ErrNotExist
	}
	return out, nil
}
func (m *memStorage) Stat(_ context.Context, key string) (certmagic.KeyInfo, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	v, ok := m.files[key]
	if !ok {
		return certmagic.KeyInfo{}, fs.ErrNotExist
	}
	return certmagic.KeyInfo{Key: key, Size: int64(len(v)), Modified: m.times[key], IsTerminal: true}, nil
}

// mholtValue and mholtState mirror the shapes of the state file that
// mholt/caddy-ratelimit documents (per zone, per key: the count in the
// window and the oldest event), under other type names: gob matches the
// fields by name, so these are what an instance of that module writes
// and reads.
type mholtValue struct {
	Count       int
	OldestEvent time.Time
}

type mholtState struct {
	Timestamp time.Time
	Zones     map[string]map[string]mholtValue
}

func putState(t testing.TB, s *memStorage, id string, st mholtState) {
	t.Helper()
	var buf bytes.Buffer
	if err := gob.NewEncoder(&buf).Encode(st); err != nil {
		t.Fatal(err)
	}
	if err := s.Store(context.Background(), path.Join("rate_limit/instances", id+".rlstate"), buf.Bytes()); err != nil {
		t.Fatal(err)
	}
}

type distClock struct{ now int64 }

func (c *distClock) get() int64                    { return c.now }
func (c *distClock) advance(d time.Duration)       { c.now += int64(d) }
func (c *distClock) time() time.Time               { return time.Unix(0, c.now) }
func (c *distClock) ago(d time.Duration) time.Time { return time.Unix(0, c.now-int64(d)) }

// provisionDist provisions a handler that syncs through s, on clock c.
func provisionDist(t testing.TB, config string, s *memStorage, c *distClock) *unitHandler {
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

// The intervals are long so that only the test's own reads and writes
// happen.
const distZone = `{"rate_limits": {"dist_a": {"key": "static", "max_events": 10, "window": "1m"}},
	"distributed": {"read_interval": "1h", "write_interval": "1h"}}`

func TestDistributedAddsOtherInstancesCounts(t *testing.T) {
	s, c := newMemStorage(), &distClock{now: fuzzStart}
	u := provisionDist(t, distZone, s, c)
	// Another instance admitted 7 of the key, the first 20 s ago.
	putState(t, s, "peer-1", mholtState{Timestamp: c.ago(time.Second), Zones: map[string]map[string]mholtValue{
		"dist_a": {"static": {Count: 7, OldestEvent: c.ago(20 * time.Second)}, "other": {Count: 10}},
	}})
	if err := u.h.plan.fleet.f.read(context.Background()); err != nil {
		t.Fatal(err)
	}
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

func TestDistributedPeerCountsAddUp(t *testing.T) {
	s, c := newMemStorage(), &distClock{now: fuzzStart}
	u := provisionDist(t, distZone, s, c)
	for _, id := range []string{"peer-1", "peer-2"} {
		putState(t, s, id, mholtState{Timestamp: c.time(), Zones: map[string]map[string]mholtValue{
			"dist_a": {"static": {Count: 4}},
		}})
	}
	// A report older than the window counts nothing.
	putState(t, s, "peer-3", mholtState{Timestamp: c.ago(61 * time.Second), Zones: map[string]map[string]mholtValue{
		"dist_a": {"static": {Count: 10}},
	}})
	if err := u.h.plan.fleet.f.read(context.Background()); err != nil {
		t.Fatal(err)
	}
	if ok, _ := admittedOf(u, 5); ok != 2 {
		t.Errorf("admitted %d, want 10 − 4 − 4 = 2", ok)
	}
}

func TestDistributedWritesMholtState(t *testing.T) {
	s, c := newMemStorage(), &distClock{now: fuzzStart}
	u := provisionDist(t, distZone, s, c)
	admittedOf(u, 4)
	c.advance(10 * time.Second)
	admittedOf(u, 8) // 6 more pass, 2 denied
	f := u.h.plan.fleet.f
	if err := f.write(context.Background()); err != nil {
		t.Fatal(err)
	}
	data, err := s.Load(context.Background(), path.Join("rate_limit/instances", f.id+".rlstate"))
	if err != nil {
		t.Fatal(err)
	}
	var st mholtState
	if err := gob.NewDecoder(bytes.NewReader(data)).Decode(&st); err != nil {
		t.Fatal(err)
	}
	got := st.Zones["dist_a"]["static"]
	if !st.Timestamp.Equal(c.time()) || got.Count != 10 || !got.OldestEvent.Equal(c.ago(10*time.Second)) {
		t.Errorf("wrote %v %+v, want count 10 at %v, oldest %v", st.Timestamp, got, c.time(), c.ago(10*time.Second))
	}
	// Its own file is not read back as another instance's.
	if err := f.read(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := len(*f.others.Load()); n != 0 {
		t.Errorf("read %d other instances, want 0", n)
	}
	// Once the key is idle, the snapshot forgets it: memory stays bounded
	// by the keys in use.
	c.advance(time.Minute)
	if err := f.write(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := f.limits["dist_a"].n.Load(); n != 0 {
		t.Errorf("%d keys tracked after they went idle, want 0", n)
	}
}

func TestDistributedTracksAtMostMaxKeys(t *testing.T) {
	s, c := newMemStorage(), &distClock{now: fuzzStart}
	u := provisionDist(t, `{"rate_limits": {"dist_keys": {"key": "{http.request.header.K}", "max_keys": 3, "max_events": 10, "window": "1m"}},
	"distributed": {"read_interval": "1h", "write_interval": "1h"}}`, s, c)
	for _, k := range []string{"a", "b", "c", "d", "e", "a"} {
		u.serve(context.Background(), func(r *http.Request) { r.Header.Set("K", k) })
	}
	f := u.h.plan.fleet.f
	if n := f.limits["dist_keys"].n.Load(); n != 3 {
		t.Errorf("tracked %d keys, want max_keys 3", n)
	}
	f.write(context.Background())
	st := f.snapshot(context.Background())
	if n := len(st.Zones["dist_keys"]); n > 3 {
		t.Errorf("snapshot of %d keys, want at most 3", n)
	}
}

func TestDistributedPurgeAge(t *testing.T) {
	s, c := newMemStorage(), &distClock{now: fuzzStart}
	u := provisionDist(t, `{"rate_limits": {"dist_p": {"key": "static", "max_events": 10, "window": "1h"}},
	"distributed": {"read_interval": "1h", "write_interval": "1h", "purge_age": "5m"}}`, s, c)
	putState(t, s, "gone", mholtState{Timestamp: c.ago(6 * time.Minute), Zones: map[string]map[string]mholtValue{
		"dist_p": {"static": {Count: 10}},
	}})
	putState(t, s, "alive", mholtState{Timestamp: c.ago(4 * time.Minute), Zones: map[string]map[string]mholtValue{
		"dist_p": {"static": {Count: 5}},
	}})
	if err := u.h.plan.fleet.f.read(context.Background()); err != nil {
		t.Fatal(err)
	}
	if s.Exists(context.Background(), "rate_limit/instances/gone.rlstate") {
		t.Error("the file of an instance silent for longer than purge_age is still there")
	}
	if ok, _ := admittedOf(u, 10); ok != 5 {
		t.Errorf("admitted %d, want 10 − 5 of the live peer = 5", ok)
	}
}

func TestDistributedOtherAlgorithms(t *testing.T) {
	for _, alg := range []string{"fixed_window", "sliding_window_counter"} {
		s, c := newMemStorage(), &distClock{now: fuzzStart}
		u := provisionDist(t, `{"rate_limits": {"dist_`+alg+`": {"key": "static", "algorithm": "`+alg+`", "max_events": 10, "window": "1m"}},
	"distributed": {"read_interval": "1h", "write_interval": "1h"}}`, s, c)
		putState(t, s, "peer", mholtState{Timestamp: c.time(), Zones: map[string]map[string]mholtValue{
			"dist_" + alg: {"static": {Count: 6}},
		}})
		u.h.plan.fleet.f.read(context.Background())
		if ok, _ := admittedOf(u, 10); ok != 4 {
			t.Errorf("%s: admitted %d, want 4", alg, ok)
		}
	}
}

// A fixed window's counts all leave at its end: a report taken before
// the boundary counts nothing after it, and this instance writes its
// counts dated so.
func TestDistributedFixedWindowBoundary(t *testing.T) {
	s, c := newMemStorage(), &distClock{now: int64(10 * time.Hour)} // on a minute boundary
	u := provisionDist(t, `{"rate_limits": {"dist_fixed": {"key": "static", "algorithm": "fixed_window", "max_events": 10, "window": "1m"}},
	"distributed": {"read_interval": "1h", "write_interval": "1h"}}`, s, c)
	putState(t, s, "peer", mholtState{Timestamp: c.ago(time.Second), Zones: map[string]map[string]mholtValue{
		"dist_fixed": {"static": {Count: 10, OldestEvent: c.ago(time.Minute)}},
	}})
	u.h.plan.fleet.f.read(context.Background())
	c.advance(15 * time.Second)
	if ok, _ := admittedOf(u, 4); ok != 4 {
		t.Fatalf("admitted %d, want 4: the peer's window ended", ok)
	}
	st := u.h.plan.fleet.f.snapshot(context.Background())
	// Its 4 leave at the end of the window, 45 s from now.
	if got := st.Zones["dist_fixed"]["static"]; got.Count != 4 || !got.OldestEvent.Equal(c.ago(15*time.Second)) {
		t.Errorf("wrote %+v, want 4 dated %v", got, c.ago(15*time.Second))
	}
}

// Counts that would overflow, from any number of instances, and clocks
// ahead of this one by less than a window, deny with at most a window's
// wait; a report from further ahead counts nothing.
func TestDistributedHostileReports(t *testing.T) {
	s, c := newMemStorage(), &distClock{now: fuzzStart}
	u := provisionDist(t, distZone, s, c)
	for _, id := range []string{"p1", "p2", "p3"} {
		putState(t, s, id, mholtState{Timestamp: c.time().Add(30 * time.Second), Zones: map[string]map[string]mholtValue{
			"dist_a": {"static": {Count: int(^uint(0) >> 1), OldestEvent: c.time().Add(time.Hour)}},
		}})
	}
	for id, at := range map[string]time.Time{"ahead": c.time().Add(time.Hour), "y3000": time.Date(3000, 1, 1, 0, 0, 0, 0, time.UTC)} {
		putState(t, s, id, mholtState{Timestamp: at, Zones: map[string]map[string]mholtValue{
			"dist_a": {"static": {Count: int(^uint(0) >> 1)}},
		}})
	}
	putState(t, s, "negative", mholtState{Timestamp: c.time(), Zones: map[string]map[string]mholtValue{
		"dist_a": {"static": {Count: -100}},
	}})
	u.h.plan.fleet.f.read(context.Background())
	ok, last := admittedOf(u, 3)
	if ok != 0 || last.header.Get("Retry-After") != "60" {
		t.Errorf("admitted %d, Retry-After %q; want 0 and 60", ok, last.header.Get("Retry-After"))
	}
	// The reports 30 s ahead leave a window after their time; the ones
	// further ahead never counted.
	c.advance(91 * time.Second)
	if ok, _ := admittedOf(u, 3); ok != 3 {
		t.Errorf("a window after the reports 30 s ahead: admitted %d, want 3", ok)
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

// Handlers of one process sharing a storage write one file; the sync
// stops with the last of them.
func TestDistributedFleetSharedAndReleased(t *testing.T) {
	s, c := newMemStorage(), &distClock{now: fuzzStart}
	a := provisionDist(t, distZone, s, c)
	b := provisionDist(t, `{"rate_limits": {"dist_b": {"key": "static", "max_events": 10, "window": "1m"}},
	"distributed": {"read_interval": "1h", "write_interval": "1h"}}`, s, c)
	if a.h.plan.fleet.f != b.h.plan.fleet.f {
		t.Fatal("two handlers of one storage run two syncs")
	}
	f := a.h.plan.fleet.f
	admittedOf(a, 1)
	admittedOf(b, 2)
	st := f.snapshot(context.Background())
	if st.Zones["dist_a"]["static"].Count != 1 || st.Zones["dist_b"]["static"].Count != 2 {
		t.Errorf("snapshot %+v, want both handlers' zones", st.Zones)
	}
	_ = a.h.Cleanup()
	select {
	case <-f.done:
		t.Fatal("the sync stopped while a handler still uses it")
	default:
	}
	_ = b.h.Cleanup()
	select {
	case <-f.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the sync did not stop with its last handler")
	}
}

// A reload joins the running sync: the keys the old config noted are still
// written, the new intervals apply, and the others' counts still count.
func TestDistributedReloadKeepsSyncing(t *testing.T) {
	s, c := newMemStorage(), &distClock{now: fuzzStart}
	old := provisionDist(t, distZone, s, c)
	admittedOf(old, 3)
	putState(t, s, "peer", mholtState{Timestamp: c.time(), Zones: map[string]map[string]mholtValue{
		"dist_a": {"static": {Count: 7}},
	}})
	f := old.h.plan.fleet.f
	if err := f.read(context.Background()); err != nil {
		t.Fatal(err)
	}
	reloaded := provisionDist(t, `{"rate_limits": {"dist_a": {"key": "static", "max_events": 20, "window": "1m"}},
	"distributed": {"read_interval": "2h", "write_interval": "2h"}}`, s, c)
	_ = old.h.Cleanup()
	if reloaded.h.plan.fleet.f != f || time.Duration(f.config().ReadInterval) != 2*time.Hour {
		t.Fatalf("the reload did not join the running sync with its intervals: %+v", f.config())
	}
	if got := f.snapshot(context.Background()).Zones["dist_a"]["static"].Count; got != 3 {
		t.Errorf("snapshot after the reload counts %d, want the 3 of the old config", got)
	}
	if ok, _ := admittedOf(reloaded, 20); ok != 10 {
		t.Errorf("admitted %d after the reload, want 20 − 3 − 7 = 10", ok)
	}
}

// BenchmarkDistributedWrite is the cost of one write of a zone of 10,000
// keys: a snapshot of every key and its encoding.
func BenchmarkDistributedWrite(b *testing.B) {
	s, c := newMemStorage(), &distClock{now: fuzzStart}
	u := provisionDist(b, `{"rate_limits": {"dist_bench": {"key": "{http.request.header.K}", "max_events": 10, "window": "1m"}},
	"distributed": {"read_interval": "1h", "write_interval": "1h"}}`, s, c)
	for i := range 10000 {
		u.serve(context.Background(), func(r *http.Request) { r.Header.Set("K", fmt.Sprintf("client-%d", i)) })
	}
	f := u.h.plan.fleet.f
	b.ReportAllocs()
	for b.Loop() {
		if err := f.write(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
	data, _ := s.Load(context.Background(), f.file(f.id))
	b.ReportMetric(float64(len(data)), "bytes/write")
}

// BenchmarkDistributedRead is the cost of reading another instance's
// report of 10,000 keys.
func BenchmarkDistributedRead(b *testing.B) {
	s, c := newMemStorage(), &distClock{now: fuzzStart}
	u := provisionDist(b, distZone, s, c)
	keys := map[string]mholtValue{}
	for i := range 10000 {
		keys[fmt.Sprintf("client-%d", i)] = mholtValue{Count: 5, OldestEvent: c.time()}
	}
	putState(b, s, "peer", mholtState{Timestamp: c.time(), Zones: map[string]map[string]mholtValue{"dist_a": keys}})
	f := u.h.plan.fleet.f
	b.ReportAllocs()
	for b.Loop() {
		if err := f.read(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
}

// The handler's storage option and the config's storage, or two configs,
// naming one directory are one fleet: they must write one file.
func TestDistributedStorageKey(t *testing.T) {
	a, b, other := &certmagic.FileStorage{Path: "/x"}, &certmagic.FileStorage{Path: "/x"}, &certmagic.FileStorage{Path: "/y"}
	if storageKey(a) != storageKey(b) || storageKey(a) == storageKey(other) {
		t.Errorf("keys %q %q %q: want the first two equal, the third apart", storageKey(a), storageKey(b), storageKey(other))
	}
	if m, n := newMemStorage(), newMemStorage(); storageKey(m) == storageKey(n) {
		t.Error("two storages that cannot describe themselves share a fleet")
	}
}

// This process's own file is never counted, but one of its name written
// later is another process's (a copied data directory, hence one instance
// id) and counts.
func TestDistributedTwinInstanceID(t *testing.T) {
	s, c := newMemStorage(), &distClock{now: fuzzStart}
	u := provisionDist(t, distZone, s, c)
	f := u.h.plan.fleet.f
	// This instance's file from a run before this process.
	putState(t, s, f.id, mholtState{Timestamp: c.ago(time.Second), Zones: map[string]map[string]mholtValue{
		"dist_a": {"static": {Count: 9}},
	}})
	if err := f.read(context.Background()); err != nil {
		t.Fatal(err)
	}
	admittedOf(u, 4)
	if err := f.write(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := f.read(context.Background()); err != nil {
		t.Fatal(err)
	}
	if ok, _ := admittedOf(u, 4); ok != 4 {
		t.Fatalf("with this process's own file: admitted %d, want 4 (its own counts not counted twice)", ok)
	}
	c.advance(time.Second)
	putState(t, s, f.id, mholtState{Timestamp: c.time(), Zones: map[string]map[string]mholtValue{
		"dist_a": {"static": {Count: 2}},
	}})
	if err := f.read(context.Background()); err != nil {
		t.Fatal(err)
	}
	if ok, _ := admittedOf(u, 4); ok != 0 {
		t.Errorf("with a twin's 2 in this instance's file: admitted %d, want 10 − 8 − 2 = 0", ok)
	}
}

// A run of sync failures logs its first, then one a minute, then the
// recovery.
func TestDistributedSyncErrorsLogOnce(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	logger, e, t0 := zap.New(core), syncErrors{}, time.Unix(1000, 0)
	fail := errors.New("read-only")
	for i := range 100 {
		e.report(logger, "sync", fail, t0.Add(time.Duration(i)*10*time.Millisecond))
	}
	if n := logs.Len(); n != 1 {
		t.Fatalf("100 failures in a second logged %d lines, want 1", n)
	}
	e.report(logger, "sync", fail, t0.Add(time.Minute))
	e.report(logger, "sync", nil, t0.Add(time.Minute+time.Second))
	e.report(logger, "sync", nil, t0.Add(time.Minute+2*time.Second))
	all := logs.All()
	if len(all) != 3 || all[1].ContextMap()["failed_in_a_row"] != int64(101) || all[2].Message != "sync: working again" {
		t.Fatalf("logged %+v, want the first failure, one a minute later (101 in a row), the recovery", all)
	}
	e.report(logger, "sync", fail, t0.Add(2*time.Minute))
	if logs.Len() != 4 {
		t.Errorf("a new run of failures logged %d lines in all, want 4", logs.Len())
	}
}

// Reports older than every zone's window are not kept; without purge_age,
// a file not modified for over an hour and two windows is not even
// loaded (the files of instances gone pile up).
func TestDistributedStaleReportsLeftOut(t *testing.T) {
	s, c := newMemStorage(), &distClock{now: fuzzStart}
	u := provisionDist(t, distZone, s, c)
	f := u.h.plan.fleet.f
	putState(t, s, "live", mholtState{Timestamp: c.time(), Zones: map[string]map[string]mholtValue{"dist_a": {"static": {Count: 1}}}})
	putState(t, s, "old", mholtState{Timestamp: c.ago(2 * time.Minute), Zones: map[string]map[string]mholtValue{"dist_a": {"static": {Count: 1}}}})
	putState(t, s, "corrupt-but-stale", mholtState{})
	s.files[path.Join(fleetPrefix, "corrupt-but-stale"+fleetSuffix)] = []byte("not gob")
	s.times[path.Join(fleetPrefix, "corrupt-but-stale"+fleetSuffix)] = c.ago(2 * time.Hour)
	core, logs := observer.New(zap.ErrorLevel)
	u.h.plan.fleet.logger = zap.New(core)
	if err := f.read(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := len(*f.others.Load()); got != 1 {
		t.Errorf("kept %d reports, want the live one only", got)
	}
	if logs.Len() != 0 {
		t.Errorf("a file not modified for 2 hours was loaded: %v", logs.All())
	}
}

// stallStorage is a memStorage whose Store (or List) waits, once entered,
// until the test lets it go, and which counts the calls that happened.
type stallStorage struct {
	*memStorage
	stall   string // "Store" or "List"
	entered chan struct{}
	release chan struct{}
	calls   atomic.Int64
	mu      sync.Mutex
	once    bool
}

func (s *stallStorage) wait(op string) {
	s.calls.Add(1)
	s.mu.Lock()
	first := op == s.stall && !s.once
	s.once = s.once || first
	s.mu.Unlock()
	if first {
		close(s.entered)
		<-s.release
	}
}

func (s *stallStorage) Store(ctx context.Context, key string, v []byte) error {
	s.wait("Store")
	return s.memStorage.Store(ctx, key, v)
}

func (s *stallStorage) List(ctx context.Context, prefix string, rec bool) ([]string, error) {
	s.wait("List")
	return s.memStorage.List(ctx, prefix, rec)
}

// The last handler's Cleanup returns once the sync stopped: a write, or
// the first read, under way when the config unloads is waited for, so
// that nothing touches the storage after (a test's directory was removed
// while a sync still wrote into it). A storage that hangs holds the
// unload up for stopWait at most, and that is logged.
func TestDistributedCleanupWaitsForTheSync(t *testing.T) {
	for _, tt := range []struct {
		stall string
		hang  bool
	}{{"Store", false}, {"List", false}, {"Store", true}} {
		name := tt.stall
		if tt.hang {
			name += "_hangs"
		}
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := &stallStorage{memStorage: newMemStorage(), stall: tt.stall, entered: make(chan struct{}), release: make(chan struct{})}
				core, logs := observer.New(zap.WarnLevel)
				m := &fleetMember{conf: Distributed{ReadInterval: caddy.Duration(time.Hour), WriteInterval: caddy.Duration(time.Second)},
					limits: map[*limit]*tracked{}, logger: zap.New(core)}
				f, fresh := joinFleet("stall "+t.Name(), s, "self", func() int64 { return time.Now().UnixNano() }, m)
				if !fresh {
					t.Fatal("joined a running fleet")
				}
				f.start(m.logger)
				<-s.entered
				returned := make(chan struct{})
				var took time.Duration
				go func() {
					start := time.Now()
					m.leave()
					took = time.Since(start)
					close(returned)
				}()
				synctest.Wait()
				if tt.hang {
					time.Sleep(stopWait) // the fake clock of the bubble
					synctest.Wait()
					select {
					case <-returned:
					default:
						close(s.release)
						t.Fatalf("Cleanup still waits after %s for a storage that hangs", stopWait)
					}
					if took != stopWait {
						t.Errorf("Cleanup waited %s, want %s", took, stopWait)
					}
					if logs.FilterMessageSnippet("did not finish").Len() != 1 {
						t.Errorf("logged %v, want the storage that did not finish", logs.All())
					}
					close(s.release)
					return
				}
				select {
				case <-returned:
					t.Errorf("Cleanup returned while a %s of the storage was under way", tt.stall)
				default:
				}
				close(s.release)
				<-returned
				calls := s.calls.Load()
				time.Sleep(time.Hour) // many intervals of the fake clock
				if got := s.calls.Load(); got != calls {
					t.Errorf("the storage was called %d times after Cleanup returned", got-calls)
				}
				if logs.FilterMessageSnippet("did not finish").Len() != 0 {
					t.Errorf("logged %v, want no storage that did not finish", logs.All())
				}
			})
		})
	}
}
