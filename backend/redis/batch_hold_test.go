package redis

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
)

// A fixed clock for the stores of one test, so that a key's count stays
// in its window however long the test runs.
const holdClock = int64(1_764_460_500_000_000_000)

// clockedStore is a store over c with prefix and timeout, deciding with
// holdClock, and its zone: a fixed window of 5 an hour.
func clockedStore(t *testing.T, prefix string, timeout time.Duration) (*Store, backend.Limit) {
	t.Helper()
	s, err := New(standaloneClient(t), Options{KeyPrefix: prefix, Timeout: timeout, NoCache: true,
		now: func() int64 { return holdClock }, ttlExtra: 3_600_000})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	z := mustZone(t, s, "z", algorithms.NameFixedWindow, policy(5, time.Hour))
	return s, z
}

// charged reads how many times each key was decided (with a cost of 1),
// through a store of the same prefix and clock.
func charged(t *testing.T, prefix string, keys []string) []int64 {
	t.Helper()
	s, z := clockedStore(t, prefix, 10*time.Second)
	n := make([]int64, len(keys))
	for i, k := range keys {
		var out [1]algorithms.Result
		if _, err := s.Decide(context.Background(), []backend.Request{{Limit: z, Key: k, Cost: 0}}, out[:]); err != nil {
			t.Fatal(err)
		}
		n[i] = 5 - out[0].Remaining
	}
	return n
}

// batcherOf returns s's one batcher.
func batcherOf(t *testing.T, s *Store, z backend.Limit) *batcher {
	t.Helper()
	items, _, err := s.resolve([]backend.Request{{Limit: z, Key: "any"}})
	if err != nil {
		t.Fatal(err)
	}
	return s.batcherFor(items)
}

// settles waits until b has nothing queued, in flight or held, as it must
// soon after its last caller returned.
func settles(t *testing.T, b *batcher) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for {
		b.mu.Lock()
		q, f, o, h := len(b.queue), b.inFlight, len(b.out), b.held
		b.mu.Unlock()
		if q == 0 && f == 0 && o == 0 && !h {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("2s after the last caller returned: %d queued, %d calls in flight (%d listed), held %v", q, f, o, h)
		}
		time.Sleep(time.Millisecond)
	}
}

// How a stress request's caller behaves.
const (
	plain     = iota // no deadline of its own, never cancelled
	gone             // its context cancelled before it asks
	leaves           // its context cancelled while it waits, perhaps
	hurried          // a deadline of its own, shorter than the store's
	behaviors        // how many there are
)

// stressed is one request of the stress: its caller's behaviour and what
// it got.
type stressed struct {
	key      string
	behavior int
	budget   time.Duration // the deadline, from the start of Decide
	allowed  bool
	err      error
	took     time.Duration
	late     time.Duration // how long it returned after its cancellation, if it did
}

// Rounds of lockstep callers (each asks again as soon as it is answered,
// which makes the calls that hold for their round) and bursts of many
// callers followed by silence, with callers that leave, that left before
// asking and that have deadlines shorter than the store's: every caller
// returns by its deadline and a slack, and within the slack of its
// leaving; a caller that left before asking is never charged, an allowed
// one is charged once and any other at most once; with the store's
// timeout long, every caller that neither leaves nor hurries is allowed
// (no decision is stranded until its deadline by a hold); and the
// batcher is idle once its callers returned.
func TestBatchHoldStress(t *testing.T) {
	for _, timeout := range []time.Duration{10 * time.Second, 5 * time.Millisecond, time.Millisecond} {
		t.Run(timeout.String(), func(t *testing.T) {
			holdStress(t, timeout)
		})
	}
}

