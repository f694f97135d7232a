package redis

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
)

// olderScript is src as a build without room logs decides: its logLoad
// takes a room log for an older version's log of format 0 with events
// given back (and rewrites it), and its logPlainOne leaves it to
// decideKeys.
func olderScript(t *testing.T, src string) string {
	t.Helper()
	var branch string
	for _, line := range strings.Split(src, "\n") {
		if strings.Contains(line, "== MAGIC then") && strings.Contains(line, "hdr") {
			if branch != "" {
				t.Fatal("logLoad has two room branches")
			}
			branch = line
		}
	}
	const one = "if m >= HDR + 24 and struct.unpack('<I4', raw, HDR + 1) == MAGIC then return roomOne(key, W, limit, raw, m) end"
	if branch == "" || strings.Count(src, one) != 1 {
		t.Fatal("the script has no room branch in logLoad or logPlainOne")
	}
	src = strings.Replace(src, branch, strings.Replace(branch, "if ", "if false and ", 1), 1)
	return strings.Replace(src, one, "", 1)
}

// loadOlder loads olderScript as a Function and returns its name.
func loadOlder(t *testing.T) string {
	t.Helper()
	name := functionName + "_older"
	lib := olderScript(t, strings.ReplaceAll(functionSource, functionName, name))
	c := standaloneClient(t)
	if err := c.Do(context.Background(), "function", "load", "replace", lib).Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Do(context.Background(), "function", "delete", name) })
	return name
}

// roomRig decides requests of one log key by the script as it is
// (database 0), by decideKeys alone (database 1) and by olderScript
// (database 2), with ttlExtra (ms) added to every expiry so that no key
// expires on the server while the fake clock runs.
type roomRig struct {
	*plainOneRig
	fns   [3]string
	extra int64
}

func newRoomRig(t *testing.T) *roomRig {
	r := &roomRig{plainOneRig: newRig(t, 1_764_460_000_000_000_000+123_456_789, 3_600_000), extra: 3_600_000}
	r.fns = [3]string{functionName, r.generic, loadOlder(t)}
	return r
}

func (r *roomRig) key(z backend.Limit, name string) string {
	items, _, err := r.s.resolve([]backend.Request{{Limit: z, Key: name, Cost: 1}})
	if err != nil {
		r.t.Fatal(err)
	}
	return items[0].key
}

// roomCall is one decision's outcome on one database.
type roomCall struct {
	reply   any
	err     string
	res     algorithms.Result
	logged  int64
	value   string // "" when the key is absent
	expTime int64  // PEXPIRETIME after the call
	setExp  bool   // the call set the key's expiry (PERSIST before it)
	t0, t1  int64  // server ms just before and just after the call
}

// decide runs the request (cost on key name of zone z) with function
// fns[db] on database db, the key's expiry taken off first (and put back
// if the call did not set one), so that the call's own expiry is known.
func (r *roomRig) decide(db int, z backend.Limit, name string, cost int64) roomCall {
	t := r.t
	t.Helper()
	items, _, err := r.s.resolve([]backend.Request{{Limit: z, Key: name, Cost: cost}})
	if err != nil {
		t.Fatal(err)
	}
	key := items[0].key
	cmd, _ := r.s.manyCmd(r.ctx, []*pending{{ctx: r.ctx, items: items}}, nil)
	before, _ := r.do(db, "pexpiretime", key).Int64()
	if before > 0 && db < 2 {
		r.do(db, "persist", key)
	}
	args := slices.Clone(cmd.Args())
	args[0], args[1] = "fcall", r.fns[db]
	var tb, ta *goredis.TimeCmd
	var call *goredis.Cmd
	if _, err := r.conn.Pipelined(r.ctx, func(p goredis.Pipeliner) error {
		tb = p.Time(r.ctx)
		call = p.Do(r.ctx, args...)
		ta = p.Time(r.ctx)
		return nil
	}); err != nil && err != call.Err() {
		t.Fatal(err)
	}
	var c roomCall
	c.t0, c.t1 = tb.Val().UnixMilli(), ta.Val().UnixMilli()
	c.reply = call.Val()
	if call.Err() != nil {
		c.err = call.Err().Error()
	} else {
		p := &pending{ctx: r.ctx, items: items, results: make([]algorithms.Result, 1)}
		pc := goredis.NewCmd(r.ctx)
		pc.SetVal(call.Val())
		if err := parseBatch(pc, []*pending{p}); err != nil {
			t.Fatalf("db %d: %v", db, err)
		}
		c.res, c.logged = p.results[0], p.items[0].logged
	}
	c.value, _ = r.do(db, "get", key).Text()
	c.expTime, _ = r.do(db, "pexpiretime", key).Int64()
	switch {
	case c.expTime > 0:
		c.setExp = true
	case c.expTime == -1 && before > 0 && db < 2:
		r.do(db, "pexpireat", key, before)
		c.expTime = before
	}
	return c
}

