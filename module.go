package sluice

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyevents"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/backend/memory"
)

func init() {
	caddy.RegisterModule(Handler{})
}

// Handler limits the rate of requests, per zone and per key.
//
// A request is checked against every zone whose matchers it satisfies and is
// decided once, all or nothing: when any zone denies it, no zone consumes
// anything. A denied request gets HTTP 429 with a Retry-After header, as an
// error that `handle_errors` routes can shape; the placeholder
// `{http.rate_limit.exceeded.name}` holds the name of the zone that denied it.
//
// The JSON shape is a superset of mholt/caddy-ratelimit's, so its configs work
// unchanged and behave the same (an exact sliding window per zone).
type Handler struct {
	// RateLimits are the zones, keyed by name. Zones of the same name share
	// their state, across handlers and across config reloads, so give zones
	// of different handlers different names unless they should share.
	RateLimits map[string]*Zone `json:"rate_limits,omitempty"`

	// Jitter adds a random extra wait of up to this fraction of the wait to
	// Retry-After (0.2 adds up to 20%), so that denied clients do not all
	// retry at the same instant. Default: 0.
	Jitter float64 `json:"jitter,omitempty"`

	// SweepInterval is how often keys that are back to idle are dropped from
	// memory. Default: 1m.
	SweepInterval caddy.Duration `json:"sweep_interval,omitempty"`

	// LogKey adds the key to the log line of a denied request. Off by
	// default because keys can hold personal data.
	LogKey bool `json:"log_key,omitempty"`

	// DisableMetrics turns off this handler's Prometheus metrics.
	DisableMetrics bool `json:"disable_metrics,omitempty"`

	// Distributed is mholt/caddy-ratelimit's approximate cluster sync
	// through Caddy storage. Sluice accepts it so such configs load, but does
	// not implement it: limits are enforced per instance, and a warning is
	// logged at startup.
	Distributed json.RawMessage `json:"distributed,omitempty"`

	// StorageRaw is the storage mholt/caddy-ratelimit syncs through; it is
	// accepted with Distributed and, like it, not used.
	StorageRaw json.RawMessage `json:"storage,omitempty"`

	zones    []*Zone
	store    backend.Store
	logger   *zap.Logger
	denyLog  *zap.Logger
	events   *caddyevents.App
	ctx      caddy.Context
	now      func() int64
	jitterFn func() float64
}

// Zone is one rate limit: the requests it applies to (match), what
// distinguishes one client from another (key), and the rate.
type Zone struct {
	// MatcherSetsRaw selects the requests this zone applies to; all of them
	// when empty.
	MatcherSetsRaw caddyhttp.RawMatcherSets `json:"match,omitempty" caddy:"namespace=http.matchers"`

	// Key tells clients apart: each distinct value after placeholders are
	// replaced has its own quota. A static key ("global") makes one quota
	// for the whole zone; "{http.request.remote.host}" one per client
	// address. Placeholders that do not resolve become empty.
	Key string `json:"key,omitempty"`

	// MaxEvents is how many events (units of cost) the zone allows per
	// Window. Required.
	MaxEvents int64 `json:"max_events,omitempty"`

	// Window is the length of the window MaxEvents are counted over.
	// Required.
	Window caddy.Duration `json:"window,omitempty"`

	// Burst is the bucket capacity of token_bucket and gcra: how many events
	// may pass at once after a quiet period. Default: MaxEvents. Not used by
	// the window algorithms, which reject it.
	Burst int64 `json:"burst,omitempty"`

	// Algorithm is how the zone counts: "sliding_window" (exact log of
	// events; the default, and mholt/caddy-ratelimit's behaviour),
	// "sliding_window_counter", "fixed_window", "token_bucket", "gcra" or
	// "leaky_bucket". docs/algorithms.md compares them.
	Algorithm string `json:"algorithm,omitempty"`

	// MaxDelay makes a leaky_bucket zone a queue: a request that arrives
	// before its slot waits for it, up to this long, instead of being
	// denied, so requests leave at a steady max_events per window. Only a
	// request whose slot is further away is denied. A client that gives up
	// while waiting frees its slot. Default: 0 (a meter that denies).
	MaxDelay caddy.Duration `json:"max_delay,omitempty"`

	// Cost is how many units one request consumes: a whole number (0 makes
	// requests free), or a placeholder that expands to one, such as
	// "{http.request.header.X-Cost}". Default: 1. A request whose cost
	// placeholder is not a whole number ≥ 0 is answered with 400.
	Cost *Cost `json:"cost,omitempty"`

	// IPv4Prefix, when the whole key is an IPv4 address, limits its
	// network of this many bits instead (24 puts 192.0.2.0/24 in one
	// bucket). Default: 0, the address itself.
	IPv4Prefix int `json:"ipv4_prefix,omitempty"`

	// IPv6Prefix, when the whole key is an IPv6 address, limits its network
	// of this many bits instead (64 is one customer's network).
	// Default: 0, the address itself.
	IPv6Prefix int `json:"ipv6_prefix,omitempty"`

	// MaxKeys caps how many keys the zone tracks in memory. When a new key
	// arrives at the cap, keys that are back to idle go first, then the key
	// closest to idle among a random sample. Default: sized for about
	// 100 MB (1,638,400 keys for the bucket algorithms; fewer for
	// sliding_window, depending on max_events).
	MaxKeys int `json:"max_keys,omitempty"`

	// Shadow makes the zone decide and count, and log the requests it would
	// deny, but never deny one: for trying a limit on live traffic first.
	Shadow bool `json:"shadow,omitempty"`

	name      string
	algorithm string
	matchers  caddyhttp.MatcherSets
	handle    backend.Zone
	maxCost   int64
	metrics   zoneMetrics
}

