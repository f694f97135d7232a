package integration

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddytest"
)

// shardUpstream is a test upstream that counts the requests of each
// tenant, and the most it ever had in flight of a tenant.
type shardUpstream struct {
	srv  *httptest.Server
	addr string

	mu       sync.Mutex
	hits     map[string]int
	inFlight map[string]int
	peak     map[string]int
}

// shardUpstreams starts n upstreams. Their addresses never contain the
// default test ports, which withPorts would rewrite.
func shardUpstreams(t *testing.T, n int) []*shardUpstream {
	t.Helper()
	var ups []*shardUpstream
	for len(ups) < n {
		u := &shardUpstream{hits: map[string]int{}, inFlight: map[string]int{}, peak: map[string]int{}}
		u.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			tenant := r.Header.Get("X-Tenant")
			u.mu.Lock()
			u.hits[tenant]++
			u.inFlight[tenant]++
			u.peak[tenant] = max(u.peak[tenant], u.inFlight[tenant])
			u.mu.Unlock()
			defer func() {
				u.mu.Lock()
				u.inFlight[tenant]--
				u.mu.Unlock()
			}()
			if tenant == "noisy" {
				time.Sleep(2 * time.Millisecond) // a slow tenant, so that its flood piles up in flight
			}
			fmt.Fprint(w, u.addr)
		}))
		u.addr = strings.TrimPrefix(u.srv.URL, "http://")
		if strings.Contains(u.addr, "2999") || strings.Contains(u.addr, "908") {
			u.srv.Close()
			continue
		}
		t.Cleanup(u.srv.Close)
		ups = append(ups, u)
	}
	return ups
}

func (u *shardUpstream) hitsOf(tenant string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.hits[tenant]
}

// shardProxy is a site proxying to ups with the shuffle_shard policy,
// opts inside lb_policy's block and extra inside reverse_proxy's.
func shardProxy(ups []*shardUpstream, policy, extra string) string {
	addrs := make([]string, len(ups))
	for i, u := range ups {
		addrs[i] = u.addr
	}
	return caddyfileServer(`	reverse_proxy ` + strings.Join(addrs, " ") + ` {
		lb_policy ` + policy + `
` + extra + `
	}`)
}

// tenantShard sends n requests of tenant and returns the upstreams that
// answered them, sorted.
func tenantShard(t *testing.T, tester *caddytest.Tester, tenant string, n int) []string {
	t.Helper()
	seen := map[string]bool{}
	for range n {
		code, _, body := do(t, tester, "GET", "/", "X-Tenant", tenant)
		if code != http.StatusOK {
			t.Fatalf("tenant %s: status %d (%q)", tenant, code, body)
		}
		seen[body] = true
	}
	out := make([]string, 0, len(seen))
	for addr := range seen {
		out = append(out, addr)
	}
	slices.Sort(out)
	return out
}

// tenantsInShards sends 30 requests for each of at least n tenants,
// requires each tenant to reach exactly 2 upstreams and the tenants
// together all of ups, and returns each tenant's upstreams. The shards
// hash the upstreams' addresses, whose ports differ from run to run: 16
// tenants miss one of 8 upstreams in about 8% of runs (8 × (21/28)^16),
// so more tenants are asked until all are used, up to 10n (8 × 0.75^160:
// never).
func tenantsInShards(t *testing.T, tester *caddytest.Tester, ups []*shardUpstream, n int) map[string][]string {
	t.Helper()
	shards := map[string][]string{}
	used := map[string]bool{}
	for i := 0; i < n || (len(used) < len(ups) && i < 10*n); i++ {
		tenant := fmt.Sprintf("tenant-%d", i)
		// Idle upstreams tie, and ties are broken at random: 30 requests
		// reach both of a 2-shard with probability 1-2^-29.
		shards[tenant] = tenantShard(t, tester, tenant, 30)
		if len(shards[tenant]) != 2 {
			t.Fatalf("%s reached %v, want exactly its 2 upstreams", tenant, shards[tenant])
		}
		for _, a := range shards[tenant] {
			used[a] = true
		}
	}
	if len(used) != len(ups) {
		t.Fatalf("%d tenants used %d of %d upstreams", len(shards), len(used), len(ups))
	}
	return shards
}

// Through a real Caddy with 8 upstreams and k=2: each tenant only ever
// reaches its 2 upstreams, the same 2 when the upstreams are listed in
// another order, and the tenants together use all 8.
func TestShuffleShardTenantsStayInShard(t *testing.T) {
	ups := shardUpstreams(t, 8)
	policy := "shuffle_shard {http.request.header.X-Tenant} 2"
	tester := newTester(t, shardProxy(ups, policy, ""), "caddyfile")
	shards := tenantsInShards(t, tester, ups, 24)
	reversed := slices.Clone(ups)
	slices.Reverse(reversed)
	tester = newTester(t, shardProxy(reversed, policy, ""), "caddyfile")
	for tenant, want := range shards {
		if got := tenantShard(t, tester, tenant, 30); !slices.Equal(got, want) {
			t.Fatalf("%s: upstreams %v with the upstreams reversed, %v before", tenant, got, want)
		}
	}
}

