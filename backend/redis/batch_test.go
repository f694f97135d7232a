package redis

import (
	"context"
	"errors"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
)

// holdBatcher makes s's (only) batcher believe its calls are all in
// flight, so that decisions queue; release sends the queue as one batch,
// in this goroutine, and lets the batcher go.
func holdBatcher(t *testing.T, s *Store, z backend.Limit) (b *batcher, queued func() int, release func()) {
	t.Helper()
	items, _, err := s.resolve([]backend.Request{{Limit: z, Key: "any"}})
	if err != nil {
		t.Fatal(err)
	}
	b = s.batcherFor(items)
	b.mu.Lock()
	b.inFlight += maxInFlight
	b.mu.Unlock()
	queued = func() int {
		b.mu.Lock()
		defer b.mu.Unlock()
		return len(b.queue)
	}
	release = func() {
		b.mu.Lock()
		batch := b.take()
		b.inFlight -= maxInFlight
		b.mu.Unlock()
		if len(batch) > 0 {
			b.send(batch)
		}
	}
	return b, queued, release
}

// waitQueued yields until the batcher holds n decisions (each decision's
// goroutine queues it and then blocks).
func waitQueued(t *testing.T, queued func() int, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for queued() < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d decisions queued, want %d", queued(), n)
		}
		runtime.Gosched()
	}
}

