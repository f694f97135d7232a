package redis

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/algorithms"
)

// Concurrent decisions are gathered into one script call (modeMany) that
// decides each request on its own: the call's fixed cost (EVALSHA, TIME,
// the script's set-up, a round trip, the client's work) is paid once per
// batch. The batching is a group commit, with no timer while the store is
// not busy (see hold): a decision that finds no call in flight is sent at
// once, by its own goroutine, so an idle store adds no latency.
// Decisions that arrive while a call is in flight wait for it to return
// and then go together in the next call; when minBatch of them wait and
// fewer than maxInFlight calls are in flight, they leave at once in a call
// of their own, written while Redis runs the previous one. So under load a
// decision waits for at most the calls in flight before its own (more
// while over maxInFlight × maxBatch decisions wait), never past its
// deadline, and a call carries one decision only when it has Redis to
// itself.
//
// One more rule keeps a busy store's calls full: when a call of many
// decisions returns, their callers answer their clients and most come
// back with their next request a moment later. The first of those would
// otherwise leave at once with the few that arrived with it, and the rest
// would wait for that small call: under load, calls alternated between
// nearly all the requests in flight and a handful. So after a call of at
// least holdMin decisions, with no other in flight, the next call waits
// until nearly as many decisions queue (holdShare eighths of them) or
// holdFor passes (see hold). A store that is not that busy never holds.

// maxBatch bounds the requests of one script call, so that one call does
// not hold Redis (which runs one script at a time) for long: 64 token
// bucket decisions take about 0.5 ms of Redis CPU.
const maxBatch = 64

// maxInFlight is how many batch calls of one store and slot may be in
// flight at once: the next batch is encoded and written while Redis runs
// the previous one.
const maxInFlight = 2

// minBatch is how many waiting decisions make a call of their own while
// another is in flight; fewer wait for it to return. A second call of a
// few decisions would cost Redis and the client nearly what a call of
// many does (in Redis about 90 µs per call against 20 per decision). Half
// a call: at 32 connections 16 gave 11–14 decisions per call end to end,
// 32 gave 15–19.
const minBatch = maxBatch / 2

// holdMin is the smallest call after which the next one waits for the
// round of requests to come back (hold): below it the store is not busy
// enough for the wait to save a call.
const holdMin = 8

// holdShare is the share, in eighths, of the returned call's decisions
// that must queue before a held call leaves: not all of them, since some
// callers leave or pause between requests.
const holdShare = 7

// holdFor bounds how long a held call waits for its round (Store.holdFor:
// at most a tenth of the store's timeout): at 32 connections on one core
// the round comes back in about 0.8 ms, and a round that does not (the
// load stopped) costs its first requests at most this much.
const holdFor = time.Millisecond

// argsPool holds the argument slices of batch calls.
var argsPool = sync.Pool{New: func() any { return new([]any) }}

// pending is one request's decision waiting in a batch.
type pending struct {
	ctx      context.Context // the caller's: a request that left is not sent
	deadline time.Time
	items    []item
	results  []algorithms.Result
	allowed  bool
	err      error
	// state is waiting until the answer or the deadline comes first;
	// whichever wins gives done its one value, whose buffer lets the
	// sender go on whether or not the caller still waits.
	state atomic.Uint32
	done  chan struct{}
	// sending is set while the caller sends its own call: it is not
	// waiting, and takes the call's answer when the call returns, so
	// expire does not answer it for its context.
	sending atomic.Bool
}

// The states of a pending.
const (
	waiting  uint32 = iota
	answered        // by its call, or by send when it was not sent
	expired         // its deadline passed first: its call may still write p
	left            // its context ended first (expire saw it): likewise
)

// leftPoll is how often the batcher's timer looks for waiting decisions
// whose caller's context ended (the client left), while decisions wait.
// A caller waits on its answer alone: waiting on its context as well made
// the request context's Done channel and a two-way select, about 0.3 µs
// of a request's Caddy CPU; a call returns well within this anyway.
const leftPoll = 10 * time.Millisecond

