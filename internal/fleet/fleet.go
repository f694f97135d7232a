// Package fleet shares the counts of window limits across a fleet of Caddy
// instances through a Caddy storage they all use: each instance writes,
// every write interval, how many events each key of each limit has in its
// window, and reads the others' every read interval. A request is then
// denied when this instance's count plus the others' last known counts
// would go over the limit. The sharing is eventually consistent, not
// exact: between two syncs each instance admits from its own quota what
// the others have not reported yet.
//
// The files are those of mholt/caddy-ratelimit (rate_limit/instances/
// <instance id>.rlstate, the same encoding), so a fleet can mix both
// modules while it migrates.
package fleet

import (
	"bytes"
	"cmp"
	"context"
	"encoding/gob"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/certmagic"
	"go.uber.org/zap"
)

const (
	// DefaultInterval is the read and write interval of a config that
	// sets none.
	DefaultInterval = 5 * time.Second
	// MinInterval keeps a sync loop from spinning on the storage.
	MinInterval = 10 * time.Millisecond

	// prefix is where each instance's file lives, the path
	// mholt/caddy-ratelimit uses, so that both read each other.
	prefix = "rate_limit/instances"
	suffix = ".rlstate"
	// scopeSep joins a zone and a scope into one name in the file: a
	// scope is a limit mholt/caddy-ratelimit does not have, so it never
	// finds these names.
	scopeSep = "\x1f"
	// defaultTrackedKeys is how many keys of a limit without MaxKeys have
	// their counts shared: the snapshot of a limit holds at most this many.
	defaultTrackedKeys = 65536
)

// Config is how one member syncs.
type Config struct {
	// Storage is where the files are: every member whose storage is the
	// same place (see storageKey) shares one sync and writes one file.
	Storage certmagic.Storage
	// Instance is this instance's id, the name of its file.
	Instance string
	// ReadInterval and WriteInterval are how often the others' files
	// are read and this instance's written; at least MinInterval.
	ReadInterval, WriteInterval time.Duration
	// PurgeAge deletes another instance's file once it has not been
	// written for this long; 0: never.
	PurgeAge time.Duration
	// Now is the clock, in ns since 1970: the files' timestamps are on it.
	Now    func() int64
	Logger *zap.Logger
}

// Limit is one limit whose counts are shared.
type Limit struct {
	// ID is what the member's caller names the limit by in Check: any
	// comparable value, distinct among one member's limits.
	ID any
	// Zone and Scope name the limit in the files: the zone alone for
	// its own limit (Scope ""), as mholt/caddy-ratelimit names it.
	Zone, Scope string
	// Window is the limit's window in ns.
	Window int64
	// MaxKeys is how many of its keys have their counts shared at most;
	// 0: 65536.
	MaxKeys int64
	// Fixed is set for a fixed window, whose counts all leave at once, at
	// the end of the window: the file dates them so, and a report whose
	// window has ended counts nothing.
	Fixed bool
	// Counts reads this instance's counts of the limit's keys.
	Counts Counter
}

// Counter reads how much of a key's window is used in this instance.
type Counter interface {
	Usage(ctx context.Context, key string) (Usage, error)
}

// Usage is a key's use of its window in this instance, in ns and units.
type Usage struct {
	// Used is how many units the key has in its window; 0 or less: idle.
	Used int64
	// RetryAfter is how long until a unit leaves the window, when the
	// key is full; 0 or less when not known.
	RetryAfter int64
	// ResetAfter is how long until the key is back to its full quota.
	ResetAfter int64
}

// fleetFile is what one instance writes. The field names and types are
// the wire format (gob matches fields by name): a file written by
// mholt/caddy-ratelimit reads into it and the other way round. The type
// names are in the file too (decoders ignore them).
type fleetFile struct {
	// Timestamp is when the counts were taken.
	Timestamp time.Time
	// Zones maps a zone name to its keys' counts.
	Zones map[string]map[string]fleetCount
}

type fleetCount struct {
	// Count is how many units the key had in its window at Timestamp.
	Count int
	// OldestEvent is the time of the oldest of them, which leaves the
	// window a window later; zero when unknown.
	OldestEvent time.Time
}

// tracked is one limit of a fleet: the keys whose counts are written.
// Stores need not keep the keys themselves (the memory store keeps only a
// hash of each), so the keys this instance admitted are remembered here,
// at most cap of them; a key is forgotten when a snapshot finds it idle.
type tracked struct {
	name string // zone, or zone scopeSep scope
	// window and cap are the newest config's: a reload may change them
	// while the old config still decides.
	window atomic.Int64
	cap    atomic.Int64
	fixed  atomic.Bool
	keys   sync.Map // string → struct{}
	n      atomic.Int64
	full   atomic.Bool // logged that a key could not be tracked
	// regs are the configs using this limit, newest last; the newest is
	// asked for the counts. Guarded by the fleet's mu.
	regs []trackedReg
}