func uncachedStore(t *testing.T, c goredis.UniversalClient, timeout time.Duration) *Store {
	t.Helper()
	s, err := New(c, Options{KeyPrefix: uniquePrefix(t), Timeout: timeout, NoCache: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// Decisions that arrive while calls are in flight go together in one
// script call, decided in the order they came, each on its own.
func TestBatchDecidesQueuedRequestsInOneCall(t *testing.T) {
	c := standaloneClient(t)
	s := uncachedStore(t, c, 10*time.Second)
	z := mustZone(t, s, "gather", algorithms.NameFixedWindow, policy(3, time.Hour))
	other := mustZone(t, s, "gather_other", algorithms.NameTokenBucket, policy(10, time.Hour))
	// The script is loaded (a first EVALSHA may find it missing).
	if _, err := s.Decide(context.Background(), []backend.Request{{Limit: other, Key: "warm", Cost: 1}}, make([]algorithms.Result, 1)); err != nil {
		t.Fatal(err)
	}
	_, queued, release := holdBatcher(t, s, z)

	type answer struct {
		ok  bool
		out []algorithms.Result
		err error
	}
	reqs := [][]backend.Request{
		{{Limit: z, Key: "k", Cost: 2}},
		{{Limit: z, Key: "k", Cost: 1}, {Limit: other, Key: "k", Cost: 4}},
		{{Limit: z, Key: "k", Cost: 1}},                                     // over: denied
		{{Limit: z, Key: "j", Cost: 1}, {Limit: other, Key: "j", Cost: 11}}, // the second key denies: nothing taken
		{{Limit: z, Key: "j", Cost: 3}},
	}
	answers := make([]chan answer, len(reqs))
	calls0, _ := commandStats(t, c)
	for i, r := range reqs {
		answers[i] = make(chan answer, 1)
		go func() {
			out := make([]algorithms.Result, len(r))
			ok, err := s.Decide(context.Background(), r, out)
			answers[i] <- answer{ok, out, err}
		}()
		waitQueued(t, queued, i+1)
	}
	release()
	wantOK := []bool{true, true, false, false, true}
	wantRemaining := [][]int64{{1}, {0, 6}, {0}, {2, 10}, {0}}
	for i := range reqs {
		a := <-answers[i]
		if a.err != nil {
			t.Fatalf("request %d: %v", i, a.err)
		}
		if a.ok != wantOK[i] {
			t.Errorf("request %d: allowed %v, want %v", i, a.ok, wantOK[i])
		}
		for k, r := range a.out {
			if r.Remaining != wantRemaining[i][k] {
				t.Errorf("request %d key %d: remaining %d, want %d", i, k, r.Remaining, wantRemaining[i][k])
			}
		}
	}
	if calls, _ := commandStats(t, c); calls-calls0 != 1 {
		t.Fatalf("%v script calls for %d queued requests, want 1", calls-calls0, len(reqs))
	}
}

// A decision whose deadline passes while it waits for a batch is never
// sent: it cannot be charged after its caller was told it failed.
func TestBatchDropsRequestPastItsDeadline(t *testing.T) {
	c := standaloneClient(t)
	s := uncachedStore(t, c, 30*time.Millisecond)
	z := mustZone(t, s, "late", algorithms.NameTokenBucket, policy(5, time.Hour))
	_, _, release := holdBatcher(t, s, z)
	start := time.Now()
	_, err := s.Decide(context.Background(), []backend.Request{{Limit: z, Key: "k", Cost: 1}}, make([]algorithms.Result, 1))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err %v, want the deadline", err)
	}
	if waited := time.Since(start); waited > time.Second {
		t.Fatalf("waited %v past a 30ms timeout", waited)
	}
	calls0, _ := commandStats(t, c)
	release()
	if calls, _ := commandStats(t, c); calls != calls0 {
		t.Fatalf("the late request was sent (%v calls)", calls-calls0)
	}
	if n, _ := c.Exists(context.Background(), z.(*zone).prefix+"k}").Result(); n != 0 {
		t.Fatal("the late request was charged")
	}
}

// A request that fails in Redis (its key holds another type, or a state
// the script fails on) fails alone: the others of its batch are decided,
// and its error is Redis's answer about it, not an outage.
func TestBatchFailingRequestFailsAlone(t *testing.T) {
	for _, p := range poisons {
		t.Run(p.name, func(t *testing.T) {
			c := standaloneClient(t)
			s := newStore(t, c)
			z := mustZone(t, s, "poisoned", algorithms.NameTokenBucket, policy(5, time.Hour))
			ctx := context.Background()
			if err := p.plant(c, z.(*zone).prefix+"bad}"); err != nil {
				t.Fatal(err)
			}
			var ps []*pending
			for _, key := range []string{"good1", "bad", "good2"} {
				items, _, err := s.resolve([]backend.Request{{Limit: z, Key: key, Cost: 1}})
				if err != nil {
					t.Fatal(err)
				}
				ps = append(ps, &pending{ctx: ctx, deadline: time.Now().Add(time.Minute), items: items, results: make([]algorithms.Result, 1), done: make(chan struct{}, 1)})
			}
			s.batcherFor(ps[0].items).send(ps)
			if ps[1].err == nil || !strings.Contains(ps[1].err.Error(), p.says) || !failedAlone(ps[1].err) {
				t.Fatalf("bad key: err %v, want %s, failed alone", ps[1].err, p.says)
			}
			for _, i := range []int{0, 2} {
				if ps[i].err != nil || !ps[i].allowed || ps[i].results[0].Remaining != 4 {
					t.Fatalf("request %d: err %v allowed %v %+v", i, ps[i].err, ps[i].allowed, ps[i].results[0])
				}
			}
		})
	}
}

// A queued request whose client left returns (within leftPoll, when the
// batcher's timer looks) and is never sent; a request queued after it
// waits for its answer and is decided.
func TestBatchDropsRequestWhoseClientLeft(t *testing.T) {
	c := standaloneClient(t)
	s := uncachedStore(t, c, time.Minute)
	z := mustZone(t, s, "left", algorithms.NameTokenBucket, policy(5, time.Hour))
	_, queued, release := holdBatcher(t, s, z)
	ctx, cancel := context.WithCancel(context.Background())
	errs := make(chan error, 1)
	go func() {
		_, err := s.Decide(ctx, []backend.Request{{Limit: z, Key: "gone", Cost: 1}}, make([]algorithms.Result, 1))
		errs <- err
	}()
	waitQueued(t, queued, 1)
	cancel()
	if err := <-errs; !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v, want the cancellation", err)
	}
	type answer struct {
		ok  bool
		err error
	}
	answers := make(chan answer, 1)
	go func() {
		ok, err := s.Decide(context.Background(), []backend.Request{{Limit: z, Key: "stays", Cost: 1}}, make([]algorithms.Result, 1))
		answers <- answer{ok, err}
	}()
	waitQueued(t, queued, 2)
	release()
	if a := <-answers; a.err != nil || !a.ok {
		t.Fatalf("the request that stayed: allowed %v, err %v", a.ok, a.err)
	}
	if n, _ := c.Exists(context.Background(), z.(*zone).prefix+"gone}").Result(); n != 0 {
		t.Fatal("the request whose client left was charged")
	}
}

// While a call is in flight, fewer than minBatch decisions wait for it to
// return rather than leave in a small call of their own; the minBatch-th
// sends them all at once, in one call.
func TestBatchSecondCallWaitsForMinBatch(t *testing.T) {
	c := standaloneClient(t)
	s := uncachedStore(t, c, 10*time.Second)
	z := mustZone(t, s, "second", algorithms.NameTokenBucket, policy(10, time.Hour))
	if _, err := s.Decide(context.Background(), []backend.Request{{Limit: z, Key: "warm", Cost: 1}}, make([]algorithms.Result, 1)); err != nil {
		t.Fatal(err)
	}
	items, _, err := s.resolve([]backend.Request{{Limit: z, Key: "any"}})
	if err != nil {
		t.Fatal(err)
	}
	b := s.batcherFor(items)
	b.mu.Lock()
	b.inFlight++ // a call in flight that never returns
	b.mu.Unlock()
	queued := func() int {
		b.mu.Lock()
		defer b.mu.Unlock()
		return len(b.queue)
	}
	calls0, _ := commandStats(t, c)
	errs := make(chan error, minBatch)
	decide := func(i int) {
		go func() {
			ok, err := s.Decide(context.Background(), []backend.Request{{Limit: z, Key: strconv.Itoa(i), Cost: 1}}, make([]algorithms.Result, 1))
			if err == nil && !ok {
				err = errors.New("denied")
			}
			errs <- err
		}()
	}
	for i := range minBatch - 1 {
		decide(i)
	}
	// Each decision is queued before its goroutine could send it: all of
	// them queued means none left.
	waitQueued(t, queued, minBatch-1)
	decide(minBatch - 1)
	for range minBatch {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if calls, _ := commandStats(t, c); calls-calls0 != 1 {
		t.Fatalf("%v script calls for %d decisions, want 1", calls-calls0, minBatch)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.inFlight != 1 || len(b.queue) != 0 {
		t.Fatalf("%d calls in flight, %d queued after the batch returned; want the one held, none", b.inFlight, len(b.queue))
	}
	b.inFlight--
}

// A batch of which no request failed is answered packed, in as many
// struct.pack calls as its values need (replyPackedChunk each), and read
// as the array would be: a full batch of one-key requests (short
// decisions), and one request whose keys alone take more than a chunk.
func TestBatchPackedReply(t *testing.T) {
	c := standaloneClient(t)
	s := uncachedStore(t, c, time.Minute)
	one := mustZone(t, s, "packed_one", algorithms.NameTokenBucket, policy(100, time.Hour))
	many := mustZone(t, s, "packed_many", algorithms.NameFixedWindow, policy(1000, time.Hour))
	ctx := context.Background()
	const wide = 60 // keys of one request: more values than a chunk
	var live []*pending
	add := func(reqs []backend.Request) {
		items, _, err := s.resolve(reqs)
		if err != nil {
			t.Fatal(err)
		}
		live = append(live, &pending{ctx: ctx, deadline: time.Now().Add(time.Minute), items: items, results: make([]algorithms.Result, len(items)), done: make(chan struct{}, 1)})
	}
	var reqs []backend.Request
	for k := range wide {
		reqs = append(reqs, backend.Request{Limit: many, Key: "w" + strconv.Itoa(k), Cost: int64(k + 1)})
	}
	add(reqs)
	for i := range maxBatch - 1 {
		add([]backend.Request{{Limit: one, Key: "k" + strconv.Itoa(i), Cost: int64(i%7 + 1)}})
	}
	values := replyClockValues
	for _, p := range live {
		if len(p.items) == 1 {
			values += shortValues // allowed, as it is
		} else {
			values += decisionLen(len(p.items))
		}
	}
	if values <= 2*replyPackedChunk || values%replyPackedChunk == 0 {
		t.Fatalf("%d values do not make full chunks and a part", values)
	}
	cmd, _ := s.manyCmd(ctx, live, nil)
	gs := []group{{cmd: cmd}}
	if err := s.run(ctx, gs); err != nil {
		t.Fatal(err)
	}
	if v, ok := gs[0].cmd.Val().(string); !ok || len(v) != values*replyPackedBytes {
		t.Fatalf("reply %T of %d bytes, want %d packed values", gs[0].cmd.Val(), len(v), values)
	}
	if err := parseBatch(gs[0].cmd, live); err != nil {
		t.Fatal(err)
	}
	now := time.Now().UnixNano()
	for i, p := range live {
		if p.err != nil || !p.allowed {
			t.Fatalf("request %d: err %v, allowed %v", i, p.err, p.allowed)
		}
		for k, r := range p.results {
			limit, remaining := int64(1000), int64(1000-k-1)
			if i > 0 {
				limit, remaining = 100, int64(100-(i-1)%7-1)
			}
			if !r.Allowed || r.Limit != limit || r.Remaining != remaining || r.RetryAfter != 0 || r.ResetAfter <= 0 || r.ResetAfter > int64(time.Hour) {
				t.Fatalf("request %d key %d: %+v, want limit %d, remaining %d", i, k, r, limit, remaining)
			}
			if d := now - r.At; d < 0 || d > int64(time.Minute) {
				t.Fatalf("request %d key %d: decided at %d, now %d", i, k, r.At, now)
			}
		}
	}
	// A bucket's reset is its cost's worth of intervals (36 s each, past
	// 32 bits of ns).
	if r := live[7].results[0]; r.ResetAfter != 7*int64(36*time.Second) {
		t.Fatalf("reset %d, want %d", r.ResetAfter, 7*int64(36*time.Second))
	}
}

// Each waiting decision returns at its own deadline, whatever the order
// the deadlines came in: one that queues after another with a later
// deadline brings the batcher's timer forward, and the timer, once it
// fired, is set again for the next deadline. None is sent.
func TestBatchExpiresEachWaiterAtItsDeadline(t *testing.T) {
	c := standaloneClient(t)
	s := uncachedStore(t, c, time.Minute)
	z := mustZone(t, s, "expire", algorithms.NameTokenBucket, policy(5, time.Hour))
	b, queued, release := holdBatcher(t, s, z)
	start := time.Now()
	after := []time.Duration{600 * time.Millisecond, 100 * time.Millisecond, 300 * time.Millisecond}
	returned := make([]chan time.Duration, len(after))
	for i, d := range after {
		returned[i] = make(chan time.Duration, 1)
		items, _, err := s.resolve([]backend.Request{{Limit: z, Key: "k" + strconv.Itoa(i), Cost: 1}})
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			// The request's context has no deadline: only the
			// batcher's timer ends the wait.
			_, err, _ := b.decide(context.Background(), start.Add(d), items, make([]algorithms.Result, 1))
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("request %d: err %v, want the deadline", i, err)
			}
			returned[i] <- time.Since(start)
		}()
		waitQueued(t, queued, i+1)
	}
	for i, d := range after {
		select {
		case got := <-returned[i]:
			if got < d || got > d+250*time.Millisecond {
				t.Errorf("request %d returned after %v, its deadline was %v", i, got, d)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("request %d still waits, its deadline was %v", i, d)
		}
	}
	calls0, _ := commandStats(t, c)
	release()
	if calls, _ := commandStats(t, c); calls != calls0 {
		t.Fatalf("expired requests were sent (%v calls)", calls-calls0)
	}
}

// slowCalls holds each script call for a while before it is sent.
type slowCalls struct{ delay time.Duration }

func (h slowCalls) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (h slowCalls) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		if n := cmd.Name(); n == "fcall" || n == "evalsha" || n == "eval" {
			time.Sleep(h.delay)
		}
		return next(ctx, cmd)
	}
}

