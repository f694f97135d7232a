package sluice

import (
	"fmt"
	"hash/fnv"
	"net/http"
	"net/textproto"
	"slices"
	"strings"
	"sync"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/internal/keys"
)

// Tier is one row of a limit's tiers table: a plan's rate, burst and
// concurrency cap.
type Tier struct {
	// Name is the tier's name, the value of the tier placeholder that picks
	// it (matched exactly, case included): letters, digits, '_', '-' and
	// '.', at most 64 bytes.
	Name string `json:"name"`
	// MaxEvents is how many events (units of cost) the tier allows per
	// Window. Required.
	MaxEvents int64 `json:"max_events"`
	// Window is the length of the tier's window. Required.
	Window caddy.Duration `json:"window"`
	// Burst is the tier's bucket capacity (token_bucket, gcra and the
	// leaky_bucket meter). Default: MaxEvents.
	Burst int64 `json:"burst,omitempty"`
	// Concurrency caps the requests of a key of this tier in flight at
	// once (503 beyond). Default: 0, no cap.
	Concurrency int64 `json:"concurrency,omitempty"`
}

// MaxTiers is the most tiers a limit may have: each is a limit of its own
// in the store.
const MaxTiers = 64

// maxTierName is the longest tier name, in bytes.
const maxTierName = 64

// tierSet picks the limit of a request's tier. It is read-only once
// provisioned, so requests share it without locks.
type tierSet struct {
	expr string // the tier template, as configured
	// Where the value is read without Caddy's replacer (which boxes every
	// value it returns): a request header, or a var an earlier handler set.
	header    string // canonical header name
	varName   string
	byName    map[string]*limit
	def       *limit
	byHandler []*handlerPlaceholder
}

// pick returns the limit of r's tier: the tier its value names, or the
// default tier for any other value (absent, empty, given twice, unknown),
// so the table alone bounds the state a client can make. empty tells that
// the value was empty.
func (t *tierSet) pick(r *http.Request, repl *caddy.Replacer) (l *limit, empty bool) {
	v := t.value(r, repl)
	if len(v) > maxTierName {
		// No tier has such a name: not worth hashing a value a client
		// may have made a megabyte long.
		return t.def, false
	}
	if l, ok := t.byName[v]; ok {
		return l, false
	}
	return t.def, v == ""
}

// value is the tier value of r. A header given more than once is no value:
// Caddy would join the copies, and the application might read either.
func (t *tierSet) value(r *http.Request, repl *caddy.Replacer) string {
	switch {
	case t.header != "":
		if vals := r.Header[t.header]; len(vals) == 1 {
			return vals[0]
		}
		return ""
	case t.varName != "":
		vars, _ := r.Context().Value(caddyhttp.VarsCtxKey).(map[string]any)
		switch v := vars[t.varName].(type) {
		case string:
			return v
		case nil:
			return ""
		default:
			return caddy.ToString(v)
		}
	}
	return repl.ReplaceKnown(t.expr, "")
}

// shownScope is the scope clients are told of (in rate limit fields and
// refusal bodies): a tier's limit goes by its scope as configured, without
// the tier and its version.
func (l *limit) shownScope() string {
	if l.tier != "" {
		return l.base
	}
	return l.scope
}

// tiered tells whether l is a tiers table (rather than a limit of its own).
func (l *Limit) tiered() bool {
	return l.Tiers != nil || l.Tier != "" || l.DefaultTier != ""
}