// pendings holds the pending requests whose callers took their answer; a
// request abandoned at its deadline is left to the collector, since its
// batch may still answer it.
var pendings = sync.Pool{New: func() any { return &pending{done: make(chan struct{}, 1)} }}

// settle gives p its answer (allowed, err and results set) unless its
// deadline came first.
func (p *pending) settle() {
	if p.state.CompareAndSwap(waiting, answered) {
		p.done <- struct{}{}
	}
}

// answer returns p's answer, once its done value was taken, and gives p
// back to the pool when its call is done with it; held reports that its
// call may still write p's items and results.
func (p *pending) answer() (allowed bool, err error, held bool) {
	switch p.state.Load() {
	case expired:
		return false, context.DeadlineExceeded, true
	case left:
		return false, p.ctx.Err(), true
	}
	allowed, err = p.allowed, p.err
	p.ctx, p.deadline, p.items, p.results, p.allowed, p.err = nil, time.Time{}, nil, nil, false, nil
	p.state.Store(waiting)
	pendings.Put(p)
	return allowed, err, false
}

// batcher gathers the decisions of one store (on a cluster: of one hash
// slot, since one script call may only touch keys of one slot).
type batcher struct {
	s        *Store
	mu       sync.Mutex
	queue    []*pending
	inFlight int
	// The calls in flight, and the timer that answers the waiting
	// decisions whose deadline passed and ends the calls whose deadline
	// passed (expire): one for the batcher, armed by watchAt (zero: not
	// armed) at or before the earliest deadline of those queued or in
	// flight. A timer of each waiting request's own cost about a tenth
	// of the client's CPU per decision, one of each call's (a context
	// with a deadline) a twentieth.
	out     []flight
	timer   *time.Timer
	watchAt time.Time
	// A held call (hold): no call leaves until target decisions queue or
	// release runs, by holdTimer.
	held      bool
	target    int
	heldUntil time.Time
	holdTimer *time.Timer
}

// flight is a call in flight: its decisions and its context.
type flight struct {
	live []*pending
	ctx  *callCtx
}

// callCtx is a batch call's context: go-redis bounds the call's socket
// reads and writes by its deadline, and its waits (for a pooled
// connection) by Done, which expire closes at the deadline.
type callCtx struct {
	context.Context // Background's values
	deadline        time.Time
	done            chan struct{}
	ended           atomic.Bool
}

func (c *callCtx) Deadline() (time.Time, bool) { return c.deadline, true }

func (c *callCtx) Done() <-chan struct{} { return c.done }

func (c *callCtx) Err() error {
	if c.ended.Load() {
		return context.DeadlineExceeded
	}
	return nil
}

// batcherFor returns the batcher of the slot of items (which share one).
func (s *Store) batcherFor(items []item) *batcher {
	var slot uint16
	if s.cluster || s.opts.split {
		slot = slotOf(items[0].key)
	}
	if b, ok := s.batchers.Load(slot); ok {
		return b.(*batcher)
	}
	b, _ := s.batchers.LoadOrStore(slot, &batcher{s: s})
	return b.(*batcher)
}

// decide decides items (one request, one slot) in a batch. It waits for
// the answer until ctx ends or the deadline passes; a request whose batch
// was already sent may still be decided once by Redis after that, as a
// call of its own would. held reports that the batch may still write
// items and results.
func (b *batcher) decide(ctx context.Context, deadline time.Time, items []item, results []algorithms.Result) (allowed bool, err error, held bool) {
	p := pendings.Get().(*pending)
	p.ctx, p.deadline, p.items, p.results = ctx, deadline, items, results
	b.mu.Lock()
	b.queue = append(b.queue, p)
	b.watch(deadline)
	if ok, alone := b.claim(); ok {
		// This goroutine sends the queue (with its own request, unless
		// more than maxBatch wait) rather than wake another, unless
		// the call may outlive its own deadline: the call's deadline is
		// the latest of its requests', and a caller sending it would be
		// held to that one, so another goroutine sends it.
		batch := b.gather(alone)
		if outlives(batch, deadline) {
			go func() {
				b.next(b.send(batch))
			}()
		} else {
			p.sending.Store(true)
			b.next(b.send(batch))
			p.sending.Store(false)
		}
	} else {
		b.mu.Unlock()
	}
	<-p.done // the answer, the deadline or the caller's leaving (expire)
	return p.answer()
}

