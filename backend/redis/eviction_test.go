package redis

import (
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// What each memory policy is logged as: a warning when Redis can evict
// (maxmemory set, any policy but noeviction: every Sluice key has an
// expiry, so volatile-* evicts them too), a note for noeviction, nothing
// without maxmemory.
func TestLogPolicy(t *testing.T) {
	for _, tc := range []struct {
		policy    string
		maxmemory int64
		level     zapcore.Level // -2: no line
		says      string
	}{
		{"allkeys-lru", 2 << 20, zapcore.WarnLevel, "redis evicts keys"},
		{"volatile-lru", 2 << 20, zapcore.WarnLevel, "redis evicts keys"},
		{"volatile-ttl", 1 << 30, zapcore.WarnLevel, "redis evicts keys"},
		{"allkeys-lfu", 1, zapcore.WarnLevel, "redis evicts keys"},
		{"allkeys-random", 2 << 20, zapcore.WarnLevel, "redis evicts keys"},
		{"noeviction", 2 << 20, zapcore.InfoLevel, "redis refuses writes"},
		{"allkeys-lru", 0, -2, ""},
		{"noeviction", 0, -2, ""},
	} {
		core, logs := observer.New(zapcore.DebugLevel)
		logPolicy(zap.New(core), nodePolicy{addr: "10.0.0.5:6379", policy: tc.policy, maxmemory: tc.maxmemory})
		all := logs.All()
		if tc.level == -2 {
			if len(all) != 0 {
				t.Errorf("%s, maxmemory %d: %d lines, want none", tc.policy, tc.maxmemory, len(all))
			}
			continue
		}
		if len(all) != 1 || all[0].Level != tc.level || !strings.HasPrefix(all[0].Message, tc.says) {
			t.Errorf("%s, maxmemory %d: %+v, want one %v line saying %q", tc.policy, tc.maxmemory, all, tc.level, tc.says)
			continue
		}
		f := all[0].ContextMap()
		if f["address"] != "10.0.0.5:6379" || f["maxmemory_policy"] != tc.policy || f["maxmemory"] != tc.maxmemory {
			t.Errorf("%s: fields %v", tc.policy, f)
		}
	}
}

func TestRefusedForGood(t *testing.T) {
	for _, tc := range []struct {
		err  error
		good bool
	}{
		{scriptError("NOPERM User sluice has no permissions to run the 'config|get' command"), true},
		{scriptError("ERR unknown command 'CONFIG', with args beginning with: 'GET' 'maxmemory*' "), true},
		{scriptError("LOADING Redis is loading the dataset in memory"), false},
		{errors.New("dial tcp 127.0.0.1:1: connect: connection refused"), false},
		{goredis.ErrClosed, false},
	} {
		if got := refusedForGood(tc.err); got != tc.good {
			t.Errorf("refusedForGood(%v) = %v, want %v", tc.err, got, tc.good)
		}
	}
}

// A config load does not wait for Redis to say its policy: against a
// server that takes connections and never answers, Provision returns with
// the check still waiting, and closing the module ends the check.
func TestEvictionCheckDoesNotHoldProvision(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	// Nothing else dials when a config loads: a connection is the check's.
	asked := make(chan struct{}, 1)
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			defer conn.Close()
			select {
			case asked <- struct{}{}:
			default:
			}
		}
	}()
	m, err := provisionModule(t, `{"addresses": ["`+l.Addr().String()+`"], "key_prefix": "`+uniquePrefix(t)+`"}`)
	if err != nil {
		t.Fatal(err)
	}
	select { // never answered; Provision returned already
	case <-asked:
	case <-time.After(30 * time.Second):
		t.Fatal("no check reached the server")
	}
	check := lookupCheck(t, m)
	if !check.running.Load() {
		t.Fatal("the check is not waiting for its answer")
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(evictionTimeout + 10*time.Second)
	for check.running.Load() {
		if time.Now().After(deadline) {
			t.Fatal("the check still runs after its pool was closed")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// lookupCheck is the eviction check of m's connection pool.
func lookupCheck(t *testing.T, m *Module) *evictionCheck {
	t.Helper()
	var check *evictionCheck
	clients.Range(func(k, v any) bool {
		if k == m.poolKey {
			check = v.(sharedClient).evict
			return false
		}
		return true
	})
	if check == nil {
		t.Fatal("no shared client for the module")
	}
	return check
}