func (h slowCalls) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return next
}

// A decision whose call is in flight past its deadline returns at its
// deadline, while the call goes on to the latest deadline of its
// requests and answers the others.
func TestBatchExpiresWaiterWhoseCallIsSlow(t *testing.T) {
	c := goredis.NewClient(&goredis.Options{Addr: standalone(t), ContextTimeoutEnabled: true, PoolSize: 64})
	t.Cleanup(func() { c.Close() })
	s := uncachedStore(t, c, time.Minute)
	z := mustZone(t, s, "slow", algorithms.NameTokenBucket, policy(5, time.Hour))
	// The script is loaded before calls are slowed.
	if _, err := s.Decide(context.Background(), []backend.Request{{Limit: z, Key: "warm", Cost: 1}}, make([]algorithms.Result, 1)); err != nil {
		t.Fatal(err)
	}
	c.AddHook(slowCalls{600 * time.Millisecond})
	b, queued, release := holdBatcher(t, s, z)
	start := time.Now()
	type answer struct {
		ok  bool
		err error
		at  time.Duration
	}
	answers := make([]chan answer, 2)
	for i, d := range []time.Duration{150 * time.Millisecond, 10 * time.Second} {
		answers[i] = make(chan answer, 1)
		items, _, err := s.resolve([]backend.Request{{Limit: z, Key: "k" + strconv.Itoa(i), Cost: 1}})
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			ok, err, _ := b.decide(context.Background(), start.Add(d), items, make([]algorithms.Result, 1))
			answers[i] <- answer{ok, err, time.Since(start)}
		}()
		waitQueued(t, queued, i+1)
	}
	release() // sends both in one call, held 600ms
	if a := <-answers[0]; !errors.Is(a.err, context.DeadlineExceeded) || a.at > 450*time.Millisecond {
		t.Errorf("short deadline: err %v after %v, want the deadline after 150ms", a.err, a.at)
	}
	if a := <-answers[1]; a.err != nil || !a.ok {
		t.Errorf("long deadline: allowed %v, err %v", a.ok, a.err)
	}
}

