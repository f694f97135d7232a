// Package fleettest holds what the tests of internal/fleet and of the
// handler that uses it share: a Caddy storage in memory, and the state
// file of mholt/caddy-ratelimit as that module writes and reads it.
package fleettest

import (
	"bytes"
	"context"
	"encoding/gob"
	"io/fs"
	"path"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"
)

// Storage is a certmagic.Storage in a map. Stat reports when a key was
// last stored, on the system clock, unless SetModified says otherwise.
type Storage struct {
	mu    sync.Mutex
	files map[string][]byte
	times map[string]time.Time
}

func NewStorage() *Storage {
	return &Storage{files: map[string][]byte{}, times: map[string]time.Time{}}
}

func (m *Storage) Lock(context.Context, string) error   { return nil }
func (m *Storage) Unlock(context.Context, string) error { return nil }

func (m *Storage) Store(_ context.Context, key string, v []byte) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.files[key] = bytes.Clone(v)
	m.times[key] = time.Now()
	return nil
}

func (m *Storage) Load(_ context.Context, key string) ([]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	v, ok := m.files[key]
	if !ok {
		return nil, fs.ErrNotExist
	}
	return bytes.Clone(v), nil
}

func (m *Storage) Delete(_ context.Context, key string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.files, key)
	return nil
}

func (m *Storage) Exists(_ context.Context, key string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, ok := m.files[key]
	return ok
}

func (m *Storage) List(_ context.Context, prefix string, _ bool) ([]string, error) {
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

func (m *Storage) Stat(_ context.Context, key string) (certmagic.KeyInfo, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	v, ok := m.files[key]
	if !ok {
		return certmagic.KeyInfo{}, fs.ErrNotExist
	}
	return certmagic.KeyInfo{Key: key, Size: int64(len(v)), Modified: m.times[key], IsTerminal: true}, nil
}

// SetModified sets when key was last stored, as Stat reports it.
func (m *Storage) SetModified(key string, t time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.times[key] = t
}

// Value and State mirror the shapes of the state file that
// mholt/caddy-ratelimit documents (per zone, per key: the count in the
// window and the oldest event), under other type names: gob matches the
// fields by name, so these are what an instance of that module writes
// and reads.
type Value struct {
	Count       int
	OldestEvent time.Time
}

type State struct {
	Timestamp time.Time
	Zones     map[string]map[string]Value
}

// File is the storage key of the instance id's state file.
func File(id string) string { return path.Join("rate_limit/instances", id+".rlstate") }

// Put stores st as the instance id's file.
func Put(t testing.TB, s certmagic.Storage, id string, st State) {
	t.Helper()
	var buf bytes.Buffer
	if err := gob.NewEncoder(&buf).Encode(st); err != nil {
		t.Fatal(err)
	}
	if err := s.Store(context.Background(), File(id), buf.Bytes()); err != nil {
		t.Fatal(err)
	}
}

// Get reads the instance id's file.
func Get(t testing.TB, s certmagic.Storage, id string) State {
	t.Helper()
	data, err := s.Load(context.Background(), File(id))
	if err != nil {
		t.Fatal(err)
	}
	var st State
	if err := gob.NewDecoder(bytes.NewReader(data)).Decode(&st); err != nil {
		t.Fatal(err)
	}
	return st
}
