package shard

import (
	"context"
	"fmt"
	"maps"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
)

func upstreams(n int) []*reverseproxy.Upstream {
	pool := make([]*reverseproxy.Upstream, n)
	for i := range pool {
		pool[i] = &reverseproxy.Upstream{Host: new(reverseproxy.Host), Dial: fmt.Sprintf("10.0.0.%d:8080", i+1)}
	}
	return pool
}

func all(*reverseproxy.Upstream) bool { return true }

// shardOf is the set of upstreams pick ever returns for key when all are
// up: with every upstream idle, ties are broken at random, so 200 draws
// reach each of k=2 upstreams with probability 1-2^-199.
func shardOf(pool []*reverseproxy.Upstream, key string, k int) []string {
	seen := map[string]bool{}
	for range 200 {
		seen[pick(pool, key, k, true, all).Dial] = true
	}
	out := make([]string, 0, len(seen))
	for d := range seen {
		out = append(out, d)
	}
	slices.Sort(out)
	return out
}

func tenants(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("tenant-%d", i)
	}
	return out
}

// The shard of a tenant depends on its key and the upstreams' addresses,
// not on their order in the config, and holds exactly k upstreams.
func TestShardStableAcrossOrder(t *testing.T) {
	pool := upstreams(8)
	reversed := slices.Clone(pool)
	slices.Reverse(reversed)
	rotated := append(slices.Clone(pool[3:]), pool[:3]...)
	for _, tenant := range tenants(100) {
		want := shardOf(pool, tenant, 2)
		if len(want) != 2 {
			t.Fatalf("%s: shard %v, want 2 upstreams", tenant, want)
		}
		for _, p := range [][]*reverseproxy.Upstream{pool, reversed, rotated} {
			if got := shardOf(p, tenant, 2); !slices.Equal(got, want) {
				t.Fatalf("%s: shard %v in another order, %v before", tenant, got, want)
			}
		}
	}
}

// Over 100 tenants with n=8 and k=2: every upstream serves some tenants,
// no upstream carries far more than its 100*2/8 = 25, many of the 28
// shards are used, and the share of tenants with exactly a noisy tenant's
// shard is near 1/28 (3.6%; 3 or 4 of 100 expected).
func TestShardSpreadAndOverlap(t *testing.T) {
	pool := upstreams(8)
	perUpstream := map[string]int{}
	perShard := map[string]int{}
	shards := map[string]string{}
	for _, tenant := range tenants(100) {
		s := shardOf(pool, tenant, 2)
		for _, d := range s {
			perUpstream[d]++
		}
		shards[tenant] = strings.Join(s, ",")
		perShard[shards[tenant]]++
	}
	if len(perUpstream) != 8 {
		t.Fatalf("%d of 8 upstreams used: %v", len(perUpstream), perUpstream)
	}
	for d, c := range perUpstream {
		// 25 expected; binomial(100, 1/4) has sd 4.3: 10..40 is 3.5 sd.
		if c < 10 || c > 40 {
			t.Errorf("upstream %s serves %d tenants, want near 25", d, c)
		}
	}
	if len(perShard) < 20 {
		t.Errorf("%d distinct shards over 100 tenants, want most of the 28", len(perShard))
	}
	// Averaged over every tenant as the noisy one, the fraction of the
	// other 99 that share its whole shard estimates P = 1/28.
	full, partial := 0, 0
	for noisy, ns := range shards {
		for other, os := range shards {
			if other == noisy {
				continue
			}
			if os == ns {
				full++
			} else if overlaps(ns, os) {
				partial++
			}
		}
	}
	pairs := float64(100 * 99)
	fullFrac, partialFrac := float64(full)/pairs, float64(partial)/pairs
	t.Logf("full overlap %.4f (1/28 = %.4f), partial %.4f (12/28 = %.4f), %d shards used", fullFrac, 1.0/28, partialFrac, 12.0/28, len(perShard))
	if math.Abs(fullFrac-1.0/28) > 0.02 {
		t.Errorf("fraction of tenants sharing a noisy tenant's whole shard %.4f, want about 1/28 = %.4f", fullFrac, 1.0/28)
	}
	// A shard shares exactly one upstream with 2*6 = 12 of the other 27.
	if math.Abs(partialFrac-12.0/28) > 0.08 {
		t.Errorf("fraction sharing one upstream %.4f, want about 12/28 = %.4f", partialFrac, 12.0/28)
	}
}

func overlaps(a, b string) bool {
	for _, d := range strings.Split(a, ",") {
		if slices.Contains(strings.Split(b, ","), d) {
			return true
		}
	}
	return false
}