// A call that waits for a pooled connection past its deadline gives up
// there: its context ends with its last request's deadline.
func TestBatchCallEndsAtItsDeadlineWaitingForConnection(t *testing.T) {
	c := goredis.NewClient(&goredis.Options{Addr: standalone(t), ContextTimeoutEnabled: true, PoolSize: 1, PoolTimeout: 10 * time.Second})
	t.Cleanup(func() { c.Close() })
	s := uncachedStore(t, c, 200*time.Millisecond)
	z := mustZone(t, s, "pool", algorithms.NameTokenBucket, policy(5, time.Hour))
	if _, err := s.Decide(context.Background(), []backend.Request{{Limit: z, Key: "warm", Cost: 1}}, make([]algorithms.Result, 1)); err != nil {
		t.Fatal(err)
	}
	held := make(chan struct{})
	go func() {
		defer close(held)
		// Holds the pool's only connection for 2s.
		c.BLPop(context.Background(), 2*time.Second, uniquePrefix(t)+"none")
	}()
	deadline := time.Now().Add(5 * time.Second)
	for c.PoolStats().IdleConns != 0 || c.PoolStats().TotalConns != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the blocking command did not take the connection")
		}
		time.Sleep(time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond) // BLPOP was written
	start := time.Now()
	_, err := s.Decide(context.Background(), []backend.Request{{Limit: z, Key: "k", Cost: 1}}, make([]algorithms.Result, 1))
	if waited := time.Since(start); err == nil || waited > time.Second {
		t.Fatalf("err %v after %v, want a failure at the 200ms deadline", err, waited)
	}
	<-held
}