func holdStress(t *testing.T, timeout time.Duration) {
	prefix := uniquePrefix(t)
	s, z := clockedStore(t, prefix, timeout)
	ctx := context.Background()
	warm, wz := clockedStore(t, prefix, 10*time.Second) // the function loaded
	var out [1]algorithms.Result
	if _, err := warm.Decide(ctx, []backend.Request{{Limit: wz, Key: "warm", Cost: 0}}, out[:]); err != nil {
		t.Fatal(err)
	}
	b := batcherOf(t, s, z)
	before := runtime.NumGoroutine()

	// A generous slack: the machine is shared, and the race detector
	// slows everything; a decision stranded by a hold waits for its
	// deadline, which is 10s in the subtest that checks it.
	const slack = 2 * time.Second
	var mu sync.Mutex
	var all []*stressed
	var held atomic.Int64
	watching := make(chan struct{})
	watched := make(chan struct{})
	go func() { // counts the holds seen, to show the stress made some
		defer close(watched)
		for {
			select {
			case <-watching:
				return
			case <-time.After(100 * time.Microsecond):
			}
			b.mu.Lock()
			if b.held {
				held.Add(1)
			}
			b.mu.Unlock()
		}
	}()
	ask := func(rng *rand.Rand, key string) {
		r := &stressed{key: key, behavior: rng.IntN(behaviors), budget: timeout}
		cctx, cancel := context.WithCancel(ctx)
		var cancelled atomic.Int64 // UnixNano of the cancellation
		leave := func() {
			cancelled.Store(time.Now().UnixNano())
			cancel()
		}
		var timer *time.Timer
		switch r.behavior {
		case gone:
			leave()
		case leaves:
			timer = time.AfterFunc(time.Duration(rng.IntN(3000))*time.Microsecond, leave)
		case hurried:
			d := time.Duration(100+rng.IntN(5000)) * time.Microsecond
			r.budget = min(d, timeout)
			cctx, cancel = context.WithTimeout(cctx, d)
		}
		start := time.Now()
		var out [1]algorithms.Result
		r.allowed, r.err = s.Decide(cctx, []backend.Request{{Limit: z, Key: key, Cost: 1}}, out[:])
		end := time.Now()
		r.took = end.Sub(start)
		if timer != nil {
			timer.Stop()
		}
		if at := cancelled.Load(); at != 0 {
			r.late = end.Sub(time.Unix(0, at))
		}
		cancel()
		mu.Lock()
		all = append(all, r)
		mu.Unlock()
	}

	// Lockstep: each caller asks again once answered.
	const lockstep, each = 32, 40
	var wg sync.WaitGroup
	for w := range lockstep {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
			for i := range each {
				ask(rng, fmt.Sprint("l", w, "-", i))
			}
		}()
	}
	wg.Wait()
	// Bursts: many callers at once, then silence.
	const bursts, burst = 8, 200
	for r := range bursts {
		startLine := make(chan struct{})
		for w := range burst {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(r*burst+w), uint64(time.Now().UnixNano())))
				<-startLine
				for i := range 1 + rng.IntN(3) {
					ask(rng, fmt.Sprint("b", r, "-", w, "-", i))
				}
			}()
		}
		close(startLine)
		wg.Wait()
		time.Sleep(time.Duration(rand.IntN(15)) * time.Millisecond)
	}
	close(watching)
	<-watched
	settles(t, b)

	keys := make([]string, len(all))
	for i, r := range all {
		keys[i] = r.key
	}
	n := charged(t, prefix, keys)
	var counts [behaviors]int
	var allowed, failed int
	for i, r := range all {
		counts[r.behavior]++
		if r.allowed {
			allowed++
		}
		if r.err != nil {
			failed++
		}
		switch {
		case r.took > r.budget+slack:
			t.Errorf("%s (behaviour %d): returned after %v, its deadline was %v", r.key, r.behavior, r.took, r.budget)
		case r.late > slack:
			t.Errorf("%s: returned %v after its client left", r.key, r.late)
		case n[i] > 1:
			t.Errorf("%s: charged %d times", r.key, n[i])
		case r.allowed && n[i] != 1:
			t.Errorf("%s: allowed, charged %d times", r.key, n[i])
		case r.err == nil && !r.allowed:
			t.Errorf("%s: denied, its first request", r.key)
		case r.behavior == gone && (n[i] != 0 || r.err == nil):
			t.Errorf("%s: left before asking: charged %d times, err %v", r.key, n[i], r.err)
		case r.behavior == plain && timeout >= 10*time.Second && (r.err != nil || !r.allowed):
			t.Errorf("%s: neither left nor hurried: allowed %v, err %v after %v", r.key, r.allowed, r.err, r.took)
		}
	}
	t.Logf("%d requests (by behaviour %v): %d allowed, %d failed; held at %d of the samples",
		len(all), counts, allowed, failed, held.Load())

	noGoroutinesLeft(t, before)
}

// roundOf makes a call of n decisions return with none other in flight,
// as the batcher's own would (n queued behind a call in flight, sent, then
// next): b holds for the round after it. It returns when they are
// answered.
func roundOf(t *testing.T, s *Store, z backend.Limit, b *batcher, n int) {
	t.Helper()
	b.mu.Lock()
	b.inFlight++
	b.mu.Unlock()
	queued := func() int {
		b.mu.Lock()
		defer b.mu.Unlock()
		return len(b.queue)
	}
	errs := make(chan error, n)
	for i := range n {
		go func() {
			_, err := s.Decide(context.Background(), []backend.Request{{Limit: z, Key: fmt.Sprint(t.Name(), i), Cost: 0}}, make([]algorithms.Result, 1))
			errs <- err
		}()
	}
	waitQueued(t, queued, n)
	b.mu.Lock()
	batch := b.take()
	b.mu.Unlock()
	b.next(b.send(batch))
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.held {
		t.Fatalf("a call of %d decisions returned alone, and the batcher holds nothing", n)
	}
}

// decideAsync decides one request of key in a goroutine; its answer comes
// on the channel.
func decideAsync(ctx context.Context, s *Store, z backend.Limit, key string) <-chan error {
	errs := make(chan error, 1)
	go func() {
		ok, err := s.Decide(ctx, []backend.Request{{Limit: z, Key: key, Cost: 1}}, make([]algorithms.Result, 1))
		if err == nil && !ok {
			err = fmt.Errorf("%s denied", key)
		}
		errs <- err
	}()
	return errs
}

