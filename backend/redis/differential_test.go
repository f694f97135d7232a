package redis

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/backend/memory"
)

// Short sequences at the edges where the two stores are easiest to tell
// apart, each reduced to the steps that matter.

// A key the over-limit cache remembers as denied, then granted, must be
// asked of Redis again even when the clock then reads earlier than the
// grant: only a clock that never steps back kept the entry from answering.
func TestDifferentialCacheAfterGrantClockBack(t *testing.T) {
	client := standaloneClient(t)
	for _, alg := range []string{algorithms.NameTokenBucket, algorithms.NameSlidingCounter} {
		t.Run(alg, func(t *testing.T) {
			tw := newTwinWith(t, client, false, t0, zoneSpec{name: "c", alg: alg, policy: algorithms.Policy{Limit: 1, Window: 1000}})
			tw.do(ask{0, "k", 1, false}) // granted
			tw.do(ask{0, "k", 1, false}) // denied: the cache remembers it
			tw.clock += 1000
			tw.do(ask{0, "k", 1, false}) // granted at the retry time
			tw.clock -= 400              // the clock steps back
			tw.do(ask{0, "k", 1, false})
		})
	}
}

// A queue whose slots are given out up to max_delay ahead, to a request of
// the whole queue, owes max_delay + queue × interval: past 2^52 ns for a
// 30-day window.
func TestDifferentialLongQueueDebt(t *testing.T) {
	client := standaloneClient(t)
	day := int64(24 * time.Hour)
	p := algorithms.Policy{Limit: 4, Window: 30 * day, MaxDelay: 30 * day / 4 * 3}
	tw := newTwinWith(t, client, false, t0, zoneSpec{name: "q", alg: algorithms.NameLeakyBucket, policy: p})
	for range 3 {
		tw.do(ask{0, "k", 1, false})
	}
	tw.do(ask{0, "k", 4, false}) // its slots start max_delay away
	tw.do(ask{0, "k", 1, false})
	tw.clock++
	// A rate a nanosecond per slot slower: the debt is rebased.
	q := zoneSpec{name: "q", alg: algorithms.NameLeakyBucket, policy: p}
	q.policy.Window += 4
	q.policy.MaxDelay = 3 * q.policy.Interval()
	tw.reloadTo(false, q)
	_, r := tw.do(ask{0, "k", 1, false})
	if want := 7*q.policy.Interval() - 1 - q.policy.MaxDelay; r[0].RetryAfter != want {
		t.Errorf("retry after %d, want %d: the slots given out are kept at the new rate", r[0].RetryAfter, want)
	}
	tw.clock += day
	tw.do(ask{0, "k", 1, false})
	// Then a token bucket of 6 a minute: the debt past 2^52 is scaled to
	// the new interval as it is (70 s), not cut to 2^52 first.
	tb := zoneSpec{name: "q", alg: algorithms.NameTokenBucket, policy: policy(6, time.Minute)}
	tw.reloadTo(false, tb)
	tw.do(ask{0, "k", 0, false})
	tw.do(ask{0, "k", 1, false})
}

// A refund after some of a log's events have left its window, then a
// longer window: the events that left are gone in both stores. Redis let
// the key the refund wrote expire when its newest event had left the
// window an hour before (the test's expiry margin), and kept those events
// when a newer one was live; the memory store kept them in both cases, and
// counted them again.
func TestDifferentialLogRefundAfterWindow(t *testing.T) {
	client := standaloneClient(t)
	for _, live := range []bool{false, true} {
		spec := zoneSpec{name: "l", alg: algorithms.NameSlidingWindow, policy: policy(5, time.Hour)}
		tw := newTwinWith(t, client, false, t0, spec)
		tw.do(ask{0, "k", 1, false})
		if live {
			tw.clock += int64(59 * time.Minute)
			tw.do(ask{0, "k", 2, false})
			tw.do(ask{0, "k", 1, false})
			tw.clock += int64(11 * time.Minute) // the first event has left
			tw.giveBack(1)                      // of two live events, one goes
		} else {
			tw.do(ask{0, "k", 2, false})
			tw.clock += int64(3 * time.Hour)
			tw.giveBack(0) // an event that left the window two hours ago
			waitExpired(t, tw, 0, "k")
		}
		spec.policy = policy(5, 4*time.Hour)
		tw.reloadTo(false, spec)
		tw.do(ask{0, "k", 1, false})
	}
}