// A request that returned at its deadline while its call was out leaves
// its item to that call: the call sends its key, not the key of a request
// that took the memory after it.
func TestBatchExpiredRequestKeepsItsItem(t *testing.T) {
	c := goredis.NewClient(&goredis.Options{Addr: standalone(t), ContextTimeoutEnabled: true, PoolSize: 64})
	t.Cleanup(func() { c.Close() })
	s := uncachedStore(t, c, 100*time.Millisecond)
	z := mustZone(t, s, "kept", algorithms.NameTokenBucket, policy(5, time.Hour))
	if _, err := s.Decide(context.Background(), []backend.Request{{Limit: z, Key: "warm", Cost: 1}}, make([]algorithms.Result, 1)); err != nil {
		t.Fatal(err)
	}
	c.AddHook(slowCalls{400 * time.Millisecond})
	b, queued, release := holdBatcher(t, s, z)
	prefix := z.(*zone).prefix
	errs := make(chan error, 1)
	go func() {
		_, err := s.Decide(context.Background(), []backend.Request{{Limit: z, Key: "a", Cost: 1}}, make([]algorithms.Result, 1))
		// What the next request of this goroutine would take.
		one := singles.Get().(*single)
		one.items[0].key = prefix + "other}"
		errs <- err
	}()
	waitQueued(t, queued, 1)
	// A request of a later deadline keeps the call going past the
	// first one's.
	items, _, err := s.resolve([]backend.Request{{Limit: z, Key: "b", Cost: 1}})
	if err != nil {
		t.Fatal(err)
	}
	go b.decide(context.Background(), time.Now().Add(time.Minute), items, make([]algorithms.Result, 1))
	waitQueued(t, queued, 2)
	sent := make(chan struct{})
	go func() { release(); close(sent) }() // sends both, held 400ms
	if err := <-errs; !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err %v, want the deadline", err)
	}
	<-sent
	ctx := context.Background()
	if n, _ := c.Exists(ctx, prefix+"other}").Result(); n != 0 {
		t.Fatal("the call sent another request's key")
	}
	if n, _ := c.Exists(ctx, prefix+"a}").Result(); n != 1 {
		t.Fatal("the request that was sent was not decided")
	}
}

