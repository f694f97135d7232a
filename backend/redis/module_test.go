package redis

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
)

func parseModule(t *testing.T, input string) (*Module, error) {
	t.Helper()
	m := new(Module)
	err := m.UnmarshalCaddyfile(caddyfile.NewTestDispenser(input))
	return m, err
}

func TestModuleCaddyfile(t *testing.T) {
	m, err := parseModule(t, `redis {
		address 10.0.0.1:6379 10.0.0.2:6379
		address 10.0.0.3:6379
		cluster
		username sluice
		password {env.REDIS_PASSWORD}
		tls {
			ca /etc/ssl/redis-ca.pem
			server_name redis.internal
		}
		key_prefix rl:
		timeout 50ms
		pool_size 64
	}`)
	if err != nil {
		t.Fatal(err)
	}
	got := string(caddyconfig.JSONModuleObject(m, "name", "redis", nil))
	want := `{"addresses":["10.0.0.1:6379","10.0.0.2:6379","10.0.0.3:6379"],"cluster":true,"key_prefix":"rl:","name":"redis","password":"{env.REDIS_PASSWORD}","pool_size":64,"timeout":50000000,"tls":{"ca":"/etc/ssl/redis-ca.pem","server_name":"redis.internal"},"username":"sluice"}`
	if got != want {
		t.Fatalf("adapted to\n%s\nwant\n%s", got, want)
	}

	m, err = parseModule(t, "redis {\n\tsentinel mymaster 10.0.0.1:26379 10.0.0.2:26379\n\tdb 2\n}")
	if err != nil || m.Sentinel == nil || m.Sentinel.MasterName != "mymaster" || len(m.Sentinel.Addresses) != 2 || m.DB != 2 {
		t.Fatalf("sentinel: %+v %v", m.Sentinel, err)
	}
}

func TestModuleCaddyfileErrors(t *testing.T) {
	for _, tt := range []struct{ input, want string }{
		{"redis extra", "wrong argument count"},
		{"redis {\n\tport 6379\n}", `unrecognized option "port"`},
		{"redis {\n\turl a\n\turl b\n}", "url given twice"},
		{"redis {\n\tdb two\n}", `db must be a whole number ≥ 0, got "two"`},
		{"redis {\n\ttimeout 0s\n}", `invalid timeout "0s"`},
		{"redis {\n\tsentinel mymaster\n}", "sentinel <master_name> <sentinel_address...>"},
		{"redis {\n\ttls {\n\t\tverify no\n\t}\n}", `unrecognized tls option "verify"`},
		{"redis {\n\tcluster yes\n}", "wrong argument count"},
	} {
		if _, err := parseModule(t, tt.input); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%q: error %v, want one containing %q", tt.input, err, tt.want)
		}
	}
}

func provisionModule(t *testing.T, raw string) (*Module, error) {
	t.Helper()
	m := new(Module)
	if err := json.Unmarshal([]byte(raw), m); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(cancel)
	if err := m.Provision(ctx); err != nil {
		return nil, err
	}
	t.Cleanup(func() { _ = m.Close() })
	return m, nil
}

func TestModuleProvisionErrors(t *testing.T) {
	for _, tt := range []struct{ raw, want string }{
		{`{"addresses": ["a:1", "b:2"]}`, "several addresses are the seeds of a Redis Cluster: add cluster"},
		{`{"url": "redis://x:6379", "addresses": ["a:1"]}`, "url replaces addresses"},
		{`{"url": "http://x"}`, "redis: url:"},
		{`{"cluster": true, "db": 1}`, "only database 0"},
		{`{"cluster": true, "sentinel": {"master_name": "m", "addresses": ["a:1"]}}`, "either cluster or sentinel"},
		{`{"sentinel": {"master_name": "m"}}`, "sentinel needs a master name and at least one Sentinel address"},
		{`{"timeout": -1}`, "timeout must be positive"},
		{`{"pool_size": -1}`, "pool_size must be at least 1"},
		{`{"tls": {"ca": "/nonexistent/ca.pem"}}`, "tls ca:"},
		{`{"key_prefix": "sluice{"}`, `redis: key_prefix "sluice{": a { starts the hash tag`},
	} {
		if _, err := provisionModule(t, tt.raw); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: error %v, want one containing %q", tt.raw, err, tt.want)
		}
	}
}

// Secrets come from the environment at provision time; two modules naming
// the same Redis share one client, closed when the last lets go; the
// module decides through the real server.
func TestModuleSharesClientAndDecides(t *testing.T) {
	needRedis(t)
	addr := standalone(t)
	t.Setenv("SLUICE_TEST_REDIS_ADDR", addr)
	raw := `{"addresses": ["{env.SLUICE_TEST_REDIS_ADDR}"], "key_prefix": "` + uniquePrefix(t) + `", "timeout": "5s"}`
	a, err := provisionModule(t, raw)
	if err != nil {
		t.Fatal(err)
	}
	b, err := provisionModule(t, raw)
	if err != nil {
		t.Fatal(err)
	}
	if a.client != b.client {
		t.Fatal("two modules naming the same Redis made two clients")
	}
	if refs, _ := clients.References(a.poolKey); refs != 2 {
		t.Fatalf("%d references to the shared client, want 2", refs)
	}

	z, err := a.Register(backend.LimitConfig{Name: "module_decides", Algorithm: algorithms.NameTokenBucket, Policy: algorithms.Policy{Limit: 2, Window: int64(3600e9)}})
	if err != nil {
		t.Fatal(err)
	}
	var allowed []bool
	for range 3 {
		out := make([]algorithms.Result, 1)
		ok, err := a.Decide(context.Background(), []backend.Request{{Limit: z, Key: "k", Cost: 1}}, out)
		if err != nil {
			t.Fatal(err)
		}
		allowed = append(allowed, ok)
	}
	if !allowed[0] || !allowed[1] || allowed[2] {
		t.Fatalf("decisions %v, want two allowed then denied", allowed)
	}

	key := a.poolKey
	_ = a.Close()
	if refs, ok := clients.References(key); !ok || refs != 1 {
		t.Fatalf("after one Close: %d references (present %v), want 1", refs, ok)
	}
	_ = b.Close()
	if _, ok := clients.References(key); ok {
		t.Fatal("the client outlived its last user")
	}
	if err := b.client.Ping(context.Background()).Err(); err == nil {
		t.Fatal("the shared client is still open after its last user closed")
	}
}

// A sliding_window whose cost a placeholder sets loads, as every
// algorithm does with a constant cost or a placeholder: its log finds a
// denied request's retry time in O(log n) reads, whatever the costs.
func TestModuleLoadsVariableCostLogs(t *testing.T) {
	m, err := provisionModule(t, `{"addresses": ["127.0.0.1:1"], "key_prefix": "`+uniquePrefix(t)+`"}`)
	if err != nil {
		t.Fatal(err)
	}
	p := algorithms.Policy{Limit: 1_000_000, Window: int64(3600e9)}
	for _, c := range []struct {
		alg  string
		cost int64
	}{{algorithms.NameSlidingWindow, 0}, {algorithms.NameSlidingWindow, 1}, {algorithms.NameSlidingWindow, 5}, {algorithms.NameTokenBucket, 0}, {algorithms.NameSlidingCounter, 0}} {
		if _, err := m.Register(backend.LimitConfig{Name: fmt.Sprintf("varlog_%s_%d", c.alg, c.cost), Algorithm: c.alg, Policy: p, Cost: c.cost}); err != nil {
			t.Fatalf("%s with cost %d: %v", c.alg, c.cost, err)
		}
	}
}