// waitExpired waits, at most a second, until Redis has expired key's
// state in zone z: an expiry set in the past of the test's clock is a
// millisecond of Redis's own.
func waitExpired(t *testing.T, tw *twin, z int, key string) {
	t.Helper()
	rz := tw.cur.redZ[z].(*zone)
	k := rz.stateKey(key)
	for stop := time.Now().Add(time.Second); time.Now().Before(stop); time.Sleep(time.Millisecond) {
		if n, err := tw.client.Exists(context.Background(), k).Result(); err != nil || n == 0 {
			return
		}
	}
}

// The differential test: the same requests, at the same instants, to the
// memory store and to the Redis store must get the same answers, field by
// field (allowed, limit, remaining, retry, reset, delay, time), through
// costs, shadow requests, refunds and reloads that change policies.

// chooser drives a sequence: a seeded PRNG, or a fuzzer's bytes.
type chooser interface {
	intn(n int) int
}

type prng struct{ r *rand.Rand }

func (p prng) intn(n int) int { return p.r.IntN(n) }

type fuzzBytes struct {
	b []byte
	r *rand.Rand // once the bytes are used up
}

func (f *fuzzBytes) intn(n int) int {
	if len(f.b) >= 2 {
		v := int(binary.LittleEndian.Uint16(f.b))
		f.b = f.b[2:]
		return v % n
	}
	return f.r.IntN(n)
}

// zoneSpec is one zone of a differential run; its algorithm family stays
// fixed (a change of kind of state starts a fresh state in memory but
// finds the old one in Redis), its policy changes with reloads.
type zoneSpec struct {
	name    string
	scope   string
	alg     string
	policy  algorithms.Policy
	lockout backend.Lockout
}

// config is one "loaded config": a memory store and a Redis store holding
// the same zones.
type config struct {
	mem   *memory.Store
	red   *Store
	memZ  []backend.Limit
	redZ  []backend.Limit
	specs []zoneSpec
}

type twin struct {
	t testing.TB
	c chooser
	// lc draws the lock-outs, apart from c, so that runs draw the same
	// zones and steps with lock-outs as without.
	lc     chooser
	clock  int64
	client goredis.UniversalClient
	prefix string
	split  bool
	// stepBack lets the clock step back a little. Such runs do not reload:
	// a rate change rebases a debt that a stepped-back clock inflated, and
	// a change to a much slower rate can scale that beyond the exact range
	// (docs/redis.md).
	stepBack bool
	cur      *config
	zones    []zoneSpec
	// granted decisions that a later refund may give back
	granted []grant
	log     []string
	// adjusted is the max_events each zone was moved to (adapt_diff_test.go)
	adjusted map[int]int64
}

type grant struct {
	memReqs, redReqs []backend.Request
	out              []algorithms.Result
}

var twinSeq int

var tailLen = 15