// checkTiers validates a tiers table and the options its tiers share, so
// that the Caddyfile adapter can name the line; provisioning checks it
// again.
func (l *Limit) checkTiers() error {
	switch {
	case l.Tier == "":
		return optionErrorf("tiers", "tiers: set tier to the placeholder that names a request's tier, such as {http.request.header.X-Plan} or {http.vars.plan}")
	case len(l.Tiers) == 0:
		return optionErrorf("tier", "tier: no tiers table: give the tiers and their rates")
	case len(l.Tiers) > MaxTiers:
		return optionErrorf("tiers", "tiers: at most %d tiers, got %d", MaxTiers, len(l.Tiers))
	}
	tmpl, err := keys.ParseTemplate(l.Tier)
	if err == nil {
		err = keys.CheckTemplate(tmpl)
	}
	if err != nil {
		return optionErrorf("tier", "tier: %v", err)
	}
	if len(tmpl.Placeholders()) == 0 {
		return optionErrorf("tier", "tier %q has no placeholder: every request would get the same tier (use one such as {http.request.header.X-Plan}, or a rate without tiers)", l.Tier)
	}
	if tmpl.NeedsBody() {
		return optionErrorf("tier", "tier %q reads the request body: a tier comes from a header or from a var an earlier handler sets", l.Tier)
	}
	if unused := setOptions(
		option{l.MaxEvents != 0, "max_events"}, option{l.Window != 0, "window"},
		option{l.Burst != 0, "burst"}, option{l.Concurrency != 0, "concurrency"},
	); len(unused) > 0 {
		return optionErrorf(unused[0], "%s would do nothing with tiers: each tier has its own rate, burst and concurrency (remove %s)", strings.Join(unused, ", "), itOrThem(unused))
	}
	if l.Lease != 0 {
		// A lease is taken per tier: units leased under one tier stay
		// unspent, held from the fleet, when the key changes tier.
		return optionErrorf("lease", "lease cannot be used with tiers: units leased in one tier would stay held when a key changes tier")
	}
	if l.Queue != 0 {
		return optionErrorf("queue", "queue cannot be used with tiers: it waits for a concurrency slot, and each tier sets its own concurrency")
	}
	seen := make(map[string]bool, len(l.Tiers))
	var names []string
	for i, t := range l.Tiers {
		if err := checkTierName(t.Name); err != nil {
			return optionErrorf("tiers", "tiers[%d]: %v", i, err)
		}
		if seen[t.Name] {
			return optionErrorf("tiers", "tiers: tier %q given twice", t.Name)
		}
		seen[t.Name] = true
		names = append(names, t.Name)
		if t.MaxEvents == 0 || t.Window == 0 {
			return optionErrorf("tiers", "tiers: tier %q needs a rate: max_events and window (rate 60/1m)", t.Name)
		}
		if _, err := l.tierLimit(t).check(); err != nil {
			return optionErrorf("tiers", "tiers: tier %q: %w", t.Name, err)
		}
	}
	switch {
	case l.DefaultTier == "":
		return optionErrorf("tiers", "tiers: no default tier: name the tier of requests whose tier is missing or unknown (default %s)", names[0])
	case !seen[l.DefaultTier]:
		return optionErrorf("default_tier", "default tier %q is not in the tiers table (%s)", l.DefaultTier, strings.Join(names, ", "))
	}
	return nil
}

// checkTierName accepts the names a metric label, a store key and a
// header value all carry as they are.
func checkTierName(name string) error {
	if name == "" || len(name) > maxTierName {
		return fmt.Errorf("a tier name must be 1 to %d bytes, got %q", maxTierName, name)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.') {
			return fmt.Errorf("tier name %q: only letters, digits, '_', '-' and '.'", name)
		}
	}
	return nil
}

// tierLimit is l with tier t's numbers in place of its own.
func (l *Limit) tierLimit(t Tier) *Limit {
	c := *l
	c.Tier, c.Tiers, c.DefaultTier = "", nil, ""
	c.MaxEvents, c.Window, c.Burst, c.Concurrency = t.MaxEvents, t.Window, t.Burst, t.Concurrency
	return &c
}

// tierVersion is a short hash of what a tier's state means: its algorithm
// and rate. It is part of the tier's state name, so state counted under
// one policy is never read under another (a tier changed by a reload
// starts afresh, where an untiered limit carries its usage over).
func tierVersion(alg string, p algorithms.Policy) string {
	h := fnv.New32a()
	fmt.Fprintf(h, "%s/%d/%d/%d/%d", alg, p.Limit, p.Window, p.Burst, p.MaxDelay)
	return fmt.Sprintf("%08x", h.Sum32())
}