// logDump is a log value read back.
type logDump struct {
	base               float64
	sum                float64
	wide, tombs        byte
	h, n               uint32
	magic, cap         uint32
	newestOff, expOff  float64
	times              []int64 // of the live events h+1..n (units > 0)
	units              []int64
	pastZero, lenRight bool // a room log: zeros past event n, length 26+8*cap
}

func readLog(v string) (logDump, error) {
	var d logDump
	if len(v) < 26 {
		return d, fmt.Errorf("%d bytes", len(v))
	}
	f := func(at int) float64 { return math.Float64frombits(binary.LittleEndian.Uint64([]byte(v[at:]))) }
	d.base, d.sum, d.wide, d.tombs = f(0), f(8), v[16], v[17]
	d.h, d.n = binary.LittleEndian.Uint32([]byte(v[18:])), binary.LittleEndian.Uint32([]byte(v[22:]))
	stride := map[byte]int{0: 8, 1: 12, 2: 20}[d.wide]
	if stride == 0 {
		return d, fmt.Errorf("format %d", d.wide)
	}
	if len(v) < 26+int(d.n)*stride {
		return d, fmt.Errorf("%d bytes for %d events", len(v), d.n)
	}
	if d.wide == 0 && d.tombs == 1 && len(v) >= 26+24 {
		d.magic, d.cap = binary.LittleEndian.Uint32([]byte(v[26:])), binary.LittleEndian.Uint32([]byte(v[30:]))
		d.newestOff, d.expOff = f(34), f(42)
		d.lenRight = len(v) == 26+8*int(d.cap)
		d.pastZero = strings.Trim(v[26+8*int(d.n):], "\x00") == ""
	}
	b := int64(d.base) * 1e9
	for i := d.h; i < d.n; i++ {
		off := f(26 + int(i)*stride)
		u := int64(1)
		if d.wide != 0 {
			u = int64(binary.LittleEndian.Uint32([]byte(v[26+int(i)*stride+8:])))
		}
		if off < 0 {
			continue
		}
		d.times = append(d.times, b+int64(off))
		d.units = append(d.units, u)
	}
	return d, nil
}

// logModel is the sliding log the memory store keeps.
type logModel struct {
	times, units []int64
}

func (m *logModel) prune(now, W int64) {
	for len(m.times) > 0 && m.times[0]+W <= now {
		m.times, m.units = m.times[1:], m.units[1:]
	}
}

func (m *logModel) count() (c int64) {
	for _, u := range m.units {
		c += u
	}
	return
}

// decide is the memory store's decision, and logs the event if allowed.
func (m *logModel) decide(now, W, limit, cost int64) algorithms.Result {
	m.prune(now, W)
	count := m.count()
	r := algorithms.Result{Limit: limit, Remaining: max(limit-count, 0), At: now}
	if len(m.times) > 0 && m.times[len(m.times)-1]+W > now {
		r.ResetAfter = m.times[len(m.times)-1] + W - now
	}
	switch {
	case cost == 0:
		r.Allowed = true
	case cost > limit:
		r.RetryAfter = algorithms.Never
	case count+cost <= limit:
		r.Allowed, r.Remaining = true, limit-count-cost
		r.ResetAfter = max(r.ResetAfter, W)
		t := now
		if len(m.times) > 0 && m.times[len(m.times)-1] > t {
			t = m.times[len(m.times)-1]
		}
		m.times, m.units = append(m.times, t), append(m.units, cost)
	default:
		need := count + cost - limit
		for i, u := range m.units {
			need -= u
			if need <= 0 {
				r.RetryAfter = m.times[i] + W - now
				break
			}
		}
	}
	return r
}