type trackedReg struct {
	member *Member
	counts Counter
}

// note remembers key as one whose count is shared.
func (t *tracked) note(key string, logger *zap.Logger) {
	if _, ok := t.keys.Load(key); ok {
		return
	}
	if t.n.Add(1) > t.cap.Load() {
		t.n.Add(-1)
		if !t.full.Swap(true) {
			logger.Warn("distributed: too many keys to share; new keys are limited by this instance only until tracked keys go idle",
				zap.String("zone", strings.ReplaceAll(t.name, scopeSep, "/")), zap.Int64("tracked_keys", t.cap.Load()))
		}
		return
	}
	if _, loaded := t.keys.LoadOrStore(key, struct{}{}); loaded {
		t.n.Add(-1)
	}
}

// fleet is the sync of one storage: this instance's file in it, and the
// latest read of the others'. Every member of the process that shares
// through the same storage uses one fleet, so that they write one file.
type fleet struct {
	key     string
	storage certmagic.Storage
	id      string
	now     func() int64

	mu      sync.Mutex
	members []*Member // oldest first; the newest's conf and logger apply
	conf    Config    // the newest member's, kept when the last leaves
	limits  map[string]*tracked

	others atomic.Pointer[[]fleetFile]
	// wrote is the time of the last report this process stored, started
	// when the sync began: a file of this instance's name dated after
	// both was written by another process with the same instance id
	// (twin: warned about once).
	wrote   atomic.Int64
	started int64
	twin    atomic.Bool

	wake   chan struct{}
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}
}

// Member is one config's use of the fleet of its storage.
type Member struct {
	f      *fleet
	conf   Config
	limits map[any]*tracked
	logger *zap.Logger
}

var fleets = struct {
	sync.Mutex
	m map[string]*fleet
}{m: map[string]*fleet{}}

// Join adds a config's limits to the fleet of its storage, starting the
// sync when no other config of the process syncs through that storage.
// A config that replaces another joins before the old one leaves, so the
// keys the old one noted are still written; the newest member's intervals,
// purge age, windows and key caps apply.
func Join(conf Config, limits []Limit) *Member {
	if conf.Logger == nil {
		conf.Logger = zap.NewNop()
	}
	m := &Member{conf: conf, limits: make(map[any]*tracked, len(limits)), logger: conf.Logger}
	f, fresh := joinFleet(storageKey(conf.Storage), conf.Storage, conf.Instance, conf.Now, m)
	f.mu.Lock()
	for _, l := range limits {
		name := l.Zone
		if l.Scope != "" {
			name += scopeSep + l.Scope
		}
		t := f.limits[name]
		if t == nil {
			t = &tracked{name: name}
			f.limits[name] = t
		}
		t.window.Store(l.Window)
		t.cap.Store(cmp.Or(l.MaxKeys, defaultTrackedKeys))
		t.fixed.Store(l.Fixed)
		t.regs = append(t.regs, trackedReg{m, l.Counts})
		m.limits[l.ID] = t
	}
	f.mu.Unlock()
	if fresh {
		// After the limits registered, so that the first read knows
		// their windows.
		f.start(m.logger)
	}
	return m
}

// storageKey tells storages apart: each config makes its own storage
// value, and a handler's storage option and the config's storage may
// name one place. Storages that describe themselves (file_system says its
// path) are one fleet across configs and handlers; others one per value.
func storageKey(s certmagic.Storage) string {
	if str, ok := s.(fmt.Stringer); ok {
		return fmt.Sprintf("%T %s", s, str)
	}
	return fmt.Sprintf("%T %p", s, s)
}

// joinFleet returns the running fleet of storageKey, or a new one (fresh)
// that the caller starts once its limits are registered.
func joinFleet(storageKey string, storage certmagic.Storage, id string, now func() int64, m *Member) (f *fleet, fresh bool) {
	fleets.Lock()
	defer fleets.Unlock()
	if f := fleets.m[storageKey]; f != nil {
		f.mu.Lock()
		f.members = append(f.members, m)
		f.conf, m.f = m.conf, f
		f.mu.Unlock()
		f.reconfigure()
		return f, false
	}
	ctx, cancel := context.WithCancel(context.Background())
	f = &fleet{key: storageKey, storage: storage, id: id, now: now, members: []*Member{m}, conf: m.conf,
		limits: map[string]*tracked{}, wake: make(chan struct{}, 1), ctx: ctx, cancel: cancel, done: make(chan struct{}), started: now()}
	m.f = f
	fleets.m[storageKey] = f
	return f, true
}

