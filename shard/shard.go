// Package shard is a reverse_proxy load-balancing policy for multi-tenant
// upstreams: shuffle sharding. Each tenant is mapped by a stable hash to its
// own k of the n upstreams, so a tenant that floods or poisons its upstreams
// takes down only those k; with n=8 and k=2 there are C(8,2)=28 shards, and
// any other tenant shares the whole shard of a noisy one with probability
// 1/28.
package shard

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"go.uber.org/zap"
)

func init() {
	caddy.RegisterModule(new(Selection))
}

// The fallbacks when every upstream of a tenant's shard is unavailable.
const (
	// FallbackNext spills to the tenant's next-ranked available upstream.
	FallbackNext = "next"
	// FallbackNone selects no upstream: the proxy answers 503.
	FallbackNone = "none"
)

// DefaultSize is the shard size when none is configured.
const DefaultSize = 2

// Selection is the `shuffle_shard` load-balancing policy: it sends each
// tenant's requests only to that tenant's shard, a fixed set of Size of
// the upstreams chosen by rendezvous hashing of the tenant key with each
// upstream's address. The shard depends on the key and the addresses only,
// not on the order of the upstreams in the config, so every Caddy instance
// agrees on it and adding or removing one upstream moves only the tenants
// whose shard held it. Within its shard, a request goes to the available
// upstream with the fewest requests in flight.
type Selection struct {
	// Key names the tenant: a placeholder such as
	// `{http.request.header.X-Tenant}`, or text with several placeholders,
	// evaluated per request. Required. Requests whose key evaluates to
	// the empty string are one tenant and share one shard.
	Key string `json:"key,omitempty"`

	// Size is k, the number of upstreams in each tenant's shard. Default 2.
	// At least 1 and at most the number of upstreams; with dynamic
	// upstreams, a Size above their number at request time uses them all
	// and logs a warning once.
	Size int `json:"size,omitempty"`

	// Fallback is what happens when every upstream of a tenant's shard is
	// unavailable (unhealthy or at max_requests): "next" (the default)
	// sends the request to the tenant's highest-ranked available upstream
	// outside the shard, the same one for every request of that tenant;
	// "none" selects no upstream, so the proxy answers 503 (after
	// lb_try_duration, if set).
	Fallback string `json:"fallback,omitempty"`

	// placeholder is the name of the key when it is one placeholder and
	// nothing else, read without building a string per request.
	placeholder string
	logger      *zap.Logger
	warned      atomic.Bool
}

// CaddyModule returns the Caddy module information.
func (*Selection) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.reverse_proxy.selection_policies.shuffle_shard",
		New: func() caddy.Module { return new(Selection) },
	}
}

// Provision checks the configuration. The number of upstreams is known
// here when the enclosing reverse_proxy lists them statically, so a Size
// larger than that is refused at load rather than discovered per request.
func (s *Selection) Provision(ctx caddy.Context) error {
	s.logger = ctx.Logger()
	if s.Key == "" {
		return fmt.Errorf("key: required, a placeholder naming the tenant such as {http.request.header.X-Tenant}")
	}
	if !strings.Contains(s.Key, "{") {
		return fmt.Errorf("key %q: has no placeholder, so every request would be one tenant on one shard", s.Key)
	}
	if name, ok := strings.CutPrefix(s.Key, "{"); ok && strings.IndexAny(name, "{}") == len(name)-1 {
		s.placeholder = name[:len(name)-1]
	}
	size := strconv.Itoa(s.Size)
	if s.Size == 0 {
		s.Size, size = DefaultSize, strconv.Itoa(DefaultSize)+" (the default)"
	}
	if s.Size < 1 {
		return fmt.Errorf("size %d: must be at least 1", s.Size)
	}
	switch s.Fallback {
	case "":
		s.Fallback = FallbackNext
	case FallbackNext, FallbackNone:
	default:
		return fmt.Errorf("fallback %q: must be %q or %q", s.Fallback, FallbackNext, FallbackNone)
	}
	// The nearest reverse_proxy is the one whose upstreams this policy picks.
	mods := ctx.Modules()
	for i := len(mods) - 1; i >= 0; i-- {
		h, ok := mods[i].(*reverseproxy.Handler)
		if !ok {
			continue
		}
		if h.DynamicUpstreamsRaw == nil && len(h.Upstreams) > 0 && s.Size > len(h.Upstreams) {
			return fmt.Errorf("size %s: larger than the %d upstreams", size, len(h.Upstreams))
		}
		break
	}
	return nil
}

// Select returns an available upstream of the request's tenant's shard.
func (s *Selection) Select(pool reverseproxy.UpstreamPool, r *http.Request, _ http.ResponseWriter) *reverseproxy.Upstream {
	key := s.Key
	if repl, ok := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer); ok {
		if s.placeholder != "" {
			key, _ = repl.GetString(s.placeholder)
		} else {
			key = repl.ReplaceAll(s.Key, "")
		}
	}
	k := s.Size
	if k > len(pool) && len(pool) > 0 {
		if !s.warned.Swap(true) && s.logger != nil {
			s.logger.Warn("shuffle_shard size is larger than the number of upstreams; each tenant uses all of them",
				zap.Int("size", k), zap.Int("upstreams", len(pool)))
		}
		k = len(pool)
	}
	return pick(pool, key, k, s.Fallback != FallbackNone, (*reverseproxy.Upstream).Available)
}