// The complete example of docs/protection.md, with its 8 addresses
// replaced by the test upstreams: tenants stay in their shards, and the
// per-tenant rate limit denies the 101st request of a second.
func TestDocsShuffleShardExample(t *testing.T) {
	ups := shardUpstreams(t, 8)
	site := docSite(t, "../docs/protection.md", "lb_policy shuffle_shard {http.request.header.X-Tenant} 2")
	for i, u := range ups {
		site = strings.Replace(site, fmt.Sprintf("10.0.0.%d:8080", i+1), u.addr, 1)
	}
	if strings.Contains(site, "10.0.0.") {
		t.Fatalf("the example has more than 8 upstreams:\n%s", site)
	}
	tester := newTester(t, site, "caddyfile")
	tenantsInShards(t, tester, ups, 16)
	denied := 0
	for range 110 {
		if code, _, _ := do(t, tester, "GET", "/", "X-Tenant", "flood"); code == http.StatusTooManyRequests {
			denied++
		}
	}
	if denied == 0 {
		t.Fatalf("110 requests of one tenant: none denied by its 100/1s limit")
	}
}

// One tenant flooding with 64 concurrent clients reaches only its shard:
// the other 6 upstreams never see one of its requests, while a quiet
// tenant keeps being served by its own shard.
func TestShuffleShardFloodStaysInShard(t *testing.T) {
	ups := shardUpstreams(t, 8)
	tester := newTester(t, shardProxy(ups, "shuffle_shard {http.request.header.X-Tenant} 2", ""), "caddyfile")
	noisyShard := tenantShard(t, tester, "noisy", 30)
	var wg sync.WaitGroup
	errs := make(chan string, 64)
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 20 {
				req, _ := http.NewRequest("GET", httpBase+"/", nil)
				req.Header.Set("X-Tenant", "noisy")
				resp, err := tester.Client.Do(req)
				if err != nil {
					errs <- err.Error()
					return
				}
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					errs <- resp.Status
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Fatalf("flood request: %s", e)
	}
	total, peak := 0, 0
	for _, u := range ups {
		n := u.hitsOf("noisy")
		total += n
		if !slices.Contains(noisyShard, u.addr) && n != 0 {
			t.Errorf("upstream %s outside the noisy shard %v got %d of its requests", u.addr, noisyShard, n)
		}
		if slices.Contains(noisyShard, u.addr) {
			u.mu.Lock()
			t.Logf("noisy shard upstream %s: %d requests, peak %d in flight", u.addr, n, u.peak["noisy"])
			peak = max(peak, u.peak["noisy"])
			u.mu.Unlock()
		}
	}
	if peak < 2 {
		t.Fatalf("the flood never had 2 requests in flight at one upstream: not a flood")
	}
	if total != 30+64*20 {
		t.Fatalf("upstreams counted %d noisy requests, want %d", total, 30+64*20)
	}
}

// When the tenant's whole shard is down, `fallback next` serves it from
// one further upstream, always the same, and `fallback none` answers 503.
func TestShuffleShardFallback(t *testing.T) {
	ups := shardUpstreams(t, 8)
	policy := "shuffle_shard {http.request.header.X-Tenant} 2"
	health := "\t\tlb_retries 3\n\t\tfail_duration 1m\n\t\tmax_fails 1"
	tester := newTester(t, shardProxy(ups, policy, health), "caddyfile")
	shard := tenantShard(t, tester, "acme", 30)
	for _, u := range ups {
		if slices.Contains(shard, u.addr) {
			u.srv.Close()
		}
	}
	// The first requests fail over the shard's two closed upstreams, which
	// passive health checks then mark down.
	spill := tenantShard(t, tester, "acme", 30)
	if len(spill) != 1 || slices.Contains(shard, spill[0]) {
		t.Fatalf("with shard %v down, answered by %v, want one upstream outside it", shard, spill)
	}

	tester = newTester(t, shardProxy(ups, policy+" {\n\t\t\tfallback none\n\t\t}", health), "caddyfile")
	for range 3 {
		do(t, tester, "GET", "/", "X-Tenant", "acme") // mark the closed shard down
	}
	if code, _, body := do(t, tester, "GET", "/", "X-Tenant", "acme"); code != http.StatusServiceUnavailable {
		t.Fatalf("fallback none with shard %v down: %d %q, want 503", shard, code, body)
	}
}

func TestShuffleShardConfigErrors(t *testing.T) {
	ups := shardUpstreams(t, 8)
	for _, c := range []struct{ policy, want string }{
		{"shuffle_shard {http.request.header.X-Tenant} 9", "size 9: larger than the 8 upstreams"},
		{"shuffle_shard {http.request.header.X-Tenant} 0", "must be a whole number of upstreams, at least 1"},
		{"shuffle_shard", "a key is required"},
		{"shuffle_shard X-Tenant 2", "has no placeholder, so every request would be one tenant"},
		{"shuffle_shard {http.request.header.X-Tenant} {\n\t\t\tfallback random\n\t\t}", "must be \\\"next\\\" or"},
	} {
		t.Run(c.policy, func(t *testing.T) {
			assertLoadError(t, shardProxy(ups, c.policy, ""), "caddyfile", c.want)
		})
	}
	assertLoadError(t, caddyfileServer("\treverse_proxy "+ups[0].addr+" {\n\t\tlb_policy shuffle_shard {http.request.header.X-Tenant}\n\t}"),
		"caddyfile", "size 2 (the default): larger than the 1 upstreams")
	json := jsonServer(`{"handler": "reverse_proxy", "upstreams": [{"dial": "`+ups[0].addr+`"}],
		"load_balancing": {"selection_policy": {"policy": "shuffle_shard", "key": "{http.request.header.X-Tenant}", "size": -1}}}`, "")
	assertLoadError(t, json, "json", "size -1: must be at least 1")
}
