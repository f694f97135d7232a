package fleet

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/caddyserver/certmagic"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/backend/memory"
	"github.com/sluicehq/sluice/internal/fleet/fleettest"
)

// start is a time in ns with every digit used, so that a unit lost on
// the way shows.
const start = int64(1_767_225_600_123_456_789)

type clock struct{ now atomic.Int64 }

func newClock(at int64) *clock {
	c := &clock{}
	c.now.Store(at)
	return c
}

func (c *clock) get() int64                    { return c.now.Load() }
func (c *clock) advance(d time.Duration)       { c.now.Add(int64(d)) }
func (c *clock) time() time.Time               { return time.Unix(0, c.get()) }
func (c *clock) ago(d time.Duration) time.Time { return time.Unix(0, c.get()-int64(d)) }

// counts is a Counter over a map: what a store reports of its keys.
type counts struct {
	mu sync.Mutex
	m  map[string]Usage
}

func newCounts() *counts { return &counts{m: map[string]Usage{}} }

func (c *counts) set(key string, u Usage) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.m[key] = u
}

func (c *counts) Usage(_ context.Context, key string) (Usage, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m[key], nil
}

// window is the window of the limits of the tests that do not set one.
const window = int64(time.Minute)

// limit is a sliding window of a minute named zone, read from c.
func limit(zone string, c Counter) Limit {
	return Limit{ID: zone, Zone: zone, Window: window, Counts: c}
}

// join joins a member that syncs through s on clock c. The intervals are
// long so that only the test's own reads and writes happen.
func join(t testing.TB, s certmagic.Storage, c *clock, limits ...Limit) *Member {
	t.Helper()
	m := Join(Config{Storage: s, Instance: "self", ReadInterval: time.Hour, WriteInterval: time.Hour, Now: c.get}, limits)
	t.Cleanup(m.Leave)
	return m
}

// allowed is what Check says of a request of the limit id on key that
// leaves remaining units here.
func allowed(m *Member, id any, key string, remaining, now int64) (bool, int64) {
	var v Verdict
	m.Check(&v, 0, id, key, remaining, now)
	_, wait, denied := v.Denied()
	return !denied, wait
}

func read(t testing.TB, m *Member) {
	t.Helper()
	if err := m.Read(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestCheckAddsOtherInstancesCounts(t *testing.T) {
	s, c := fleettest.NewStorage(), newClock(start)
	m := join(t, s, c, limit("a", newCounts()))
	// Another instance counted 7 of the key, the first 20 s ago.
	fleettest.Put(t, s, "peer-1", fleettest.State{Timestamp: c.ago(time.Second), Zones: map[string]map[string]fleettest.Value{
		"a": {"static": {Count: 7, OldestEvent: c.ago(20 * time.Second)}, "other": {Count: 10}},
	}})
	read(t, m)
	for _, tt := range []struct {
		name      string
		remaining int64
		allowed   bool
		wait      time.Duration
	}{
		{"as many left as the others used", 7, true, 0},
		// Room comes back when the peer's oldest event leaves the window.
		{"fewer left than the others used", 6, false, 40 * time.Second},
		{"none left", 0, false, 40 * time.Second},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ok, wait := allowed(m, "a", "static", tt.remaining, c.get())
			if ok != tt.allowed || (!ok && wait != int64(tt.wait)) {
				t.Errorf("allowed %v, wait %s; want %v, %s", ok, time.Duration(wait), tt.allowed, tt.wait)
			}
		})
	}
	// Once the peer's report is older than the window, it counts nothing.
	if ok, _ := allowed(m, "a", "static", 0, c.get()+int64(59500*time.Millisecond)); !ok {
		t.Error("denied by a report older than the window")
	}
}

