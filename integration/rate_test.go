package integration

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/internal/redistest"
)

// Every algorithm through a real Caddy: 3 per hour for one key, then 429
// with the Retry-After the algorithm defines.
func TestEachAlgorithmOverHTTP(t *testing.T) {
	untilHourEnds := func() (int, int) {
		now := time.Now()
		left := now.Truncate(time.Hour).Add(time.Hour).Sub(now)
		secs := int((left + time.Second - 1) / time.Second)
		return secs - 2, secs + 1
	}
	tests := []struct {
		alg    string
		retry  func() (int, int)
		remark string
	}{
		{"sliding_window", func() (int, int) { return 3599, 3600 }, "the oldest event leaves in an hour"},
		{"sliding_window_counter", untilHourEnds, "full current window: fits once the next window starts"},
		{"fixed_window", untilHourEnds, "the hour window ends"},
		{"token_bucket", func() (int, int) { return 1199, 1200 }, "one token per 20 minutes"},
		{"gcra", func() (int, int) { return 1199, 1200 }, "T = 20 minutes"},
		{"leaky_bucket", func() (int, int) { return 1199, 1200 }, "one unit leaks per 20 minutes"},
	}
	zones := ""
	for i, tt := range tests {
		if i > 0 {
			zones += ","
		}
		zones += fmt.Sprintf(`"http_%[1]s": {"match": [{"path": ["/%[1]s"]}], "key": "static", "window": "1h", "max_events": 3, "algorithm": %[1]q}`, tt.alg)
	}
	tester := newTester(t, jsonServer(`{"handler": "rate_limit", "rate_limits": {`+zones+`}}, `+okHandler, ""), "json")
	// The window algorithms' windows end on the hour: keep the three
	// requests and the check inside one.
	if left := time.Until(time.Now().Truncate(time.Hour).Add(time.Hour)); left < 5*time.Second {
		time.Sleep(left + 100*time.Millisecond)
	}
	for _, tt := range tests {
		t.Run(tt.alg, func(t *testing.T) {
			path := "/" + tt.alg
			expectN(t, tester, 3, http.StatusOK, "GET", path)
			lo, hi := tt.retry()
			expect429(t, tester, max(lo, 1), hi, "GET", path)
		})
	}
}

// The leaky bucket as a queue: 10 per second, waiting up to 500 ms. Eight
// requests at once: each admitted one is given a slot at least 100 ms after
// the one before and at most 500 ms away, and is answered no earlier than
// it. The queue holds six: when the eight are decided within 100 ms, two
// are denied. (Slots are the store's; answers are checked against them
// only as lower bounds, which a loaded machine cannot break.)
func TestLeakyQueueDelaysOverHTTP(t *testing.T) {
	zone := freshZone("queue_http")
	tester := newTester(t, jsonServer(`{"handler": "rate_limit", "backend": {"name": "sluice_test_slots"}, "rate_limits": {
		"`+zone+`": {"key": "static", "window": "1s", "max_events": 10, "algorithm": "leaky_bucket", "max_delay": "500ms"}
	}}, `+okHandler, ""), "json")

	codes := make([]int, 8)
	answered := make([]int64, 8)
	var wg sync.WaitGroup
	for i := range codes {
		wg.Go(func() {
			codes[i], _, _ = do(t, tester, "GET", "/")
			answered[i] = backend.SystemNow()
		})
	}
	wg.Wait()
	var passed []int64
	for i, code := range codes {
		switch code {
		case http.StatusOK:
			passed = append(passed, answered[i])
		case http.StatusTooManyRequests:
		default:
			t.Fatalf("status %d", code)
		}
	}
	z := slots.of(zone)
	if len(z.granted) != len(passed) || len(z.decided) != len(codes) {
		t.Fatalf("%d passed, the store admitted %d of %d decided", len(passed), len(z.granted), len(z.decided))
	}
	spread := time.Duration(slices.Max(z.decided) - slices.Min(z.decided))
	switch {
	case len(passed) < 6:
		t.Fatalf("%d passed; the queue holds six", len(passed))
	case spread < 100*time.Millisecond && len(passed) != 6:
		t.Fatalf("%d passed of eight decided within %v; want six", len(passed), spread)
	}
	for _, d := range z.delays {
		if d < 0 || d > 500*time.Millisecond {
			t.Fatalf("a request was given a delay of %v, beyond max_delay (delays: %v)", d, z.delays)
		}
	}
	released := z.released()
	assertSpaced(t, released, 100*time.Millisecond)
	assertNotBefore(t, passed, released)
}