func newTwin(t testing.TB, c chooser, client goredis.UniversalClient, split bool) *twin {
	twinSeq++
	tw := &twin{t: t, c: c, lc: prng{rand.New(rand.NewPCG(uint64(twinSeq), 13))}, client: client, prefix: uniquePrefix(t), split: split}
	tw.stepBack = c.intn(3) == 0
	// A realistic Unix time, not aligned to anything.
	tw.clock = 1_764_460_000_000_000_000 + int64(c.intn(1<<30))*977
	n := 1 + c.intn(4)
	for i := range n {
		fam := c.intn(4)
		var alg string
		switch fam {
		case 0:
			alg = algorithms.NameSlidingWindow
		case 1:
			alg = algorithms.NameFixedWindow
		case 2:
			alg = algorithms.NameSlidingCounter
		default:
			alg = tw.bucketAlg()
		}
		scope := ""
		if c.intn(3) == 0 {
			scope = "s"
		}
		spec := zoneSpec{name: fmt.Sprintf("diff%d-%d-z%d", twinSeq, i, i), scope: scope, alg: alg}
		spec.policy = tw.policy(alg)
		if tw.lc.intn(3) == 0 {
			spec.lockout = tw.lockout(spec.policy)
		}
		tw.zones = append(tw.zones, spec)
	}
	tw.cur = tw.load(tw.zones)
	t.Cleanup(func() {
		tw.cur.mem.Close()
		tw.cur.red.Close()
	})
	return tw
}

func (tw *twin) bucketAlg() string {
	return []string{algorithms.NameTokenBucket, algorithms.NameGCRA, algorithms.NameLeakyBucket, algorithms.NameLeakyBucket}[tw.c.intn(4)]
}

var windows = []int64{
	int64(time.Millisecond), 7 * int64(time.Millisecond), 1_234_567_891, int64(time.Second),
	int64(time.Minute), int64(time.Hour), 24 * int64(time.Hour), 30 * 24 * int64(time.Hour), 999,
}

// lockout draws lock-out steps: around the policy's window (so that a
// key's lock-outs end while its state still denies, and it escalates) or
// fixed ones from a millisecond to the longest step.
func (tw *twin) lockout(p algorithms.Policy) backend.Lockout {
	w := min(max(p.Window, 1), backend.MaxLockoutStep/4)
	switch tw.lc.intn(4) {
	case 0:
		return backend.Lockout{w}
	case 1:
		return backend.Lockout{max(w/3, 1), w, 4 * w}
	case 2:
		return backend.Lockout{int64(time.Millisecond), 7 * int64(time.Millisecond), int64(time.Hour)}
	}
	return backend.Lockout{int64(time.Minute), 5 * int64(time.Minute), 24 * int64(time.Hour), backend.MaxLockoutStep}
}

// policy draws a policy both stores accept.
func (tw *twin) policy(alg string) algorithms.Policy {
	for {
		p := algorithms.Policy{Window: windows[tw.c.intn(len(windows))]}
		switch tw.c.intn(6) {
		case 0:
			p.Limit = 1
		case 1:
			p.Limit = int64(100 + tw.c.intn(1000))
		case 2:
			p.Limit = int64(1_000_000_000 + tw.c.intn(1000))
		default:
			p.Limit = int64(1 + tw.c.intn(10))
		}
		if tw.c.intn(5) == 0 {
			p.Window += int64(tw.c.intn(1000))
		}
		if algorithms.UsesBurst(alg) && tw.c.intn(2) == 0 {
			p.Burst = int64(1 + tw.c.intn(20))
		}
		if alg == algorithms.NameLeakyBucket && tw.c.intn(2) == 0 {
			p.Burst = 0
			p.MaxDelay = p.Interval() * int64(tw.c.intn(6))
			if tw.c.intn(3) == 0 {
				p.MaxDelay += int64(tw.c.intn(1000))
			}
		}
		name, err := algorithms.Check(alg, p)
		if err != nil || checkExact(name, p) != nil {
			continue
		}
		return p
	}
}