// callOut waits until b has a call in flight.
func callOut(t *testing.T, b *batcher) {
	t.Helper()
	for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(time.Millisecond) {
		b.mu.Lock()
		out := len(b.out)
		b.mu.Unlock()
		if out == 1 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the call never left")
		}
	}
}

// within returns what errs gives within 2s.
func within(t *testing.T, errs <-chan error, what string) error {
	t.Helper()
	select {
	case err := <-errs:
		return err
	case <-time.After(2 * time.Second):
		t.Fatalf("%s: no answer within 2s", what)
		return nil
	}
}

// The timer of an earlier hold (one that fired as a claim ended that
// hold) does not end a later one before its time; the later hold's own
// timer ends it.
func TestBatchStaleHoldTimerKeepsTheLaterHold(t *testing.T) {
	c, s, z := warmStore(t, 10*time.Second, "stale", algorithms.NameTokenBucket, 100)
	b := batcherOf(t, s, z)
	s.holdFor = time.Hour
	roundOf(t, s, z, b, 16)
	calls0, _ := commandStats(t, c)
	errs := decideAsync(context.Background(), s, z, "held")
	waitQueued(t, func() int { b.mu.Lock(); defer b.mu.Unlock(); return len(b.queue) }, 1)
	b.release() // the earlier hold's timer
	b.mu.Lock()
	q, held := len(b.queue), b.held
	b.mu.Unlock()
	if calls, _ := commandStats(t, c); q != 1 || !held || calls != calls0 {
		t.Fatalf("a stale timer: %d queued, held %v, %v calls; want 1, true, none", q, held, calls-calls0)
	}
	b.mu.Lock()
	b.heldUntil = time.Now() // the later hold's time is up
	b.mu.Unlock()
	b.release()
	if err := within(t, errs, "the held decision"); err != nil {
		t.Fatal(err)
	}
}

// A hold whose round never comes, with nothing queued, ends by its timer:
// a decision that comes later leaves at once, rather than wait for a
// round or its deadline.
func TestBatchHoldEndsWithNothingQueued(t *testing.T) {
	_, s, z := warmStore(t, 10*time.Second, "empty", algorithms.NameTokenBucket, 100)
	b := batcherOf(t, s, z)
	s.holdFor = 10 * time.Millisecond
	roundOf(t, s, z, b, 16)
	settles(t, b)
	s.holdFor = time.Hour // a hold from here on would strand the decision
	if err := within(t, decideAsync(context.Background(), s, z, "later"), "a decision after the hold"); err != nil {
		t.Fatal(err)
	}
}

// A decision whose client leaves while its call is in flight returns
// within leftPoll with the cancellation, not when its (slow) call does;
// the call still decides it, once.
func TestBatchClientLeavesWhileCallIsOut(t *testing.T) {
	c, s, z := warmStore(t, time.Minute, "out", algorithms.NameFixedWindow, 5)
	c.AddHook(slowCalls{3 * time.Second})
	_, queued, release := holdBatcher(t, s, z)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errs := decideAsync(ctx, s, z, "gone")
	waitQueued(t, queued, 1)
	sent := make(chan struct{})
	go func() { release(); close(sent) }()
	callOut(t, batcherOf(t, s, z))
	cancel()
	if err := within(t, errs, "the departed client's decision"); !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v, want the cancellation", err)
	}
	select {
	case <-sent:
		t.Fatal("the departed client's decision waited for its call")
	default:
	}
	<-sent
	// A fixed window's value: its start, its count and its length.
	v, err := c.Get(context.Background(), z.(*zone).prefix+"gone}").Result()
	if f := strings.Split(v, ":"); err != nil || len(f) != 3 || f[1] != "1" {
		t.Fatalf("the departed client's key holds %q (%v), want a count of 1", v, err)
	}
}

// A caller that sends its own call (an idle store) takes that call's
// answer when it returns, even if its client left meanwhile: the call
// was decided, and the caller is told what Redis did.
func TestBatchSenderKeepsItsAnswer(t *testing.T) {
	c, s, z := warmStore(t, time.Minute, "sender", algorithms.NameFixedWindow, 5)
	c.AddHook(slowCalls{time.Second})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errs := decideAsync(ctx, s, z, "sent")
	callOut(t, batcherOf(t, s, z))
	cancel() // while its own call is out, for longer than leftPoll
	if err := within(t, errs, "the sender's decision"); err != nil {
		t.Fatalf("err %v, want the call's answer (allowed)", err)
	}
}

// warmStore is a store without the over-limit cache (timeout its calls'),
// its client and a zone of alg at limit an hour whose script is loaded
// and whose batcher exists: a first decision has been made.
func warmStore(t *testing.T, timeout time.Duration, name, alg string, limit int64) (*goredis.Client, *Store, backend.Limit) {
	t.Helper()
	c := standaloneClient(t)
	s := uncachedStore(t, c, timeout)
	z := mustZone(t, s, name, alg, policy(limit, time.Hour))
	if _, err := s.Decide(context.Background(), []backend.Request{{Limit: z, Key: "warm", Cost: 0}}, make([]algorithms.Result, 1)); err != nil {
		t.Fatal(err)
	}
	return c, s, z
}