// A client that gives up while queued frees its slot for the next one,
// when it was the last slot given. Slots are 2 s apart, so that the
// departure is seen long before the abandoned slot comes.
func TestLeakyQueueCancelFreesSlot(t *testing.T) {
	zone := freshZone("queue_cancel")
	tester := newTester(t, jsonServer(`{"handler": "rate_limit", "backend": {"name": "sluice_test_slots"}, "rate_limits": {
		"`+zone+`": {"key": "static", "window": "2s", "max_events": 1, "algorithm": "leaky_bucket", "max_delay": "10s"}
	}}, `+okHandler, ""), "json")

	expectN(t, tester, 1, http.StatusOK, "GET", "/") // slot now; the next free slot is 2 s later
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	gaveUp := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, "GET", httpBase+"/", nil)
		resp, err := tester.Client.Do(req)
		if err == nil {
			resp.Body.Close()
			err = fmt.Errorf("the queued request was answered (%d)", resp.StatusCode)
		}
		gaveUp <- err
	}()
	waitFor(t, "the second request to be queued", func() bool { return len(slots.of(zone).granted) == 2 })
	cancel()
	if err := <-gaveUp; !errors.Is(err, context.Canceled) {
		t.Fatalf("the client giving up got %v", err)
	}
	waitFor(t, "the abandoned slot to be given back", func() bool { return len(slots.of(zone).refunded) == 1 })

	expectN(t, tester, 1, http.StatusOK, "GET", "/")
	answered := backend.SystemNow()
	z := slots.of(zone)
	freed := z.refunded[0]
	if z.refunded[0] != z.granted[1] {
		t.Fatalf("given back slot %d, the abandoned one was %d", z.refunded[0], z.granted[1])
	}
	// Kept, the abandoned slot would have put this one 2 s later.
	if want := max(freed, z.at[2]); z.granted[2] != want {
		t.Fatalf("the next request got slot %+dms from the freed one, want %+dms", (z.granted[2]-freed)/1e6, (want-freed)/1e6)
	}
	assertNotBefore(t, []int64{answered}, z.granted[2:])
}

// Clients that give up in the middle of the queue do not make it release
// two requests at once (five cancellations must not release five requests
// in one millisecond). The slots the store gave the requests that were let
// through are checked, not when the server's goroutines ran.
func TestLeakyQueueCancellationsNeverBurst(t *testing.T) {
	zone := freshZone("queue_cancel_burst")
	tester := newTester(t, jsonServer(`{"handler": "rate_limit", "backend": {"name": "sluice_test_slots"}, "rate_limits": {
		"`+zone+`": {"key": "static", "window": "1s", "max_events": 5, "algorithm": "leaky_bucket", "max_delay": "3s"}
	}}, `+okHandler, ""), "json")

	var mu sync.Mutex
	var answered []int64
	var wg sync.WaitGroup
	send := func(timeout time.Duration) {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", httpBase+"/", nil)
		resp, err := tester.Client.Do(req)
		if err != nil {
			return // gave up while queued
		}
		defer resp.Body.Close()
		if _, err := io.ReadAll(resp.Body); err == nil && resp.StatusCode == http.StatusOK {
			mu.Lock()
			answered = append(answered, backend.SystemNow())
			mu.Unlock()
		}
	}
	// Three rounds: queue six, of which the middle four give up early;
	// then newcomers take what is left. The sleeps only spread the
	// arrivals: any delay the machine adds keeps the same invariant.
	for round := 0; round < 3; round++ {
		for i := 0; i < 6; i++ {
			timeout := 10 * time.Second
			if i > 0 && i < 5 {
				timeout = 100 * time.Millisecond
			}
			wg.Go(func() { send(timeout) })
			time.Sleep(10 * time.Millisecond)
		}
		time.Sleep(150 * time.Millisecond)
	}
	wg.Wait()
	released := slots.of(zone).released()
	if len(released) < 4 {
		t.Fatalf("only %d requests released", len(released))
	}
	assertSpaced(t, released, 200*time.Millisecond)
	assertNotBefore(t, answered, released)
}

