package sluice

import (
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"runtime/debug"
	"slices"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyevents"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/certmagic"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
	// The stores register themselves as backend modules.
	_ "github.com/sluicehq/sluice/backend/memory"
	_ "github.com/sluicehq/sluice/backend/redis"
	"github.com/sluicehq/sluice/internal/keys"
	// The shuffle_shard load-balancing policy ships with the handler.
	"github.com/sluicehq/sluice/internal/shed"
	"github.com/sluicehq/sluice/internal/tarpit"
	_ "github.com/sluicehq/sluice/shard"
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
	// retry at the same instant. 0 or more; above 1 (more than doubling the
	// wait) a warning is logged, since `jitter 20` is usually meant as 20%.
	// Default: 0.
	Jitter float64 `json:"jitter,omitempty"`

	// SweepInterval is how often keys that are back to idle are dropped from
	// memory. Default (and 0): 1m. Values under 1s are taken as 1s and values
	// over 24h as 24h, with a warning: a key back to idle has nothing left to
	// limit, so only memory and CPU see the difference.
	SweepInterval caddy.Duration `json:"sweep_interval,omitempty"`

	// LogKey adds the key to the log line of a denied request. Off by
	// default because keys can hold personal data.
	LogKey bool `json:"log_key,omitempty"`

	// DisableMetrics turns off this handler's Prometheus metrics.
	DisableMetrics bool `json:"disable_metrics,omitempty"`

	// BackendRaw is where the zones' state lives and requests are decided:
	// a module of the http.rate_limit.backends namespace, chosen by its
	// "name". "memory" keeps the state in this Caddy process (each instance
	// of a fleet limits on its own). Default: {"name": "memory"}.
	BackendRaw json.RawMessage `json:"backend,omitempty" caddy:"namespace=http.rate_limit.backends inline_key=name"`

	// Distributed shares the zones' counts with the other instances that
	// use the same storage, eventually consistent (see Distributed), as
	// mholt/caddy-ratelimit does. An empty object enables it with the
	// defaults. Default: unset, each instance limits on its own.
	Distributed *Distributed `json:"distributed,omitempty"`

	// StorageRaw is the Caddy storage module distributed syncs through.
	// Default: the storage of the Caddy config (file_system unless set).
	StorageRaw json.RawMessage `json:"storage,omitempty" caddy:"namespace=caddy.storage inline_key=module"`

	// BodyLimit is how many bytes of a request body are read to find a key
	// or cost field ({http.request.body.json.*}, {http.request.body.form.*},
	// {http.request.body.field.*}), or the size of a body sent without
	// Content-Length ({http.request.body.size}). A larger body is
	// unreadable (its size too, when it declares none): it is never
	// skipped by missing "skip", and a cost read from it is answered with
	// 400. The body is always handed on unchanged. Default: 65536 (64 KiB);
	// at most 16777216 (16 MiB), since each request being read holds this
	// much.
	BodyLimit int64 `json:"body_limit,omitempty"`

	// Headers is which rate limit header fields allowed and denied
	// responses carry, for every zone that does not choose its own: "draft"
	// (RateLimit-Policy and RateLimit, as structured fields), "legacy"
	// (X-RateLimit-Limit, -Remaining and -Reset, in seconds), "both" or
	// "none". Default: "none", as mholt/caddy-ratelimit sends none.
	Headers string `json:"headers,omitempty"`

	// Respond makes Sluice write the body of every refusal itself (429,
	// 503 of a zone that fails closed, 400 for a missing key or a bad cost,
	// 403 for a deny list), without Caddy's error path: "json", "problem"
	// (application/problem+json) or "text". Default: unset, every refusal
	// is a Caddy error that handle_errors routes can shape.
	Respond string `json:"respond,omitempty"`

	// Shed makes this handler's requests part of a load shedding group,
	// with a priority: when the group has too many requests in flight
	// for its capacity, the lowest priorities are refused with 503.
	// Default: unset, never shed and not counted.
	Shed *Shed `json:"shed,omitempty"`

	// Tarpit holds the answer to a request a rate limit denies for up to
	// this long (between half and all of it, at random) before it is
	// written: a scraper's connection is kept busy instead of freed to
	// try again. At most 1m. Default: 0, denials are answered at once.
	Tarpit caddy.Duration `json:"tarpit,omitempty"`

	// TarpitMax caps how many denied requests the tarpit holds at once;
	// beyond it a denial is answered at once. A held request costs its
	// own connection and handler goroutine, nothing more. From 1 to
	// 1000000. Default: 1000 (with tarpit).
	TarpitMax int64 `json:"tarpit_max,omitempty"`

	// plan is what Provision compiled the config into, which requests
	// run on.
	plan *plan
}

