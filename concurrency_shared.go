package sluice

import (
	"container/list"
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/sluicehq/sluice/backend"
)

// Polling for a slot shared through the backend. Only the first request in
// an instance's line for a key asks, so Redis sees at most one call per
// waiting key and instance every slotPollMax, whatever the length of the
// line; a slot freed by this instance wakes it at once. With many keys
// waiting (a flood of clients, each over its cap), each asks less often:
// a limit's lines ask about slotPollBudget times a second in all, so the
// flood cannot turn into one Redis call per key every 50 ms.
const (
	slotPollFirst  = 2 * time.Millisecond
	slotPollMax    = 50 * time.Millisecond
	slotPollBudget = 1000
)

// sharedConc is a concurrency limit whose slots the backend shares with
// every instance (backend.Slots). The requests that wait for a slot wait in
// this instance, in a line per key: a newcomer joins the line when it is
// not empty, and the first in line alone asks the backend, so the line
// leaves in arrival order. Across instances no order holds: the first of
// each instance's line asks when a slot may be free, and whichever asks
// first gets it.
type sharedConc struct {
	slots    backend.Slots
	queue    time.Duration
	queueMax int64
	gauge    prometheus.Gauge
	logger   *zap.Logger // sampled: while Redis is away, every release fails

	mu    sync.Mutex
	lines map[string]*list.List // of *sharedWaiter; only keys with waiters
}

// sharedWaiter is a request in line. turn is closed when it becomes the
// first; wake tells the first that this instance freed a slot of its key.
type sharedWaiter struct {
	turn chan struct{}
	wake chan struct{}
	elem *list.Element
}

func newSharedConc(slots backend.Slots, queue time.Duration, queueMax int64, gauge prometheus.Gauge, logger *zap.Logger) *sharedConc {
	if logger != nil {
		logger = logger.WithOptions(zap.WrapCore(func(c zapcore.Core) zapcore.Core {
			return zapcore.NewSamplerWithOptions(c, time.Second, 10, 100)
		}))
	}
	return &sharedConc{slots: slots, queue: queue, queueMax: queueMax, gauge: gauge, logger: logger, lines: make(map[string]*list.List)}
}

// take takes a slot of key and returns its id: at once when nobody here
// waits for the key and the backend has one free, else after waiting in
// line (up to the queue's timeout: errQueueTimeout). A full line refuses
// at once (errQueueTimeout too). Backend errors are returned as they are.
func (c *sharedConc) take(ctx context.Context, key string, newTimer func(time.Duration) (<-chan time.Time, func() bool)) (string, error) {
	c.mu.Lock()
	line := c.lines[key]
	c.mu.Unlock()
	if line == nil {
		id, err := c.slots.Acquire(ctx, key)
		if err != nil || id != "" {
			if id != "" {
				c.gauge.Inc()
			}
			return id, err
		}
		if c.queue <= 0 {
			return "", errQueueTimeout
		}
	}
	c.mu.Lock()
	line = c.lines[key]
	if line == nil {
		line = list.New()
		c.lines[key] = line
	}
	if c.queueMax > 0 && int64(line.Len()) >= c.queueMax {
		c.mu.Unlock()
		return "", errQueueTimeout
	}
	w := &sharedWaiter{turn: make(chan struct{}), wake: make(chan struct{}, 1)}
	w.elem = line.PushBack(w)
	if line.Front() == w.elem {
		close(w.turn)
	}
	c.mu.Unlock()
	id, err := c.await(ctx, key, line, w, newTimer)
	if id != "" {
		c.gauge.Inc()
	}
	return id, err
}

// await waits for w's turn, then asks the backend until it gets a slot,
// the queue's timeout passes or ctx ends. w leaves the line either way.
func (c *sharedConc) await(ctx context.Context, key string, line *list.List, w *sharedWaiter, newTimer func(time.Duration) (<-chan time.Time, func() bool)) (string, error) {
	defer c.leave(key, line, w)
	fired, stop := newTimer(c.queue)
	defer stop()
	select {
	case <-w.turn:
	case <-fired:
		return "", errQueueTimeout
	case <-ctx.Done():
		return "", ctx.Err()
	}
	poll := time.NewTimer(0)
	defer poll.Stop()
	<-poll.C
	delay := slotPollFirst
	for {
		id, err := c.slots.Acquire(ctx, key)
		if err != nil || id != "" {
			return id, err
		}
		poll.Reset(delay)
		select {
		case <-w.wake:
		case <-poll.C:
			c.mu.Lock()
			keys := len(c.lines)
			c.mu.Unlock()
			delay = min(2*delay, max(slotPollMax, time.Duration(keys)*time.Second/slotPollBudget))
		case <-fired:
			return "", errQueueTimeout
		case <-ctx.Done():
			return "", ctx.Err()
		}
		if !poll.Stop() {
			select {
			case <-poll.C:
			default:
			}
		}
	}
}

// leave takes w out of line; the next, when w was first, asks next.
func (c *sharedConc) leave(key string, line *list.List, w *sharedWaiter) {
	c.mu.Lock()
	defer c.mu.Unlock()
	first := line.Front() == w.elem
	line.Remove(w.elem)
	if line.Len() == 0 {
		if c.lines[key] == line {
			delete(c.lines, key)
		}
		return
	}
	if first {
		close(line.Front().Value.(*sharedWaiter).turn)
	}
}

// release frees the slot id of key, and wakes the first request in this
// instance's line for the key to ask for it. When the backend cannot be
// told, the slot expires after its TTL.
func (c *sharedConc) release(key, id string) {
	c.gauge.Dec()
	if err := c.slots.Release(context.Background(), key, id); err != nil && c.logger != nil {
		c.logger.Warn("freeing a concurrency slot in the backend: tried again until it answers, or the slot expires after its slot_ttl", zap.Error(err))
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if line := c.lines[key]; line != nil {
		select {
		case line.Front().Value.(*sharedWaiter).wake <- struct{}{}:
		default:
		}
	}
}

// wakeAll tells the first request of every line here to ask again at
// once: the cap was raised, and a slot may be free for it now.
func (c *sharedConc) wakeAll() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, line := range c.lines {
		select {
		case line.Front().Value.(*sharedWaiter).wake <- struct{}{}:
		default:
		}
	}
}