// At the largest max_events each algorithm accepts, costs up to the largest
// a placeholder can give never wrap a count: the quota is spent once, and a
// cost above it is refused without a Retry-After.
func TestHugeCostsNeverWrap(t *testing.T) {
	zones := []string{}
	for _, alg := range []string{"sliding_window", "fixed_window", "sliding_window_counter", "token_bucket", "gcra", "leaky_bucket"} {
		events := "1000000000000000"
		if alg == "sliding_window" {
			events = "4294967295"
		}
		zones = append(zones, fmt.Sprintf(`%q: {"match": [{"path": ["/%s"]}], "key": "static", "window": "1h", "max_events": %s, "algorithm": %q, "cost": "{http.request.header.X-Cost}"}`, "cfg_cost_"+alg, alg, events, alg))
	}
	tester := newTester(t, jsonServer(`{"handler": "rate_limit", "rate_limits": {`+strings.Join(zones, ", ")+`}}, `+okHandler, ""), "json")
	for _, alg := range []string{"sliding_window", "fixed_window", "sliding_window_counter", "token_bucket", "gcra", "leaky_bucket"} {
		most := "1000000000000000"
		if alg == "sliding_window" {
			most = "4294967295"
		}
		path := "/" + alg
		for _, huge := range []string{"9223372036854775807", "99999999999999999999", "1000000000000001"} {
			if code, ra, _ := do(t, tester, "GET", path, "X-Cost", huge); code != http.StatusTooManyRequests || ra != "" {
				t.Errorf("%s: cost %s: %d with Retry-After %q, want 429 without one", alg, huge, code, ra)
			}
		}
		expectN(t, tester, 1, http.StatusOK, "GET", path, "X-Cost", most)
		after := []string{most, "9223372036854775807", "1"}
		if strings.Contains(alg, "bucket") || alg == "gcra" {
			after = after[:2] // a bucket of 10^15 an hour refills a unit every nanosecond
		}
		for _, cost := range after {
			if code, _, _ := do(t, tester, "GET", path, "X-Cost", cost); code != http.StatusTooManyRequests {
				t.Errorf("%s: after the whole quota was spent, cost %s got %d, want 429", alg, cost, code)
			}
		}
	}
}

// slotStore is the memory store, recording the slot each request it
// admits is given (when it was decided plus how long it must wait) and
// each slot given back. Queue tests assert these slots, which the store
// computes exactly, rather than when the server's goroutines happened to
// run, which a loaded machine delays by any amount.
type slotStore struct {
	backend.Store
}

func (*slotStore) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: backend.Namespace + ".sluice_test_slots", New: func() caddy.Module { return new(slotStore) }}
}

func (s *slotStore) Provision(ctx caddy.Context) error {
	mod, err := ctx.LoadModuleByID(backend.Namespace+".memory", nil)
	if err != nil {
		return err
	}
	s.Store = mod.(backend.Store)
	return nil
}

func (s *slotStore) Configure(setup backend.Setup) { s.Store.(backend.Configurable).Configure(setup) }

