package conc

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

// Shared is a concurrency limit whose slots the backend shares with
// every instance (backend.Slots). The requests that wait for a slot wait in
// this instance, in a line per key: a newcomer joins the line when it is
// not empty, and the first in line alone asks the backend, so the line
// leaves in arrival order. Across instances no order holds: the first of
// each instance's line asks when a slot may be free, and whichever asks
// first gets it.
type Shared struct {
	slots    backend.Slots
	queue    time.Duration
	queueMax int64
	gauge    prometheus.Gauge
	logger   *zap.Logger // sampled: while Redis is away, every release fails

	mu    sync.Mutex
	lines map[string]*list.List // of *waiter; only keys with waiters
}

// waiter is a request in line. turn is closed when it becomes the
// first; wake tells the first that this instance freed a slot of its key.
type waiter struct {
	turn chan struct{}
	wake chan struct{}
	elem *list.Element
}

// NewShared is a concurrency limit on slots, whose waiters wait up to
// queue, at most queueMax of them per key (0: no cap).
func NewShared(slots backend.Slots, queue time.Duration, queueMax int64, gauge prometheus.Gauge, logger *zap.Logger) *Shared {
	if logger != nil {
		logger = logger.WithOptions(zap.WrapCore(func(c zapcore.Core) zapcore.Core {
			return zapcore.NewSamplerWithOptions(c, time.Second, 10, 100)
		}))
	}
	return &Shared{slots: slots, queue: queue, queueMax: queueMax, gauge: gauge, logger: logger, lines: make(map[string]*list.List)}
}

// Queue is how long a request may wait for a slot; 0: not at all.
func (c *Shared) Queue() time.Duration { return c.queue }

// Slots are the backend's slots the limit takes.
func (c *Shared) Slots() backend.Slots { return c.slots }

// Take takes a slot of key and returns its id: at once when nobody here
// waits for the key and the backend has one free, else after waiting in
// line (up to the queue's timeout: ErrQueueTimeout). A full line refuses
// at once (ErrQueueTimeout too). Backend errors are returned as they are.
func (c *Shared) Take(ctx context.Context, key string, newTimer func(time.Duration) (<-chan time.Time, func() bool)) (string, error) {
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
			return "", ErrQueueTimeout
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
		return "", ErrQueueTimeout
	}
	w := &waiter{turn: make(chan struct{}), wake: make(chan struct{}, 1)}
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
func (c *Shared) await(ctx context.Context, key string, line *list.List, w *waiter, newTimer func(time.Duration) (<-chan time.Time, func() bool)) (string, error) {
	defer c.leave(key, line, w)
	fired, stop := newTimer(c.queue)
	defer stop()
	select {
	case <-w.turn:
	case <-fired:
		return "", ErrQueueTimeout
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
			return "", ErrQueueTimeout
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
func (c *Shared) leave(key string, line *list.List, w *waiter) {
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
		close(line.Front().Value.(*waiter).turn)
	}
}

// Release frees the slot id of key, and wakes the first request in this
// instance's line for the key to ask for it. When the backend cannot be
// told, the slot expires after its TTL.
func (c *Shared) Release(key, id string) {
	c.gauge.Dec()
	if err := c.slots.Release(context.Background(), key, id); err != nil && c.logger != nil {
		c.logger.Warn("freeing a concurrency slot in the backend: tried again until it answers, or the slot expires after its slot_ttl", zap.Error(err))
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if line := c.lines[key]; line != nil {
		select {
		case line.Front().Value.(*waiter).wake <- struct{}{}:
		default:
		}
	}
}

// WakeAll tells the first request of every line here to ask again at
// once: the cap was raised, and a slot may be free for it now.
func (c *Shared) WakeAll() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, line := range c.lines {
		select {
		case line.Front().Value.(*waiter).wake <- struct{}{}:
		default:
		}
	}
}
