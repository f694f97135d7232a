package sluice

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

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/certmagic"
	"go.uber.org/zap"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/backend/memory"
)

// Distributed shares the counts of a fleet of Caddy instances through a
// Caddy storage they all use: each instance writes, every WriteInterval,
// how many events each key of each zone has in its window, and reads the
// others' every ReadInterval. A request is then denied when this
// instance's count plus the others' last known counts would go over the
// zone's limit. The sharing is eventually consistent, not exact: between
// two syncs each instance admits from its own quota what the others have
// not reported yet (backend redis shares exactly).
//
// The files are those of mholt/caddy-ratelimit (rate_limit/instances/
// <instance id>.rlstate, the same encoding), so a fleet can mix both
// modules while it migrates.
type Distributed struct {
	// WriteInterval is how often this instance's counts are written to
	// storage. Default: 5s; at least 10ms.
	WriteInterval caddy.Duration `json:"write_interval,omitempty"`

	// ReadInterval is how often the other instances' counts are read from
	// storage. Default: 5s; at least 10ms.
	ReadInterval caddy.Duration `json:"read_interval,omitempty"`

	// PurgeAge deletes another instance's file from storage once it has
	// not been written for this long (an instance that left the fleet).
	// Default: 0, never deleted; a file older than a zone's window counts
	// nothing for that zone either way.
	PurgeAge caddy.Duration `json:"purge_age,omitempty"`
}

const (
	defaultSyncInterval = 5 * time.Second
	// minSyncInterval keeps a sync loop from spinning on the storage.
	minSyncInterval = 10 * time.Millisecond
	// fleetPrefix is where each instance's file lives, the path
	// mholt/caddy-ratelimit uses, so that both read each other.
	fleetPrefix = "rate_limit/instances"
	fleetSuffix = ".rlstate"
	// scopeSep joins a zone and a scope into one name in the file: a
	// scope is a limit mholt/caddy-ratelimit does not have, so it never
	// finds these names.
	scopeSep = "\x1f"
	// defaultTrackedKeys is how many keys of a zone without max_keys have
	// their counts shared: the snapshot of a zone holds at most this many.
	defaultTrackedKeys = 65536
)

// fleetFile is what one instance writes. The field names and types are
// the wire format (gob matches fields by name): a file written by
// mholt/caddy-ratelimit reads into it and the other way round.
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

func (d *Distributed) check() error {
	for _, f := range []struct {
		name string
		v    *caddy.Duration
	}{{"read_interval", &d.ReadInterval}, {"write_interval", &d.WriteInterval}} {
		if *f.v == 0 {
			*f.v = caddy.Duration(defaultSyncInterval)
		}
		if time.Duration(*f.v) < minSyncInterval {
			return fmt.Errorf("distributed: %s must be at least %s, got %s", f.name, minSyncInterval, time.Duration(*f.v))
		}
	}
	if d.PurgeAge < 0 {
		return fmt.Errorf("distributed: purge_age must not be negative, got %s", time.Duration(d.PurgeAge))
	}
	return nil
}

// tracked is one limit of a fleet: the keys whose counts are written.
// The memory store keeps only a hash of each key, so the keys this
// instance admitted are remembered here, at most cap of them; a key is
// forgotten when a snapshot finds it idle.
type tracked struct {
	name string // zone, or zone scopeSep scope
	// window and cap are the newest config's: a reload may change them
	// while the old config still decides.
	window atomic.Int64
	cap    atomic.Int64
	// fixed is set for fixed_window, whose counts all leave at once, at
	// the end of the window: the file dates them so, and a report whose
	// window has ended counts nothing.
	fixed atomic.Bool
	keys  sync.Map // string → struct{}
	n     atomic.Int64
	full  atomic.Bool // logged that a key could not be tracked
	// regs are the configs using this limit, newest last; the newest is
	// asked for the counts. Guarded by the fleet's mu.
	regs []trackedReg
}