// outlives reports whether a request of batch has a deadline after
// deadline. With one timeout per store, the request that makes a batch
// leave is its newest and none does; a request whose own context ends
// sooner (an HTTP request's deadline) does.
func outlives(batch []*pending, deadline time.Time) bool {
	for _, p := range batch {
		if p.deadline.After(deadline) {
			return true
		}
	}
	return false
}

// watch makes the timer fire by deadline, and within leftPoll; b.mu is
// held.
func (b *batcher) watch(deadline time.Time) {
	if !b.watchAt.IsZero() && !deadline.Before(b.watchAt) {
		return
	}
	if poll := time.Now().Add(leftPoll); poll.Before(deadline) {
		deadline = poll
	}
	if !b.watchAt.IsZero() && !deadline.Before(b.watchAt) {
		return
	}
	b.watchAt = deadline
	if b.timer == nil {
		b.timer = time.AfterFunc(time.Until(deadline), b.expire)
	} else {
		b.timer.Reset(time.Until(deadline))
	}
}

// expire answers the waiting decisions whose deadline passed or whose
// caller left, queued or in flight, and arms the timer for the earliest
// deadline of the others, or leftPoll from now if sooner.
func (b *batcher) expire() {
	now := time.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	var next time.Time
	poll := now.Add(leftPoll)
	check := func(p *pending) {
		if p.state.Load() != waiting {
			return
		}
		if !now.Before(p.deadline) {
			if p.state.CompareAndSwap(waiting, expired) {
				p.done <- struct{}{}
			}
			return
		}
		if !p.sending.Load() && p.ctx.Err() != nil {
			if p.state.CompareAndSwap(waiting, left) {
				p.done <- struct{}{}
			}
			return
		}
		d := p.deadline
		if poll.Before(d) {
			d = poll
		}
		if next.IsZero() || d.Before(next) {
			next = d
		}
	}
	for _, p := range b.queue {
		check(p)
	}
	for _, f := range b.out {
		for _, p := range f.live {
			check(p)
		}
		if f.ctx.ended.Load() {
			continue
		}
		if !now.Before(f.ctx.deadline) {
			f.ctx.ended.Store(true)
			close(f.ctx.done)
		} else if next.IsZero() || f.ctx.deadline.Before(next) {
			next = f.ctx.deadline
		}
	}
	b.watchAt = next
	if !next.IsZero() {
		b.timer.Reset(next.Sub(now))
	}
}

// claim reports whether the queue leaves now, and counts its call in
// flight if so; alone reports that no other call is. b.mu is held.
// Whatever claim leaves queued, a call in flight will take.
func (b *batcher) claim() (ok, alone bool) {
	if len(b.queue) == 0 || b.inFlight >= maxInFlight || b.inFlight > 0 && len(b.queue) < minBatch {
		return false, false
	}
	if b.held {
		if len(b.queue) < b.target {
			return false, false
		}
		b.held = false
		b.holdTimer.Stop()
	}
	b.inFlight++
	return true, b.inFlight == 1
}

// gather takes the claimed batch from the queue and unlocks b.mu. A call
// that has Redis to itself first yields: the goroutines that can run now
// (requests already read) queue their decisions into it, rather than
// wait for a call of their own; with none, the yield returns at once, so
// an idle store waits for nothing.
func (b *batcher) gather(alone bool) []*pending {
	if alone {
		b.mu.Unlock()
		runtime.Gosched()
		b.mu.Lock()
	}
	batch := b.take()
	b.mu.Unlock()
	return batch
}

