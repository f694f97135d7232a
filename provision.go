package sluice

import (
	"cmp"
	"fmt"
	"maps"
	"net/http"
	"net/netip"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyevents"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/certmagic"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/internal/aimd"
	"github.com/sluicehq/sluice/internal/conc"
	"github.com/sluicehq/sluice/internal/keys"
	"github.com/sluicehq/sluice/internal/shed"
	"github.com/sluicehq/sluice/internal/tarpit"
)

// plan is a provisioned Handler: its config and what it runs with.
type plan struct {
	*Handler

	metrics  bool // metrics are on, and registered
	headers  bool // some zone sends rate limit fields
	outcomes bool // some limit counts or resets by the response
	budgets  bool // some limit is a spend budget (charge_when)
	// What compile found configured, so that a request tests nothing
	// else: some zone is in shadow; some limit gives queue slots
	// (max_delay) an admitted request waits for; something watches the
	// response (outcomes, adaptive, a shed latency target); and the steps
	// an admitted request runs.
	shadows, queues, watching bool
	admitted                  []func(w http.ResponseWriter, s *requestState)
	zones                     []*zone
	store                     backend.Store
	local                     backend.Store // decides "local" limits while store is unavailable
	logger                    *zap.Logger
	denyLog                   *zap.Logger
	events                    *caddyevents.App
	ctx                       caddy.Context
	now                       func() int64
	jitterFn                  func() float64 // in [0, 1); rand.Float64 unless a test sets it
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
	h.compile()
	h.publish() // to the admin API
	return nil
}

// compile keeps in h, its zones and limits what a request runs: a feature
// that is not configured is not tested for on the request path.
func (h *plan) compile() {
	h.shadows, h.queues, h.watching, h.admitted = false, false, h.outcomes, nil
	if h.shed != nil && h.shedReg.Target > 0 {
		h.watching = true
	}
	for _, z := range h.zones {
		z.compile()
		h.shadows = h.shadows || z.Shadow
		for _, l := range z.limits {
			h.queues = h.queues || l.MaxDelay > 0
		}
		for _, l := range z.keyed {
			h.watching = h.watching || l.adapt != nil
		}
	}
	if h.metrics {
		h.admitted = append(h.admitted, countNear)
	}
	if h.headers {
		h.admitted = append(h.admitted, sendHeaders)
	}
}

func (z *zone) compile() {
	z.screened = len(z.matchers) > 0 || len(z.allowNets) > 0 || len(z.denyNets) > 0 || len(z.allowMatch) > 0 || len(z.denyMatch) > 0
	for _, l := range z.keyed {
		l.compile()
	}
	for _, l := range z.limits {
		l.compile()
	}
}