// tierSeries counts the running configs that use each tier version's
// metric series. A reload that changes a tier's rate names it anew, and
// without this every such reload would leave the old version's series
// behind for good: 60 reloads of one tiered zone made 1,484 series.
var tierSeries = struct {
	sync.Mutex
	n map[[2]string]int
}{n: map[[2]string]int{}}

// retainTierSeries notes that a config uses the series of a tier version.
func retainTierSeries(zone, scope string) [2]string {
	k := [2]string{zone, scope}
	tierSeries.Lock()
	tierSeries.n[k]++
	tierSeries.Unlock()
	return k
}

// releaseTierSeries drops the series of h's tier versions that no running
// config uses any more; versions the new config kept are still used, and
// keep theirs.
func (h *plan) releaseTierSeries() {
	tierSeries.Lock()
	defer tierSeries.Unlock()
	series := h.tierSeries
	h.tierSeries = nil
	for _, k := range series {
		if tierSeries.n[k]--; tierSeries.n[k] > 0 {
			continue
		}
		delete(tierSeries.n, k)
		labels := prometheus.Labels{"zone": k[0], "scope": k[1]}
		for _, v := range []interface {
			DeletePartialMatch(prometheus.Labels) int
		}{metrics.requests, metrics.declined, metrics.shadow, metrics.missing, metrics.failures, metrics.near, metrics.duration, inFlight} {
			v.DeletePartialMatch(labels)
		}
	}
}

// tierScope names the limit of one tier of scope ("" for a zone's own
// limit) in metrics, the admin API and the store.
func tierScope(scope, tier, version string) string {
	return scope + "@" + tier + ":" + version
}

// addTiers registers one limit per tier of l, and puts l in the zone's
// keyed limits to pick among them per request.
func (z *zone) addTiers(cfg *Limit, scope string, store backend.Store, logger *zap.Logger, owner any) error {
	if err := cfg.checkTiers(); err != nil {
		return err
	}
	l := &limit{Limit: cfg}
	ts := &tierSet{expr: l.Tier, byName: make(map[string]*limit, len(l.Tiers))}
	tmpl, _ := keys.ParseTemplate(l.Tier)
	if names := tmpl.Placeholders(); len(names) == 1 && "{"+names[0]+"}" == l.Tier {
		if h, ok := strings.CutPrefix(names[0], "http.request.header."); ok {
			ts.header = textproto.CanonicalMIMEHeaderKey(h)
		} else if v, ok := strings.CutPrefix(names[0], varsPrefix); ok {
			ts.varName = v
		}
	}
	keyed := len(z.keyed)
	for _, t := range l.Tiers {
		c := &limit{Limit: l.tierLimit(t), tier: t.Name, base: scope}
		alg, _ := algorithms.Check(c.Algorithm, c.policy())
		p := c.policy()
		if algorithms.UsesBurst(alg) && p.Burst == 0 {
			p.Burst = p.Limit // the default, spelled out or not, is one policy
		}
		if err := z.addRate(c, tierScope(scope, t.Name, tierVersion(alg, p)), store, logger, owner); err != nil {
			return fmt.Errorf("tiers: tier %q: %w", t.Name, err)
		}
		ts.byName[t.Name] = c
	}
	ts.def = ts.byName[l.DefaultTier]
	// Requests reach the tiers through l alone, which shares their key.
	z.keyed = slices.Delete(z.keyed, keyed, len(z.keyed))
	l.zone, l.scope, l.base, l.tiers = z, scope, scope, ts
	l.keyer, l.missing, l.fail = ts.def.keyer, ts.def.missing, ts.def.fail
	z.keyed = append(z.keyed, l)
	for _, ph := range tmpl.Placeholders() {
		if setByHandler(ph) {
			ts.byHandler = append(ts.byHandler, &handlerPlaceholder{name: ph})
		}
		if strings.HasPrefix(strings.ToLower(ph), "http.request.header.") {
			logger.Warn("a rate limit's tier is read from a request header: any client can name its own tier unless a proxy in front of Caddy, or a handler that runs before rate_limit, sets that header",
				zap.String("zone", z.name), zap.String("scope", scope), zap.String("tier", l.Tier))
		}
	}
	return nil
}