// load registers specs in a fresh memory store and a fresh Redis store:
// one config being provisioned.
func (tw *twin) load(specs []zoneSpec) *config {
	cfg := &config{
		// The memory store's sweeper runs on real time and may drop an idle
		// key whose events a later, longer window would count again; Redis
		// keeps it until its expiry. A long hunt must not race with it.
		mem:   memory.New(memory.Options{Now: func() int64 { return tw.clock }, SweepInterval: 24 * time.Hour}),
		specs: specs,
	}
	red, err := New(tw.client, Options{KeyPrefix: tw.prefix, Timeout: 10 * time.Second, now: func() int64 { return tw.clock }, ttlExtra: 3_600_000, split: tw.split})
	if err != nil {
		tw.t.Fatal(err)
	}
	cfg.red = red
	owner := new(int)
	for _, s := range specs {
		zc := backend.LimitConfig{Name: s.name, Scope: s.scope, Algorithm: s.alg, Policy: s.policy, Lockout: s.lockout, Owner: owner}
		// Redis first: when its exactness check refuses the zone, memory
		// must not register it either, or the two histories would differ.
		rz, err := cfg.red.Register(zc)
		if err != nil {
			cfg.mem.Close()
			cfg.red.Close()
			return nil
		}
		mz, err := cfg.mem.Register(zc)
		if err != nil {
			tw.t.Fatalf("memory zone %+v: %v", s, err)
		}
		cfg.memZ = append(cfg.memZ, mz)
		cfg.redZ = append(cfg.redZ, rz)
	}
	return cfg
}

// newTwinWith is a twin over the given zones, for hand-written sequences.
func newTwinWith(t testing.TB, client goredis.UniversalClient, split bool, clock int64, zones ...zoneSpec) *twin {
	twinSeq++
	tw := &twin{t: t, c: prng{rand.New(rand.NewPCG(1, 2))}, lc: prng{rand.New(rand.NewPCG(3, 4))}, client: client, prefix: uniquePrefix(t), split: split, clock: clock}
	for i := range zones {
		zones[i].name = fmt.Sprintf("adv%d-%d-%s", twinSeq, i, zones[i].name)
	}
	tw.zones = zones
	tw.cur = tw.load(zones)
	if tw.cur == nil {
		t.Fatalf("zones refused: %+v", zones)
	}
	t.Cleanup(func() {
		tw.cur.mem.Close()
		tw.cur.red.Close()
	})
	return tw
}

// ask is one request of a hand-written step: zone index, key, cost.
type ask struct {
	zone   int
	key    string
	cost   int64
	shadow bool
}

// do decides asks in both stores and compares; it returns the memory
// store's answer.
func (tw *twin) do(asks ...ask) (bool, []algorithms.Result) {
	tw.t.Helper()
	var mr, rr []backend.Request
	for _, a := range asks {
		mr = append(mr, backend.Request{Limit: tw.cur.memZ[a.zone], Key: a.key, Cost: a.cost, Shadow: a.shadow})
		rr = append(rr, backend.Request{Limit: tw.cur.redZ[a.zone], Key: a.key, Cost: a.cost, Shadow: a.shadow})
	}
	mo := make([]algorithms.Result, len(asks))
	ro := make([]algorithms.Result, len(asks))
	ma, merr := tw.cur.mem.Decide(context.Background(), mr, mo)
	ra, rerr := tw.cur.red.Decide(context.Background(), rr, ro)
	tw.log = append(tw.log, fmt.Sprintf("t=%d decide %s → %v %v", tw.clock, describe(mr), ma, mo))
	if merr != nil || rerr != nil {
		tw.fail("errors: memory %v, redis %v", merr, rerr)
	}
	if ma != ra {
		tw.fail("allowed: memory %v, redis %v\nmemory %+v\nredis  %+v", ma, ra, mo, ro)
	}
	for i := range mo {
		if mo[i] != ro[i] {
			tw.fail("request %d: memory %+v\n            redis  %+v", i, mo[i], ro[i])
		}
	}
	if ma {
		tw.granted = append(tw.granted, grant{memReqs: mr, redReqs: rr, out: mo})
	}
	return ma, mo
}

// giveBackLast refunds the newest granted decision in both stores.
func (tw *twin) giveBackLast() { tw.giveBack(len(tw.granted) - 1) }