func TestCheckPeerCountsAddUp(t *testing.T) {
	s, c := fleettest.NewStorage(), newClock(start)
	m := join(t, s, c, limit("a", newCounts()))
	for _, id := range []string{"peer-1", "peer-2"} {
		fleettest.Put(t, s, id, fleettest.State{Timestamp: c.time(), Zones: map[string]map[string]fleettest.Value{
			"a": {"static": {Count: 4}},
		}})
	}
	// A report older than the window counts nothing.
	fleettest.Put(t, s, "peer-3", fleettest.State{Timestamp: c.ago(61 * time.Second), Zones: map[string]map[string]fleettest.Value{
		"a": {"static": {Count: 10}},
	}})
	read(t, m)
	if ok, _ := allowed(m, "a", "static", 8, c.get()); !ok {
		t.Error("denied with 8 left, the peers' 4 + 4")
	}
	if ok, _ := allowed(m, "a", "static", 7, c.get()); ok {
		t.Error("allowed with 7 left, under the peers' 4 + 4")
	}
}

// Of a request's limits that deny, the verdict names the one whose room
// comes back last; a limit the member did not join with, and the zero
// verdict, allow.
func TestCheckVerdict(t *testing.T) {
	s, c := fleettest.NewStorage(), newClock(start)
	m := join(t, s, c, limit("short", newCounts()), limit("long", newCounts()), limit("free", newCounts()))
	fleettest.Put(t, s, "peer", fleettest.State{Timestamp: c.time(), Zones: map[string]map[string]fleettest.Value{
		"short": {"k": {Count: 5, OldestEvent: c.ago(50 * time.Second)}},
		"long":  {"k": {Count: 5, OldestEvent: c.ago(10 * time.Second)}},
	}})
	read(t, m)
	var v Verdict
	if _, _, denied := v.Denied(); denied {
		t.Fatal("the zero verdict denies")
	}
	now := c.get()
	m.Check(&v, 0, "free", "k", 0, now)
	m.Check(&v, 1, "short", "k", 0, now)
	m.Check(&v, 2, "long", "k", 0, now)
	m.Check(&v, 3, "not joined", "k", 0, now)
	m.Check(&v, 4, "short", "k", 0, now)
	if i, wait, denied := v.Denied(); !denied || i != 2 || wait != int64(50*time.Second) {
		t.Errorf("verdict: limit %d, wait %s, denied %v; want limit 2, 50s, denied", i, time.Duration(wait), denied)
	}
}