// roomSeed is ROOM_SEED, or the clock's: a failing run is run again with
// the seed it logs.
func roomSeed(t *testing.T) uint64 {
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("ROOM_SEED"); v != "" {
		fmt.Sscan(v, &seed)
	}
	t.Logf("seed %d", seed)
	return seed
}

// Many decisions on one key, the clock moving by random amounts (back at
// times), max_events changed between them, each decided by the script as
// it is and by decideKeys alone from the same value: the same reply,
// value and expiry every time; the memory store's decision (logModel);
// the log's live events the model's, in order; a room log's meta right
// (its newest event, zeros past the last one, its length, an expiry at
// least the newest event's plus the window, the key's own expiry too);
// and the older build deciding the value as it is the same way, leaving
// the same events. A key whose expiry has passed on the fake clock is
// deleted, as the server would have.
func TestRoomLogSweep(t *testing.T) {
	windows := []int64{int64(time.Millisecond), 7 * int64(time.Millisecond), int64(time.Second), int64(time.Minute), int64(time.Hour), 24 * int64(time.Hour)}
	limits := []int64{1, 2, 15, 16, 31, 32, 33, 40, 47, 64, 100, 129, 300, 1000, 1_000_000}
	seed := roomSeed(t)
	rng := rand.New(rand.NewPCG(seed, 7))
	r := newRoomRig(t)
	runs := 40
	if testing.Short() {
		runs = 8
	}
	for run := range runs {
		W := windows[rng.IntN(len(windows))]
		limit := limits[rng.IntN(len(limits))]
		if rng.IntN(4) > 0 {
			limit = limits[5+rng.IntN(len(limits)-5)]
		}
		z := mustZone(t, r.s, fmt.Sprintf("z%d", run), algorithms.NameSlidingWindow, algorithms.Policy{Limit: limit, Window: W})
		r.sweep(rng, z, W, limit, 400)
		if t.Failed() {
			return
		}
	}
}