// take removes the next batch from the queue; b.mu is held.
func (b *batcher) take() []*pending {
	n := min(len(b.queue), maxBatch)
	batch := make([]*pending, n)
	copy(batch, b.queue)
	rest := copy(b.queue, b.queue[n:])
	clear(b.queue[rest:])
	b.queue = b.queue[:rest]
	return batch
}

// next is called when a call of sent decisions returns: what may leave is
// sent by a goroutine that lives while calls are claimed, so that the
// caller whose call returned is not held up.
func (b *batcher) next(sent int) {
	b.mu.Lock()
	b.inFlight--
	b.hold(sent)
	ok, alone := b.claim()
	b.mu.Unlock()
	if ok {
		b.sendOn(alone)
	}
}

// sendOn sends the claimed call, and the next ones while they are claimed,
// from a goroutine of its own.
func (b *batcher) sendOn(alone bool) {
	go func() {
		for ok := true; ok; {
			b.mu.Lock()
			sent := b.send(b.gather(alone))
			b.mu.Lock()
			b.inFlight--
			b.hold(sent)
			ok, alone = b.claim()
			b.mu.Unlock()
		}
	}()
}

// hold makes the next call wait for its round when a call of sent
// decisions returned with none other in flight and at most an eighth of
// sent queued (the stragglers of the round): claim lets it leave once
// holdShare eighths of sent queue, release after holdFor. With more
// queued, the requests were already split in two groups that overlap one
// call's Redis time with the other's Caddy time, which helps when Redis
// has a core of its own. b.mu is held.
func (b *batcher) hold(sent int) {
	if b.held || b.inFlight > 0 || sent < holdMin || len(b.queue)*8 > sent {
		return
	}
	target := sent * holdShare / 8
	b.held, b.target, b.heldUntil = true, target, time.Now().Add(b.s.holdFor)
	if b.holdTimer == nil {
		b.holdTimer = time.AfterFunc(b.s.holdFor, b.release)
	} else {
		b.holdTimer.Reset(b.s.holdFor)
	}
}

// release ends a hold whose round did not come back in time: what waits
// leaves.
func (b *batcher) release() {
	b.mu.Lock()
	if !b.held || time.Now().Before(b.heldUntil) {
		// Not held, or held again since the timer fired: the timer was
		// reset for that hold.
		b.mu.Unlock()
		return
	}
	b.held = false
	ok, alone := b.claim()
	b.mu.Unlock()
	if ok {
		b.sendOn(alone)
	}
}

// send decides batch in one script call and hands each request its
// answer. Requests whose deadline passed while they queued are not sent.
// The call's deadline is the latest of its requests'; expire answers
// those whose own deadline passes first.
func (b *batcher) send(batch []*pending) (sent int) {
	live := batch[:0] // send owns batch
	var deadline, earliest time.Time
	now := time.Now()
	for _, p := range batch {
		if p.state.Load() != waiting {
			continue // expired in the queue
		}
		err := p.ctx.Err()
		if err == nil && !now.Before(p.deadline) {
			err = context.DeadlineExceeded
		}
		if err != nil {
			p.err = err
			p.settle()
			continue
		}
		if p.deadline.After(deadline) {
			deadline = p.deadline
		}
		if earliest.IsZero() || p.deadline.Before(earliest) {
			earliest = p.deadline
		}
		live = append(live, p)
	}
	if len(live) == 0 {
		return 0
	}
	ctx := &callCtx{Context: context.Background(), deadline: deadline, done: make(chan struct{})}
	// Between the queue and here, live was in neither: the timer may
	// have passed over it.
	b.mu.Lock()
	b.out = append(b.out, flight{live, ctx})
	b.watch(earliest)
	b.mu.Unlock()
	s := b.s
	// The call's arguments are built in one slice, taken from a pool
	// and given back once the reply is read (manyCmd says what they are).
	buf := argsPool.Get().(*[]any)
	defer func() {
		clear(*buf)
		*buf = (*buf)[:0]
		argsPool.Put(buf)
	}()
	cmd, args := s.manyCmd(ctx, live, *buf)
	*buf = args
	gs := []group{{cmd: cmd}}
	err := s.run(ctx, gs)
	if err == nil {
		err = parseBatch(gs[0].cmd, live)
	}
	b.mu.Lock()
	for i := range b.out {
		if b.out[i].ctx == ctx {
			b.out = slices.Delete(b.out, i, i+1)
			break
		}
	}
	b.mu.Unlock()
	for _, p := range live {
		if err != nil {
			p.err = err
		}
		p.settle()
	}
	return len(live)
}

