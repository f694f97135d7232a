package redis

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
)

// A log with room, read by a build before such logs: it decides it as
// this build does (the same reply), and leaves the same live events in
// a log of format 2 without room; this build then decides that log as it
// decides the log with room. Logs of 32 to 400 live events, some pruned,
// allowed and denied, the room used up or not.
func TestRoomLogOlderBuild(t *testing.T) {
	r := newPlainOneRig(t)
	older := loadOlder(t)
	const W = int64(time.Minute)
	for _, live := range []int{31, 32, 100, 400} {
		for _, limit := range []int{live + 1, live + 2, live + 50} {
			for _, steps := range []int{1, 5, 40} {
				name := fmt.Sprintf("live%d-limit%d-steps%d", live, limit, steps)
				z := mustZone(t, r.s, "room"+name, algorithms.NameSlidingWindow, algorithms.Policy{Limit: int64(limit), Window: W})
				items, _, err := r.s.resolve([]backend.Request{{Limit: z, Key: "k", Cost: 1}})
				if err != nil {
					t.Fatal(err)
				}
				key := items[0].key
				// live events in the last half window, after a quarter as
				// many that have left it.
				pruned := live / 4
				times := make([]int64, pruned+live)
				units := make([]uint32, len(times))
				for i := range times {
					times[i] = r.clock - 2*W + int64(i)
					if i >= pruned {
						times[i] = r.clock - W/2 + int64(i-pruned)*W/int64(4*live)
					}
					units[i] = 1
				}
				r.val(0, "set", key, logValue(times, units, 0, 0, 0), "px", 600_000)
				// This build's steps, a second apart: the log gains room.
				for range steps {
					r.clock += int64(time.Second)
					r.call(0, functionName, items)
				}
				v := r.val(0, "get", key).(string)
				if d, err := readLog(v); err != nil || d.magic != 1380994131 && live >= 31 {
					t.Fatalf("%s: no room after %d steps: %x", name, steps, v[:60])
				}
				r.clock += int64(time.Second)
				r.val(1, "set", key, v, "px", 600_000)
				for _, fn := range [][2]string{{functionName, older}, {functionName, functionName}} {
					got := [2]string{r.call(0, fn[0], items), r.call(1, fn[1], items)}
					if got[0] != got[1] {
						t.Fatalf("%s (%s): this build %s, the other %s", name, fn[1], got[0], got[1])
					}
					ev := [2][]int64{}
					for db := range 2 {
						d, err := readLog(r.val(db, "get", key).(string))
						if err != nil {
							t.Fatalf("%s (%s): %v", name, fn[1], err)
						}
						ev[db] = d.times
					}
					if !slices.Equal(ev[0], ev[1]) {
						t.Fatalf("%s (%s): events differ: %v and %v", name, fn[1], ev[0], ev[1])
					}
					r.clock += int64(time.Second) / 3
				}
			}
		}
	}
}

// val runs a command on database db and returns its value.
func (r *plainOneRig) val(db int, args ...any) any {
	r.t.Helper()
	v, err := r.do(db, args...).Result()
	if err != nil {
		r.t.Fatalf("%v: %v", args, err)
	}
	return v
}

// call decides the request of items on database db by the function fn,
// at r.clock, and returns its reply.
func (r *plainOneRig) call(db int, fn string, items []item) string {
	r.t.Helper()
	cmd, _ := r.s.manyCmd(r.ctx, []*pending{{ctx: r.ctx, items: items}}, nil)
	args := slices.Clone(cmd.Args())
	args[0], args[1] = "fcall", fn
	return fmt.Sprintf("%x", r.val(db, args...))
}