func (r *roomRig) sweep(rng *rand.Rand, z backend.Limit, W, limit int64, steps int) {
	t := r.t
	name := "k"
	key := r.key(z, name)
	var m logModel
	// exp[db] is when the key expires on the fake clock (an upper bound:
	// the call's server ms is after t0); 0 when it has none.
	var exp, expLo [2]int64
	// Per mille of steps with a jump of the clock (and of max_events
	// changed), and the usual step in quarters of the time an event takes
	// at the limit.
	jumps := []int{0, 3, 10, 40}[rng.IntN(4)]
	spread := int64(1 + rng.IntN(8))
	roomSteps, olderSteps := 0, 0
	defer func() {
		t.Logf("W %v limit %d jumps %d spread %d: %d steps of %d left a room log, %d decided by the older build", time.Duration(W), limit, jumps, spread, roomSteps, steps, olderSteps)
	}()
	for step := range steps {
		// The clock: mostly a fraction of the time an event takes at the
		// limit, so logs fill up; at times a window or more, or back.
		gap := max(W/max(limit, 1), 1)
		switch k := rng.IntN(1000); {
		case k < jumps:
			r.clock += W/2 + rng.Int64N(3*W)
		case k < 2*jumps:
			r.clock -= rng.Int64N(W/2 + 1)
		case k < 3*jumps:
			r.clock -= rng.Int64N(1000)
		case k < 3*jumps+50:
			// a burst: the same instant
		case k < 3*jumps+150 && len(m.times) > 0:
			// At an event's leaving the window, or just before: a client
			// retrying when told to.
			i := rng.IntN(min(len(m.times), 3))
			if rng.IntN(2) == 0 {
				i = len(m.times) - 1 - i
			}
			r.clock = max(r.clock, m.times[i]+W-int64(rng.IntN(2)))
		default:
			r.clock += rng.Int64N(spread*gap/4 + 1)
		}
		if rng.IntN(1000) < jumps {
			limit = max(1, limit/int64(1+rng.IntN(4))+int64(rng.IntN(3))-1)
			if rng.IntN(3) == 0 {
				limit += int64(rng.IntN(100))
			}
			if err := z.(backend.Adjustable).SetMaxEvents(limit); err != nil {
				t.Fatal(err)
			}
		}
		if (exp[0] == 0) != (exp[1] == 0) {
			t.Fatalf("step %d: a key without an expiry: %v", step, exp)
		}
		if exp[0] > 0 && r.clock >= min(exp[0], exp[1]) {
			for db := range 2 {
				r.do(db, "del", key)
				exp[db] = 0
			}
		}
		if exp[0] == 0 {
			m = logModel{}
		}
		cost := int64(1)
		if rng.IntN(40) == 0 {
			cost = int64(rng.IntN(3))
		}
		// The older build, from the same value with the same expiry.
		var old roomCall
		oldRan := false
		var setAt int64
		if v, _ := r.do(0, "get", key).Text(); v != "" && len(v) > 17 && v[17] == 1 && rng.IntN(4) == 0 {
			// The expiry the key has on the fake clock, from the server's
			// ms before it is set: the real time that passes until the
			// call does not pass on the fake clock.
			tm, err := r.conn.Time(r.ctx).Result()
			if err != nil {
				t.Fatal(err)
			}
			setAt = tm.UnixMilli()
			r.do(2, "set", key, v, "px", (exp[0]-r.clock+1e6-1)/1e6+r.extra)
			old = r.decide(2, z, name, cost)
			oldRan = true
			olderSteps++
		}
		want := m.decide(r.clock, W, limit, cost)
		var got [2]roomCall
		for db := range 2 {
			got[db] = r.decide(db, z, name, cost)
		}
		where := fmt.Sprintf("step %d (W %v, limit %d, cost %d, clock %d)", step, time.Duration(W), limit, cost, r.clock)
		if got[0].err != "" || got[1].err != "" {
			t.Fatalf("%s: errors %q, %q", where, got[0].err, got[1].err)
		}
		if !reflect.DeepEqual(got[0].reply, got[1].reply) || got[0].value != got[1].value {
			t.Fatalf("%s: logPlainOne replied %v value %x, decideKeys %v value %x", where, got[0].reply, got[0].value, got[1].reply, got[1].value)
		}
		res := got[0].res
		wantLogged := want.At
		if want.Allowed && cost > 0 {
			wantLogged = m.times[len(m.times)-1]
		}
		if res != want || (want.Allowed && got[0].logged != wantLogged) {
			t.Fatalf("%s: decided %+v logged %d, the memory store %+v logged %d", where, res, got[0].logged, want, wantLogged)
		}
		if oldRan {
			if old.err != "" || !reflect.DeepEqual(old.res, res) || old.logged != got[0].logged {
				t.Fatalf("%s: the older build decided %+v logged %d %s, the script %+v logged %d", where, old.res, old.logged, old.err, res, got[0].logged)
			}
			if len(m.times) == 0 {
				if old.value != "" {
					t.Fatalf("%s: the older build left %x, no live event", where, old.value)
				}
			} else if od, err := readLog(old.value); err != nil || !slices.Equal(od.times, m.times) || !slices.Equal(od.units, m.units) {
				t.Fatalf("%s: the older build left %x (%v): events %v units %v, want %v %v", where, old.value, err, od.times, od.units, m.times, m.units)
			} else if n := m.times[len(m.times)-1] + W; (old.expTime-setAt-r.extra+1)*1e6 < n-r.clock {
				t.Fatalf("%s: the older build left an expiry %d ms after the value was set, the newest event leaves in %d ns", where, old.expTime-setAt-r.extra, n-r.clock)
			}
		}
		for db := range 2 {
			if got[db].setExp {
				exp[db] = r.clock + (got[db].expTime-got[db].t0-r.extra)*1e6
				expLo[db] = r.clock + (got[db].expTime-got[db].t1-r.extra-1)*1e6
			} else if got[db].value == "" {
				exp[db] = 0
			}
		}
		if (exp[0] == 0) != (exp[1] == 0) || exp[0] > 0 && (expLo[0] > exp[1] || expLo[1] > exp[0]) {
			t.Fatalf("%s: expiry by logPlainOne %d, by decideKeys %d (fake clock ns)", where, exp[0], exp[1])
		}
		if len(m.times) == 0 {
			if got[0].value != "" {
				t.Fatalf("%s: no live event, the log is %x", where, got[0].value)
			}
			continue
		}
		newest := m.times[len(m.times)-1]
		if exp[0] == 0 || exp[0] < newest+W {
			t.Fatalf("%s: the key expires at %d, before the newest event %d leaves the window (%d)", where, exp[0], newest, newest+W)
		}
		d, err := readLog(got[0].value)
		if err != nil {
			t.Fatalf("%s: %v: %x", where, err, got[0].value)
		}
		if !slices.Equal(d.times, m.times) || !slices.Equal(d.units, m.units) {
			t.Fatalf("%s: log events %v units %v, the memory store's %v %v", where, d.times, d.units, m.times, m.units)
		}
		if d.tombs == 1 {
			roomSteps++
			b := int64(d.base) * 1e9
			switch {
			case d.magic != 1380994131 || d.h < 3 || d.cap < d.n || !d.lenRight || !d.pastZero:
				t.Fatalf("%s: room log of a wrong shape %+v", where, d)
			case float64(d.n-d.h) != d.sum:
				t.Fatalf("%s: room log units %v, %d live", where, d.sum, d.n-d.h)
			case b+int64(d.newestOff) != newest:
				t.Fatalf("%s: room log's newest %d, its last event %d", where, b+int64(d.newestOff), newest)
			case b+int64(d.expOff) < newest+W:
				t.Fatalf("%s: room log's expiry %d before its newest event leaves (%d)", where, b+int64(d.expOff), newest+W)
			case b+int64(d.expOff) > exp[0]:
				t.Fatalf("%s: room log's expiry %d past the key's %d", where, b+int64(d.expOff), exp[0])
			}
		}
	}
}