// compile tells whether l needs more than its key (extras), and the cost
// of its requests when it does not.
func (l *limit) compile() {
	costed := l.Cost != nil && l.Cost.expr != ""
	l.extras = l.tiers != nil || l.keyer.NeedsBody() || l.Cost.needsBody() || costed || len(l.costByHandler) > 0 ||
		l.adapt != nil || l.conc != nil || l.shared != nil || l.budget.reserve > 0
	l.cost = l.constantCost() // cost_min applies to a cost read from the request only
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

// zone is a provisioned Zone: its config, its limits and what it runs with.
type zone struct {
	*Zone

	name       string
	matchers   caddyhttp.MatcherSets
	allowNets  []netip.Prefix
	denyNets   []netip.Prefix
	allowMatch caddyhttp.MatcherSets
	denyMatch  caddyhttp.MatcherSets
	limits     []*limit // the zone's own (if it has a rate) and its scopes
	screened   bool     // the zone has matchers or lists: screen runs
	keyed      []*limit // limits plus those of concurrency alone: every key built
	allowC     prometheus.Counter
	denyC      prometheus.Counter
	status     int
	nameValue  any // name, boxed once for the replacer
	refused    refusalCounters
	errs       [numReasons]error // the refusals' Caddy errors, made once
}

type listing int

const (
	listNone listing = iota
	listAllow
	listDeny
)

// listed tells whether r is on the zone's deny list (which wins) or allow
// list.
func (z *zone) listed(r *http.Request) (listing, error) {
	if len(z.denyNets) > 0 && keys.Contains(z.denyNets, clientIP(r)) {
		return listDeny, nil
	}
	if len(z.denyMatch) > 0 {
		if ok, err := z.denyMatch.AnyMatchWithError(r); err != nil || ok {
			return listDeny, err
		}
	}
	allow := len(z.allowNets) > 0 && keys.Contains(z.allowNets, clientIP(r))
	if !allow && len(z.allowMatch) > 0 {
		ok, err := z.allowMatch.AnyMatchWithError(r)
		if err != nil {
			return listNone, err
		}
		allow = ok
	}
	if allow {
		if z.allowC != nil {
			z.allowC.Inc()
		}
		return listAllow, nil
	}
	return listNone, nil
}

// limit is a provisioned Limit: its config (a scope's as its zone completes
// it) and what it runs with.
type limit struct {
	*Limit

	zone      *zone
	scope     string // "" for the zone's own limit
	missing   string // in force: the limit's (a scope on its zone's key: the zone's), else shared
	fail      string // in force: the limit's (a scope's: else its zone's), else defaultFail
	keyer     *keys.Keyer
	handle    backend.Limit
	algorithm string
	maxCost   int64
	metrics   limitMetrics
	cfg       backend.LimitConfig // as registered with the store
	local     backend.Limit       // the in-process fallback of a "local" limit
	failC     prometheus.Counter
	conc      *conc.Local  // nil without concurrency; with shared slots, the "local" fallback
	shared    *conc.Shared // slots shared through the backend (Redis)
	// The answer of a denial by this limit, made at provision.
	denyStatus int
	denyErr    error
	denyReason reason
	// tiers picks the limit of a request's tier; nil without Tiers. Each
	// tier's limit has its tier's name in tier.
	tiers    *tierSet
	tier     string
	base     string         // a tier's scope as configured, without the tier
	budget   limitBudget    // charge_when and align (budget.go)
	adapt    *adaptiveLimit // nil unless adaptive
	adaptCfg aimd.Config
	// The zone and scope names as placeholder values, converted once:
	// converting a string to an interface value allocates.
	zoneName, scopeName any
	hdr                 limitHeaders
	// Placeholders of the key and cost that an earlier handler must set.
	keyByHandler, costByHandler []*handlerPlaceholder
	settle                      *settler // nil without settle
	// extras: a request needs more than l's key (collectExtras); else
	// each costs cost.
	extras bool
	cost   int64
}

func (z *zone) provision(ctx caddy.Context, name string, store backend.Store, logger *zap.Logger) error {
	z.name = name
	if err := checkNearLimit(z.NearLimit); err != nil {
		return err
	}
	var err error
	if z.allowNets, err = keys.ParseCIDRs(z.Allow); err != nil {
		return fmt.Errorf("allow: %v", err)
	}
	if z.denyNets, err = keys.ParseCIDRs(z.Deny); err != nil {
		return fmt.Errorf("deny: %v", err)
	}
	for field, sets := range map[string]*caddyhttp.MatcherSets{"MatcherSetsRaw": &z.matchers, "AllowMatchRaw": &z.allowMatch, "DenyMatchRaw": &z.denyMatch} {
		if err := loadMatchers(ctx, z.Zone, field, sets); err != nil {
			return err
		}
	}

	// The zone's own limit exists when it has a rate (or is the only one:
	// then its errors name the missing fields).
	own := z.Limit
	if own.MaxEvents != 0 || own.Window != 0 || own.Concurrency != 0 || own.Tiers != nil || len(z.Scopes) == 0 {
		if err := z.addLimit(&z.Limit, "", store, logger, configID(ctx)); err != nil {
			return err
		}
	} else if unused := own.ownOnly(); len(unused) > 0 {
		return ownOnlyError(unused)
	}
	for _, scope := range slices.Sorted(maps.Keys(z.Scopes)) {
		l := z.Scopes[scope]
		switch {
		case !validScopeName(scope):
			return fmt.Errorf("scope %q: a scope name must be non-empty, without / or braces", scope)
		case l == nil:
			return fmt.Errorf("scope %q: empty definition", scope)
		}
		if err := z.addLimit(z.inherit(l), scope, store, logger, configID(ctx)); err != nil {
			return fmt.Errorf("scope %q: %w", scope, err)
		}
	}
	return nil
}

// inherit is scope l completed by its zone, as its limit runs (the config
// stays as written): a scope without a fail policy takes the zone's, and a
// scope without a key of its own counts the zone's key, processed the same
// way: a cooldown or a daily cap on the same identifier.
func (z *Zone) inherit(l *Limit) *Limit {
	c := *l
	c.Fail = cmp.Or(c.Fail, z.Fail)
	if c.Key == "" {
		c.Key = z.Key
		c.IPv4Prefix = cmp.Or(c.IPv4Prefix, z.IPv4Prefix)
		c.IPv6Prefix = cmp.Or(c.IPv6Prefix, z.IPv6Prefix)
		c.Hash = cmp.Or(c.Hash, z.Hash)
		c.Missing = cmp.Or(c.Missing, z.Missing)
		if c.Normalize == nil {
			c.Normalize = z.Normalize
		}
	}
	return &c
}

func loadMatchers(ctx caddy.Context, z *Zone, field string, sets *caddyhttp.MatcherSets) error {
	raw := map[string]caddyhttp.RawMatcherSets{"MatcherSetsRaw": z.MatcherSetsRaw, "AllowMatchRaw": z.AllowMatchRaw, "DenyMatchRaw": z.DenyMatchRaw}[field]
	if len(raw) == 0 {
		return nil
	}
	mods, err := ctx.LoadModule(z, field)
	if err != nil {
		return fmt.Errorf("loading matchers: %v", err)
	}
	if err := sets.FromInterface(mods); err != nil {
		return fmt.Errorf("loading matchers: %v", err)
	}
	return nil
}

// scoped prefixes err with the scope it is about (as configured), if any.
func (l *limit) scoped(err error) error {
	if l.shownScope() == "" {
		return err
	}
	return fmt.Errorf("scope %q: %w", l.shownScope(), err)
}

// displayName names a limit in messages: the zone, or "<zone>/<scope>".
func (l *limit) displayName() string {
	if l.scope == "" {
		return l.zone.name
	}
	return l.zone.name + "/" + l.scope
}

// configID identifies the config being provisioned. The context's
// context.Context differs per server (the http app derives one for each),
// but the metrics registry is made once per config.
func configID(ctx caddy.Context) any {
	if reg := ctx.GetMetricsRegistry(); reg != nil {
		return reg
	}
	return nil
}

func (z *zone) addLimit(c *Limit, scope string, store backend.Store, logger *zap.Logger, owner any) error {
	if c.tiered() && c.Adaptive != nil {
		return errAdaptiveTiers
	}
	if c.tiered() {
		return z.addTiers(c, scope, store, logger, owner)
	}
	return z.addRate(&limit{Limit: c}, scope, store, logger, owner)
}

// addRate provisions l, a limit of its own (not a tiers table), as the
// zone's limit of scope.
func (z *zone) addRate(l *limit, scope string, store backend.Store, logger *zap.Logger, owner any) error {
	l.zone, l.scope = z, scope
	l.zoneName, l.scopeName = z.name, scope
	if err := l.provision(logger); err != nil {
		return err
	}
	if err := l.provisionConc(store, logger); err != nil {
		return err
	}
	z.keyed = append(z.keyed, l)
	if l.concOnly() {
		return l.provisionAdaptive(logger)
	}
	policy := l.policy()
	var err error
	if l.Lease > 0 && z.Shadow {
		return fmt.Errorf("lease: a shadow zone's requests never deny, and each is decided by the backend: remove lease")
	}
	if err := z.checkLockoutShadow(l); err != nil {
		return err
	}
	l.cfg = backend.LimitConfig{Name: z.name, Scope: scope, Algorithm: l.algorithm, Policy: policy, MaxKeys: l.MaxKeys, Cost: l.constantCost(), Lease: l.Lease, Lockout: l.lockoutSteps(), MostEvents: l.adaptCfg.Max, Owner: owner, Calendar: l.budget.cal}
	l.handle, err = store.Register(l.cfg)
	if err != nil {
		return err
	}
	z.limits = append(z.limits, l)
	return l.provisionAdaptive(logger)
}

func (l *limit) provision(logger *zap.Logger) error {
	alg, err := l.check()
	if err != nil {
		return err
	}
	l.missing = cmp.Or(l.Missing, MissingShared)
	l.fail = cmp.Or(l.Fail, l.defaultFail())
	l.algorithm = alg
	if l.adaptCfg, err = l.adaptiveConfig(alg); err != nil {
		return err
	}
	if l.Settle != "" {
		if l.settle, err = parseSettle(l.Settle); err != nil {
			return err
		}
	}
	if err := l.provisionBudget(); err != nil {
		return err
	}
	if alg != "" {
		l.maxCost = algorithms.MaxCost(alg, l.policy())
	}

	opts := keys.Options{IPv4Prefix: l.IPv4Prefix, IPv6Prefix: l.IPv6Prefix}
	for i, n := range l.Normalize {
		f, err := keys.NewNormalizer(n.Name, n.Region, n.Aliases)
		if err != nil {
			return fmt.Errorf("normalize[%d]: %v", i, err)
		}
		opts.Normalizers = append(opts.Normalizers, f)
	}
	if l.Hash != "" {
		secret := caddy.NewReplacer().ReplaceAll(l.Hash, "")
		switch {
		case secret == "":
			return fmt.Errorf("hash: the secret %q is empty (is the environment variable set?)", l.Hash)
		case len(secret) < minSecret:
			return fmt.Errorf("hash: the secret must be at least %d bytes, got %d", minSecret, len(secret))
		}
		opts.Secret = []byte(secret)
	}
	if l.keyer, err = keys.NewKeyer(l.Key, opts); err != nil {
		return fmt.Errorf("key: %v", err)
	}
	for _, ph := range l.keyer.Template().Placeholders() {
		lower := strings.ToLower(ph)
		for _, h := range spoofable {
			if lower == "http.request.header."+h {
				logger.Warn("a rate limit key reads a header any client can set: each client can pose as many. Use {client_ip} ({http.vars.client_ip}) and configure trusted_proxies instead",
					zap.String("zone", l.zone.name), zap.String("scope", l.scope), zap.String("key", l.Key))
			}
		}
	}
	return nil
}