// plan is a provisioned Handler: its config and what it runs with.
type plan struct {
	*Handler

	metrics  bool // metrics are on, and registered
	headers  bool // some zone sends rate limit fields
	outcomes bool // some limit counts or resets by the response
	budgets  bool // some limit is a spend budget (charge_when)
	zones    []*zone
	store    backend.Store
	local    backend.Store // decides "local" limits while store is unavailable
	logger   *zap.Logger
	denyLog  *zap.Logger
	events   *caddyevents.App
	ctx      caddy.Context
	now      func() int64
	jitterFn func() float64 // in [0, 1); rand.Float64 unless a test sets it
	// newTimer makes the timer a queued request waits on (time.NewTimer's
	// channel and Stop unless a test sets it).
	newTimer func(time.Duration) (<-chan time.Time, func() bool)

	// bodyFields are the JSON paths found in one pass over a body, of at
	// most bodyLimit bytes.
	bodyFields *keys.BodyFields
	bodyLimit  int64
	// sweepInterval is the config's, within the bounds the sweeper runs at.
	sweepInterval time.Duration

	shed    *shed.Group // nil without shed
	shedReg *shed.Reg
	// shedRefusal is the refusal of every shed request, in the group's
	// name.
	shedRefusal *refusal
	tarpit      *tarpit.Tarpit // nil without tarpit
	fleet       *fleetMember   // nil without distributed
	// distStorage replaces the config's storage for distributed (tests).
	distStorage certmagic.Storage
	// tierSeries are the metric series of this config's tier versions.
	tierSeries [][2]string // zone, scope
}

// jitterWarnAbove is the jitter above which a warning says that the value
// is a fraction: mholt/caddy-ratelimit's Caddyfile syntax calls it a
// percent, so `jitter 20` may mean 20% where it adds up to 20 times the wait.
const jitterWarnAbove = 1

// minSweepInterval keeps the sweeper from spinning: each sweep walks every
// key.
const minSweepInterval = time.Second

// maxSweepInterval is the longest sweep interval: beyond a day, idle keys
// would leave memory only when max_keys evicts them.
const maxSweepInterval = 24 * time.Hour

// checkJitter refuses what no wait can be multiplied by. Any other value
// loads, as it did with mholt/caddy-ratelimit: the wait it gives is bounded
// where it is added.
func checkJitter(j float64) error {
	if math.IsNaN(j) || math.IsInf(j, 0) || j < 0 {
		return fmt.Errorf("jitter must be a fraction of the wait, 0 or more (0.2 adds up to 20%%), got %v", j)
	}
	return nil
}

// sweepInterval is si brought within the bounds the sweeper runs at, and
// whether it had to be.
func sweepInterval(si time.Duration) (time.Duration, bool) {
	switch {
	case si < minSweepInterval:
		return minSweepInterval, true
	case si > maxSweepInterval:
		return maxSweepInterval, true
	}
	return si, false
}

// MaxBodyLimit is the largest body_limit, in bytes: every request whose
// body is read for a key holds up to this much in memory until it is
// decided, so a flood of large bodies costs at most this much each.
const MaxBodyLimit = 16 << 20

// CaddyModule returns the Caddy module information.
func (Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.rate_limit",
		New: func() caddy.Module { return new(Handler) },
	}
}

// Provision validates the zones and connects them to their state. When it
// fails, Caddy calls Cleanup, which undoes every rate this provision put
// in force, so the running config's rates stay.
func (h *Handler) Provision(ctx caddy.Context) error {
	return h.provision(ctx, &plan{Handler: h})
}

// provision compiles h into p, which h then runs on. Tests give p a clock
// (the system's when nil) and the storage distributed syncs through.
func (h *Handler) provision(ctx caddy.Context, p *plan) (err error) {
	// A panic here would skip that Cleanup (and, under the admin API, leave
	// this config's rates in force): report it as a failed provision.
	defer func() {
		if r := recover(); r != nil {
			ctx.Logger().Error("panic while provisioning", zap.Any("panic", r), zap.ByteString("stack", debug.Stack()))
			err = fmt.Errorf("internal error while provisioning: %v", r)
		}
	}()
	// Set first: Cleanup undoes what a provision that fails half way took.
	h.plan = p
	return p.provision(ctx)
}

