// Package conctest holds fakes for tests of concurrency slots: a backend's
// shared slots kept in memory, and a queue timer the test fires.
package conctest

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"time"

	"github.com/sluicehq/sluice/backend"
)

// Slots are a backend's shared slots held in memory: limit per key, or
// unavailable (a backend.UnavailableError) while Down is set. Set Down
// before the slots are used.
type Slots struct {
	Down bool

	mu    sync.Mutex
	limit int
	held  map[string]map[string]bool
	seq   int
	calls int
}

// NewSlots are slots of limit per key.
func NewSlots(limit int) *Slots {
	return &Slots{limit: limit, held: map[string]map[string]bool{}}
}

func (f *Slots) Acquire(_ context.Context, key string) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if f.Down {
		return "", &backend.UnavailableError{Err: errors.New("down"), RetryAfter: 2 * time.Second}
	}
	if len(f.held[key]) >= f.limit {
		return "", nil
	}
	if f.held[key] == nil {
		f.held[key] = map[string]bool{}
	}
	f.seq++
	id := strconv.Itoa(f.seq)
	f.held[key][id] = true
	return id, nil
}

func (f *Slots) Release(_ context.Context, key, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.Down {
		return &backend.UnavailableError{Err: errors.New("down")}
	}
	delete(f.held[key], id)
	return nil
}

// Count is how many slots of key are held.
func (f *Slots) Count(key string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.held[key])
}

// Keys is how many keys ever held a slot.
func (f *Slots) Keys() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.held)
}

// Calls is how many times Acquire was called since the last ResetCalls.
func (f *Slots) Calls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls
}

// ResetCalls sets the count of Acquire calls back to 0.
func (f *Slots) ResetCalls() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = 0
}

// Timer is a queue timer the test fires: every timer it makes fires when
// Fire receives.
type Timer struct{ Fire chan time.Time }

// NewTimer has the signature of the limiters' newTimer.
func (m *Timer) NewTimer(time.Duration) (<-chan time.Time, func() bool) {
	return m.Fire, func() bool { return true }
}

var _ backend.Slots = (*Slots)(nil)