// Logs that gain room and keep it, against the memory store: a key of
// many requests a window, the clock moving by random steps (now and then
// back), requests denied at the limit, refunds, grants, a limit lowered
// and raised by reloads, and requests of two keys at once (decideKeys). Every
// reply must be the memory store's, and a key must never expire before
// its newest event has left the window.
func TestDifferentialRoomLog(t *testing.T) {
	client := standaloneClient(t)
	const W = int64(time.Second)
	spec := func(limit int64) zoneSpec {
		return zoneSpec{name: "room", alg: algorithms.NameSlidingWindow, policy: algorithms.Policy{Limit: limit, Window: W}}
	}
	tw := newTwinWith(t, client, false, t0, spec(300))
	rooms := 0
	expAt, expires := map[string]int64{}, map[string]int64{}
	var lastMs, endMs int64
	for step := range 6000 {
		// Each step in milliseconds of the server's clock of its own
		// (lastMs, read before it writes anything, to endMs): two writes
		// of one expiry in one of its milliseconds could not be told
		// from none.
		for lastMs <= endMs {
			lastMs = serverMs(t, client)
		}
		switch c := tw.c.intn(1000); {
		case c < 4:
			tw.clock -= int64(tw.c.intn(50)) * int64(time.Millisecond)
		case c < 8:
			tw.reloadTo(false, spec(int64(40+tw.c.intn(400))))
		case c < 12:
			// An operator's grant gives back the newest units; both
			// stores must then inspect alike.
			key := fmt.Sprintf("k%d", tw.c.intn(2))
			units := int64(1 + tw.c.intn(40))
			mem, red := backend.Admin(tw.cur.mem), backend.Admin(tw.cur.red)
			mu, merr := mem.Grant(context.Background(), tw.cur.memZ[0], key, units)
			ru, rerr := red.Grant(context.Background(), tw.cur.redZ[0], key, units)
			if merr != nil || rerr != nil || mu != ru {
				t.Fatalf("step %d: grant %d %s: memory %+v %v, redis %+v %v", step, units, key, mu, merr, ru, rerr)
			}
			mi, merr := mem.Inspect(context.Background(), tw.cur.memZ[0], key)
			ri, rerr := red.Inspect(context.Background(), tw.cur.redZ[0], key)
			if merr != nil || rerr != nil || mi != ri {
				t.Fatalf("step %d: inspect after a grant: memory %+v %v, redis %+v %v", step, mi, merr, ri, rerr)
			}
			tw.granted = nil // what a refund would give back may be granted already
		case c < 20 && step > 5400 && len(tw.granted) > 0:
			// (Last: a refund rewrites the log in format 2, which
			// keeps it until it idles.)
			tw.giveBack(tw.c.intn(len(tw.granted)))
		default:
			tw.clock += int64(tw.c.intn(8)) * int64(time.Millisecond)
		}
		key := fmt.Sprintf("k%d", tw.c.intn(2))
		if tw.c.intn(20) == 0 {
			tw.do(ask{0, "k0", 1, false}, ask{0, "k1", 1, false})
		} else {
			tw.do(ask{0, key, 1, false})
		}
		if len(tw.granted) > 64 {
			tw.granted = tw.granted[len(tw.granted)-64:]
		}
		for _, k := range []string{"k0", "k1"} {
			items, _, err := tw.cur.red.resolve([]backend.Request{{Limit: tw.cur.redZ[0], Key: k, Cost: 1}})
			if err != nil {
				t.Fatal(err)
			}
			v, err := client.Get(context.Background(), items[0].key).Result()
			if err != nil {
				continue // none
			}
			d, err := readLog(v)
			if err != nil {
				t.Fatalf("step %d: %s: %v", step, k, err)
			}
			times := d.times
			if d.magic == 1380994131 {
				rooms++
			}
			if len(times) == 0 {
				continue
			}
			// The server's clock runs the expiry, the test's the events:
			// an expiry that moved was written by this step, at the
			// test's clock, and holds till then plus what was left of it
			// when the step started (the server's millisecond then, no
			// later than the write: a step that takes long under load
			// cannot make an expiry look early), less the twin's hour
			// (ttlExtra).
			abs := client.Do(context.Background(), "pexpiretime", items[0].key).Val().(int64)
			if abs != expAt[k] {
				expAt[k], expires[k] = abs, tw.clock+(abs-lastMs-3_600_000)*int64(time.Millisecond)
			}
			// (A millisecond either way: the server keeps expiries in
			// whole milliseconds.)
			if newest := times[len(times)-1]; expires[k] < newest+W-int64(time.Millisecond) {
				t.Fatalf("step %d: %s expires at %d, its newest event leaves the window at %d\n%s", step, k, expires[k], newest+W, strings.Join(tw.log[max(0, len(tw.log)-6):], "\n"))
			}
		}
		endMs = serverMs(t, client)
	}
	if rooms < 1000 {
		t.Fatalf("only %d checks saw a log with room", rooms)
	}
}

// serverMs is the server's clock, in Unix ms.
func serverMs(t *testing.T, c *goredis.Client) int64 {
	t.Helper()
	srv, err := c.Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return srv.UnixMilli()
}