// start runs the sync after a first read, so that the first requests
// already count the others. A storage that does not answer, or files that
// take long to decode (storages ignore the context, and decoding does),
// must not hold up the config's load: it waits for the first read a
// second at most, and the loop starts once the read is done.
func (f *fleet) start(logger *zap.Logger) {
	first := make(chan struct{})
	go func() {
		defer close(first)
		if err := f.read(f.ctx); err != nil && f.ctx.Err() == nil {
			logger.Error("distributed: reading the other instances' counts", zap.Error(err))
		}
	}()
	select {
	case <-first:
	case <-time.After(firstReadWait):
		logger.Warn("distributed: the other instances' counts are still being read; requests count only this instance's until they are", zap.Duration("waited", firstReadWait))
	}
	go f.run(f.ctx, first)
}

// firstReadWait is how long the load of a config waits for the first
// read of the other instances' counts.
const firstReadWait = time.Second

// reconfigure makes the sync loop pick up the newest member's intervals.
func (f *fleet) reconfigure() {
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

// newest is the member whose config applies; f.mu is held.
func (f *fleet) newest() *Member { return f.members[len(f.members)-1] }

// Leave drops the member's limits; the last member stops the sync.
func (m *Member) Leave() {
	f := m.f
	fleets.Lock()
	f.mu.Lock()
	for name, t := range f.limits {
		t.regs = slices.DeleteFunc(t.regs, func(r trackedReg) bool { return r.member == m })
		if len(t.regs) == 0 {
			delete(f.limits, name)
		}
	}
	f.members = slices.DeleteFunc(f.members, func(o *Member) bool { return o == m })
	last := len(f.members) == 0
	if !last {
		f.conf = f.newest().conf
	}
	f.mu.Unlock()
	if last {
		delete(fleets.m, f.key)
	} else {
		// A failed reload leaves: the running config's intervals apply
		// again.
		f.reconfigure()
	}
	fleets.Unlock()
	if last {
		f.stop(m.logger, stopWait)
	}
}

// stopWait bounds how long the last member's Leave waits for the sync to
// stop. A read or write under way is let finish, so that nothing touches
// the storage once the config is gone (the storage may be removed or
// handed to another config right after); but storages ignore the
// context, and one that hangs must not hold up the reload that unloads
// the config.
const stopWait = 5 * time.Second

// stop ends the sync and waits, within wait, for its last storage call.
func (f *fleet) stop(logger *zap.Logger, wait time.Duration) {
	f.cancel()
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-f.done:
	case <-t.C:
		logger.Warn("distributed: the storage did not finish a read or write of the counts in time; the config is unloaded without waiting for it",
			zap.Duration("waited", wait))
	}
}

func (f *fleet) run(ctx context.Context, first <-chan struct{}) {
	defer func() {
		// Stopped only once the first read is done too: it may still
		// be reading when the config unloads.
		<-first
		close(f.done)
	}()
	select {
	case <-ctx.Done():
		return
	case <-first:
	}
	conf := f.config()
	var readErrs, writeErrs syncErrors
	read := time.NewTicker(conf.ReadInterval)
	write := time.NewTicker(conf.WriteInterval)
	defer read.Stop()
	defer write.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-f.wake:
			conf = f.config()
			read.Reset(conf.ReadInterval)
			write.Reset(conf.WriteInterval)
		case <-read.C:
			if err := f.read(ctx); ctx.Err() == nil {
				readErrs.report(f.log(), "distributed: reading the other instances' counts", err, time.Now())
			}
		case <-write.C:
			if err := f.write(ctx); ctx.Err() == nil {
				writeErrs.report(f.log(), "distributed: writing this instance's counts", err, time.Now())
			}
		}
	}
}

// syncErrors logs the failures of one sync operation without flooding
// the log at short intervals (a storage that cannot be written, at 10ms,
// logged 190 lines a second): the first of a run of failures, then one a
// minute with how many failed, and the recovery.
type syncErrors struct {
	failed int // in a row
	logged time.Time
}

const syncErrorsEvery = time.Minute