// Room logs against the memory store: many requests of one or two keys
// of a sliding window whose limit lets logs grow past the size from which
// they are written with room, the clock moving by a fraction of the time
// an event takes at the limit (back at times), with refunds of granted
// decisions, operators' grants, settles and max_events changed among
// them: every answer, and every Inspect, the memory store's.
func TestRoomLogTwin(t *testing.T) {
	client := standaloneClient(t)
	seed := roomSeed(t)
	rng := rand.New(rand.NewPCG(seed, 11))
	windows := []int64{int64(time.Millisecond), int64(time.Second), int64(time.Minute), int64(time.Hour), 24 * int64(time.Hour)}
	runs := 16
	if testing.Short() {
		runs = 4
	}
	for range runs {
		W := windows[rng.IntN(len(windows))]
		limit := []int64{32, 33, 40, 64, 100, 200, 1000}[rng.IntN(7)]
		tw := newTwinWith(t, client, false, t0+rng.Int64N(1e9), zoneSpec{name: "l", alg: algorithms.NameSlidingWindow, policy: algorithms.Policy{Limit: limit, Window: W}})
		tw.c = prng{rng}
		keys := []string{"k", "j"}
		rooms := 0
		ops := 1 + rng.IntN(3) // per mille of each kind of other step
		for range 800 {
			gap := max(W/limit, 1)
			switch k := rng.IntN(100); {
			case k < 2:
				tw.clock += W/2 + rng.Int64N(2*W)
			case k < 4:
				tw.clock -= rng.Int64N(W/4 + 1)
			case k < 10:
			default:
				tw.clock += rng.Int64N(gap + 1)
			}
			key := keys[rng.IntN(4)/3]
			// Refunds, grants, settles and other costs make a log of
			// format 2 until its events leave the window: rare.
			k := rng.IntN(1000)
			if k >= 10*ops {
				k = 100
			} else {
				k /= ops
			}
			switch {
			case k < 4 && len(tw.granted) > 0:
				// the newest decisions mostly: their events are live
				i := len(tw.granted) - 1 - rng.IntN(min(len(tw.granted), 4))
				if rng.IntN(4) == 0 {
					i = rng.IntN(len(tw.granted))
				}
				tw.giveBack(i)
			case k < 7:
				units := int64(1 + rng.IntN(5))
				mu, merr := tw.cur.mem.Grant(context.Background(), tw.cur.memZ[0], key, units)
				ru, rerr := tw.cur.red.Grant(context.Background(), tw.cur.redZ[0], key, units)
				tw.log = append(tw.log, fmt.Sprintf("t=%d grant %s %d → %+v", tw.clock, key, units, mu))
				if merr != nil || rerr != nil || mu != ru {
					tw.fail("grant: memory %+v %v, redis %+v %v", mu, merr, ru, rerr)
				}
			case k < 10 && len(tw.granted) > 0:
				i := len(tw.granted) - 1 - rng.IntN(min(len(tw.granted), 4))
				g := tw.granted[i]
				tw.granted = append(tw.granted[:i], tw.granted[i+1:]...)
				act := make([]int64, len(g.memReqs))
				for j := range act {
					act[j] = int64(rng.IntN(4))
				}
				tw.log = append(tw.log, fmt.Sprintf("t=%d settle %s granted %v at %v", tw.clock, describe(g.memReqs), g.out, act))
				merr := tw.cur.mem.Settle(context.Background(), g.memReqs, g.out, act)
				rerr := tw.cur.red.Settle(context.Background(), g.redReqs, g.out, act)
				if merr != nil || rerr != nil {
					tw.fail("settle: memory %v, redis %v", merr, rerr)
				}
			case k < 12:
				limit = max(1, limit+int64(rng.IntN(41))-20)
				if err := tw.cur.redZ[0].(backend.Adjustable).SetMaxEvents(limit); err != nil {
					t.Fatal(err)
				}
				if err := tw.cur.memZ[0].(backend.Adjustable).SetMaxEvents(limit); err != nil {
					t.Fatal(err)
				}
				tw.log = append(tw.log, fmt.Sprintf("max_events %d", limit))
			case k < 15:
				mu, merr := tw.cur.mem.Inspect(context.Background(), tw.cur.memZ[0], key)
				ru, rerr := tw.cur.red.Inspect(context.Background(), tw.cur.redZ[0], key)
				if merr != nil || rerr != nil || mu != ru {
					tw.fail("inspect: memory %+v %v, redis %+v %v", mu, merr, ru, rerr)
				}
			case k < 18 || rng.IntN(1000) < ops:
				tw.do(ask{0, "k", 1, false}, ask{0, "j", 1, false})
			default:
				cost := int64(1)
				if rng.IntN(1000) < ops {
					cost = int64(rng.IntN(3))
				}
				tw.do(ask{0, key, cost, rng.IntN(30) == 0})
			}
			if t.Failed() {
				return
			}
			if v, _ := tw.client.Get(context.Background(), tw.cur.redZ[0].(*zone).stateKey(key)).Result(); len(v) > 30 && v[17] == 1 {
				rooms++
			}
		}
		t.Logf("W %v limit %d ops %d: %d steps of 800 with a room log", time.Duration(W), limit, ops, rooms)
	}
}

