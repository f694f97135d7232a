package redis

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"reflect"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/backend/redis/internal/luasrc"
)

// beforePlain is the last commit whose script decided every batched
// request in decideKeys, with the same protocol but for the head of a
// request of modeMany and the short decision (manyNames).
const beforePlain = "4d198b3"

// manyNames are the protocol's names that beforePlain's script lacks or
// names otherwise: its head of a request of modeMany was always the
// number of keys (manyCountArgs), which oldHeads turns every head into,
// and it never replies a short decision, where the store reads a full one
// alike.
var manyNames = map[string]bool{"MANY_COUNT_ARGS": true, "MANY_HEAD_ARGS": true, "MANY_HEAD_COUNTED": true, "MANY_HEAD_SHADOW": true,
	"SHORT_REMAINING": true, "SHORT_RESET": true, "SHORT_VALUES": true}

// oldHeads is Lua that turns the arguments of a call (argv) into the
// protocol of beforePlain: a head that stands for a request of one key
// becomes the key count 1 and the key's arguments.
var oldHeads = fmt.Sprintf(`local function oldHeads(argv)
	if argv[%d] ~= %q then return argv end
	local a, o = {}, %d + tonumber(argv[%[3]d]) * %d
	for i = 1, o do a[i] = argv[i] end
	while o < #argv do
		local h = argv[o + 1]
		local zi, x1, cost = string.match(h, '^(%%d+)(%%a)(%%d+)$')
		if zi then
			if x1 == %q then x1 = %q else x1 = %q end
			for _, v in ipairs({'1', zi, cost, x1, ''}) do a[#a + 1] = v end
			o = o + 1
		else
			local n = 1 + tonumber(h) * %d
			for i = 1, n do a[#a + 1] = argv[o + i] end
			o = o + n
		end
	end
	return a
end
`, argMode, modeMany, headerArgs+manyZonesArgs, zoneArgs, manyHeadShadow, decideShadow, decideCounted, manyKeyArgs)

// scriptAt is the script of a commit (read from git), as a script and as
// a library of Functions, with its SHA1 and its function's name; both
// read the arguments of this protocol (oldHeads).
func scriptAt(t *testing.T, commit string) (src, lib, hash, name string) {
	t.Helper()
	out, err := exec.Command("git", "ls-tree", "--full-tree", "--name-only", commit+":backend/redis/lua").Output()
	if err != nil {
		t.Skipf("no git history of %s: %v", commit, err)
	}
	fsys := fstest.MapFS{}
	for _, f := range strings.Fields(string(out)) {
		text, err := exec.Command("git", "show", commit+":backend/redis/lua/"+f).Output()
		if err != nil {
			t.Fatal(err)
		}
		fsys[f] = &fstest.MapFile{Data: text}
	}
	text, p, err := luasrc.Join(fsys)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []luasrc.Protocol{p, protocol} {
		for k := range q {
			if p[k] != protocol[k] && !manyNames[k] {
				t.Fatalf("the script of %s speaks another protocol: %s is %q, here %q", commit, k, p[k], protocol[k])
			}
		}
	}
	text += oldHeads
	src = text + "return call(_G.KEYS, oldHeads(_G.ARGV))\n"
	sum := sha1.Sum([]byte(src))
	hash = hex.EncodeToString(sum[:])
	name = "sluice_" + hash
	_, rest, _ := strings.Cut(text, "\n")
	lib = "#!lua name=" + name + "\n" + rest + "redis.register_function('" + name + "', function(keys, argv) return call(keys, oldHeads(argv)) end)\n"
	return src, lib, hash, name
}