// ranked is an upstream with its score for one tenant.
type ranked struct {
	score uint64
	up    *reverseproxy.Upstream
}

// above orders upstreams by score, then address, so that even equal scores
// (one address listed twice) rank the same in any config order.
func (a ranked) above(b ranked) bool {
	return a.score > b.score || a.score == b.score && a.up.Dial > b.up.Dial
}

// pick returns the available upstream of key's shard (its k best-scored
// upstreams) with the fewest requests in flight, ties broken at random so
// a tenant's sequential requests spread over its shard too. When none is
// available and spill is set, it returns the best-scored available
// upstream outside the shard.
func pick(pool []*reverseproxy.Upstream, key string, k int, spill bool, available func(*reverseproxy.Upstream) bool) *reverseproxy.Upstream {
	if k <= 0 || len(pool) == 0 {
		return nil
	}
	var buf [16]ranked
	top := buf[:0]
	if k > len(buf) {
		top = make([]ranked, 0, k)
	}
	hk := hashString(key)
	for _, up := range pool {
		top = insertTop(top, k, ranked{score(hk, up.Dial), up})
	}
	var best *reverseproxy.Upstream
	bestReqs, ties := 0, 0
	for _, r := range top {
		if !available(r.up) {
			continue
		}
		switch reqs := r.up.NumRequests(); {
		case best == nil || reqs < bestReqs:
			best, bestReqs, ties = r.up, reqs, 1
		case reqs == bestReqs:
			ties++
			if rand.IntN(ties) == 0 { //nolint:gosec // load spreading, not security
				best = r.up
			}
		}
	}
	if best != nil || !spill {
		return best
	}
	floor := top[len(top)-1]
	var next ranked
	for _, up := range pool {
		r := ranked{score(hk, up.Dial), up}
		if floor.above(r) && (next.up == nil || r.above(next)) && available(up) {
			next = r
		}
	}
	return next.up
}

// insertTop adds r to top, kept sorted best first and at most k long.
func insertTop(top []ranked, k int, r ranked) []ranked {
	if len(top) == k {
		if !r.above(top[k-1]) {
			return top
		}
		top = top[:k-1]
	}
	i := len(top)
	top = append(top, r)
	for ; i > 0 && r.above(top[i-1]); i-- {
		top[i] = top[i-1]
	}
	top[i] = r
	return top
}

// score is the rendezvous weight of an upstream for a tenant. Both
// hashes are FNV-1a, fixed across processes so that every instance maps
// a tenant alike; the finalizer makes the weights of one tenant over
// upstreams with similar addresses independent.
func score(tenant uint64, dial string) uint64 {
	return mix(tenant ^ mix(hashString(dial)))
}

func hashString(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h
}

// mix is the SplitMix64 finalizer.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}

// UnmarshalCaddyfile sets up the policy from Caddyfile tokens:
//
//	lb_policy shuffle_shard <key> [<size>] {
//		size     <k>
//		fallback next|none
//	}
func (s *Selection) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // the policy name
	if !d.NextArg() {
		return d.Err("shuffle_shard: a key is required, such as {http.request.header.X-Tenant}")
	}
	s.Key = d.Val()
	if d.NextArg() {
		if err := s.parseSize(d); err != nil {
			return err
		}
	}
	if d.NextArg() {
		return d.ArgErr()
	}
	for d.NextBlock(0) {
		switch d.Val() {
		case "size":
			if !d.NextArg() {
				return d.ArgErr()
			}
			if s.Size != 0 {
				return d.Err("shuffle_shard: size already specified")
			}
			if err := s.parseSize(d); err != nil {
				return err
			}
		case "fallback":
			if !d.NextArg() {
				return d.ArgErr()
			}
			if s.Fallback != "" {
				return d.Err("shuffle_shard: fallback already specified")
			}
			s.Fallback = d.Val()
		default:
			return d.Errf("shuffle_shard: unrecognized option %q", d.Val())
		}
		if d.NextArg() {
			return d.ArgErr()
		}
	}
	return nil
}

func (s *Selection) parseSize(d *caddyfile.Dispenser) error {
	n, err := strconv.Atoi(d.Val())
	if err != nil || n < 1 {
		return d.Errf("shuffle_shard: size %q must be a whole number of upstreams, at least 1", d.Val())
	}
	s.Size = n
	return nil
}

// Interface guards
var (
	_ reverseproxy.Selector = (*Selection)(nil)
	_ caddy.Provisioner     = (*Selection)(nil)
	_ caddyfile.Unmarshaler = (*Selection)(nil)
)