// giveBack refunds the i-th granted decision in both stores.
func (tw *twin) giveBack(i int) {
	tw.t.Helper()
	g := tw.granted[i]
	tw.granted = append(tw.granted[:i], tw.granted[i+1:]...)
	tw.log = append(tw.log, fmt.Sprintf("t=%d refund %s granted %v", tw.clock, describe(g.memReqs), g.out))
	if err := tw.cur.mem.Refund(context.Background(), g.memReqs, g.out); err != nil {
		tw.fail("memory refund: %v", err)
	}
	if err := tw.cur.red.Refund(context.Background(), g.redReqs, g.out); err != nil {
		tw.fail("redis refund: %v", err)
	}
}

// reloadTo provisions specs as a new config and drops the old one; failed
// drops the new one instead (a reload that failed and was undone).
func (tw *twin) reloadTo(failed bool, specs ...zoneSpec) {
	tw.t.Helper()
	for i := range specs {
		specs[i].name = tw.zones[i].name
	}
	next := tw.load(specs)
	if next == nil {
		tw.t.Fatalf("reload refused: %+v", specs)
	}
	tw.switchTo(next, specs, failed)
}

// switchTo finishes a reload: the old config is cleaned up, or for a
// failed reload the new one.
func (tw *twin) switchTo(next *config, specs []zoneSpec, failed bool) {
	tw.log = append(tw.log, fmt.Sprintf("t=%d reload failed=%v %+v", tw.clock, failed, specs))
	if failed {
		next.mem.Close()
		next.red.Close()
		return
	}
	tw.cur.mem.Close()
	tw.cur.red.Close()
	tw.cur = next
	tw.zones = specs
	tw.granted = nil // their handles belong to the old config
}

var keyNames = []string{"a", "b", "10.0.0.1", "user{7}", "}x{", ""}

func (tw *twin) costOf() int64 {
	switch tw.c.intn(12) {
	case 0:
		return 0
	case 1:
		return int64(2 + tw.c.intn(5))
	case 2:
		return 1 << 60
	case 3:
		return int64(tw.c.intn(30))
	}
	return 1
}

func (tw *twin) advance() {
	var step int64
	z := tw.zones[tw.c.intn(len(tw.zones))].policy
	switch tw.c.intn(10) {
	case 0, 1:
		step = 0
	case 2:
		step = 1
	case 3:
		step = z.Window
	case 4:
		step = z.Window - z.Window%3
	case 5:
		if tw.stepBack {
			step = -int64(tw.c.intn(1000)) // the clock steps back a little
		}
	case 6:
		step = int64(tw.c.intn(int(min(4*z.Window, 1<<40)) + 1))
	default:
		step = int64(tw.c.intn(int(min(z.Window/2, 1<<40)) + 1))
	}
	tw.clock += step
}

func (tw *twin) asks() []ask {
	asks := make([]ask, 1+tw.c.intn(3))
	for i := range asks {
		asks[i] = ask{zone: tw.c.intn(len(tw.zones)), key: keyNames[tw.c.intn(len(keyNames))], cost: tw.costOf(), shadow: tw.c.intn(8) == 0}
	}
	return asks
}

func (tw *twin) decide() {
	if tw.c.intn(5) == 0 {
		reqs := make([][]ask, 2+tw.c.intn(6))
		for i := range reqs {
			reqs[i] = tw.asks()
		}
		tw.doBatch(reqs)
	} else {
		tw.do(tw.asks()...)
	}
	if len(tw.granted) > 8 {
		tw.granted = tw.granted[len(tw.granted)-8:]
	}
}