// roomValue is a room log as lua/07-slidinglog.lua writes it: events at
// times (ns, from the base second of the first), the first pruned of
// them past the three meta slots, room up to capSlots slots; newest and
// exp are the meta slots' offsets from the base.
func roomValue(times []int64, pruned int, capSlots uint32, newest, exp float64) []byte {
	base := times[0] / 1e9 * 1e9
	n := 3 + len(times)
	b := binary.LittleEndian.AppendUint64(nil, math.Float64bits(float64(base/1e9)))
	b = binary.LittleEndian.AppendUint64(b, math.Float64bits(float64(len(times)-pruned)))
	b = append(b, 0, 1)
	b = binary.LittleEndian.AppendUint32(b, uint32(3+pruned))
	b = binary.LittleEndian.AppendUint32(b, uint32(n))
	b = binary.LittleEndian.AppendUint32(b, 1380994131)
	b = binary.LittleEndian.AppendUint32(b, capSlots)
	b = binary.LittleEndian.AppendUint64(b, math.Float64bits(newest))
	b = binary.LittleEndian.AppendUint64(b, math.Float64bits(exp))
	for _, t := range times {
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(float64(t-base)))
	}
	for i := n; i < int(capSlots); i++ {
		b = binary.LittleEndian.AppendUint64(b, 0)
	}
	return b
}