// parseBatch reads a modeMany reply into each request's results.
func parseBatch(cmd *goredis.Cmd, live []*pending) error {
	if err := cmd.Err(); err != nil {
		return err
	}
	var r batchReply
	switch v := cmd.Val().(type) {
	case string:
		if len(v)%replyPackedBytes != 0 {
			return fmt.Errorf("script answered %d bytes of packed values", len(v))
		}
		r.packed, r.n = v, len(v)/replyPackedBytes
	case []any:
		r.vals, r.n = v, len(v)
	default:
		return fmt.Errorf("script answered %T for a batch", v)
	}
	tooFew := func() error {
		return fmt.Errorf("script answered %d values for %d requests", r.n, len(live))
	}
	var clock [replyClockValues]int64
	if r.n < len(clock) {
		return tooFew()
	}
	for i := range clock {
		var err error
		if clock[i], err = r.num(i); err != nil {
			return err
		}
	}
	at := replyClock(clock[:])
	o := replyClockValues
	for _, p := range live {
		if o >= r.n {
			return tooFew()
		}
		if msg, ok := r.failure(o); ok {
			// This request failed in Redis (a key of another type, say);
			// the others were decided.
			p.err = scriptError(msg)
			o++
			continue
		}
		first, err := r.num(o)
		if err != nil {
			return err
		}
		if first < 0 {
			var v [shortValues]int64
			if len(p.items) != 1 {
				return fmt.Errorf("script answered a short decision for %d keys", len(p.items))
			}
			if o+len(v) > r.n {
				return tooFew()
			}
			for i := range v {
				if v[i], err = r.num(o + i); err != nil {
					return err
				}
			}
			o += len(v)
			p.allowed = true
			if p.results[0], err = shortResult(v[:], p.items[0].conf, at); err != nil {
				return err
			}
			p.items[0].logged = at
			continue
		}
		var small [decisionHeadValues + keyReplyValues*4]int64 // up to four keys without an allocation
		n := decisionLen(len(p.items))
		if o+n > r.n {
			return tooFew()
		}
		var v []int64
		if n <= len(small) {
			v = small[:n]
		} else {
			v = make([]int64, n)
		}
		for i := range v {
			var err error
			if v[i], err = r.num(o + i); err != nil {
				return err
			}
		}
		o += len(v)
		p.allowed = v[decisionAllowed-1] == 1
		for i := range p.items {
			p.results[i], p.items[i].logged = keyResult(v, i, at)
		}
	}
	if o != r.n {
		return fmt.Errorf("script answered %d values for %d requests", r.n, len(live))
	}
	return nil
}

// batchReply is a modeMany reply's n values: an array (vals), or the
// numbers packed in one string (packed) when no request failed.
type batchReply struct {
	vals   []any
	packed string
	n      int
}

// num is value i (< n), a number.
func (r *batchReply) num(i int) (int64, error) {
	if r.vals == nil {
		return packedValue(r.packed[i*replyPackedBytes:]), nil
	}
	v, ok := r.vals[i].(int64)
	if !ok {
		return 0, fmt.Errorf("script answered %T where a number belongs", r.vals[i])
	}
	return v, nil
}

// failure is the error message at value i (< n), if a request failed
// there.
func (r *batchReply) failure(i int) (string, bool) {
	if r.vals == nil {
		return "", false
	}
	msg, ok := r.vals[i].(string)
	return msg, ok
}