// CaddyModule returns the Caddy module information.
func (Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.rate_limit",
		New: func() caddy.Module { return new(Handler) },
	}
}

// Provision validates the zones and connects them to their state.
func (h *Handler) Provision(ctx caddy.Context) error {
	h.ctx = ctx
	h.logger = ctx.Logger()
	// Denials can come by the thousand per second under attack: log the
	// first few each second, then one in a hundred.
	h.denyLog = h.logger.WithOptions(zap.WrapCore(func(c zapcore.Core) zapcore.Core {
		return zapcore.NewSamplerWithOptions(c, time.Second, 10, 100)
	}))
	if h.now == nil {
		h.now = memory.SystemNow
	}

	if math.IsNaN(h.Jitter) || math.IsInf(h.Jitter, 0) || h.Jitter < 0 {
		return fmt.Errorf("jitter must be a number ≥ 0, got %v", h.Jitter)
	}
	if h.SweepInterval < 0 {
		return fmt.Errorf("sweep_interval must be positive, got %v", time.Duration(h.SweepInterval))
	}
	if len(h.Distributed) > 0 && string(h.Distributed) != "null" {
		h.logger.Warn("the distributed option of mholt/caddy-ratelimit is accepted but not implemented: each instance enforces its zones on its own",
			zap.String("zones", strings.Join(slices.Sorted(maps.Keys(h.RateLimits)), ",")))
	}

	eventsApp, err := ctx.App("events")
	if err != nil {
		return fmt.Errorf("getting events app: %v", err)
	}
	h.events = eventsApp.(*caddyevents.App)

	h.store = memory.New(memory.Options{Now: h.now, SweepInterval: time.Duration(h.SweepInterval)})

	// Zones are checked in name order so that decisions and logs are
	// deterministic.
	for _, name := range slices.Sorted(maps.Keys(h.RateLimits)) {
		z := h.RateLimits[name]
		if z == nil {
			return fmt.Errorf("zone %q: empty definition", name)
		}
		if err := z.provision(ctx, name, h.store); err != nil {
			return fmt.Errorf("zone %q: %w", name, err)
		}
		h.zones = append(h.zones, z)
	}

	if !h.DisableMetrics {
		if err := registerMetrics(ctx.GetMetricsRegistry()); err != nil {
			h.logger.Error("failed to register rate limit metrics; continuing without them", zap.Error(err))
			h.DisableMetrics = true
		}
		for _, z := range h.zones {
			z.metrics = newZoneMetrics(z.name)
		}
	}
	return nil
}

