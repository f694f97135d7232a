package redis

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
)

// plainCall is the line of decideMany that hands a request to
// decidePlain; genericScript is the script with that line sending every
// request to decideKeys.
const plainCall = "if not decidePlain(k0, n, out, at) then"

func genericScript(t *testing.T, src string) string {
	t.Helper()
	if strings.Count(src, plainCall) != 1 {
		t.Fatalf("the script does not call decidePlain once as %q", plainCall)
	}
	return strings.Replace(src, plainCall, "if true then", 1)
}

// The batched call decides a request of plain buckets, fixed windows and
// sliding logs in decidePlain and any other in decideKeys: the two must
// reply the same and leave the same values with the same expiries. The
// same calls run on two databases of one server, the script as it is on
// one and with decideKeys alone on the other, over random policies,
// reloads, max_events adjustments, costs (0, past the burst), shadow keys,
// the clock stepping back, requests of several keys and zones (queues,
// lock-outs among them: decideKeys's), and values put there by hand:
// written under another policy, another lineage, a time out of range, a
// forwarding mark, a key of another type, and logs (logValue) small and
// large, of each format, with events given back, pruned, in the future,
// or a base far back; in every other stretch of steps most keys are
// deleted before their requests, so decidePlain writes first (decideAbsent)
// then reads first again. Run by EVAL, and as Functions, whose tables
// outlive the call.
func TestDecidePlainAsDecideKeys(t *testing.T) {
	t.Run("script", func(t *testing.T) {
		testDecidePlain(t, [2][2]any{{"eval", scriptSource}, {"eval", genericScript(t, scriptSource)}})
	})
	t.Run("function", func(t *testing.T) {
		testDecidePlain(t, [2][2]any{{"fcall", functionName}, {"fcall", loadGeneric(t)}})
	})
}

// loadGeneric loads the script as a Function, and as another one (whose
// name it returns) with decideKeys alone.
func loadGeneric(t *testing.T) string {
	t.Helper()
	name := functionName + "_decidekeys"
	lib := genericScript(t, strings.ReplaceAll(functionSource, functionName, name))
	c := standaloneClient(t)
	for _, src := range []string{functionSource, lib} {
		if err := c.Do(context.Background(), "function", "load", "replace", src).Err(); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { c.Do(context.Background(), "function", "delete", name) })
	return name
}