// doBatch decides reqs in one script call, as concurrent requests are
// batched, and in the memory store one after another in the same order:
// each request must get the answer it would get alone. A request whose
// keys span slots (never batched) or that falls to another slot's batch
// is decided on its own, in its turn.
func (tw *twin) doBatch(reqs [][]ask) {
	tw.t.Helper()
	red := tw.cur.red
	type one struct {
		mr, rr []backend.Request
		of     []int
		p      *pending
	}
	var batch []one
	var b *batcher
	flush := func() {
		if len(batch) == 0 {
			return
		}
		ps := make([]*pending, len(batch))
		for i := range batch {
			ps[i] = batch[i].p
		}
		var sent int64
		var epoch uint64
		if red.cache != nil {
			sent, epoch = red.cache.mark()
		}
		b.send(ps)
		for _, o := range batch {
			<-o.p.done
			if red.cache != nil {
				// As Decide does after a batched call: without it, a
				// denial the cache remembers would outlive the grant
				// that followed it here.
				red.cache.learn(o.p.items, o.p.results, o.p.allowed, sent, epoch, nil)
			}
			mo := make([]algorithms.Result, len(o.mr))
			ma, merr := tw.cur.mem.Decide(context.Background(), o.mr, mo)
			tw.log = append(tw.log, fmt.Sprintf("t=%d batched decide %s → %v %v", tw.clock, describe(o.mr), ma, mo))
			if merr != nil || o.p.err != nil {
				tw.fail("errors: memory %v, redis %v", merr, o.p.err)
			}
			ro := make([]algorithms.Result, len(o.mr))
			for i := range ro {
				ro[i] = o.p.results[o.of[i]]
			}
			if ma != o.p.allowed {
				tw.fail("batched, allowed: memory %v, redis %v\nmemory %+v\nredis  %+v", ma, o.p.allowed, mo, ro)
			}
			for i := range mo {
				if mo[i] != ro[i] {
					tw.fail("batched request %d: memory %+v\n            redis  %+v", i, mo[i], ro[i])
				}
			}
			if ma {
				tw.granted = append(tw.granted, grant{memReqs: o.mr, redReqs: o.rr, out: mo})
			}
		}
		batch, b = nil, nil
	}
	for _, asks := range reqs {
		var o one
		for _, a := range asks {
			o.mr = append(o.mr, backend.Request{Limit: tw.cur.memZ[a.zone], Key: a.key, Cost: a.cost, Shadow: a.shadow})
			o.rr = append(o.rr, backend.Request{Limit: tw.cur.redZ[a.zone], Key: a.key, Cost: a.cost, Shadow: a.shadow})
		}
		items, of, err := red.resolve(o.rr)
		if err != nil {
			tw.t.Fatal(err)
		}
		if len(red.groups(items)) > 1 {
			flush()
			tw.do(asks...)
			continue
		}
		if nb := red.batcherFor(items); nb != b {
			flush()
			b = nb
		}
		o.of = of
		o.p = &pending{ctx: context.Background(), deadline: time.Now().Add(time.Minute), items: items, results: make([]algorithms.Result, len(items)), done: make(chan struct{}, 1)}
		batch = append(batch, o)
	}
	flush()
}

func (tw *twin) refund() {
	if len(tw.granted) > 0 {
		tw.giveBack(tw.c.intn(len(tw.granted)))
	}
}

// reload changes some zones' policies: the new config is provisioned, then
// the old one (or, for a failed reload, the new one) is cleaned up.
func (tw *twin) reload() {
	specs := append([]zoneSpec(nil), tw.zones...)
	for i := range specs {
		if tw.c.intn(2) == 0 {
			if algorithms.UsesBurst(specs[i].alg) {
				specs[i].alg = tw.bucketAlg()
			}
			specs[i].policy = tw.policy(specs[i].alg)
		}
		// Other steps, or lockout on or off: a key's state is where it
		// was, with or without (clientKey).
		switch tw.lc.intn(8) {
		case 0, 1:
			if specs[i].lockout != nil {
				specs[i].lockout = tw.lockout(specs[i].policy)
			}
		case 2:
			if specs[i].lockout != nil {
				specs[i].lockout = nil
			} else {
				specs[i].lockout = tw.lockout(specs[i].policy)
			}
		}
	}
	next := tw.load(specs)
	if next == nil {
		return // refused by the Redis store's exactness check: no reload
	}
	tw.switchTo(next, specs, tw.c.intn(4) == 0)
}