// A rolling upgrade: instances running the script before decidePlain and
// instances running it now decide the same keys in turn, by FCALL and by
// EVALSHA. Each request is decided so on database 0 and by the earlier
// script alone on database 1: the answers, the values and their expiries
// must be the same, over bucket, window and log zones, reloads, shadow
// requests, costs from 0 to huge and the clock stepping back.
func TestPlainRollingUpgrade(t *testing.T) {
	oldSrc, oldLib, oldHash, oldName := scriptAt(t, beforePlain)
	if oldName == functionName {
		t.Fatal("the script did not change")
	}
	ctx := context.Background()
	addr := standalone(t)
	var cs [2]*goredis.Client
	for db := range cs {
		cs[db] = goredis.NewClient(&goredis.Options{Addr: addr, DB: db, ContextTimeoutEnabled: true, PoolSize: 4})
		t.Cleanup(func() { cs[db].Close() })
	}
	if err := cs[0].Do(ctx, "function", "load", "replace", oldLib).Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs[0].Do(ctx, "function", "delete", oldName) })
	if err := cs[0].ScriptLoad(ctx, oldSrc).Err(); err != nil {
		t.Fatal(err)
	}
	if err := cs[0].ScriptLoad(ctx, scriptSource).Err(); err != nil {
		t.Fatal(err)
	}
	newID, newHash := functionID, scriptHash
	t.Cleanup(func() { functionID, scriptHash = newID, newHash })

	rng := rand.New(rand.NewPCG(4, uint64(time.Now().UnixNano())))
	tw := &twin{t: t, c: prng{rng}}
	clock := 1_764_460_000_000_000_000 + int64(rng.IntN(1<<30))*977
	prefix := uniquePrefix(t)
	algs := []string{algorithms.NameTokenBucket, algorithms.NameGCRA, algorithms.NameLeakyBucket,
		algorithms.NameFixedWindow, algorithms.NameSlidingWindow, algorithms.NameSlidingWindow}
	policies := make([]algorithms.Policy, len(algs))
	var stores [2]*Store
	var zones [2][]backend.Limit
	// load registers freshly drawn policies in a store of each database,
	// as a reload does; a draw the change refuses (a debt it could not
	// rebase exactly) is drawn again.
	load := func() {
		for range 100 {
			for i, alg := range algs {
				policies[i] = tw.policy(alg)
			}
			var next [2]*Store
			var nz [2][]backend.Limit
			refused := false
			for db := range next {
				s, err := New(cs[db], Options{KeyPrefix: prefix, Timeout: 10 * time.Second, NoCache: true,
					now: func() int64 { return clock }, ttlExtra: 3_600_000})
				if err != nil {
					t.Fatal(err)
				}
				next[db] = s
				for i, alg := range algs {
					z, err := s.Register(backend.LimitConfig{Name: fmt.Sprint("z", i), Algorithm: alg, Policy: policies[i]})
					if err != nil {
						refused = true
						break
					}
					nz[db] = append(nz[db], z)
				}
				if refused {
					break
				}
			}
			if refused {
				for _, s := range next {
					if s != nil {
						s.Close()
					}
				}
				continue
			}
			for db := range stores {
				if stores[db] != nil {
					stores[db].Close()
				}
			}
			stores, zones = next, nz
			return
		}
		t.Fatal("no policies accepted")
	}
	load()
	t.Cleanup(func() { stores[0].Close(); stores[1].Close() })

	// compareKeys compares every value and expiry of the two databases.
	compareKeys := func(step int) {
		t.Helper()
		keys, err := cs[0].Keys(ctx, prefix+"*").Result()
		if err != nil {
			t.Fatal(err)
		}
		keys1, err := cs[1].Keys(ctx, prefix+"*").Result()
		if err != nil {
			t.Fatal(err)
		}
		if len(keys) != len(keys1) {
			t.Fatalf("step %d: %d keys across the upgrade, %d before it", step, len(keys), len(keys1))
		}
		for _, k := range keys {
			var v [2]string
			var ttl [2]time.Duration
			for db := range cs {
				v[db], err = cs[db].Get(ctx, k).Result()
				if err != nil {
					t.Fatalf("step %d: %s: %v", step, k, err)
				}
				ttl[db] = cs[db].PTTL(ctx, k).Val()
			}
			if v[0] != v[1] {
				t.Fatalf("step %d: %s holds %q across the upgrade, %q before it", step, k, v[0], v[1])
			}
			if d := ttl[0] - ttl[1]; d < -time.Second || d > time.Second {
				t.Fatalf("step %d: %s expires in %v across the upgrade, %v before it", step, k, ttl[0], ttl[1])
			}
		}
	}

	names := []string{"a", "b", "10.0.0.1"}
	ways := []string{"new fcall", "old fcall", "new evalsha", "old evalsha"}
	for step := range 1500 {
		switch rng.IntN(40) {
		case 0:
			load()
		case 1:
			compareKeys(step)
		}
		n := 1 + rng.IntN(3)
		var reqs [2][]backend.Request
		for range n {
			zi, key, cost, shadow := rng.IntN(len(algs)), names[rng.IntN(len(names))], tw.costOf(), rng.IntN(6) == 0
			for db := range reqs {
				reqs[db] = append(reqs[db], backend.Request{Limit: zones[db][zi], Key: key, Cost: cost, Shadow: shadow})
			}
		}
		var allowed [2]bool
		var errs [2]string
		var out [2][]algorithms.Result
		way := ways[rng.IntN(len(ways))]
		for db := range stores {
			functionID, scriptHash = newID, newHash
			if db == 1 || strings.HasPrefix(way, "old") {
				functionID, scriptHash = oldName, oldHash
			}
			stores[db].noFunctions.Store(db == 0 && strings.HasSuffix(way, "evalsha"))
			out[db] = make([]algorithms.Result, n)
			var err error
			allowed[db], err = stores[db].Decide(ctx, reqs[db], out[db])
			if err != nil {
				errs[db] = err.Error()
			}
		}
		if allowed[0] != allowed[1] || errs[0] != errs[1] || !reflect.DeepEqual(out[0], out[1]) {
			t.Fatalf("step %d (%s, %+v): across the upgrade %v %q %+v, before it %v %q %+v",
				step, way, reqs[1], allowed[0], errs[0], out[0], allowed[1], errs[1], out[1])
		}
		switch rng.IntN(10) {
		case 0:
		case 1:
			clock -= int64(rng.IntN(1000)) // stepping back
		case 2:
			clock += policies[rng.IntN(len(policies))].Window
		default:
			clock += int64(rng.IntN(int(min(policies[rng.IntN(len(policies))].Window, 1<<40)) + 1))
		}
	}
	compareKeys(-1)
}