func (z *Zone) provision(ctx caddy.Context, name string, store backend.Store) error {
	z.name = name
	if z.IPv4Prefix < 0 || z.IPv4Prefix > 32 {
		return fmt.Errorf("ipv4_prefix must be between 0 and 32, got %d", z.IPv4Prefix)
	}
	if z.IPv6Prefix < 0 || z.IPv6Prefix > 128 {
		return fmt.Errorf("ipv6_prefix must be between 0 and 128, got %d", z.IPv6Prefix)
	}
	if z.MaxKeys < 0 {
		return fmt.Errorf("max_keys must be at least 1, got %d", z.MaxKeys)
	}
	if z.Burst < 0 {
		return fmt.Errorf("burst must be at least 1, got %d", z.Burst)
	}
	if z.MaxDelay < 0 {
		return fmt.Errorf("max_delay must be positive, got %v", time.Duration(z.MaxDelay))
	}
	policy := algorithms.Policy{Limit: z.MaxEvents, Window: int64(z.Window), Burst: z.Burst, MaxDelay: int64(z.MaxDelay)}
	alg, err := algorithms.Check(z.Algorithm, policy)
	if err != nil {
		return err
	}
	z.algorithm = alg
	z.maxCost = algorithms.MaxCost(alg, policy)
	if z.Cost != nil {
		if err := z.Cost.validate(); err != nil {
			return fmt.Errorf("cost: %w", err)
		}
		if z.Cost.expr == "" && z.Cost.n > z.maxCost {
			return fmt.Errorf("cost %d can never pass: the zone holds at most %d units (raise %s)", z.Cost.n, z.maxCost, burstOrMax(alg, z.MaxDelay))
		}
	}

	if len(z.MatcherSetsRaw) > 0 {
		mods, err := ctx.LoadModule(z, "MatcherSetsRaw")
		if err != nil {
			return fmt.Errorf("loading matchers: %v", err)
		}
		if err := z.matchers.FromInterface(mods); err != nil {
			return fmt.Errorf("loading matchers: %v", err)
		}
	}

	z.handle, err = store.Zone(backend.ZoneConfig{
		Name:      name,
		Algorithm: alg,
		Policy:    policy,
		MaxKeys:   z.MaxKeys,
	})
	return err
}

func burstOrMax(alg string, maxDelay caddy.Duration) string {
	switch {
	case maxDelay > 0:
		return "max_delay"
	case algorithms.UsesBurst(alg):
		return "burst"
	}
	return "max_events"
}

// Cleanup releases the zones' state; state still used by another config
// (the one replacing this one in a reload) stays.
func (h *Handler) Cleanup() error {
	if h.store != nil {
		return h.store.Close()
	}
	return nil
}

// Cost is the units one request consumes: a whole number, or a placeholder
// that expands to one. In JSON it is a number or a string.
type Cost struct {
	n    int64
	expr string
}

// ConstantCost returns a Cost of n units.
func ConstantCost(n int64) *Cost { return &Cost{n: n} }

// ParseCost reads a cost as written in a Caddyfile: a whole number, or text
// holding placeholders.
func ParseCost(s string) (*Cost, error) {
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		c := &Cost{n: n}
		return c, c.validate()
	}
	if !strings.Contains(s, "{") {
		return nil, fmt.Errorf("cost must be a whole number or a placeholder, got %q", s)
	}
	return &Cost{expr: s}, nil
}

func (c *Cost) validate() error {
	if c.expr == "" && c.n < 0 {
		return fmt.Errorf("must be at least 0, got %d", c.n)
	}
	return nil
}

// MarshalJSON writes a constant cost as a number and a placeholder as a
// string.
func (c Cost) MarshalJSON() ([]byte, error) {
	if c.expr != "" {
		return json.Marshal(c.expr)
	}
	return json.Marshal(c.n)
}

// UnmarshalJSON reads a number or a string.
func (c *Cost) UnmarshalJSON(b []byte) error {
	var n int64
	if err := json.Unmarshal(b, &n); err == nil {
		*c = Cost{n: n}
		return nil
	}
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return errors.New("cost must be a whole number or a string with placeholders")
	}
	p, err := ParseCost(s)
	if err != nil {
		return err
	}
	*c = *p
	return nil
}

// eval returns the cost of the request behind repl.
func (c *Cost) eval(repl *caddy.Replacer) (int64, error) {
	if c == nil {
		return 1, nil
	}
	if c.expr == "" {
		return c.n, nil
	}
	s := strings.TrimSpace(repl.ReplaceAll(c.expr, ""))
	if s == "" {
		return 1, nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("cost %q is not a whole number ≥ 0", s)
	}
	return n, nil
}

// Interface guards.
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddy.CleanerUpper          = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
	_ json.Marshaler              = Cost{}
	_ json.Unmarshaler            = (*Cost)(nil)
)