// This instance's file has the shape mholt/caddy-ratelimit reads: per
// zone (a scope joined to it), per key, the count and its oldest event.
func TestWriteMholtState(t *testing.T) {
	s, c := fleettest.NewStorage(), newClock(start)
	sliding, fixed := newCounts(), newCounts()
	m := join(t, s, c, limit("a", sliding),
		Limit{ID: "s", Zone: "z", Scope: "ip", Window: window, Counts: sliding},
		Limit{ID: "f", Zone: "f", Window: window, Fixed: true, Counts: fixed})
	for _, id := range []string{"a", "s"} {
		allowed(m, id, "full", 0, c.get())
		allowed(m, id, "room", 5, c.get())
	}
	allowed(m, "f", "full", 0, c.get())
	// Full, the first of its 10 leaves in 50 s: taken 10 s ago.
	sliding.set("full", Usage{Used: 10, RetryAfter: int64(50 * time.Second)})
	// With room, its oldest is not known (stores report no wait).
	sliding.set("room", Usage{Used: 5})
	// A fixed window's count is dated by the end of the window.
	fixed.set("full", Usage{Used: 4, RetryAfter: -1, ResetAfter: int64(45 * time.Second)})
	if err := m.Write(context.Background()); err != nil {
		t.Fatal(err)
	}
	st := fleettest.Get(t, s, "self")
	if !st.Timestamp.Equal(c.time()) {
		t.Errorf("timestamp %v, want %v", st.Timestamp, c.time())
	}
	for _, tt := range []struct {
		zone, key string
		want      fleettest.Value
	}{
		{"a", "full", fleettest.Value{Count: 10, OldestEvent: c.ago(10 * time.Second)}},
		{"a", "room", fleettest.Value{Count: 5, OldestEvent: time.Time{}}},
		{"z\x1fip", "full", fleettest.Value{Count: 10, OldestEvent: c.ago(10 * time.Second)}},
		{"f", "full", fleettest.Value{Count: 4, OldestEvent: c.ago(15 * time.Second)}},
	} {
		if got := st.Zones[tt.zone][tt.key]; got.Count != tt.want.Count || !got.OldestEvent.Equal(tt.want.OldestEvent) {
			t.Errorf("%q %q: wrote %+v, want %+v", tt.zone, tt.key, got, tt.want)
		}
	}
	// Its own file is not read back as another instance's.
	read(t, m)
	if n := len(*m.f.others.Load()); n != 0 {
		t.Errorf("read %d other instances, want 0", n)
	}
	// Once the keys are idle, the snapshot forgets them: memory stays
	// bounded by the keys in use.
	sliding.set("full", Usage{})
	sliding.set("room", Usage{})
	if err := m.Write(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := m.f.limits["a"].n.Load(); n != 0 {
		t.Errorf("%d keys tracked after they went idle, want 0", n)
	}
	if _, ok := fleettest.Get(t, s, "self").Zones["a"]; ok {
		t.Error("a zone of idle keys is written")
	}
}

func TestTracksAtMostMaxKeys(t *testing.T) {
	s, c := fleettest.NewStorage(), newClock(start)
	core, logs := observer.New(zap.WarnLevel)
	cs := newCounts()
	m := Join(Config{Storage: s, Instance: "self", ReadInterval: time.Hour, WriteInterval: time.Hour, Now: c.get, Logger: zap.New(core)},
		[]Limit{{ID: 1, Zone: "keys", Window: window, MaxKeys: 3, Counts: cs}})
	t.Cleanup(m.Leave)
	for _, k := range []string{"a", "b", "c", "d", "e", "a"} {
		cs.set(k, Usage{Used: 1})
		allowed(m, 1, k, 9, c.get())
	}
	if n := m.f.limits["keys"].n.Load(); n != 3 {
		t.Errorf("tracked %d keys, want MaxKeys 3", n)
	}
	if n := logs.FilterMessageSnippet("too many keys").Len(); n != 1 {
		t.Errorf("logged %d warnings of too many keys, want 1", n)
	}
	if err := m.Write(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := len(fleettest.Get(t, s, "self").Zones["keys"]); n != 3 {
		t.Errorf("wrote %d keys, want 3", n)
	}
	// Idle keys make room again.
	cs.set("a", Usage{})
	m.Write(context.Background())
	allowed(m, 1, "d", 9, c.get())
	if _, ok := m.f.limits["keys"].keys.Load("d"); !ok {
		t.Error("a new key is not tracked once another went idle")
	}
}

func TestPurgeAge(t *testing.T) {
	s, c := fleettest.NewStorage(), newClock(start)
	m := Join(Config{Storage: s, Instance: "self", ReadInterval: time.Hour, WriteInterval: time.Hour, PurgeAge: 5 * time.Minute, Now: c.get},
		[]Limit{{ID: "p", Zone: "p", Window: int64(time.Hour), Counts: newCounts()}})
	t.Cleanup(m.Leave)
	fleettest.Put(t, s, "gone", fleettest.State{Timestamp: c.ago(6 * time.Minute), Zones: map[string]map[string]fleettest.Value{
		"p": {"static": {Count: 10}},
	}})
	fleettest.Put(t, s, "alive", fleettest.State{Timestamp: c.ago(4 * time.Minute), Zones: map[string]map[string]fleettest.Value{
		"p": {"static": {Count: 5}},
	}})
	read(t, m)
	if s.Exists(context.Background(), "rate_limit/instances/gone.rlstate") {
		t.Error("the file of an instance silent for longer than purge_age is still there")
	}
	if !s.Exists(context.Background(), "rate_limit/instances/alive.rlstate") {
		t.Error("the file of a live instance was deleted")
	}
	if ok, _ := allowed(m, "p", "static", 5, c.get()); !ok {
		t.Error("denied with 5 left, the live peer's 5")
	}
	if ok, _ := allowed(m, "p", "static", 4, c.get()); ok {
		t.Error("allowed with 4 left, under the live peer's 5")
	}
}

// A fixed window's counts all leave at its end: a report taken before
// the boundary counts nothing after it.
func TestFixedWindowBoundary(t *testing.T) {
	s, c := fleettest.NewStorage(), newClock(int64(10*time.Hour)) // on a minute boundary
	m := join(t, s, c, Limit{ID: "f", Zone: "f", Window: window, Fixed: true, Counts: newCounts()})
	fleettest.Put(t, s, "peer", fleettest.State{Timestamp: c.ago(time.Second), Zones: map[string]map[string]fleettest.Value{
		"f": {"static": {Count: 10, OldestEvent: c.ago(time.Minute)}},
	}})
	read(t, m)
	if ok, _ := allowed(m, "f", "static", 0, c.get()-int64(time.Millisecond)); ok {
		t.Error("allowed before the peer's window ended")
	}
	if ok, _ := allowed(m, "f", "static", 0, c.get()); !ok {
		t.Error("denied after the peer's window ended")
	}
}

// Counts that would overflow, from any number of instances, and clocks
// ahead of this one by less than a window, deny with at most a window's
// wait; a report from further ahead counts nothing.
func TestHostileReports(t *testing.T) {
	s, c := fleettest.NewStorage(), newClock(start)
	m := join(t, s, c, limit("a", newCounts()))
	for _, id := range []string{"p1", "p2", "p3"} {
		fleettest.Put(t, s, id, fleettest.State{Timestamp: c.time().Add(30 * time.Second), Zones: map[string]map[string]fleettest.Value{
			"a": {"static": {Count: int(^uint(0) >> 1), OldestEvent: c.time().Add(time.Hour)}},
		}})
	}
	for id, at := range map[string]time.Time{"ahead": c.time().Add(time.Hour), "y3000": time.Date(3000, 1, 1, 0, 0, 0, 0, time.UTC)} {
		fleettest.Put(t, s, id, fleettest.State{Timestamp: at, Zones: map[string]map[string]fleettest.Value{
			"a": {"static": {Count: int(^uint(0) >> 1)}},
		}})
	}
	fleettest.Put(t, s, "negative", fleettest.State{Timestamp: c.time(), Zones: map[string]map[string]fleettest.Value{
		"a": {"static": {Count: -100}},
	}})
	read(t, m)
	used, _ := remote(*m.f.others.Load(), m.f.limits["a"], "static", c.get())
	if used != 3*maxCount {
		t.Errorf("the others used %d, want 3 reports of at most %d", used, int64(maxCount))
	}
	if ok, wait := allowed(m, "a", "static", 3*maxCount-1, c.get()); ok || wait != window {
		t.Errorf("allowed %v, wait %s; want denied for the window, 1m", ok, time.Duration(wait))
	}
	// The reports 30 s ahead leave a window after their time; the ones
	// further ahead never counted.
	if ok, _ := allowed(m, "a", "static", 0, c.get()+int64(91*time.Second)); !ok {
		t.Error("denied a window after the reports 30 s ahead")
	}
}

// Members of one process sharing a storage write one file; the sync stops
// with the last of them.
func TestMembersShareOneSync(t *testing.T) {
	s, c := fleettest.NewStorage(), newClock(start)
	ca, cb := newCounts(), newCounts()
	a := Join(Config{Storage: s, Instance: "self", ReadInterval: time.Hour, WriteInterval: time.Hour, Now: c.get}, []Limit{limit("a", ca)})
	b := Join(Config{Storage: s, Instance: "self", ReadInterval: time.Hour, WriteInterval: time.Hour, Now: c.get}, []Limit{limit("b", cb)})
	if a.f != b.f {
		b.Leave()
		a.Leave()
		t.Fatal("two members of one storage run two syncs")
	}
	f := a.f
	ca.set("static", Usage{Used: 1})
	cb.set("static", Usage{Used: 2})
	allowed(a, "a", "static", 9, c.get())
	allowed(b, "b", "static", 8, c.get())
	st := f.snapshot(context.Background())
	if st.Zones["a"]["static"].Count != 1 || st.Zones["b"]["static"].Count != 2 {
		t.Errorf("snapshot %+v, want both members' zones", st.Zones)
	}
	a.Leave()
	select {
	case <-f.done:
		t.Fatal("the sync stopped while a member still uses it")
	default:
	}
	if _, ok := f.limits["a"]; ok {
		t.Error("the zone of the member that left is still written")
	}
	b.Leave()
	select {
	case <-f.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the sync did not stop with its last member")
	}
	fleets.Lock()
	defer fleets.Unlock()
	if _, ok := fleets.m[f.key]; ok {
		t.Error("the stopped sync is still found by its storage")
	}
}

// A reload joins the running sync: the keys the old config noted are still
// written, from the new config's counts, and the new intervals, window and
// key cap apply; when the new config fails and leaves, the old one's apply
// again.
func TestReloadKeepsSyncing(t *testing.T) {
	s, c := fleettest.NewStorage(), newClock(start)
	before, after := newCounts(), newCounts()
	old := Join(Config{Storage: s, Instance: "self", ReadInterval: time.Hour, WriteInterval: time.Hour, Now: c.get}, []Limit{limit("a", before)})
	defer old.Leave()
	allowed(old, "a", "static", 7, c.get())
	fleettest.Put(t, s, "peer", fleettest.State{Timestamp: c.time(), Zones: map[string]map[string]fleettest.Value{
		"a": {"static": {Count: 7}},
	}})
	read(t, old)
	f := old.f
	failed := Join(Config{Storage: s, Instance: "self", ReadInterval: 3 * time.Hour, WriteInterval: 3 * time.Hour, Now: c.get}, []Limit{limit("a", before)})
	failed.Leave()
	if got := f.config().ReadInterval; got != time.Hour {
		t.Errorf("after a failed reload the read interval is %s, want the running config's 1h", got)
	}
	reloaded := Join(Config{Storage: s, Instance: "self", ReadInterval: 2 * time.Hour, WriteInterval: 2 * time.Hour, Now: c.get},
		[]Limit{{ID: "a", Zone: "a", Window: 2 * window, MaxKeys: 5, Counts: after}})
	defer reloaded.Leave()
	old.Leave()
	if reloaded.f != f || f.config().ReadInterval != 2*time.Hour {
		t.Fatalf("the reload did not join the running sync with its intervals: %+v", f.config())
	}
	if tr := f.limits["a"]; tr.window.Load() != 2*window || tr.cap.Load() != 5 {
		t.Errorf("window %d, key cap %d; want the new config's %d, 5", tr.window.Load(), tr.cap.Load(), 2*window)
	}
	after.set("static", Usage{Used: 3})
	if got := f.snapshot(context.Background()).Zones["a"]["static"].Count; got != 3 {
		t.Errorf("snapshot after the reload counts %d, want the 3 the new config's store reports for the old config's key", got)
	}
	if ok, _ := allowed(reloaded, "a", "static", 6, c.get()); ok {
		t.Error("after the reload the peer's 7 no longer count")
	}
}

// The handler's storage option and the config's storage, or two configs,
// naming one directory are one fleet: they must write one file.
func TestStorageKey(t *testing.T) {
	a, b, other := &certmagic.FileStorage{Path: "/x"}, &certmagic.FileStorage{Path: "/x"}, &certmagic.FileStorage{Path: "/y"}
	if storageKey(a) != storageKey(b) || storageKey(a) == storageKey(other) {
		t.Errorf("keys %q %q %q: want the first two equal, the third apart", storageKey(a), storageKey(b), storageKey(other))
	}
	if m, n := fleettest.NewStorage(), fleettest.NewStorage(); storageKey(m) == storageKey(n) {
		t.Error("two storages that cannot describe themselves share a fleet")
	}
}

// This process's own file is never counted, but one of its name written
// later is another process's (a copied data directory, hence one instance
// id) and counts.
func TestTwinInstanceID(t *testing.T) {
	s, c := fleettest.NewStorage(), newClock(start)
	cs := newCounts()
	core, logs := observer.New(zap.WarnLevel)
	m := Join(Config{Storage: s, Instance: "self", ReadInterval: time.Hour, WriteInterval: time.Hour, Now: c.get, Logger: zap.New(core)},
		[]Limit{limit("a", cs)})
	t.Cleanup(m.Leave)
	// This instance's file from a run before this process.
	fleettest.Put(t, s, "self", fleettest.State{Timestamp: c.ago(time.Second), Zones: map[string]map[string]fleettest.Value{
		"a": {"static": {Count: 9}},
	}})
	read(t, m)
	if ok, _ := allowed(m, "a", "static", 0, c.get()); !ok {
		t.Fatal("denied by this instance's file of a run before this process")
	}
	cs.set("static", Usage{Used: 4})
	if err := m.Write(context.Background()); err != nil {
		t.Fatal(err)
	}
	read(t, m)
	if ok, _ := allowed(m, "a", "static", 0, c.get()); !ok {
		t.Fatal("denied by this process's own file: its counts counted twice")
	}
	c.advance(time.Second)
	fleettest.Put(t, s, "self", fleettest.State{Timestamp: c.time(), Zones: map[string]map[string]fleettest.Value{
		"a": {"static": {Count: 2}},
	}})
	read(t, m)
	if ok, _ := allowed(m, "a", "static", 1, c.get()); ok {
		t.Error("a twin's 2 in this instance's file do not count")
	}
	if n := logs.FilterMessageSnippet("another instance writes this instance's file").Len(); n != 1 {
		t.Errorf("warned %d times of a twin, want 1", n)
	}
}

// A run of sync failures logs its first, then one a minute, then the
// recovery.
func TestSyncErrorsLogOnce(t *testing.T) {
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

// Reports older than every limit's window are not kept; without
// purge_age, a file not modified for over an hour and two windows is not
// even loaded (the files of instances gone pile up).
func TestStaleReportsLeftOut(t *testing.T) {
	s, c := fleettest.NewStorage(), newClock(start)
	core, logs := observer.New(zap.ErrorLevel)
	m := Join(Config{Storage: s, Instance: "self", ReadInterval: time.Hour, WriteInterval: time.Hour, Now: c.get, Logger: zap.New(core)},
		[]Limit{limit("a", newCounts())})
	t.Cleanup(m.Leave)
	fleettest.Put(t, s, "live", fleettest.State{Timestamp: c.time(), Zones: map[string]map[string]fleettest.Value{"a": {"static": {Count: 1}}}})
	fleettest.Put(t, s, "old", fleettest.State{Timestamp: c.ago(2 * time.Minute), Zones: map[string]map[string]fleettest.Value{"a": {"static": {Count: 1}}}})
	fleettest.Put(t, s, "corrupt-but-stale", fleettest.State{})
	corrupt := fleettest.File("corrupt-but-stale")
	s.Store(context.Background(), corrupt, []byte("not gob"))
	s.SetModified(corrupt, c.ago(2*time.Hour))
	read(t, m)
	if got := len(*m.f.others.Load()); got != 1 {
		t.Errorf("kept %d reports, want the live one only", got)
	}
	if logs.Len() != 0 {
		t.Errorf("a file not modified for 2 hours was loaded: %v", logs.All())
	}
	// A corrupt file that is not stale is loaded, and logged.
	s.SetModified(corrupt, c.time())
	read(t, m)
	if logs.FilterMessageSnippet("corrupted").Len() != 1 {
		t.Errorf("logged %v, want the corrupt file", logs.All())
	}
}

// stallStorage is a Storage in memory whose Store (or List) waits, once entered,
// until the test lets it go, and which counts the calls that happened.
type stallStorage struct {
	*fleettest.Storage
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
	return s.Storage.Store(ctx, key, v)
}

func (s *stallStorage) List(ctx context.Context, prefix string, rec bool) ([]string, error) {
	s.wait("List")
	return s.Storage.List(ctx, prefix, rec)
}

// The last member's Leave returns once the sync stopped: a write, or the
// first read, under way when the config unloads is waited for, so that
// nothing touches the storage after (a test's directory was removed while
// a sync still wrote into it). A storage that hangs holds the unload up
// for stopWait at most, and that is logged.
func TestLeaveWaitsForTheSync(t *testing.T) {
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
				s := &stallStorage{Storage: fleettest.NewStorage(), stall: tt.stall, entered: make(chan struct{}), release: make(chan struct{})}
				core, logs := observer.New(zap.WarnLevel)
				m := Join(Config{Storage: s, Instance: "self", ReadInterval: time.Hour, WriteInterval: time.Second,
					Now: func() int64 { return time.Now().UnixNano() }, Logger: zap.New(core)}, nil)
				<-s.entered
				returned := make(chan struct{})
				var took time.Duration
				go func() {
					start := time.Now()
					m.Leave()
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
						t.Fatalf("Leave still waits after %s for a storage that hangs", stopWait)
					}
					if took != stopWait {
						t.Errorf("Leave waited %s, want %s", took, stopWait)
					}
					if logs.FilterMessageSnippet("did not finish").Len() != 1 {
						t.Errorf("logged %v, want the storage that did not finish", logs.All())
					}
					close(s.release)
					return
				}
				select {
				case <-returned:
					t.Errorf("Leave returned while a %s of the storage was under way", tt.stall)
				default:
				}
				close(s.release)
				<-returned
				calls := s.calls.Load()
				time.Sleep(time.Hour) // many intervals of the fake clock
				if got := s.calls.Load(); got != calls {
					t.Errorf("the storage was called %d times after Leave returned", got-calls)
				}
				if logs.FilterMessageSnippet("did not finish").Len() != 0 {
					t.Errorf("logged %v, want no storage that did not finish", logs.All())
				}
			})
		})
	}
}