// Removing an upstream moves only the tenants whose shard held it.
func TestShardMinimalMovement(t *testing.T) {
	pool := upstreams(8)
	smaller := slices.Delete(slices.Clone(pool), 5, 6)
	gone := pool[5].Dial
	for _, tenant := range tenants(100) {
		before, after := shardOf(pool, tenant, 2), shardOf(smaller, tenant, 2)
		if !slices.Contains(before, gone) && !slices.Equal(before, after) {
			t.Fatalf("%s: shard %v moved to %v though %s was not in it", tenant, before, after, gone)
		}
	}
}

// A request goes to the shard's upstream with the fewest in flight; when
// the whole shard is down it spills to the tenant's next-ranked upstream
// (always the same one), or to none.
func TestPickAvailability(t *testing.T) {
	pool := upstreams(8)
	shard := shardOf(pool, "acme", 2)
	down := map[string]bool{shard[0]: true}
	avail := func(u *reverseproxy.Upstream) bool { return !down[u.Dial] }
	for range 50 {
		if got := pick(pool, "acme", 2, true, avail).Dial; got != shard[1] {
			t.Fatalf("with %s down: %s, want %s", shard[0], got, shard[1])
		}
	}
	down[shard[1]] = true
	spill := pick(pool, "acme", 2, true, avail)
	if spill == nil || slices.Contains(shard, spill.Dial) {
		t.Fatalf("whole shard down: spilled to %v", spill)
	}
	// The spill target is the first upstream of the tenant's 3-shard
	// that is not in its 2-shard.
	if three := shardOf(pool, "acme", 3); !slices.Contains(three, spill.Dial) {
		t.Fatalf("spill %s is not the tenant's next-ranked upstream (3-shard %v)", spill.Dial, three)
	}
	for range 50 {
		if got := pick(pool, "acme", 2, true, avail); got != spill {
			t.Fatalf("spill target changed: %s, then %s", spill.Dial, got.Dial)
		}
	}
	if got := pick(pool, "acme", 2, false, avail); got != nil {
		t.Fatalf("fallback none with the shard down: %s, want no upstream", got.Dial)
	}
	if got := pick(pool, "acme", 2, true, func(*reverseproxy.Upstream) bool { return false }); got != nil {
		t.Fatalf("every upstream down: %s, want none", got.Dial)
	}
	if got := pick(nil, "acme", 2, true, all); got != nil {
		t.Fatalf("empty pool: %s", got.Dial)
	}
}

// Shards larger than the stack buffer work the same.
func TestPickLargeShard(t *testing.T) {
	pool := upstreams(40)
	if got := shardOf(pool, "acme", 20); len(got) != 20 {
		t.Fatalf("20-shard reached %d upstreams", len(got))
	}
}

// tenantRequest is a request with a replacer that reads its headers, as
// Caddy's HTTP server gives one, and tenant in X-Tenant unless empty.
func tenantRequest(tenant string) *http.Request {
	req := httptest.NewRequest("GET", "/", nil)
	if tenant != "" {
		req.Header.Set("X-Tenant", tenant)
	}
	repl := caddy.NewReplacer()
	repl.Map(func(key string) (any, bool) {
		if name, ok := strings.CutPrefix(key, "http.request.header."); ok {
			return req.Header.Get(name), true
		}
		return nil, false
	})
	return req.WithContext(context.WithValue(req.Context(), caddy.ReplacerCtxKey, repl))
}

func provision(t testing.TB, s *Selection) error {
	t.Helper()
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(cancel)
	return s.Provision(ctx)
}

func TestProvisionErrors(t *testing.T) {
	for _, c := range []struct {
		s    *Selection
		want string
	}{
		{&Selection{}, "key: required"},
		{&Selection{Key: "tenant"}, "has no placeholder"},
		{&Selection{Key: "{http.request.header.X-Tenant}", Size: -1}, "size -1: must be at least 1"},
		{&Selection{Key: "{http.request.header.X-Tenant}", Fallback: "random"}, `fallback "random"`},
	} {
		err := provision(t, c.s)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: error %v, want %q", c.s, err, c.want)
		}
	}
	s := Selection{Key: "{http.request.header.X-Tenant}"}
	if err := provision(t, &s); err != nil || s.Size != 2 || s.Fallback != FallbackNext {
		t.Fatalf("defaults: %v, size %d, fallback %q", err, s.Size, s.Fallback)
	}
}

// A size above the number of upstreams known only at request time uses
// them all.
func TestSelectSizeAbovePool(t *testing.T) {
	s := Selection{Key: "{http.request.header.X-Tenant}", Size: 5}
	if err := provision(t, &s); err != nil {
		t.Fatal(err)
	}
	pool := upstreams(3)
	req := tenantRequest("acme")
	seen := map[string]bool{}
	for range 200 {
		seen[s.Select(pool, req, nil).Dial] = true
	}
	if len(seen) != 3 {
		t.Fatalf("reached %v, want all 3", seen)
	}
}