// After a call of holdMin or more decisions returns with none other in
// flight, the next call waits for its round: the decisions that arrive
// queue until holdShare/8 of the returned call's count wait, and then
// leave together in one call; with fewer, holdFor releases them. A call of
// fewer than holdMin decisions holds nothing.
func TestBatchHoldsForTheRound(t *testing.T) {
	c := standaloneClient(t)
	s := uncachedStore(t, c, 10*time.Second)
	z := mustZone(t, s, "round", algorithms.NameTokenBucket, policy(100, time.Hour))
	ctx := context.Background()
	if _, err := s.Decide(ctx, []backend.Request{{Limit: z, Key: "warm", Cost: 1}}, make([]algorithms.Result, 1)); err != nil {
		t.Fatal(err)
	}
	items, _, err := s.resolve([]backend.Request{{Limit: z, Key: "any"}})
	if err != nil {
		t.Fatal(err)
	}
	b := s.batcherFor(items)
	queued := func() int {
		b.mu.Lock()
		defer b.mu.Unlock()
		return len(b.queue)
	}
	errs := make(chan error, maxBatch)
	decide := func(key string) {
		go func() {
			ok, err := s.Decide(ctx, []backend.Request{{Limit: z, Key: key, Cost: 1}}, make([]algorithms.Result, 1))
			if err == nil && !ok {
				err = errors.New("denied")
			}
			errs <- err
		}()
	}
	wait := func(n int) {
		t.Helper()
		for range n {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
	}
	// round makes a call of n decisions return as the batcher's own
	// would: n queued behind a call in flight, sent, then next. The hold
	// that the call before left is lifted first.
	round := func(n int) {
		t.Helper()
		b.mu.Lock()
		b.held = false
		b.inFlight++
		b.mu.Unlock()
		for i := range n {
			decide("round" + strconv.Itoa(i))
		}
		waitQueued(t, queued, n)
		b.mu.Lock()
		batch := b.take()
		b.mu.Unlock()
		b.next(b.send(batch))
		wait(n)
	}
	calls := func() float64 {
		n, _ := commandStats(t, c)
		return n
	}

	s.holdFor = time.Hour // only the round's count releases the call
	round(16)
	target := 16 * holdShare / 8
	calls0 := calls()
	for i := range target - 1 {
		decide("next" + strconv.Itoa(i))
	}
	waitQueued(t, queued, target-1)
	for range 1000 {
		runtime.Gosched()
	}
	if n := queued(); n != target-1 || calls() != calls0 {
		t.Fatalf("%d queued, %v calls made while held; want %d, none", n, calls()-calls0, target-1)
	}
	decide("last")
	wait(target)
	if n := calls() - calls0; n != 1 {
		t.Fatalf("%v calls for the round's %d decisions, want 1", n, target)
	}

	s.holdFor = time.Millisecond // a round that does not come back
	round(holdMin)
	calls0 = calls()
	decide("alone")
	wait(1)
	if n := calls() - calls0; n != 1 {
		t.Fatalf("%v calls for the held decision, want 1", n)
	}

	s.holdFor = time.Hour
	round(holdMin - 1) // too small a call to hold
	b.mu.Lock()
	held := b.held
	b.mu.Unlock()
	if held {
		t.Fatalf("held after a call of %d decisions", holdMin-1)
	}
	decide("unheld")
	wait(1)

	// A call that returns with more than an eighth of its count queued
	// (two groups of requests taking turns) holds nothing either.
	b.mu.Lock()
	b.inFlight++ // the first group's call
	b.mu.Unlock()
	for i := range 16 {
		decide("first" + strconv.Itoa(i))
	}
	waitQueued(t, queued, 16)
	b.mu.Lock()
	first := b.take()
	b.mu.Unlock()
	for i := range 3 {
		decide("second" + strconv.Itoa(i))
	}
	waitQueued(t, queued, 3)
	calls0 = calls()
	b.next(b.send(first)) // 3 > 16/8 wait: they leave at once
	wait(16 + 3)
	if n := calls() - calls0; n != 2 {
		t.Fatalf("%v calls for two groups of 16 and 3, want 2", n)
	}
}