// testDecidePlain runs the calls with heads[0] (FCALL and the function,
// or EVAL and the script) on database 0, and with heads[1] on database 1.
func testDecidePlain(t *testing.T, heads [2][2]any) {
	ctx := context.Background()
	c := goredis.NewClient(&goredis.Options{Addr: standalone(t), ContextTimeoutEnabled: true, PoolSize: 1})
	t.Cleanup(func() { c.Close() })
	conn := c.Conn()
	t.Cleanup(func() { conn.Close() })
	rng := rand.New(rand.NewPCG(19, uint64(time.Now().UnixNano())))
	tw := &twin{t: t, c: prng{rng}}
	tw.clock = 1_764_460_000_000_000_000 + int64(rng.IntN(1<<30))*977
	prefix := uniquePrefix(t)

	// Bucket and fixed window zones, some of two keys' scopes, and
	// zones decidePlain leaves to decideKeys.
	type spec struct {
		name, scope, alg string
		policy           algorithms.Policy
		lockout          backend.Lockout
	}
	var specs []spec
	const plain = 6 // the zones decidePlain may decide: b0 to b3, l0 and l1
	for i := range 4 {
		alg := tw.bucketAlg()
		if alg == algorithms.NameLeakyBucket {
			alg = algorithms.NameTokenBucket // a leaky bucket may draw max_delay: a queue
		}
		if i >= 2 && rng.IntN(2) == 0 {
			alg = algorithms.NameFixedWindow
		}
		scope := ""
		if i%2 == 1 {
			scope = "s"
		}
		specs = append(specs, spec{name: fmt.Sprintf("b%d", i), scope: scope, alg: alg})
	}
	specs = append(specs,
		spec{name: "l0", alg: algorithms.NameSlidingWindow},
		spec{name: "l1", scope: "s", alg: algorithms.NameSlidingWindow},
		spec{name: "q", alg: algorithms.NameLeakyBucket},
		spec{name: "w", alg: algorithms.NameFixedWindow},
		spec{name: "lk", alg: algorithms.NameTokenBucket, lockout: backend.Lockout{int64(time.Second)}})
	draw := func(s *spec) {
		s.policy = tw.policy(s.alg)
		if s.name == "q" {
			s.policy = algorithms.Policy{Limit: 5, Window: int64(time.Second), MaxDelay: int64(time.Second)}
		}
	}
	for i := range specs {
		draw(&specs[i])
	}
	var s *Store
	var zones []backend.Limit
	// load registers specs in a store of their own, as a reload does; it
	// reports false when a policy is refused (a debt the change could not
	// rebase exactly), and the store before it stays.
	load := func() bool {
		next, err := New(c, Options{KeyPrefix: prefix, Timeout: 10 * time.Second, now: func() int64 { return tw.clock }, ttlExtra: 3_600_000, NoCache: true})
		if err != nil {
			t.Fatal(err)
		}
		owner := new(int)
		var nz []backend.Limit
		for _, sp := range specs {
			z, err := next.Register(backend.LimitConfig{Name: sp.name, Scope: sp.scope, Algorithm: sp.alg, Policy: sp.policy, Lockout: sp.lockout, Owner: owner})
			if err != nil {
				next.Close()
				return false
			}
			nz = append(nz, z)
		}
		if s != nil {
			s.Close()
		}
		s, zones = next, nz
		return true
	}
	if !load() {
		t.Fatalf("zones refused: %+v", specs)
	}
	t.Cleanup(func() { s.Close() })

	names := []string{"a", "b", "c", "10.0.0.1"}
	// both runs cmds on database 0 then the same on database 1.
	both := func(cmds ...[]any) {
		t.Helper()
		for db := range 2 {
			if err := conn.Do(ctx, "select", db).Err(); err != nil {
				t.Fatal(err)
			}
			for _, a := range cmds {
				if err := conn.Do(ctx, a...).Err(); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	keyOf := func(zi int, name string) string {
		items, _, err := s.resolve([]backend.Request{{Limit: zones[zi], Key: name, Cost: 1}})
		if err != nil {
			t.Fatal(err)
		}
		return items[0].key
	}
	// plantLog puts a log by hand: some decidePlain decides, some it
	// must leave to decideKeys.
	plantLog := func(key string, w int64) {
		n := 1 + rng.IntN(100)
		if rng.IntN(3) == 0 {
			n = 128 + rng.IntN(500) // read in parts
			if rng.IntN(3) == 0 {
				n = []int{128, 129, 511, 512}[rng.IntN(4)] // at the edges of the first read and of a whole write
			}
		}
		// Times from two windows back on, some past the clock.
		from := tw.clock - 2*w
		if rng.IntN(8) == 0 {
			from = tw.clock - 60*24*int64(time.Hour) // the base past logTake's exact range
		}
		times := make([]int64, n)
		for i := range times {
			times[i] = from + rng.Int64N(2*w+int64(rng.IntN(3))*w/2+1)
		}
		if rng.IntN(2) == 0 {
			times[rng.IntN(n)] = tw.clock - w // leaving the window just now
			times[rng.IntN(n)] = tw.clock - w + 1
		}
		slices.Sort(times)
		units := make([]uint32, n)
		for i := range units {
			units[i] = 1
		}
		wide, tombs, head := byte(0), byte(0), uint32(rng.IntN(n+1))
		switch rng.IntN(8) {
		case 0: // format 2, an event given back
			wide = 2
			for i := range units {
				units[i] = uint32(1 + rng.IntN(3))
			}
			units[rng.IntN(n)] = 0
		case 1: // format 1, an older version's
			wide = 1
			for i := range units {
				units[i] = uint32(1 + rng.IntN(3))
			}
		case 2: // an older version's format 0 with events given back
			tombs = 1
		}
		v := logValue(times, units, wide, tombs, head)
		switch rng.IntN(12) {
		case 0: // a header whose units do not match its events
			binary.LittleEndian.PutUint64([]byte(v)[8:], math.Float64bits(float64(n+1)))
		case 1: // a base out of range
			binary.LittleEndian.PutUint64([]byte(v)[0:], math.Float64bits(float64(tw.clock/1e9-1e7)))
		case 2: // shorter than a header
			v = v[:rng.IntN(26)]
		case 3: // longer than its header says
			v += v[len(v)-1-rng.IntN(8):]
		}
		both([]any{"set", key, v})
	}
	// plant puts a value that decidePlain must leave to decideKeys, or a
	// log.
	plant := func() {
		zi := rng.IntN(plain)
		key := keyOf(zi, names[rng.IntN(len(names))])
		if zi >= 4 && rng.IntN(4) > 0 {
			plantLog(key, specs[zi].policy.Window)
			return
		}
		at := fmt.Sprint(tw.clock + int64(rng.IntN(1<<40)))
		switch rng.IntN(11) {
		case 0: // another policy of this lineage, or of none
			both([]any{"set", key, at + ":" + fmt.Sprint(1+rng.IntN(1<<30))})
		case 1: // another process's history
			both([]any{"set", key, at + ":1000000:abcdef012345:" + fmt.Sprint(1+rng.IntN(3))})
		case 2: // out of the exact range
			both([]any{"set", key, "1:1000000"})
		case 3: // a forwarding mark of a change of kind
			both([]any{"set", key, "mw:1000000000:5:" + fmt.Sprint(strings.Index(key, "{"))})
		case 4: // a key of another type
			both([]any{"del", key}, []any{"hset", key, "f", "v"})
		case 5: // out of the exact range, of the zone's current policy
			if err := conn.Do(ctx, "select", 0).Err(); err != nil {
				t.Fatal(err)
			}
			if v, err := conn.Get(ctx, key).Result(); err == nil && len(v) > 20 && v[19] == ':' {
				far := tw.clock + int64(2*rng.IntN(2)-1)*2e16 // 231 days
				both([]any{"set", key, fmt.Sprint(far) + v[19:]})
			}
		case 6: // the field after the time emptied: a window without its count
			if err := conn.Do(ctx, "select", 0).Err(); err != nil {
				t.Fatal(err)
			}
			if v, err := conn.Get(ctx, key).Result(); err == nil && len(v) > 20 && v[19] == ':' {
				rest := v[20:]
				if j := strings.IndexByte(rest, ':'); j >= 0 {
					both([]any{"set", key, v[:20] + rest[j:]})
				}
			}
		default:
			both([]any{"del", key})
		}
	}
	// compare checks both databases hold the same keys, values and
	// expiries: each expiry (PX) is known to lie between the Unix ms the
	// server read just before and just after the call that wrote it
	// (sent), and those of the two must overlap. A value that did not
	// change was not written again; one that changed under the same
	// expiry may keep its expiry (a log's header is written in place)
	// or have it set again to the same instant: either range.
	type seen struct {
		v      string
		lo, hi int64 // the expiry; -1 for none
		exp    int64 // PEXPIRETIME
	}
	last := [2]map[string]seen{{}, {}}
	compare := func(sent [2][2]int64, step int) {
		t.Helper()
		for db := range 2 {
			if err := conn.Do(ctx, "select", db).Err(); err != nil {
				t.Fatal(err)
			}
			keys, err := conn.Keys(ctx, prefix+"*").Result()
			if err != nil {
				t.Fatal(err)
			}
			now := map[string]seen{}
			for _, k := range keys {
				v := conn.Type(ctx, k).Val()
				if v == "string" {
					v = conn.Get(ctx, k).Val()
				}
				exp, err := conn.Do(ctx, "pexpiretime", k).Int64()
				if err != nil {
					t.Fatal(err)
				}
				was, ok := last[db][k]
				switch {
				case ok && was.v == v:
					now[k] = was
				case ok && was.exp == exp && exp > 0:
					now[k] = seen{v, min(was.lo, exp-sent[db][1]), max(was.hi, exp-sent[db][0]), exp}
				case exp > 0:
					now[k] = seen{v, exp - sent[db][1], exp - sent[db][0], exp}
				default:
					now[k] = seen{v, -1, -1, exp}
				}
			}
			last[db] = now
		}
		for k, s0 := range last[0] {
			s1, ok := last[1][k]
			if !ok || s0.v != s1.v {
				t.Fatalf("step %d: %s is %q by decidePlain, %q by decideKeys", step, k, s0.v, s1.v)
			}
			if (s0.lo < 0) != (s1.lo < 0) || s0.lo > s1.hi || s1.lo > s0.hi {
				t.Fatalf("step %d: %s expires %d to %d ms after its call by decidePlain, %d to %d by decideKeys", step, k, s0.lo, s0.hi, s1.lo, s1.hi)
			}
		}
		if len(last[0]) != len(last[1]) {
			t.Fatalf("step %d: keys by decidePlain %v, by decideKeys %v", step, last[0], last[1])
		}
	}

	for step := range 1500 {
		switch rng.IntN(30) {
		case 0: // a reload changes some policies
			was := slices.Clone(specs)
			for i := range specs {
				if rng.IntN(2) == 0 {
					draw(&specs[i])
				}
			}
			if !load() {
				specs = was
			}
			continue
		case 1:
			zi := rng.IntN(plain)
			if err := zones[zi].(backend.Adjustable).SetMaxEvents(int64(1 + rng.IntN(20))); err != nil {
				t.Fatal(err)
			}
			continue
		case 2, 3:
			plant()
			continue
		case 4, 5, 6, 7, 8:
			switch rng.IntN(5) {
			case 0:
				tw.clock++
			case 1:
				tw.clock -= int64(rng.IntN(1000))
				if rng.IntN(3) == 0 {
					tw.clock -= int64(rng.IntN(int(specs[rng.IntN(len(specs))].policy.Window)))
				}
			default:
				tw.clock += int64(rng.IntN(int(specs[rng.IntN(len(specs))].policy.Window)))
			}
			continue
		}
		// In every other stretch of steps most keys are absent when a
		// request of one key reads them, as they are on a server whose
		// clients come and go: decidePlain writes first (decideAbsent)
		// while they are, and reads first after a stretch of keys
		// present, the key of another type among them.
		cold := step/150%2 == 0
		live := make([]*pending, 1+rng.IntN(8))
		for i := range live {
			reqs := make([]backend.Request, 1+rng.IntN(3))
			if rng.IntN(2) == 0 {
				reqs = reqs[:1]
			}
			for j := range reqs {
				zi := rng.IntN(plain)
				if rng.IntN(8) == 0 {
					zi = rng.IntN(len(zones))
				}
				reqs[j] = backend.Request{Limit: zones[zi], Key: names[rng.IntN(len(names))], Cost: tw.costOf(), Shadow: rng.IntN(6) == 0}
				if cold && rng.IntN(4) > 0 {
					both([]any{"del", keyOf(zi, reqs[j].Key)})
				}
			}
			items, _, err := s.resolve(reqs)
			if err != nil {
				t.Fatal(err)
			}
			live[i] = &pending{ctx: ctx, items: items}
		}
		cmd, _ := s.manyCmd(ctx, live, nil)
		var replies [2]any
		var errs [2]string
		var sent [2][2]int64
		for db, head := range heads {
			args := slices.Clone(cmd.Args())
			args[0], args[1] = head[0], head[1]
			var before, after *goredis.TimeCmd
			var call *goredis.Cmd
			if _, err := conn.Pipelined(ctx, func(p goredis.Pipeliner) error {
				p.Select(ctx, db)
				before = p.Time(ctx)
				call = p.Do(ctx, args...)
				after = p.Time(ctx)
				return nil
			}); err != nil && err != call.Err() {
				t.Fatal(err)
			}
			replies[db] = call.Val()
			if call.Err() != nil {
				errs[db] = call.Err().Error()
			}
			sent[db] = [2]int64{before.Val().UnixMilli(), after.Val().UnixMilli()}
		}
		if !reflect.DeepEqual(replies[0], replies[1]) || errs[0] != errs[1] {
			t.Fatalf("step %d: decidePlain replied %q %v, decideKeys %q %v", step, replies[0], errs[0], replies[1], errs[1])
		}
		compare(sent, step)
	}
}

// logValue is a sliding log as lua/07-slidinglog.lua stores it: events
// at times (ns, not decreasing) of units (0: given back) in format wide,
// head of them pruned.
func logValue(times []int64, units []uint32, wide, tombs byte, head uint32) string {
	base := times[0] / 1e9 * 1e9
	var sum uint32
	for _, u := range units[head:] {
		sum += u
	}
	b := binary.LittleEndian.AppendUint64(nil, math.Float64bits(float64(base/1e9)))
	b = binary.LittleEndian.AppendUint64(b, math.Float64bits(float64(sum)))
	b = append(b, wide, tombs)
	b = binary.LittleEndian.AppendUint32(b, head)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(times)))
	fen := make([]float64, len(units))
	for i, u := range units {
		fen[i] += float64(u)
		if j := i + (i+1)&-(i+1); j < len(fen) {
			fen[j] += fen[i]
		}
	}
	for i, t := range times {
		off := float64(t - base)
		if units[i] == 0 {
			off = -off - 1
		}
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(off))
		if wide == 0 {
			continue
		}
		u := units[i]
		if u == 0 {
			u = 1
		}
		b = binary.LittleEndian.AppendUint32(b, u)
		if wide == 2 {
			b = binary.LittleEndian.AppendUint64(b, math.Float64bits(fen[i]))
		}
	}
	return string(b)
}