func (s *slotStore) Decide(ctx context.Context, reqs []backend.Request, out []algorithms.Result) (bool, error) {
	allowed, err := s.Store.Decide(ctx, reqs, out)
	if err == nil {
		for i, req := range reqs {
			slots.record(req.Limit.Name(), out[i], allowed, false)
		}
	}
	return allowed, err
}

func (s *slotStore) Refund(ctx context.Context, reqs []backend.Request, granted []algorithms.Result) error {
	err := s.Store.Refund(ctx, reqs, granted)
	for i, req := range reqs {
		slots.record(req.Limit.Name(), granted[i], true, true)
	}
	return err
}

// slots holds what slotStore saw, by zone.
var slots = slotLog{zones: map[string]*zoneSlots{}}

type slotLog struct {
	sync.Mutex
	zones map[string]*zoneSlots
}

// zoneSlots are what a zone decided, in Unix nanoseconds of the store's
// clock: when each request was decided, the slots it gave out (with the
// decision time and delay of each) and the slots given back.
type zoneSlots struct {
	decided     []int64
	granted, at []int64
	delays      []time.Duration
	refunded    []int64
}

func (l *slotLog) record(zone string, res algorithms.Result, allowed, refund bool) {
	l.Lock()
	defer l.Unlock()
	z := l.zones[zone]
	if z == nil {
		z = new(zoneSlots)
		l.zones[zone] = z
	}
	switch {
	case refund:
		z.refunded = append(z.refunded, res.At+res.Delay)
	case allowed:
		z.granted = append(z.granted, res.At+res.Delay)
		z.at = append(z.at, res.At)
		z.delays = append(z.delays, time.Duration(res.Delay))
		fallthrough
	default:
		z.decided = append(z.decided, res.At)
	}
}

func (l *slotLog) of(zone string) zoneSlots {
	l.Lock()
	defer l.Unlock()
	z := l.zones[zone]
	if z == nil {
		return zoneSlots{}
	}
	return zoneSlots{slices.Clone(z.decided), slices.Clone(z.granted), slices.Clone(z.at), slices.Clone(z.delays), slices.Clone(z.refunded)}
}

// released are the slots of the requests that were let through: those
// given out, less one of each given back.
func (z zoneSlots) released() []int64 {
	out := slices.Clone(z.granted)
	for _, back := range z.refunded {
		if i := slices.Index(out, back); i >= 0 {
			out = slices.Delete(out, i, i+1)
		}
	}
	slices.Sort(out)
	return out
}

// waitFor polls cond until it holds, failing the test after a generous
// deadline: synchronisation without guessing how long the server takes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

var zoneRuns atomic.Int64

// assertSpaced fails unless the slots are at least interval apart: a queue
// never lets two requests through at once.
func assertSpaced(t *testing.T, slots []int64, interval time.Duration) {
	t.Helper()
	for i := 1; i < len(slots); i++ {
		if gap := time.Duration(slots[i] - slots[i-1]); gap < interval {
			t.Fatalf("slots %d and %d are %v apart, want at least %v (slots: %v)", i, i+1, gap, interval, slots)
		}
	}
}

// assertNotBefore fails unless each response came no earlier than a slot
// of its own: in order, the k-th response at or after the k-th slot.
func assertNotBefore(t *testing.T, answered, slots []int64) {
	t.Helper()
	answered, slots = slices.Sorted(slices.Values(answered)), slices.Sorted(slices.Values(slots))
	if len(answered) > len(slots) {
		t.Fatalf("%d responses for %d slots", len(answered), len(slots))
	}
	for i := range answered {
		if answered[i] < slots[i] {
			t.Fatalf("response %d came %v before its slot", i+1, time.Duration(slots[i]-answered[i]))
		}
	}
}