// Room logs put there by hand, right and wrong: the script as it is and
// decideKeys alone decide each the same way (reply, value, expiry). The
// wrong ones no version writes: a newest-event slot that is not the last
// event's time, an event not a number or given back (format 0 of an
// older version), a string shorter than its events or its meta.
func TestRoomLogPlanted(t *testing.T) {
	r := newPlainOneRig(t)
	const W = int64(time.Minute)
	z := mustZone(t, r.s, "l", algorithms.NameSlidingWindow, algorithms.Policy{Limit: 50, Window: W})
	zt := mustZone(t, r.s, "lt", algorithms.NameSlidingWindow, algorithms.Policy{Limit: 40, Window: W})
	for _, c := range roomCases(r.clock, W) {
		if only := os.Getenv("ROOM_CASE"); only != "" && only != c.name {
			continue
		}
		r.check(z, c.name, c.v)
		r.check(zt, c.name, c.v)
	}
}

type roomCase struct {
	name string
	v    []byte
}

// roomCases are room logs of 40 events over the half window before now.
func roomCases(now, W int64) []roomCase {
	events := func(n int, from int64) []int64 {
		ts := make([]int64, n)
		for i := range ts {
			ts[i] = from + int64(i)*W/100
		}
		return ts
	}
	ev := events(40, now-W/2)
	base := ev[0] / 1e9 * 1e9
	newest, exp := float64(ev[39]-base), float64(ev[39]+W+W/16-base)
	off := func(v []byte, slot int, x float64) []byte {
		v = slices.Clone(v)
		binary.LittleEndian.PutUint64(v[26+8*slot:], math.Float64bits(x))
		return v
	}
	good := roomValue(ev, 0, 60, newest, exp)
	far := now - 53*24*int64(time.Hour)
	headed := func(v []byte, h uint32) []byte {
		v = slices.Clone(v)
		binary.LittleEndian.PutUint32(v[18:], h)
		return v
	}
	capped := func(v []byte, c uint32) []byte {
		v = slices.Clone(v)
		binary.LittleEndian.PutUint32(v[30:], c)
		return v
	}
	return []roomCase{
		{"right", good},
		{"all-pruned", roomValue(ev, 40, 60, newest, exp)},
		{"some-pruned", roomValue(ev, 10, 60, newest, exp)},
		{"head-past-window", roomValue(events(40, now-2*W), 0, 80, float64(39*W/100), 0)},
		{"event-given-back", off(good, 3+20, -float64(ev[20]-base)-1)},
		{"cap-below-n", roomValue(ev, 0, 30, newest, exp)},
		{"cap-huge", capped(good, 1<<31)},
		{"short-of-cap", roomValue(ev, 0, 200, newest, exp)[:26+8*50]},
		{"meta-whole", good[:26+24]},
		{"head-in-meta", headed(good, 2)},
		{"head-past-n", headed(good, 44)},
		{"magic-wrong", slices.Concat(good[:26], []byte{1}, good[27:])},
		// Its base past the exact range of the event to log.
		{"base-far", roomValue(append([]int64{far}, ev...), 1, 60, float64(ev[39]-far/1e9*1e9), float64(ev[39]+W-far/1e9*1e9))},
		{"newest-lies", roomValue(ev, 0, 60, newest-float64(W/4), exp)},
		{"newest-nan", roomValue(ev, 0, 60, math.NaN(), exp)},
		{"newest-future", roomValue(ev, 0, 60, newest+float64(W), exp)},
		{"event-nan", off(good, 3+39, math.NaN())},
		{"head-given-back", off(good, 3, -float64(ev[0]-base)-1)},
		{"short-of-events", roomValue(ev, 0, 60, newest, exp)[:26+8*36]},
		{"meta-only", good[:26+16]},
		{"meta-half", good[:26+20]},
	}
}