func (h *plan) provision(ctx caddy.Context) error {
	h.ctx = ctx
	h.logger = ctx.Logger()
	// Denials can come by the thousand per second under attack: log the
	// first few each second, then one in a hundred.
	h.denyLog = h.logger.WithOptions(zap.WrapCore(func(c zapcore.Core) zapcore.Core {
		return zapcore.NewSamplerWithOptions(c, time.Second, 10, 100)
	}))
	if h.now == nil {
		h.now = backend.SystemNow
	}

	if err := checkJitter(h.Jitter); err != nil {
		return err
	}
	if h.Jitter > jitterWarnAbove {
		h.logger.Warn("jitter is a fraction of the wait: this one adds up to this many times the wait to Retry-After; for a percentage write a fraction (0.2 for 20%)",
			zap.Float64("jitter", h.Jitter))
	}
	if h.BodyLimit < 0 || h.BodyLimit > MaxBodyLimit {
		return fmt.Errorf("body_limit must be from 1 to %d bytes (16MiB), got %d", MaxBodyLimit, h.BodyLimit)
	}
	bodyLimitSet := h.BodyLimit != 0
	h.bodyLimit = cmp.Or(h.BodyLimit, keys.DefaultBodyLimit)
	h.sweepInterval = time.Duration(h.SweepInterval)
	if si := h.sweepInterval; si < 0 {
		return fmt.Errorf("sweep_interval must be positive (0 is the default, 1m), got %s", algorithms.FormatSpan(int64(si)))
	} else if si != 0 {
		if in, changed := sweepInterval(si); changed {
			h.logger.Warn("sweep_interval is taken within 1s to 24h",
				zap.String("configured", algorithms.FormatSpan(int64(si))), zap.String("used", algorithms.FormatSpan(int64(in))))
			h.sweepInterval = in
		}
	}

	eventsApp, err := ctx.App("events")
	if err != nil {
		return fmt.Errorf("getting events app: %v", err)
	}
	h.events = eventsApp.(*caddyevents.App)

	if h.store, err = h.loadStore(ctx); err != nil {
		return err
	}

	// Zones are checked in name order so that decisions and logs are
	// deterministic.
	for _, name := range slices.Sorted(maps.Keys(h.RateLimits)) {
		z := h.RateLimits[name]
		if z == nil {
			return fmt.Errorf("zone %q: empty definition", name)
		}
		// In h.zones before it is provisioned, so that Cleanup finds
		// what a zone that fails half way has taken.
		rz := &zone{Zone: z}
		h.zones = append(h.zones, rz)
		if err := rz.provision(ctx, name, h.store, h.logger); err != nil {
			return fmt.Errorf("zone %q: %w", name, err)
		}
	}
	h.bodyFields = collectBodyFields(h.zones)
	if bodyLimitSet && !readsBody(h.zones) {
		return fmt.Errorf("body_limit would do nothing: no key or cost reads the request body")
	}
	byHandler := map[string]*handlerPlaceholder{}
	for _, z := range h.zones {
		for _, l := range z.limits {
			l.watchHandlerPlaceholders(byHandler)
			if err := h.provisionOutcome(l); err != nil {
				return err
			}
		}
	}

	if !h.DisableMetrics {
		h.metrics = true
		if err := registerMetrics(ctx.GetMetricsRegistry(), h.store); err != nil {
			h.logger.Error("failed to register rate limit metrics; continuing without them", zap.Error(err))
			h.metrics = false
		}
		for _, z := range h.zones {
			for _, l := range z.limits {
				l.metrics = newLimitMetrics(z.name, l.scope, z.nearLeft())
				if l.tier != "" {
					h.tierSeries = append(h.tierSeries, retainTierSeries(z.name, l.scope))
				}
			}
			z.allowC = metrics.listed.WithLabelValues(z.name, "allow")
			z.denyC = metrics.listed.WithLabelValues(z.name, "deny")
		}
	}
	if err := h.provisionContract(); err != nil {
		return err
	}
	if err := h.provisionFailover(ctx); err != nil {
		return err
	}
	if err := h.provisionShed(configID(ctx)); err != nil {
		return err
	}
	if err := h.provisionTarpit(ctx); err != nil {
		return err
	}
	if err := h.provisionDistributed(ctx); err != nil {
		return err
	}
	h.publish() // to the admin API
	return nil
}

func readsBody(zones []*zone) bool {
	for _, z := range zones {
		for _, l := range z.keyed {
			if l.keyer.NeedsBody() || l.Cost.needsBody() {
				return true
			}
		}
	}
	return false
}

// loadStore loads the configured backend (the memory store by default) and
// hands it the handler's clock, sweep interval and logger.
func (h *plan) loadStore(ctx caddy.Context) (backend.Store, error) {
	var mod any
	var err error
	if len(h.BackendRaw) == 0 {
		mod, err = ctx.LoadModuleByID(backend.Namespace+".memory", nil)
	} else {
		mod, err = ctx.LoadModule(h.Handler, "BackendRaw")
	}
	if err != nil {
		return nil, fmt.Errorf("backend: %v", err)
	}
	store, ok := mod.(backend.Store)
	if !ok {
		return nil, fmt.Errorf("backend: module %s is not a rate limit store", mod.(caddy.Module).CaddyModule().ID)
	}
	if c, ok := store.(backend.Configurable); ok {
		c.Configure(h.setup())
	}
	return store, nil
}

func (h *plan) setup() backend.Setup {
	return backend.Setup{Now: h.now, SweepInterval: h.sweepInterval, Logger: h.logger}
}

// Cleanup releases the zones' state; state still used by another config
// (the one replacing this one in a reload) stays.
func (h *Handler) Cleanup() error {
	if h.plan == nil {
		return nil
	}
	return h.plan.cleanup()
}

func (h *plan) cleanup() error {
	h.unpublish()
	h.releaseTierSeries()
	h.cleanupShed()
	h.tarpit.Stop()
	if h.fleet != nil {
		h.fleet.leave()
	}
	h.releaseAdaptive()
	if h.local != nil {
		_ = h.local.Close()
	}
	if h.store != nil {
		return h.store.Close()
	}
	return nil
}

// Interface guards.
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddy.CleanerUpper          = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
)