func TestTokenBucketAndCost(t *testing.T) {
	tester := newTester(t, jsonServer(`{
		"handler": "rate_limit",
		"rate_limits": {
			"cost_bucket": {"key": "{http.request.header.X-User}", "window": "1h", "max_events": 10, "algorithm": "token_bucket", "cost": "{http.request.header.X-Cost}"}
		}
	}, `+okHandler, ""), "json")

	expectN(t, tester, 3, http.StatusOK, "GET", "/", "X-User", "u1", "X-Cost", "3")
	// 1 token left; the 2 missing refill at 10/h in 12 minutes.
	expect429(t, tester, 719, 720, "GET", "/", "X-User", "u1", "X-Cost", "3")
	expectN(t, tester, 1, http.StatusOK, "GET", "/", "X-User", "u1", "X-Cost", "1")
	// No X-Cost header: cost 1; cost 0 is free.
	expectN(t, tester, 10, http.StatusOK, "GET", "/", "X-User", "u2")
	expectN(t, tester, 5, http.StatusOK, "GET", "/", "X-User", "u2", "X-Cost", "0")
	// A cost that can never pass: 429 without a misleading Retry-After,
	// however large the number.
	for _, huge := range []string{"11", "9223372036854775807", "99999999999999999999"} {
		code, ra, _ := do(t, tester, "GET", "/", "X-User", "u3", "X-Cost", huge)
		if code != http.StatusTooManyRequests || ra != "" {
			t.Fatalf("cost %s: status %d, Retry-After %q; want 429 without Retry-After", huge, code, ra)
		}
	}
	// A cost that is not a number is the client's error.
	expectN(t, tester, 1, http.StatusBadRequest, "GET", "/", "X-User", "u4", "X-Cost", "lots")
	expectN(t, tester, 1, http.StatusBadRequest, "GET", "/", "X-User", "u4", "X-Cost", "-2")
}

func TestJitterStretchesRetryAfter(t *testing.T) {
	tester := newTester(t, jsonServer(`{
		"handler": "rate_limit",
		"jitter": 1.0,
		"rate_limits": {"jitter_zone": {"key": "static", "window": "100s", "max_events": 1}}
	}, `+okHandler, ""), "json")
	expectN(t, tester, 1, http.StatusOK, "GET", "/")
	seen := map[string]bool{}
	for i := 0; i < 20; i++ {
		_, ra, _ := do(t, tester, "GET", "/")
		seen[ra] = true
		expect429(t, tester, 99, 200, "GET", "/")
	}
	if len(seen) < 2 {
		t.Fatalf("20 denials with jitter 1.0 all had Retry-After %v", seen)
	}
}

// A sliding_window whose cost a placeholder sets loads on the redis backend
// as on the memory one, and both answer a client that chooses its costs
// alike: the retry time of a denied cost is when enough units leave.
func TestRedisSlidingWindowVariableCost(t *testing.T) {
	addr, _ := perfRedis(t)
	for _, b := range []struct{ name, block string }{
		{"memory", ""},
		{"redis", fmt.Sprintf("backend redis {\n\t\t\taddress %s\n\t\t\ttimeout 2s\n\t\t}", addr)},
	} {
		t.Run(b.name, func(t *testing.T) {
			tester := newTester(t, caddyfileServer(`	rate_limit {
		`+b.block+`
		zone lease_varcost_`+b.name+` {
			by header X-Key
			rate 1000/1h
			algorithm sliding_window
			cost {http.request.header.X-Cost}
		}
	}
	respond "ok"`), "caddyfile")
			cost := func(n int) []string { return []string{"X-Key", "c", "X-Cost", strconv.Itoa(n)} }
			// Many tiny events, then costs that need nearly all of them.
			for range 300 {
				expectN(t, tester, 1, 200, "GET", "/", cost(1)...)
			}
			expectN(t, tester, 1, 200, "GET", "/", cost(650)...)
			for c := 700; c < 1000; c += 37 {
				expect429(t, tester, 3590, 3600, "GET", "/", cost(c)...)
			}
			if code, ra, _ := do(t, tester, "GET", "/", cost(1001)...); code != 429 || ra != "" {
				t.Fatalf("a cost above the limit: %d, Retry-After %q; want 429 without one (no wait helps)", code, ra)
			}
			expectN(t, tester, 1, 200, "GET", "/", cost(50)...)
			expect429(t, tester, 3590, 3600, "GET", "/", cost(1)...)
		})
	}
}

