// Package conc caps the requests in flight at once per key: Local holds
// the slots in this process, Shared asks a backend that shares them with
// every instance (backend.Slots). Both keep a line of waiters per key,
// served in arrival order, up to a queue timeout.
package conc

import (
	"container/list"
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Local caps the requests of each key in flight at once. A key's
// entry lives only while it has a request in flight, so a flood of new
// keys costs memory only for the requests actually being served.
type Local struct {
	max      atomic.Int64 // changes while it runs when the limit is adaptive
	queue    time.Duration
	queueMax int64 // most waiters of a key; 0: no cap
	gauge    prometheus.Gauge

	mu   sync.Mutex
	keys map[string]*Key
}

// Key is one key's requests in flight and its line of waiters. A
// waiter is in line only while every slot is taken: a freed slot goes to
// the first waiter, in order of arrival, never back to the pool.
type Key struct {
	key      string
	inFlight int64
	waiters  list.List // of *Waiter
}

type Waiter struct {
	ready   chan struct{} // closed when a slot is handed to the waiter
	elem    *list.Element
	granted bool // under the limiter's lock
}

// NewLocal is a cap of limit requests in flight per key, whose waiters
// wait up to queue (none: 0), at most queueMax of them per key (0: no
// cap); gauge counts the slots held.
func NewLocal(limit int64, queue time.Duration, queueMax int64, gauge prometheus.Gauge) *Local {
	c := &Local{queue: queue, queueMax: queueMax, gauge: gauge, keys: make(map[string]*Key)}
	c.max.Store(limit)
	return c
}

// Take takes a slot of key: it returns the key's entry holding the slot,
// or the entry and a waiter in its line (Await the slot), or nothing when
// every slot is taken and the limit has no queue.
func (c *Local) Take(key string) (*Key, *Waiter) {
	c.mu.Lock()
	k := c.keys[key]
	if k == nil {
		k = &Key{key: key}
		c.keys[key] = k
	}
	if k.inFlight < c.max.Load() {
		k.inFlight++
		c.mu.Unlock()
		c.gauge.Inc()
		return k, nil
	}
	if c.queue <= 0 || c.queueMax > 0 && int64(k.waiters.Len()) >= c.queueMax {
		c.mu.Unlock()
		return nil, nil
	}
	w := &Waiter{ready: make(chan struct{})}
	w.elem = k.waiters.PushBack(w)
	c.mu.Unlock()
	return k, w
}

// ErrQueueTimeout is Await's answer when no slot came within the queue's
// timeout.
var ErrQueueTimeout = errors.New("no slot within the queue's timeout")

// Await waits for the slot w is in line for, until the queue's timeout or
// ctx ends. It returns nil when w holds the slot; otherwise w has left the
// line, holding nothing.
func (c *Local) Await(ctx context.Context, k *Key, w *Waiter, newTimer func(time.Duration) (<-chan time.Time, func() bool)) error {
	fired, stop := newTimer(c.queue)
	defer stop()
	var err error
	select {
	case <-w.ready:
		return nil
	case <-fired:
		err = ErrQueueTimeout
	case <-ctx.Done():
		err = ctx.Err()
	}
	c.mu.Lock()
	if !w.granted {
		k.waiters.Remove(w.elem)
		c.mu.Unlock()
		return err
	}
	c.mu.Unlock()
	// The slot came as the wait ended: a request whose time ran out
	// takes it, one whose client left passes it on.
	if err == ErrQueueTimeout {
		return nil
	}
	c.Release(k)
	return err
}

// Release frees a slot of k: to the first waiter in line, or to the pool,
// dropping the key once nothing of it is in flight. A slot above a cap
// that was lowered meanwhile goes back to the pool.
func (c *Local) Release(k *Key) {
	c.mu.Lock()
	if e := k.waiters.Front(); e != nil && k.inFlight <= c.max.Load() {
		w := k.waiters.Remove(e).(*Waiter)
		w.granted = true
		close(w.ready)
		c.mu.Unlock()
		return
	}
	k.inFlight--
	if k.inFlight == 0 {
		delete(c.keys, k.key)
	}
	c.mu.Unlock()
	c.gauge.Dec()
}

// Max is the cap in force.
func (c *Local) Max() int64 { return c.max.Load() }

// Size is the number of keys tracked.
func (c *Local) Size() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.keys)
}

// SetMax changes the cap while requests are in flight. Raised, the keys'
// waiters get the new slots at once, in order; lowered, the requests in
// flight keep their slots, and a freed slot goes back to the pool until
// its key is under the new cap.
func (c *Local) SetMax(n int64) {
	c.mu.Lock()
	c.max.Store(n)
	granted := 0
	for _, k := range c.keys {
		for k.inFlight < n {
			e := k.waiters.Front()
			if e == nil {
				break
			}
			w := k.waiters.Remove(e).(*Waiter)
			w.granted = true
			k.inFlight++
			close(w.ready)
			granted++
		}
	}
	c.mu.Unlock()
	c.gauge.Add(float64(granted))
}