func (tw *twin) step() {
	switch tw.c.intn(20) {
	case 0:
		if !tw.stepBack {
			tw.reload()
		}
	case 1, 2:
		tw.refund()
	case 3, 4, 5, 6, 7, 8:
		tw.advance()
	default:
		tw.decide()
	}
}

func (tw *twin) fail(format string, args ...any) {
	tw.t.Helper()
	tail := tw.log[max(len(tw.log)-tailLen, 0):]
	if tailLen > 15 {
		keys, _ := tw.client.Keys(context.Background(), tw.prefix+"*").Result()
		for _, k := range keys {
			v, _ := tw.client.Get(context.Background(), k).Result()
			tail = append(tail, fmt.Sprintf("%s = %q", k, v))
		}
		for _, z := range tw.cur.redZ {
			tail = append(tail, fmt.Sprintf("conf %s %+v", z.Name(), *z.(*zone).st.conf.Load()))
		}
	}
	tw.t.Fatalf("zones %+v\n%s\n"+format, append([]any{tw.zones, strings.Join(tail, "\n")}, args...)...)
}

func describe(reqs []backend.Request) string {
	var b strings.Builder
	for _, r := range reqs {
		fmt.Fprintf(&b, "[%s %q cost=%d shadow=%v]", r.Limit.Name(), r.Key, r.Cost, r.Shadow)
	}
	return b.String()
}

// diffRuns is how many random runs a differential test makes: def, fewer
// with -short, or SLUICE_DIFF_RUNS for a longer hunt.
func diffRuns(def int) int {
	if n, err := strconv.Atoi(os.Getenv("SLUICE_DIFF_RUNS")); err == nil && n > 0 {
		return n
	}
	if testing.Short() {
		return def / 8
	}
	return def
}

// diffFrom is the first run of a hunt split in chunks (SLUICE_DIFF_FROM):
// runs from..from+SLUICE_DIFF_RUNS−1 draw what they draw in one long hunt.
// SLUICE_DIFF_TAIL is how many steps a failure prints.
func diffFrom() int {
	n, err := strconv.Atoi(os.Getenv("SLUICE_DIFF_FROM"))
	if err != nil || n < 0 {
		return 0
	}
	twinSeq += n
	if t, err := strconv.Atoi(os.Getenv("SLUICE_DIFF_TAIL")); err == nil && t > 0 {
		tailLen = t // the whole sequence, and the keys at the end
	}
	return n
}

func TestDifferentialRandom(t *testing.T) {
	client := standaloneClient(t)
	from := diffFrom()
	runs, steps := diffRuns(300), 150
	for run := from; run < from+runs; run++ {
		tw := newTwin(t, prng{rand.New(rand.NewPCG(uint64(run), 7))}, client, run%4 == 3)
		for range steps {
			tw.step()
		}
	}
}

func TestDifferentialCluster(t *testing.T) {
	client := clusterClient(t)
	runs := diffRuns(40)
	for run := range runs {
		tw := newTwin(t, prng{rand.New(rand.NewPCG(uint64(run), 11))}, client, false)
		for range 100 {
			tw.step()
		}
	}
}

func FuzzDifferential(f *testing.F) {
	f.Add([]byte{0, 0, 1, 0, 2, 0, 3, 0})
	f.Add([]byte("adversarial: the clock stands still, costs above the limit"))
	f.Fuzz(func(t *testing.T, data []byte) {
		client := standaloneClient(t)
		seed := uint64(len(data))
		for _, b := range data {
			seed = seed*131 + uint64(b)
		}
		tw := newTwin(t, &fuzzBytes{b: data, r: rand.New(rand.NewPCG(seed, 3))}, client, seed%2 == 0)
		for range 60 {
			tw.step()
		}
	})
}