type trackedReg struct {
	member *fleetMember
	admin  backend.Admin
	handle backend.Limit
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
// latest read of the others'. Every handler of the process that shares
// through the same storage uses one fleet, so that they write one file.
type fleet struct {
	key     string
	storage certmagic.Storage
	id      string
	now     func() int64

	mu      sync.Mutex
	members []*fleetMember // oldest first; the newest's conf and logger apply
	conf    Distributed    // the newest member's, kept when the last leaves
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

// fleetMember is one handler's use of a fleet.
type fleetMember struct {
	f      *fleet
	conf   Distributed
	limits map[*limit]*tracked
	logger *zap.Logger
}

var fleets = struct {
	sync.Mutex
	m map[string]*fleet
}{m: map[string]*fleet{}}

// provisionDistributed joins the fleet of the handler's storage.
func (h *plan) provisionDistributed(ctx caddy.Context) error {
	var storage certmagic.Storage
	if len(h.StorageRaw) > 0 {
		mod, err := ctx.LoadModule(h.Handler, "StorageRaw")
		if err != nil {
			return fmt.Errorf("storage: %v", err)
		}
		if storage, err = mod.(caddy.StorageConverter).CertMagicStorage(); err != nil {
			return fmt.Errorf("storage: %v", err)
		}
		if h.Distributed == nil {
			h.logger.Warn("storage does nothing without distributed")
			return nil
		}
	}
	if h.Distributed == nil {
		return nil
	}
	if err := h.Distributed.check(); err != nil {
		return err
	}
	if _, ok := h.store.(*memory.Store); !ok {
		return fmt.Errorf("distributed: the backend already decides where counts are kept (backend redis shares them across a fleet, exactly): remove distributed")
	}
	admin, ok := h.store.(backend.Admin)
	if !ok {
		return fmt.Errorf("distributed: the backend cannot report its counts")
	}
	m := &fleetMember{conf: *h.Distributed, limits: map[*limit]*tracked{}, logger: h.logger}
	for _, z := range h.zones {
		for _, l := range z.limits {
			switch algorithms.KindOf(l.algorithm) {
			case algorithms.KindLog, algorithms.KindWindow, algorithms.KindCounter:
			default:
				return fmt.Errorf("zone %q: algorithm: distributed shares counts of events in a window, which %s does not keep: use sliding_window, sliding_window_counter or fixed_window, or remove distributed", z.name, l.algorithm)
			}
		}
	}
	if storage == nil {
		storage = h.distStorage
	}
	if storage == nil {
		storage = ctx.Storage()
	}
	id, err := caddy.InstanceID()
	if err != nil {
		return fmt.Errorf("distributed: instance id: %v", err)
	}
	f, fresh := joinFleet(storageKey(storage), storage, id.String(), h.now, m)
	f.mu.Lock()
	for _, z := range h.zones {
		for _, l := range z.limits {
			name := z.name
			if l.scope != "" {
				name += scopeSep + l.scope
			}
			t := f.limits[name]
			if t == nil {
				t = &tracked{name: name}
				f.limits[name] = t
			}
			t.window.Store(int64(l.Window))
			t.cap.Store(cmp.Or(int64(l.MaxKeys), defaultTrackedKeys))
			t.fixed.Store(algorithms.KindOf(l.algorithm) == algorithms.KindWindow)
			t.regs = append(t.regs, trackedReg{m, admin, l.handle})
			m.limits[l] = t
		}
	}
	f.mu.Unlock()
	if fresh {
		// After the zones registered, so that the first read knows
		// their windows.
		f.start(m.logger)
	}
	h.fleet = m
	return nil
}

// storageKey tells storages apart: each config makes its own storage
// value, and the handler's storage option and the config's storage may
// name one place. Storages that describe themselves (file_system says its
// path) are one fleet across configs and handlers; others one per value.
func storageKey(s certmagic.Storage) string {
	if str, ok := s.(fmt.Stringer); ok {
		return fmt.Sprintf("%T %s", s, str)
	}
	return fmt.Sprintf("%T %p", s, s)
}

// joinFleet returns the running fleet of storageKey, or a new one (fresh)
// that the caller starts once its zones are registered.
func joinFleet(storageKey string, storage certmagic.Storage, id string, now func() int64, m *fleetMember) (f *fleet, fresh bool) {
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
	f = &fleet{key: storageKey, storage: storage, id: id, now: now, members: []*fleetMember{m}, conf: m.conf,
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
func (f *fleet) newest() *fleetMember { return f.members[len(f.members)-1] }

// leave drops the member's limits; the last member stops the sync.
func (m *fleetMember) leave() {
	f := m.f
	fleets.Lock()
	f.mu.Lock()
	for name, t := range f.limits {
		t.regs = slices.DeleteFunc(t.regs, func(r trackedReg) bool { return r.member == m })
		if len(t.regs) == 0 {
			delete(f.limits, name)
		}
	}
	f.members = slices.DeleteFunc(f.members, func(o *fleetMember) bool { return o == m })
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

// stopWait bounds how long the last handler's Cleanup waits for the sync
// to stop. A read or write under way is let finish, so that nothing
// touches the storage once the config is gone (the storage may be removed
// or handed to another config right after); but storages ignore the
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
	read := time.NewTicker(time.Duration(conf.ReadInterval))
	write := time.NewTicker(time.Duration(conf.WriteInterval))
	defer read.Stop()
	defer write.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-f.wake:
			conf = f.config()
			read.Reset(time.Duration(conf.ReadInterval))
			write.Reset(time.Duration(conf.WriteInterval))
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

func (f *fleet) config() Distributed {
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

func (f *fleet) file(id string) string { return path.Join(fleetPrefix, id+fleetSuffix) }

// snapshot takes the count of every tracked key. Each count is read under
// its shard's lock alone, so requests wait for one key's read at most.
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
			u, err := j.reg.admin.Inspect(ctx, j.reg.handle, key)
			used := u.Limit - u.Remaining
			if err != nil || used <= 0 {
				// Idle: a request that notes it again now is missed
				// until its next one, a count of one request for one
				// interval.
				j.t.keys.Delete(key)
				j.t.n.Add(-1)
				j.t.full.Store(false)
				return true
			}
			c := fleetCount{Count: int(min(used, maxCount))}
			switch {
			case fixed && u.ResetAfter > 0:
				c.OldestEvent = time.Unix(0, now+u.ResetAfter-window)
			case u.RetryAfter > 0 && u.RetryAfter != algorithms.Never:
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
	names, err := f.storage.List(ctx, fleetPrefix, false)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			f.others.Store(&[]fleetFile{})
			return nil
		}
		return err
	}
	purge := time.Duration(f.config().PurgeAge)
	logger := f.log()
	now := time.Unix(0, f.now())
	// Without purge_age the files of instances gone pile up (a fleet
	// that scales gets a new instance id each time), and each would be
	// loaded and decoded at every read, and kept: a file not written for
	// this long reports nothing any zone counts, even with the storage's
	// clock an hour off this one's.
	f.mu.Lock()
	var longest time.Duration
	for _, t := range f.limits {
		longest = max(longest, time.Duration(t.window.Load()))
	}
	f.mu.Unlock()
	// Without a zone (all left), no window is known: nothing is left out.
	known := longest > 0
	stale := now.Add(-2*longest - time.Hour)
	others := make([]fleetFile, 0, len(names))
	for _, name := range names {
		if err := ctx.Err(); err != nil {
			// Stopping: storages ignore the context, and the files
			// left could take long to load and decode.
			return err
		}
		if !strings.HasSuffix(name, fleetSuffix) {
			continue
		}
		own := path.Base(name) == f.id+fleetSuffix
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

// check adds the other instances' counts to a decision the store allowed:
// when a request's key has fewer units left here than the others used,
// the decision is given back to the store and turned into a denial. It
// reports whether the request is still allowed.
func (m *fleetMember) check(ctx context.Context, store backend.Store, limits []*limit, reqs []backend.Request, out []algorithms.Result, now int64) bool {
	var others []fleetFile
	if p := m.f.others.Load(); p != nil {
		others = *p
	}
	deny, wait := -1, int64(0)
	for i, l := range limits {
		t := m.limits[l]
		if t == nil || reqs[i].Shadow {
			continue
		}
		t.note(reqs[i].Key, m.logger)
		used, w := remote(others, t, reqs[i].Key, now)
		if used > out[i].Remaining && (deny < 0 || w > wait) {
			deny, wait = i, w
		}
	}
	if deny < 0 {
		return true
	}
	if err := store.Refund(context.WithoutCancel(ctx), reqs, out); err != nil {
		m.logger.Error("distributed: giving back a request the fleet denies", zap.Error(err))
	}
	res := &out[deny]
	wait = max(wait, 1)
	*res = algorithms.Result{Limit: res.Limit, RetryAfter: wait, ResetAfter: max(res.ResetAfter, wait), At: res.At}
	return false
}