// A Function's tables outlive its call: what the script keeps from call
// to call must stay bounded however many sizes of logs it writes. Logs of
// as many sizes as a zone of a large limit makes, each rewritten with
// room (a quarter of its live events), must not grow the Functions' Lua
// memory by the room of each.
func TestRoomLogMemoryBounded(t *testing.T) {
	r := newPlainOneRig(t)
	const W = int64(time.Hour)
	z := mustZone(t, r.s, "l", algorithms.NameSlidingWindow, algorithms.Policy{Limit: 1_000_000, Window: W})
	vm := func() int64 {
		info := r.conn.Info(r.ctx, "memory").Val()
		for _, line := range strings.Split(info, "\r\n") {
			if v, ok := strings.CutPrefix(line, "used_memory_vm_functions:"); ok {
				var n int64
				fmt.Sscan(v, &n)
				return n
			}
		}
		t.Fatal("no used_memory_vm_functions")
		return 0
	}
	items, _, err := r.s.resolve([]backend.Request{{Limit: z, Key: "k", Cost: 1}})
	if err != nil {
		t.Fatal(err)
	}
	decide := func(n int) {
		times := make([]int64, n)
		units := make([]uint32, n)
		for i := range times {
			times[i] = r.clock - W/2 + int64(i)
			units[i] = 1
		}
		if err := r.conn.Set(r.ctx, items[0].key, logValue(times, units, 0, 0, 0), time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
		cmd, _ := r.s.manyCmd(r.ctx, []*pending{{ctx: r.ctx, items: items}}, nil)
		args := slices.Clone(cmd.Args())
		args[0], args[1] = "fcall", functionName
		if err := r.conn.Do(r.ctx, args...).Err(); err != nil {
			t.Fatal(err)
		}
	}
	decide(40_000)
	before := vm()
	const sizes = 100
	for i := range sizes {
		decide(40_000 + 4*(i+1))
	}
	grown := vm() - before
	t.Logf("Functions' Lua memory grew %d bytes over %d sizes of logs of 40k events", grown, sizes)
	if grown > 4<<20 {
		t.Errorf("Functions' Lua memory grew %d bytes over %d sizes of logs (of 80 KB of room each): kept from call to call", grown, sizes)
	}
}

// A build without room logs (olderScript) decides a room log as the
// script does, and leaves a log of its own holding the same live events
// as the script leaves, with an expiry past its newest event's leaving.
func TestRoomLogOlderBuildPlanted(t *testing.T) {
	r := newRoomRig(t)
	const W = int64(time.Minute)
	for _, limit := range []int64{30, 40, 41, 50} {
		z := mustZone(t, r.s, fmt.Sprintf("l%d", limit), algorithms.NameSlidingWindow, algorithms.Policy{Limit: limit, Window: W})
		key := r.key(z, "k")
		for _, c := range roomCases(r.clock, W) {
			if !slices.Contains([]string{"right", "all-pruned", "some-pruned", "head-past-window", "base-far", "short-of-cap", "cap-huge"}, c.name) {
				continue // no version writes the others
			}
			var got [3]roomCall
			for _, db := range []int{0, 2} {
				if err := r.do(db, "set", key, c.v, "px", 600_000).Err(); err != nil {
					t.Fatal(err)
				}
				got[db] = r.decide(db, z, "k", 1)
			}
			if got[0].err != "" || got[2].err != "" || got[0].res != got[2].res || got[0].logged != got[2].logged {
				t.Errorf("%s, limit %d: the script decided %+v %s, the older build %+v %s", c.name, limit, got[0].res, got[0].err, got[2].res, got[2].err)
				continue
			}
			a, errA := readLog(got[0].value)
			b, errB := readLog(got[2].value)
			if (got[0].value == "") != (got[2].value == "") || errA != nil && got[0].value != "" || errB != nil && got[2].value != "" ||
				!slices.Equal(a.times, b.times) || !slices.Equal(a.units, b.units) || got[2].value != "" && b.tombs != 0 {
				t.Errorf("%s, limit %d: the script left %v %v (%v), the older build %v %v format %d (%v)", c.name, limit, a.times, a.units, errA, b.times, b.units, b.wide, errB)
				continue
			}
			if n := len(b.times); n > 0 {
				if left := time.Duration(b.times[n-1] + W - r.clock); time.Duration(got[2].expTime-got[2].t0)*time.Millisecond < left {
					t.Errorf("%s, limit %d: the older build's log expires in %d ms, its newest event leaves in %v", c.name, limit, got[2].expTime-got[2].t0, left)
				}
			}
		}
	}
}