func (e *syncErrors) report(logger *zap.Logger, msg string, err error, now time.Time) {
	switch {
	case err == nil && e.failed > 0:
		logger.Info(msg+": working again", zap.Int("failed_in_a_row", e.failed))
		*e = syncErrors{}
	case err == nil:
	case e.failed == 0 || now.Sub(e.logged) >= syncErrorsEvery:
		e.failed++
		logger.Error(msg, zap.Error(err), zap.Int("failed_in_a_row", e.failed))
		e.logged = now
	default:
		e.failed++
	}
}

func (f *fleet) config() Config {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.conf
}

func (f *fleet) log() *zap.Logger {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.members) == 0 {
		return zap.NewNop()
	}
	return f.newest().logger
}

func (f *fleet) file(id string) string { return path.Join(prefix, id+suffix) }

// snapshot takes the count of every tracked key. Each count is read
// from the newest member's store, which reads each under its own key's
// lock (the memory store: its shard's), so requests wait for one key's
// read at most.
func (f *fleet) snapshot(ctx context.Context) fleetFile {
	f.mu.Lock()
	type job struct {
		t   *tracked
		reg trackedReg
	}
	jobs := make([]job, 0, len(f.limits))
	for _, t := range f.limits {
		jobs = append(jobs, job{t, t.regs[len(t.regs)-1]})
	}
	f.mu.Unlock()
	now := f.now()
	st := fleetFile{Timestamp: time.Unix(0, now), Zones: make(map[string]map[string]fleetCount, len(jobs))}
	for _, j := range jobs {
		counts := map[string]fleetCount{}
		window, fixed := j.t.window.Load(), j.t.fixed.Load()
		j.t.keys.Range(func(k, _ any) bool {
			key := k.(string)
			u, err := j.reg.counts.Usage(ctx, key)
			if err != nil || u.Used <= 0 {
				// Idle: a request that notes it again now is missed
				// until its next one, a count of one request for one
				// interval.
				j.t.keys.Delete(key)
				j.t.n.Add(-1)
				j.t.full.Store(false)
				return true
			}
			c := fleetCount{Count: int(min(u.Used, maxCount))}
			switch {
			case fixed && u.ResetAfter > 0:
				c.OldestEvent = time.Unix(0, now+u.ResetAfter-window)
			case u.RetryAfter > 0:
				c.OldestEvent = time.Unix(0, now+u.RetryAfter-window)
			}
			counts[key] = c
			return true
		})
		if len(counts) > 0 {
			st.Zones[j.t.name] = counts
		}
	}
	return st
}

// maxCount bounds one key's count in a report, read or written, so that
// the sum over any number of instances stays far from overflowing.
const maxCount = 1 << 40

// Write stores this instance's counts now, as the sync does every write
// interval.
func (m *Member) Write(ctx context.Context) error { return m.f.write(ctx) }

// Read loads the other instances' counts now, as the sync does every
// read interval.
func (m *Member) Read(ctx context.Context) error { return m.f.read(ctx) }

// write stores this instance's counts.
func (f *fleet) write(ctx context.Context) error {
	var buf bytes.Buffer
	st := f.snapshot(ctx)
	if err := gob.NewEncoder(&buf).Encode(st); err != nil {
		return err
	}
	if err := f.storage.Store(ctx, f.file(f.id), buf.Bytes()); err != nil {
		return err
	}
	f.wrote.Store(st.Timestamp.UnixNano())
	return nil
}