func TestUnmarshalCaddyfile(t *testing.T) {
	for _, c := range []struct {
		in   string
		want *Selection
		err  string
	}{
		{in: "shuffle_shard {http.request.header.X-Tenant}", want: &Selection{Key: "{http.request.header.X-Tenant}"}},
		{in: "shuffle_shard {http.request.header.X-Tenant} 3", want: &Selection{Key: "{http.request.header.X-Tenant}", Size: 3}},
		{in: "shuffle_shard {http.vars.tenant} {\n size 4\n fallback none\n}", want: &Selection{Key: "{http.vars.tenant}", Size: 4, Fallback: "none"}},
		{in: "shuffle_shard", err: "a key is required"},
		{in: "shuffle_shard {http.vars.tenant} 0", err: `size "0"`},
		{in: "shuffle_shard {http.vars.tenant} two", err: `size "two"`},
		{in: "shuffle_shard {http.vars.tenant} 2 3", err: "wrong argument count"},
		{in: "shuffle_shard {http.vars.tenant} 2 {\n size 3\n}", err: "size already specified"},
		{in: "shuffle_shard {http.vars.tenant} {\n weight 3\n}", err: `unrecognized option "weight"`},
		{in: "shuffle_shard {http.vars.tenant} {\n fallback next none\n}", err: "wrong argument count"},
		{in: "shuffle_shard {http.vars.tenant} {\n fallback next\n fallback none\n}", err: "fallback already specified"},
	} {
		var got Selection
		err := got.UnmarshalCaddyfile(caddyfile.NewTestDispenser(c.in))
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%q: error %v, want %q", c.in, err, c.err)
			}
			continue
		}
		if err != nil || got.Key != c.want.Key || got.Size != c.want.Size || got.Fallback != c.want.Fallback {
			t.Errorf("%q: key %q size %d fallback %q (%v), want %q %d %q", c.in, got.Key, got.Size, got.Fallback, err, c.want.Key, c.want.Size, c.want.Fallback)
		}
	}
}

func BenchmarkSelect(b *testing.B) {
	for _, c := range []struct {
		name string
		key  string
		n, k int
	}{
		{"n=8_k=2", "{http.request.header.X-Tenant}", 8, 2},
		{"n=64_k=2", "{http.request.header.X-Tenant}", 64, 2},
		{"n=64_k=8", "{http.request.header.X-Tenant}", 64, 8},
		{"n=8_k=2_template_key", "t-{http.request.header.X-Tenant}", 8, 2},
	} {
		b.Run(c.name, func(b *testing.B) {
			s := Selection{Key: c.key, Size: c.k}
			if err := provision(b, &s); err != nil {
				b.Fatal(err)
			}
			pool := upstreams(c.n)
			req := tenantRequest("tenant-42")
			b.ReportAllocs()
			for b.Loop() {
				if s.Select(pool, req, nil) == nil {
					b.Fatal("no upstream")
				}
			}
		})
	}
}

// The key is read as one placeholder or as a template of several, and a
// request without it is a tenant of its own.
func TestSelectKey(t *testing.T) {
	pool := upstreams(8)
	for _, c := range []struct{ key, header, tenant string }{
		{"{http.request.header.X-Tenant}", "acme", "acme"},
		{"t-{http.request.header.X-Tenant}", "acme", "t-acme"},
		{"{http.request.header.X-Tenant}/{http.request.header.X-Tenant}", "acme", "acme/acme"},
		{"{http.request.header.X-Tenant}", "", ""},
	} {
		s := Selection{Key: c.key}
		if err := provision(t, &s); err != nil {
			t.Fatal(err)
		}
		req := tenantRequest(c.header)
		seen := map[string]bool{}
		for range 200 {
			seen[s.Select(pool, req, nil).Dial] = true
		}
		got := slices.Sorted(maps.Keys(seen))
		if want := shardOf(pool, c.tenant, 2); !slices.Equal(got, want) {
			t.Errorf("key %q with header %q: %v, want the shard of %q %v", c.key, c.header, got, c.tenant, want)
		}
	}
}

// Caddy's own header hash policy on the same pool, for reference: it
// picks one upstream per tenant, not a shard.
func BenchmarkCaddyHeaderPolicy(b *testing.B) {
	for _, n := range []int{8, 64} {
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) {
			s := reverseproxy.HeaderHashSelection{Field: "X-Tenant"}
			pool := upstreams(n)
			req := httptest.NewRequest("GET", "/", nil)
			req.Header.Set("X-Tenant", "tenant-42")
			b.ReportAllocs()
			for b.Loop() {
				if s.Select(pool, req, nil) == nil {
					b.Fatal("no upstream")
				}
			}
		})
	}
}