// plainOneRig decides a request of one log key by the script as it is
// and by decideKeys alone (loadGeneric), on databases 0 and 1 of one
// server, from the same value put there by hand.
type plainOneRig struct {
	t       *testing.T
	ctx     context.Context
	s       *Store
	conn    *goredis.Conn
	generic string
	clock   int64
}

func newPlainOneRig(t *testing.T) *plainOneRig { return newRig(t, 1_764_460_000_000_000_000, 0) }

// newRig is a rig whose store runs on clock and writes every expiry
// extra ms late.
func newRig(t *testing.T, clock, extra int64) *plainOneRig {
	c := standaloneClient(t)
	r := &plainOneRig{t: t, ctx: context.Background(), generic: loadGeneric(t), clock: clock}
	s, err := New(c, Options{KeyPrefix: uniquePrefix(t), Timeout: 10 * time.Second, now: func() int64 { return r.clock }, ttlExtra: extra, NoCache: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	r.s, r.conn = s, c.Conn()
	t.Cleanup(func() { r.conn.Close() })
	return r
}

// do runs a command on database db.
func (r *plainOneRig) do(db int, args ...any) *goredis.Cmd {
	r.t.Helper()
	if err := r.conn.Do(r.ctx, "select", db).Err(); err != nil {
		r.t.Fatal(err)
	}
	return r.conn.Do(r.ctx, args...)
}

// check puts value at the key name of zone z, decides a request of cost 1
// on it both ways, and reports any difference of the replies, the values
// left or their expiries.
func (r *plainOneRig) check(z backend.Limit, name string, value []byte) {
	t := r.t
	items, _, err := r.s.resolve([]backend.Request{{Limit: z, Key: name, Cost: 1}})
	if err != nil {
		t.Fatal(err)
	}
	cmd, _ := r.s.manyCmd(r.ctx, []*pending{{ctx: r.ctx, items: items}}, nil)
	var got [2]string
	var expiry [2]time.Duration
	for db, fn := range []string{functionName, r.generic} {
		if err := r.conn.Do(r.ctx, "select", db).Err(); err != nil {
			t.Fatal(err)
		}
		if err := r.conn.Do(r.ctx, "set", items[0].key, value, "px", 600_000).Err(); err != nil {
			t.Fatal(err)
		}
		args := slices.Clone(cmd.Args())
		args[0], args[1] = "fcall", fn
		reply, err := r.conn.Do(r.ctx, args...).Result()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		got[db] = fmt.Sprintf("reply %x value %x", reply, r.conn.Get(r.ctx, items[0].key).Val())
		expiry[db] = r.conn.PTTL(r.ctx, items[0].key).Val()
	}
	if got[0] != got[1] || (expiry[0]-expiry[1]).Abs() > 100*time.Millisecond {
		t.Errorf("%s: logPlainOne %.300s expiry %v, decideKeys %.300s expiry %v", name, got[0], expiry[0], got[1], expiry[1])
	}
}

// A log of single units read in two parts by a request of one key
// (logPlainOne: the first KB of events, then the rest up to 4 KB), at the
// edges of the first read, and with bytes past the events its header
// counts, which leave it to decideKeys: the reply, value and expiry are
// decideKeys's alone.
func TestPlainOneLogInParts(t *testing.T) {
	r := newPlainOneRig(t)
	const W = int64(time.Minute)
	z := mustZone(t, r.s, "l", algorithms.NameSlidingWindow, algorithms.Policy{Limit: 600, Window: W})
	for _, n := range []int{127, 128, 129, 300, 511, 512} {
		for _, extra := range []int{0, 1, 8} {
			for _, head := range []int{0, n / 2} {
				times := make([]int64, n)
				units := make([]uint32, n)
				for i := range times {
					// The first eighth has left the window.
					times[i] = r.clock - W - W/8 + int64(i)*W/int64(n)
					units[i] = 1
				}
				v := logValue(times, units, 0, 0, uint32(head)) + strings.Repeat("\x07", extra)
				r.check(z, fmt.Sprintf("n%d-x%d-h%d", n, extra, head), []byte(v))
			}
		}
	}
}

// A log of single units whose header matches its events but one of whose
// events is not a number (a value no version writes, put there by hand):
// logPlainOne must decide it as decideKeys does, which reads its events
// one by one (logEvent) once the log is past the first read, and counts
// such an event as live and then pruned. The reply, the value and the
// expiry are decideKeys's alone, first read or in parts, the event oldest
// or newest.
func TestPlainOneLogNaNEvent(t *testing.T) {
	r := newPlainOneRig(t)
	const W = int64(time.Minute)
	z := mustZone(t, r.s, "l", algorithms.NameSlidingWindow, algorithms.Policy{Limit: 128, Window: W})
	for _, n := range []int{100, 200} {
		for _, at := range []int{0, 5, n - 1} {
			times := make([]int64, n)
			units := make([]uint32, n)
			for i := range times {
				times[i] = r.clock - W/2 + int64(i)
				units[i] = 1
			}
			b := []byte(logValue(times, units, 0, 0, 0))
			binary.LittleEndian.PutUint64(b[26+8*at:], math.Float64bits(math.NaN()))
			r.check(z, fmt.Sprintf("n%d-nan%d", n, at), b)
		}
	}
}