// read loads the other instances' counts, deleting the files purge_age
// says are of instances gone.
func (f *fleet) read(ctx context.Context) error {
	names, err := f.storage.List(ctx, prefix, false)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			f.others.Store(&[]fleetFile{})
			return nil
		}
		return err
	}
	purge := f.config().PurgeAge
	logger := f.log()
	now := time.Unix(0, f.now())
	// Without purge_age the files of instances gone pile up (a fleet
	// that scales gets a new instance id each time), and each would be
	// loaded and decoded at every read, and kept: a file not written for
	// this long reports nothing any limit counts, even with the storage's
	// clock an hour off this one's.
	f.mu.Lock()
	var longest time.Duration
	for _, t := range f.limits {
		longest = max(longest, time.Duration(t.window.Load()))
	}
	f.mu.Unlock()
	// Without a limit (all left), no window is known: nothing is left out.
	known := longest > 0
	stale := now.Add(-2*longest - time.Hour)
	others := make([]fleetFile, 0, len(names))
	for _, name := range names {
		if err := ctx.Err(); err != nil {
			// Stopping: storages ignore the context, and the files
			// left could take long to load and decode.
			return err
		}
		if !strings.HasSuffix(name, suffix) {
			continue
		}
		own := path.Base(name) == f.id+suffix
		if purge == 0 && known {
			if info, err := f.storage.Stat(ctx, name); err == nil && !info.Modified.IsZero() && info.Modified.Before(stale) {
				continue
			}
		}
		data, err := f.storage.Load(ctx, name)
		if err != nil {
			// Gone since List (purged by another instance), or unreadable.
			if !errors.Is(err, fs.ErrNotExist) {
				logger.Error("distributed: loading an instance's counts", zap.String("key", name), zap.Error(err))
			}
			continue
		}
		var st fleetFile
		if err := gob.NewDecoder(bytes.NewReader(data)).Decode(&st); err != nil {
			logger.Error("distributed: an instance's counts are corrupted", zap.String("key", name), zap.Error(err))
			continue
		}
		if y := st.Timestamp.Year(); y < 1970 || y > 2261 {
			// Not a time in nanoseconds since 1970: no window holds it.
			logger.Error("distributed: an instance's counts are corrupted", zap.String("key", name), zap.Time("timestamp", st.Timestamp))
			continue
		}
		if own {
			// Instances started from one copied data directory share
			// its instance id, and each overwrites the other's file:
			// skipped as this one's, their counts were never shared.
			if st.Timestamp.UnixNano() <= max(f.wrote.Load(), f.started) {
				continue // this process's, or of a run before it
			}
			if !f.twin.Swap(true) {
				logger.Warn("distributed: another instance writes this instance's file: instances started from a copy of one data directory share its instance id and overwrite each other's counts; give each its own data directory (or delete its instance.uuid)",
					zap.String("key", name))
			}
		} else if purge > 0 && st.Timestamp.Before(now.Add(-purge)) {
			if err := f.storage.Delete(ctx, name); err != nil {
				logger.Error("distributed: deleting a stale instance's counts", zap.String("key", name), zap.Error(err))
			}
			continue
		}
		if known && st.Timestamp.Before(now.Add(-longest)) {
			continue // counts nothing: not kept for requests to skip
		}
		others = append(others, st)
	}
	f.others.Store(&others)
	return nil
}

// remote is what the other instances last reported for key of t: their
// units in the window, and how long until the first of them leaves it.
// A report older than the window counts nothing: all it counted has left.
func remote(others []fleetFile, t *tracked, key string, now int64) (used, wait int64) {
	wait = -1
	window, fixed := t.window.Load(), t.fixed.Load()
	for i := range others {
		at := others[i].Timestamp.UnixNano()
		// A report from more than a window ahead of this clock is a
		// clock gone wrong or a hostile file: counted, it would deny the
		// keys it lists until it is rewritten, no window ever passing.
		if at+window <= now || at > now+window {
			continue
		}
		c, ok := others[i].Zones[t.name][key]
		if !ok || c.Count <= 0 {
			continue
		}
		free := at + window
		if !c.OldestEvent.IsZero() {
			// An event of the report's window: at most a window before
			// the report, and not after it.
			o := min(max(c.OldestEvent.UnixNano(), at-window), at) + window
			if fixed && o <= now {
				continue // counted in a window that has ended
			}
			if o > now && o < free {
				free = o
			}
		}
		used += min(int64(c.Count), maxCount)
		// A clock ahead of this one must not make a client wait longer
		// than a window.
		if w := min(free-now, window); wait < 0 || w < wait {
			wait = w
		}
	}
	return used, wait
}

// Verdict is the fleet's answer on a request this instance's store
// allowed, gathered by Check over the request's limits. The zero Verdict
// allows.
type Verdict struct {
	denied bool
	limit  int
	wait   int64
}

// Denied reports whether the other instances' counts deny the request:
// which limit denies (the index given to Check; of those that deny, the
// one whose room comes back last) and how long until it has room, in ns,
// at least 1.
func (v Verdict) Denied() (limit int, retryAfter int64, denied bool) {
	return v.limit, max(v.wait, 1), v.denied
}

// Check adds the other instances' counts to limit i of a request that
// this instance's store allowed: the limit Joined as id, counted against
// key, with remaining units left here. When the others used more than
// remaining, the request is denied; v keeps the denying limit whose room
// comes back last. A limit the member did not join with is left alone.
// The key is remembered as one whose count this instance writes.
func (m *Member) Check(v *Verdict, i int, id any, key string, remaining, now int64) {
	t := m.limits[id]
	if t == nil {
		return
	}
	var others []fleetFile
	if p := m.f.others.Load(); p != nil {
		others = *p
	}
	t.note(key, m.logger)
	used, w := remote(others, t, key, now)
	if used > remaining && (!v.denied || w > v.wait) {
		*v = Verdict{denied: true, limit: i, wait: w}
	}
}