func init() { caddy.RegisterModule(new(slotStore)) }

// A client that keeps hammering a full limit is let back in as soon as the
// limit has room: denied requests are never counted, on any algorithm and
// either store (a log that recorded them, or a bucket that charged them,
// would keep a hammering client out for ever).
func TestHammeringNeverExtendsTheBlock(t *testing.T) {
	backends := map[string]string{"memory": ""}
	if redistest.Available(t) {
		backends["redis"] = "backend redis {\n\t\t\taddress " + redistest.Standalone(t, "").Addr + "\n\t\t}"
	}
	for name, backend := range backends {
		for _, algo := range []string{"sliding_window", "sliding_window_counter", "fixed_window", "token_bucket", "gcra", "leaky_bucket"} {
			t.Run(name+"/"+algo, func(t *testing.T) {
				tester := newTester(t, caddyfileServer(`
	rate_limit {
		`+backend+`
		zone seeds_hammer_`+name+`_`+algo+` {
			by ip
			rate 2/1s
			algorithm `+algo+`
		}
	}
	respond "ok"`), "caddyfile")
				allowed, denied := 0, 0
				for end := time.Now().Add(2500 * time.Millisecond); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
					switch r := fetch(t, tester, "GET", "/"); r.code {
					case 200:
						allowed++
					case 429:
						denied++
						if r.header.Get("Retry-After") == "" {
							t.Fatal("429 without Retry-After")
						}
					default:
						t.Fatalf("status %d", r.code)
					}
				}
				// 2 at once, then 2 a second: at least 4 in 2.5 s for every
				// algorithm, and never more than 2 per second plus both ends'.
				if allowed < 4 || allowed > 9 || denied == 0 {
					t.Fatalf("hammering for 2.5 s: %d allowed, %d denied; want 4 to 9 allowed", allowed, denied)
				}
			})
		}
	}
}

// A load test's checks: 200 requests a second for 3 s against 60 a minute
// are either allowed or limited, never a 5xx, every 429 has Retry-After;
// the exact window admits exactly 60, a policy without burst 1 plus one
// a second.
func TestLoadAllowedOrLimited(t *testing.T) {
	tester := newTester(t, caddyfileServer(`
	rate_limit {
		zone seeds_load_window {
			match {
				path /window
			}
			by header Authorization
			rate 60/1m
		}
		zone seeds_load_smooth {
			match {
				path /smooth
			}
			by header Authorization
			rate 60/1m
			burst 1
			algorithm gcra
		}
	}
	respond "ok"`), "caddyfile")
	for _, path := range []string{"/window", "/smooth"} {
		var ok, limited, other atomic.Int64
		var wg sync.WaitGroup
		start := time.Now()
		tick := time.NewTicker(5 * time.Millisecond)
		for range 600 {
			<-tick.C
			wg.Go(func() {
				r := fetch(t, tester, "GET", path, "Authorization", "Bearer k6")
				switch {
				case r.code == 200:
					ok.Add(1)
				case r.code == 429 && r.header.Get("Retry-After") != "":
					limited.Add(1)
				default:
					other.Add(1)
				}
			})
		}
		tick.Stop()
		wg.Wait()
		elapsed := time.Since(start).Seconds()
		if other.Load() != 0 || ok.Load()+limited.Load() != 600 {
			t.Fatalf("%s: %d allowed, %d limited with Retry-After, %d other", path, ok.Load(), limited.Load(), other.Load())
		}
		switch n := ok.Load(); {
		case path == "/window" && n != 60:
			t.Fatalf("/window: %d allowed, want exactly 60", n)
		case path == "/smooth" && (n < 2 || float64(n) > 2+elapsed):
			t.Fatalf("/smooth: %d allowed in %.1fs, want 1 plus one a second", n, elapsed)
		}
	}
}