// storeCounts reads a limit's counts in a memory store, as a handler's
// memory store is read.
type storeCounts struct {
	store  *memory.Store
	handle backend.Limit
}

func (c storeCounts) Usage(ctx context.Context, key string) (Usage, error) {
	u, err := c.store.Inspect(ctx, c.handle, key)
	return Usage{Used: u.Limit - u.Remaining, RetryAfter: u.RetryAfter, ResetAfter: u.ResetAfter}, err
}

// BenchmarkWrite is the cost of one write of a zone of 10,000 keys of a
// memory store: a snapshot of every key and its encoding.
func BenchmarkWrite(b *testing.B) {
	s, c := fleettest.NewStorage(), newClock(start)
	store := memory.New(memory.Options{Now: c.get, SweepInterval: time.Hour})
	defer store.Close()
	handle, err := store.Register(backend.LimitConfig{Name: "bench", Algorithm: "sliding_window", Policy: algorithms.Policy{Limit: 10, Window: window}, Cost: 1})
	if err != nil {
		b.Fatal(err)
	}
	m := join(b, s, c, limit("bench", storeCounts{store, handle}))
	out := make([]algorithms.Result, 1)
	for i := range 10000 {
		key := fmt.Sprintf("client-%d", i)
		if ok, err := store.Decide(context.Background(), []backend.Request{{Limit: handle, Key: key, Cost: 1}}, out); !ok || err != nil {
			b.Fatalf("decide %s: %v %v", key, ok, err)
		}
		allowed(m, "bench", key, out[0].Remaining, c.get())
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := m.Write(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
	data, _ := s.Load(context.Background(), m.f.file("self"))
	b.ReportMetric(float64(len(data)), "bytes/write")
}

// BenchmarkRead is the cost of reading another instance's report of
// 10,000 keys.
func BenchmarkRead(b *testing.B) {
	s, c := fleettest.NewStorage(), newClock(start)
	m := join(b, s, c, limit("a", newCounts()))
	keys := map[string]fleettest.Value{}
	for i := range 10000 {
		keys[fmt.Sprintf("client-%d", i)] = fleettest.Value{Count: 5, OldestEvent: c.time()}
	}
	fleettest.Put(b, s, "peer", fleettest.State{Timestamp: c.time(), Zones: map[string]map[string]fleettest.Value{"a": keys}})
	b.ReportAllocs()
	for b.Loop() {
		if err := m.Read(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
}
