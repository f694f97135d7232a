package sluice

import (
	"cmp"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/dustin/go-humanize"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/internal/keys"
)

func init() {
	httpcaddyfile.RegisterHandlerDirective("rate_limit", parseCaddyfile)
	// Ordered by default, so no `order` global option is needed: before
	// basic_auth, as mholt/caddy-ratelimit does, so floods are refused
	// before any password is checked.
	httpcaddyfile.RegisterDirectiveOrder("rate_limit", httpcaddyfile.Before, "basic_auth")
	httpcaddyfile.RegisterGlobalOption("rate_limit", parseGlobalOption)
}

func parseCaddyfile(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	var handler Handler
	if err := handler.UnmarshalCaddyfile(h.Dispenser); err != nil {
		return nil, err
	}
	// A handler without a backend of its own uses the file's default.
	g, _ := h.Option("rate_limit").(globalOptions)
	if len(handler.BackendRaw) == 0 {
		handler.BackendRaw = g.backend
	}
	if err := applyGlobalShed(h.Dispenser, handler.Shed, g.shed); err != nil {
		return nil, err
	}
	return &handler, nil
}

// globalOptions are the `rate_limit` global options of a Caddyfile.
type globalOptions struct {
	backend json.RawMessage
	shed    map[string]*Shed // load shedding groups' capacities and targets
}

// parseGlobalOption reads the global options block
//
//	{
//	    rate_limit {
//	        backend <name> [{ <options of that backend> }]
//	        shed <group> {
//	            capacity       <n>
//	            latency_target <duration>
//	        }
//	    }
//	}
//
// whose backend is the default of every rate_limit handler of the file
// that does not name one, so that a fleet's Redis is written once, and
// whose shed groups give their capacity and latency target to every
// handler that names them.
func parseGlobalOption(d *caddyfile.Dispenser, existing any) (any, error) {
	if existing != nil {
		return nil, d.Err("rate_limit global options given twice")
	}
	var g globalOptions
	d.Next() // the option name
	if d.NextArg() {
		return nil, d.ArgErr()
	}
	for d.NextBlock(0) {
		switch opt := d.Val(); opt {
		case "backend":
			if g.backend != nil {
				return nil, d.Errf("backend given twice")
			}
			raw, err := unmarshalBackend(d)
			if err != nil {
				return nil, err
			}
			g.backend = raw
		case "shed":
			s, err := unmarshalShed(d, true)
			if err != nil {
				return nil, err
			}
			if _, dup := g.shed[s.Group]; dup {
				return nil, d.Errf("shed %q already defined", s.Group)
			}
			if g.shed == nil {
				g.shed = map[string]*Shed{}
			}
			g.shed[s.Group] = s
		default:
			return nil, d.Errf("unrecognized rate_limit global option %q (want backend or shed)", opt)
		}
	}
	return g, nil
}

// unmarshalBackend reads `backend <name> [{ … }]` with the backend
// module's own Caddyfile syntax.
func unmarshalBackend(d *caddyfile.Dispenser) (json.RawMessage, error) {
	if !d.NextArg() {
		return nil, d.ArgErr()
	}
	name := d.Val()
	unm, err := caddyfile.UnmarshalModule(d, backend.Namespace+"."+name)
	if err != nil {
		return nil, err
	}
	return caddyconfig.JSONModuleObject(unm, "name", name, nil), nil
}

// UnmarshalCaddyfile sets up the handler from Caddyfile tokens. Syntax:
//
//	rate_limit [<matcher>] {
//	    zone <name> {
//	        match {
//	            <matchers>
//	        }
//	        key        <string>
//	        by         ip|subnet|global|path|header <name>|cookie <name>|query <name>|json <path>|form <field>|body <field>
//	        normalize  trim|lower|path|credentials|email [aliases]|phone <region>
//	        hash       <secret>
//	        missing    shared|skip|deny
//	        rate       <events>/<duration>
//	        events     <max_events>
//	        window     <duration>
//	        burst      <n>
//	        algorithm  sliding_window|sliding_window_counter|fixed_window|token_bucket|gcra|leaky_bucket
//	        max_delay  <duration>
//	        cost       <n>|<placeholder> [min <n>]
//	        ipv4_prefix <bits>
//	        ipv6_prefix <bits>
//	        max_keys   <n>
//	        fail       open|closed|local
//	        lease      <n>
//	        cooldown   <duration>
//	        count_when <response matcher>
//	        reset_when <response matcher>
//	        charge_when <response matcher>
//	        reservation_ttl <duration>
//	        align      hour|day|month
//	        timezone   <IANA time zone>
//	        settle     <placeholder>
//	        lockout    <duration...>
//	        concurrency <n>
//	        queue      <duration>
//	        status     <code>
//	        tier       <placeholder>
//	        tiers {
//	            <name> <events>/<duration> [burst <n>] [concurrency <n>]
//	            default <name>
//	        }
//	        adaptive {
//	            min         <n>
//	            max         <n>
//	            increase    <n>
//	            decrease    <fraction>
//	            interval    <duration>
//	            latency_p99 <low> <high>
//	            error_rate  <low>% <high>%
//	        }
//	        scope <name> {
//	            <the options above, from key to adaptive>
//	        }
//	        allow       <cidr...>
//	        deny        <cidr...>
//	        allow_match { <matchers> }
//	        deny_match  { <matchers> }
//	        shadow
//	        headers     draft|legacy|both|none
//	        near_limit  <fraction>
//	    }
//	    headers        draft|legacy|both|none
//	    respond        json|problem|text
//	    jitter         <fraction>
//	    sweep_interval <duration>
//	    log_key
//	    disable_metrics
//	    body_limit     <size>
//	    backend        <name> [{ <options of that backend> }]
//	    shed <group> {
//	        priority       <0-4>
//	        capacity       <n>
//	        latency_target <duration>
//	    }
//	    tarpit         <duration>
//	    tarpit_max     <n>
//	    distributed {
//	        read_interval  <duration>
//	        write_interval <duration>
//	        purge_age      <duration>
//	    }
//	    storage <module...>
//	}
//
// `rate 100/1m` is short for `events 100` and `window 1m`; a zone needs one
// of the two forms, or `cooldown 60s`, short for `rate 1/60s` with
// `algorithm gcra`: at least that long between two requests of a key. The
// syntax of mholt/caddy-ratelimit is accepted as is. Every option may
// appear once; anything unknown is an error.
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // directive name
	if d.NextArg() {
		return d.ArgErr()
	}
	seen := map[string]bool{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		opt := d.Val()
		// A flag given twice says the same thing twice: mholt/caddy-ratelimit
		// loads such configs, so they load here too.
		if opt != "zone" && opt != "log_key" && opt != "disable_metrics" {
			if seen[opt] {
				return d.Errf("%s already specified", opt)
			}
			seen[opt] = true
		}
		switch opt {
		case "zone":
			if !d.NextArg() {
				return d.ArgErr()
			}
			name := d.Val()
			if d.NextArg() {
				return d.Errf("zone takes one name, got another: %q", d.Val())
			}
			if _, dup := h.RateLimits[name]; dup {
				return d.Errf("zone %q already defined", name)
			}
			z, err := unmarshalZone(d, name)
			if err != nil {
				return err
			}
			if h.RateLimits == nil {
				h.RateLimits = make(map[string]*Zone)
			}
			h.RateLimits[name] = z

		case "jitter":
			v, err := oneArg(d)
			if err != nil {
				return err
			}
			j, err := strconv.ParseFloat(v, 64)
			if err == nil {
				err = checkJitter(j)
			}
			if err != nil {
				return d.Errf("invalid jitter %q: want a fraction of the wait, 0 or more, such as 0.2", v)
			}
			h.Jitter = j

		case "sweep_interval":
			v, err := oneArg(d)
			if err != nil {
				return err
			}
			dur, err := caddy.ParseDuration(v)
			if err != nil {
				return d.Errf("invalid %s %q: %v", opt, v, err)
			}
			// 0 is the default, as in JSON (where 0 is the field left out)
			// and in mholt/caddy-ratelimit's Caddyfile: such configs load.
			if dur == 0 {
				break
			}
			if dur < 0 {
				return d.Errf("invalid %s %q: must be positive (0 is the default, 1m)", opt, v)
			}
			h.SweepInterval = caddy.Duration(dur)

		case "log_key":
			if d.NextArg() {
				return d.ArgErr()
			}
			h.LogKey = true

		case "body_limit":
			v, err := oneArg(d)
			if err != nil {
				return err
			}
			size, err := humanize.ParseBytes(v)
			if err != nil || size == 0 || size > MaxBodyLimit {
				return d.Errf("invalid body_limit %q: want a size such as 64KiB, at most 16MiB (%d bytes)", v, MaxBodyLimit)
			}
			h.BodyLimit = int64(size)

		case "disable_metrics":
			if d.NextArg() {
				return d.ArgErr()
			}
			h.DisableMetrics = true

		case "backend":
			raw, err := unmarshalBackend(d)
			if err != nil {
				return err
			}
			h.BackendRaw = raw

		case "headers", "respond":
			if err := h.unmarshalContract(d, opt); err != nil {
				return err
			}

		case "shed":
			s, err := unmarshalShed(d, false)
			if err != nil {
				return err
			}
			h.Shed = s

		case "tarpit", "tarpit_max":
			if err := h.unmarshalTarpit(d, opt); err != nil {
				return err
			}

		case "distributed":
			raw, err := unmarshalDistributed(d)
			if err != nil {
				return err
			}
			h.Distributed = raw

		case "storage":
			if !d.NextArg() {
				return d.ArgErr()
			}
			modID := "caddy.storage." + d.Val()
			unm, err := caddyfile.UnmarshalModule(d, modID)
			if err != nil {
				return err
			}
			storage, ok := unm.(caddy.StorageConverter)
			if !ok {
				return d.Errf("module %s is not a caddy.StorageConverter", modID)
			}
			h.StorageRaw = caddyconfig.JSONModuleObject(storage, "module", storage.(caddy.Module).CaddyModule().ID.Name(), nil)

		default:
			return d.Errf("unrecognized subdirective %q", opt)
		}
	}
	return nil
}

func unmarshalZone(d *caddyfile.Dispenser, name string) (*Zone, error) {
	z := new(Zone)
	lp := newLimitParser(d, fmt.Sprintf("zone %q", name), &z.Limit)
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		opt := d.Val()
		var err error
		switch opt {
		case "match", "allow_match", "deny_match":
			var set caddy.ModuleMap
			set, err = caddyhttp.ParseCaddyfileNestedMatcherSet(d)
			if err != nil {
				// The matcher's error already names the line.
				return nil, fmt.Errorf("zone %q: failed to parse %s: %w", name, opt, err)
			}
			switch opt {
			case "match":
				z.MatcherSetsRaw = append(z.MatcherSetsRaw, set)
			case "allow_match":
				z.AllowMatchRaw = append(z.AllowMatchRaw, set)
			default:
				z.DenyMatchRaw = append(z.DenyMatchRaw, set)
			}
		case "allow", "deny":
			args := d.RemainingArgs()
			if len(args) == 0 {
				return nil, d.ArgErr()
			}
			if _, err := keys.ParseCIDRs(args); err != nil {
				return nil, d.Errf("zone %q: %s: %v", name, opt, err)
			}
			if opt == "allow" {
				z.Allow = append(z.Allow, args...)
			} else {
				z.Deny = append(z.Deny, args...)
			}
		case "shadow":
			if err := lp.once(opt); err != nil {
				return nil, err
			}
			if d.NextArg() {
				return nil, d.ArgErr()
			}
			z.Shadow = true
		case "headers", "status":
			if err := lp.once(opt); err != nil {
				return nil, err
			}
			err = z.unmarshalContract(d, name, opt)
		case "near_limit":
			if err := lp.once(opt); err != nil {
				return nil, err
			}
			var args []string
			if args = d.RemainingArgs(); len(args) != 1 {
				return nil, d.ArgErr()
			}
			f, perr := strconv.ParseFloat(args[0], 64)
			if perr == nil {
				perr = checkNearLimit(f)
			}
			if perr != nil || f == 0 {
				return nil, d.Errf("zone %q: near_limit must be a fraction of the limit between 0 and 1, such as 0.8, got %q", name, args[0])
			}
			z.NearLimit = f
		case "scope":
			if !d.NextArg() {
				return nil, d.ArgErr()
			}
			scope := d.Val()
			if d.NextArg() {
				return nil, d.Errf("scope takes one name, got another: %q", d.Val())
			}
			if !validScopeName(scope) {
				return nil, d.Errf("zone %q: scope %q: a scope name must be non-empty, without / or braces", name, scope)
			}
			if _, dup := z.Scopes[scope]; dup {
				return nil, d.Errf("zone %q: scope %q already defined", name, scope)
			}
			l := new(Limit)
			sp := newLimitParser(d, fmt.Sprintf("zone %q scope %q", name, scope), l)
			for nesting := d.Nesting(); d.NextBlock(nesting); {
				if err := sp.option(d.Val()); err != nil {
					return nil, err
				}
			}
			if err := sp.finish(true); err != nil {
				return nil, err
			}
			if z.Scopes == nil {
				z.Scopes = make(map[string]*Limit)
			}
			z.Scopes[scope] = l
		default:
			err = lp.option(opt)
		}
		if err != nil {
			return nil, err
		}
	}
	// A zone made only of scopes needs no rate of its own.
	if err := lp.finish(len(z.Scopes) == 0); err != nil {
		return nil, err
	}
	return z, nil
}

// limitParser reads the options a zone and its scopes share into a Limit.
type limitParser struct {
	d     *caddyfile.Dispenser
	where string
	l     *Limit
	seen  map[string]bool
	by    string // the `by` shorthand, applied by finish
	norm  string // a normalizer the `by` argument calls for
	line  int    // where the zone or scope block starts
	lines map[string]int
}

func newLimitParser(d *caddyfile.Dispenser, where string, l *Limit) *limitParser {
	return &limitParser{d: d, where: where, l: l, seen: map[string]bool{}, line: d.Line(), lines: map[string]int{}}
}

// errAt is an error about the limit, at a line of the block.
func (p *limitParser) errAt(line int, format string, args ...any) error {
	return &optionError{File: p.d.File(), Line: line, Err: fmt.Errorf("%s: %s", p.where, fmt.Sprintf(format, args...))}
}

// once rejects a repeated option.
func (p *limitParser) once(opt string) error {
	if p.seen[opt] {
		return p.d.Errf("%s: %s already specified", p.where, opt)
	}
	p.seen[opt] = true
	return nil
}

func (p *limitParser) option(opt string) error {
	d, l := p.d, p.l
	if opt != "normalize" {
		if err := p.once(opt); err != nil {
			return err
		}
	}
	p.lines[opt] = d.Line()
	var err error
	switch opt {
	case "key":
		l.Key, err = oneArg(d)
	case "by":
		return p.parseBy()
	case "events":
		l.MaxEvents, err = positiveArg(d, p.where, opt)
	case "window":
		var dur time.Duration
		dur, err = durationArg(d, p.where, opt)
		l.Window = caddy.Duration(dur)
	case "rate":
		var v string
		if v, err = oneArg(d); err == nil {
			var window time.Duration
			l.MaxEvents, window, err = ParseRate(v)
			if err != nil {
				return d.Errf("%s: %v", p.where, err)
			}
			l.Window = caddy.Duration(window)
		}
	case "burst":
		l.Burst, err = positiveArg(d, p.where, opt)
	case "algorithm":
		l.Algorithm, err = oneArg(d)
	case "max_delay":
		var dur time.Duration
		dur, err = durationArg(d, p.where, opt)
		l.MaxDelay = caddy.Duration(dur)
	case "cost":
		err = p.costOption()
	case "ipv4_prefix":
		l.IPv4Prefix, err = intArg(d, p.where, opt, 0, 32)
	case "ipv6_prefix":
		l.IPv6Prefix, err = intArg(d, p.where, opt, 0, 128)
	case "lease":
		l.Lease, err = positiveArg(d, p.where, opt)
	case "concurrency":
		l.Concurrency, err = positiveArg(d, p.where, opt)
	case "queue":
		var dur time.Duration
		dur, err = durationArg(d, p.where, opt)
		l.Queue = caddy.Duration(dur)
	case "queue_max":
		l.QueueMax, err = positiveArg(d, p.where, opt)
	case "slot_ttl":
		var dur time.Duration
		dur, err = durationArg(d, p.where, opt)
		l.SlotTTL = caddy.Duration(dur)
	case "adaptive":
		l.Adaptive, err = parseAdaptive(d, p.where)
	case "max_keys":
		var n int64
		n, err = positiveArg(d, p.where, opt)
		l.MaxKeys = int(n)
	case "normalize":
		args := d.RemainingArgs()
		if len(args) == 0 {
			return d.ArgErr()
		}
		n := Normalize{Name: args[0]}
		switch {
		case len(args) == 2 && n.Name == keys.NormPhone:
			n.Region = args[1]
		case len(args) == 2 && n.Name == keys.NormEmail && args[1] == "aliases":
			n.Aliases = true
		case len(args) > 1:
			return d.Errf("%s: normalize %s: unexpected %q (phone takes a region, email takes aliases)", p.where, n.Name, args[1])
		}
		if _, err := keys.NewNormalizer(n.Name, n.Region, n.Aliases); err != nil {
			return d.Errf("%s: %v", p.where, err)
		}
		l.Normalize = append(l.Normalize, n)
	case "hash":
		l.Hash, err = oneArg(d)
	case "fail":
		if l.Fail, err = oneArg(d); err == nil && !validFail(l.Fail) {
			return d.Errf("%s: fail must be open, closed or local, got %q", p.where, l.Fail)
		}
	case "cooldown":
		// The least time between two requests of a key: one per interval,
		// with no burst to save up, which GCRA enforces exactly.
		var dur time.Duration
		dur, err = durationArg(d, p.where, opt)
		l.MaxEvents, l.Window, l.Algorithm = 1, caddy.Duration(dur), algorithms.NameGCRA
	case "count_when":
		l.CountWhen, err = parseResponseMatcher(d, p.where, opt)
	case "reset_when":
		l.ResetWhen, err = parseResponseMatcher(d, p.where, opt)
	case "charge_when", "reservation_ttl", "align", "timezone":
		return p.budgetOption(opt)
	case "settle":
		l.Settle, err = oneArg(d)
	case "lockout":
		l.Lockout, err = parseLockout(d, p.where)
	case "status":
		var v string
		if v, err = oneArg(d); err == nil {
			if l.Status, err = strconv.Atoi(v); err != nil || checkStatus(l.Status) != nil || l.Status == 0 {
				return d.Errf("%s: status must be from 400 to 599, got %q", p.where, v)
			}
		}
	case "tier":
		l.Tier, err = oneArg(d)
	case "tiers":
		return p.parseTiers()
	case "missing":
		if l.Missing, err = oneArg(d); err == nil {
			switch l.Missing {
			case MissingShared, MissingSkip, MissingDeny:
			default:
				return d.Errf("%s: missing must be shared, skip or deny, got %q", p.where, l.Missing)
			}
		}
	default:
		return d.Errf("%s: unrecognized subdirective %q", p.where, opt)
	}
	return err
}

// byKinds are the `by` shorthands: what a limit is keyed by, and the key
// processing that goes with it.
var byKinds = map[string]struct {
	template string // %s is the argument
	args     int
	v4, v6   int
	norm     string
}{
	"ip":     {template: "{http.vars.client_ip}", v6: 64},
	"subnet": {template: "{http.vars.client_ip}", v4: 24, v6: 48},
	"global": {template: "global"},
	"header": {template: "{http.request.header.%s}", args: 1},
	"cookie": {template: "{http.request.cookie.%s}", args: 1},
	"query":  {template: "{http.request.uri.query.%s}", args: 1},
	"path":   {template: "{http.request.uri.path}", norm: keys.NormPath},
	"json":   {template: "{" + keys.BodyJSONPrefix + "%s}", args: 1},
	"form":   {template: "{" + keys.BodyFormPrefix + "%s}", args: 1},
	"body":   {template: "{" + keys.BodyFieldPrefix + "%s}", args: 1},
}

func (p *limitParser) parseBy() error {
	d := p.d
	args := d.RemainingArgs()
	if len(args) == 0 {
		return d.ArgErr()
	}
	kind, ok := byKinds[args[0]]
	if !ok {
		return d.Errf("%s: by %q: want ip, subnet, global, header <name>, cookie <name>, query <name>, path, json <path>, form <field> or body <field>", p.where, args[0])
	}
	if len(args)-1 != kind.args {
		return d.Errf("%s: by %s takes %d argument(s), got %d", p.where, args[0], kind.args, len(args)-1)
	}
	p.by = args[0]
	if kind.args == 1 && strings.ContainsAny(args[1], "{}") {
		return d.Errf("%s: by %s %q: a name cannot hold braces", p.where, args[0], args[1])
	}
	if kind.args == 1 {
		p.l.Key = fmt.Sprintf(kind.template, args[1])
		if args[0] == "header" && (strings.EqualFold(args[1], "Authorization") || strings.EqualFold(args[1], "Proxy-Authorization")) {
			// "Bearer tok" and "bearer  tok" are one client.
			p.norm = keys.NormCredentials
		}
	} else {
		p.l.Key = kind.template
	}
	return nil
}

// finish checks the limit is complete and applies the `by` defaults the
// block did not override.
func (p *limitParser) finish(needRate bool) error {
	l := p.l
	if p.seen["by"] && p.seen["key"] {
		return p.errAt(max(p.lines["by"], p.lines["key"]), "use either key or by, not both")
	}
	if kind, ok := byKinds[p.by]; ok {
		if !p.seen["ipv4_prefix"] {
			l.IPv4Prefix = kind.v4
		}
		if !p.seen["ipv6_prefix"] {
			l.IPv6Prefix = kind.v6
		}
		if norm := cmp.Or(kind.norm, p.norm); norm != "" {
			l.Normalize = append([]Normalize{{Name: norm}}, l.Normalize...)
		}
	}
	if p.seen["cooldown"] {
		for _, opt := range []string{"rate", "events", "window", "algorithm", "burst"} {
			if p.seen[opt] {
				return p.errAt(max(p.lines["cooldown"], p.lines[opt]), "cooldown sets the rate and algorithm: use it without %s", opt)
			}
		}
	}
	if l.tiered() {
		if err := l.checkTiers(); err != nil {
			line := p.optionLine(err)
			if line == p.line {
				line = cmp.Or(p.lines["tiers"], p.lines["tier"], p.line)
			}
			return p.errAt(line, "%v", err)
		}
		return nil
	}
	switch {
	case p.seen["rate"] && (p.seen["events"] || p.seen["window"]):
		return p.errAt(max(p.lines["rate"], p.lines["events"], p.lines["window"]), "use either rate or events and window, not both")
	case (l.MaxEvents == 0 || l.Window == 0) && ((needRate && l.Concurrency == 0) || l.MaxEvents != 0 || l.Window != 0):
		return p.errAt(p.line, "a rate limit zone requires both a window and maximum events (rate 100/1m, or events and window)")
	case l.MaxEvents == 0 && l.Concurrency == 0: // a zone made only of scopes
		if unused := l.ownOnly(); len(unused) > 0 {
			return p.errAt(cmp.Or(p.lines[unused[0]], p.lines["by"], p.line), "%v", ownOnlyError(unused))
		}
		return nil
	}
	// What provisioning would refuse, refused here at the line of the
	// option at fault.
	if _, err := l.check(); err != nil {
		return p.errAt(p.optionLine(err), "%v", err)
	}
	return nil
}

// parseTiers reads a tiers table:
//
//	tiers {
//	    <name> <events>/<duration> [burst <n>] [concurrency <n>]
//	    default <name>
//	}
func (p *limitParser) parseTiers() error {
	d, l := p.d, p.l
	if d.NextArg() {
		return d.ArgErr()
	}
	seen := map[string]bool{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		name := d.Val()
		args := d.RemainingArgs()
		if name == "default" {
			switch {
			case len(args) != 1:
				return d.Errf("%s: tiers: default takes the name of one tier", p.where)
			case l.DefaultTier != "":
				return d.Errf("%s: tiers: default already specified", p.where)
			case strings.Contains(args[0], "/"):
				return d.Errf("%s: tiers: default names the tier of requests whose tier is unknown (default free); no tier can be called default", p.where)
			}
			l.DefaultTier = args[0]
			continue
		}
		if err := checkTierName(name); err != nil {
			return d.Errf("%s: tiers: %v", p.where, err)
		}
		if seen[name] {
			return d.Errf("%s: tiers: tier %q given twice", p.where, name)
		}
		seen[name] = true
		if len(args) == 0 {
			return d.Errf("%s: tiers: tier %q needs a rate (%s 60/1m burst 10 concurrency 2)", p.where, name, name)
		}
		t := Tier{Name: name}
		events, window, err := ParseRate(args[0])
		if err != nil {
			return d.Errf("%s: tiers: tier %q: %v", p.where, name, err)
		}
		t.MaxEvents, t.Window = events, caddy.Duration(window)
		for i := 1; i < len(args); i += 2 {
			opt := args[i]
			var field *int64
			switch opt {
			case "burst":
				field = &t.Burst
			case "concurrency":
				field = &t.Concurrency
			default:
				return d.Errf("%s: tiers: tier %q: unknown option %q (want burst or concurrency)", p.where, name, opt)
			}
			if *field != 0 {
				return d.Errf("%s: tiers: tier %q: %s already specified", p.where, name, opt)
			}
			if i+1 >= len(args) {
				return d.Errf("%s: tiers: tier %q: %s needs a value", p.where, name, opt)
			}
			n, err := strconv.ParseInt(args[i+1], 10, 64)
			if err != nil || n < 1 {
				return d.Errf("%s: tiers: tier %q: %s must be a whole number ≥ 1, got %q", p.where, name, opt, args[i+1])
			}
			*field = n
		}
		l.Tiers = append(l.Tiers, t)
	}
	if len(l.Tiers) == 0 {
		return d.Errf("%s: tiers: the table has no tier", p.where)
	}
	return nil
}

func unmarshalDistributed(d *caddyfile.Dispenser) (*Distributed, error) {
	if d.NextArg() {
		return nil, d.ArgErr()
	}
	dist := new(Distributed)
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		opt := d.Val()
		var field *caddy.Duration
		switch opt {
		case "read_interval":
			field = &dist.ReadInterval
		case "write_interval":
			field = &dist.WriteInterval
		case "purge_age":
			field = &dist.PurgeAge
		default:
			return nil, d.Errf("distributed: unrecognized subdirective %q", opt)
		}
		if *field != 0 {
			return nil, d.Errf("distributed: %s already specified", opt)
		}
		dur, err := durationArg(d, "distributed", opt)
		if err != nil {
			return nil, err
		}
		*field = caddy.Duration(dur)
	}
	return dist, nil
}

// ParseRate reads "<events>/<duration>": "100/1m", "10/s", "5/1h30m". A
// bare unit means one of it.
func ParseRate(s string) (int64, time.Duration, error) {
	n, per, ok := strings.Cut(s, "/")
	if !ok {
		return 0, 0, fmt.Errorf("invalid rate %q: want <events>/<duration>, such as 100/1m", s)
	}
	events, err := strconv.ParseInt(n, 10, 64)
	if err != nil || events < 1 {
		return 0, 0, fmt.Errorf("invalid rate %q: events must be a whole number ≥ 1", s)
	}
	written := per
	if per != "" && (per[0] < '0' || per[0] > '9') && per[0] != '.' {
		per = "1" + per
	}
	window, err := caddy.ParseDuration(per)
	switch {
	case err != nil:
		return 0, 0, fmt.Errorf("invalid rate %q: %q is not a duration: write a number and a unit, ns, us, ms, s, m, h or d (100/1m, 10/30s, 1000/1d; the number may be left out: 100/m)", s, written)
	case window <= 0:
		return 0, 0, fmt.Errorf("invalid rate %q: the duration after / must be positive, such as 1m", s)
	}
	return events, window, nil
}

func oneArg(d *caddyfile.Dispenser) (string, error) {
	opt := d.Val()
	if !d.NextArg() {
		return "", d.ArgErr()
	}
	v := d.Val()
	if d.NextArg() {
		return "", d.Errf("%s takes one value, got another: %q", opt, d.Val())
	}
	return v, nil
}

func durationArg(d *caddyfile.Dispenser, w, opt string) (time.Duration, error) {
	v, err := oneArg(d)
	if err != nil {
		return 0, err
	}
	dur, err := caddy.ParseDuration(v)
	if err != nil {
		return 0, d.Errf("%sinvalid %s %q: %v", where(w), opt, v, err)
	}
	if dur <= 0 {
		return 0, d.Errf("%s%s must be positive, got %q", where(w), opt, v)
	}
	return dur, nil
}

// where prefixes an error with the zone (and scope) it is about.
func where(w string) string {
	if w == "" {
		return ""
	}
	return w + ": "
}

func positiveArg(d *caddyfile.Dispenser, w, opt string) (int64, error) {
	v, err := oneArg(d)
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 1 {
		return 0, d.Errf("%s%s must be a whole number ≥ 1, got %q", where(w), opt, v)
	}
	return n, nil
}

func intArg(d *caddyfile.Dispenser, w, opt string, lo, hi int) (int, error) {
	v, err := oneArg(d)
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < lo || n > hi {
		return 0, d.Errf("%s%s must be a whole number from %d to %d, got %q", where(w), opt, lo, hi, v)
	}
	return n, nil
}

// Interface guard.
var _ caddyfile.Unmarshaler = (*Handler)(nil)

// parseAdaptive reads an adaptive block:
//
//	adaptive {
//	    min         <n>
//	    max         <n>
//	    increase    <n>
//	    decrease    <fraction>
//	    interval    <duration>
//	    latency_p99 <low> <high>
//	    error_rate  <low>% <high>%
//	}
//
// Error rates are percentages ("1%") or fractions ("0.01").
func parseAdaptive(d *caddyfile.Dispenser, w string) (*Adaptive, error) {
	if d.NextArg() {
		return nil, d.Errf("%sadaptive takes a block, not %q", where(w), d.Val())
	}
	a := new(Adaptive)
	seen := map[string]bool{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		opt := d.Val()
		if seen[opt] {
			return nil, d.Errf("%sadaptive: %s already specified", where(w), opt)
		}
		seen[opt] = true
		var err error
		switch opt {
		case "min":
			a.Min, err = positiveArg(d, w, "adaptive min")
		case "max":
			a.Max, err = positiveArg(d, w, "adaptive max")
		case "increase":
			a.Increase, err = positiveArg(d, w, "adaptive increase")
		case "decrease":
			var v string
			if v, err = oneArg(d); err == nil {
				if a.Decrease, err = strconv.ParseFloat(v, 64); err != nil || !(a.Decrease > 0 && a.Decrease < 1) {
					return nil, d.Errf("%sadaptive: decrease must be a fraction strictly between 0 and 1, such as 0.7, got %q", where(w), v)
				}
			}
		case "interval":
			var dur time.Duration
			dur, err = durationArg(d, w, "adaptive interval")
			a.Interval = caddy.Duration(dur)
		case "latency_p99":
			var lo, hi time.Duration
			lo, hi, err = twoArgs(d, w, opt, func(v string) (time.Duration, error) {
				dur, err := caddy.ParseDuration(v)
				if err == nil && dur <= 0 {
					err = fmt.Errorf("must be positive")
				}
				return dur, err
			})
			a.LatencyP99Low, a.LatencyP99High = caddy.Duration(lo), caddy.Duration(hi)
		case "error_rate":
			a.ErrorRateLow, a.ErrorRateHigh, err = twoArgs(d, w, opt, parseRatio)
		default:
			return nil, d.Errf("%sadaptive: unrecognized option %q (min, max, increase, decrease, interval, latency_p99, error_rate)", where(w), opt)
		}
		if err != nil {
			return nil, err
		}
	}
	return a, nil
}

// twoArgs reads the low and high marks of an adaptive option.
func twoArgs[T any](d *caddyfile.Dispenser, w, opt string, parse func(string) (T, error)) (lo, hi T, err error) {
	args := d.RemainingArgs()
	if len(args) != 2 {
		return lo, hi, d.Errf("%sadaptive: %s takes a low and a high mark, got %d values", where(w), opt, len(args))
	}
	if lo, err = parse(args[0]); err == nil {
		hi, err = parse(args[1])
	}
	if err != nil {
		return lo, hi, d.Errf("%sadaptive: %s %s %s: %v", where(w), opt, args[0], args[1], err)
	}
	return lo, hi, nil
}

// parseRatio reads "5%" or "0.05" as 0.05.
func parseRatio(v string) (float64, error) {
	num, pct := strings.CutSuffix(v, "%")
	f, err := strconv.ParseFloat(num, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, fmt.Errorf("not a number or a percentage: %q", v)
	}
	if pct {
		f /= 100
	}
	return f, nil
}

// parseLockout reads `lockout <duration>...`; the steps' order and bounds
// are checked with the rest of the limit (checkLockout).
func parseLockout(d *caddyfile.Dispenser, w string) ([]caddy.Duration, error) {
	args := d.RemainingArgs()
	if len(args) == 0 {
		return nil, d.Errf("%slockout needs at least one duration, such as lockout 1m 5m 24h", where(w))
	}
	steps := make([]caddy.Duration, len(args))
	for i, a := range args {
		dur, err := caddy.ParseDuration(a)
		if err != nil {
			return nil, d.Errf("%sinvalid lockout step %d %q: %v", where(w), i+1, a, err)
		}
		steps[i] = caddy.Duration(dur)
	}
	return steps, nil
}

// parseResponseMatcher reads `count_when` or `reset_when` in Caddy's
// response matcher syntax, on one line or as a block:
//
//	count_when status 401 403
//	reset_when {
//	    status 2xx
//	    header X-Login ok
//	}
func parseResponseMatcher(d *caddyfile.Dispenser, where, opt string) (*caddyhttp.ResponseMatcher, error) {
	m := map[string]caddyhttp.ResponseMatcher{}
	if err := caddyhttp.ParseNamedResponseMatcher(d.NewFromNextSegment(), m); err != nil {
		return nil, fmt.Errorf("%s: %s: %w", where, opt, err)
	}
	rm := m[opt]
	return &rm, nil
}

// unmarshalContract reads the handler's `headers <mode>` and
// `respond <format>` Caddyfile options.
func (h *Handler) unmarshalContract(d *caddyfile.Dispenser, opt string) error {
	v, err := oneArg(d)
	if err != nil {
		return err
	}
	if opt == "headers" {
		if _, err := parseHeaders(v); err != nil {
			return d.Err(err.Error())
		}
		h.Headers = v
		return nil
	}
	h.Respond = v
	switch v {
	case RespondJSON, RespondProblem, RespondText:
		return nil
	}
	return d.Errf("respond must be json, problem or text, got %q", v)
}

// unmarshalContract reads a zone's `headers <mode>` and `status <code>`.
func (z *Zone) unmarshalContract(d *caddyfile.Dispenser, name, opt string) error {
	v, err := oneArg(d)
	if err != nil {
		return err
	}
	if opt == "headers" {
		if _, err := parseHeaders(v); err != nil {
			return d.Errf("zone %q: %v", name, err)
		}
		z.Headers = v
		return nil
	}
	if z.Status, err = strconv.Atoi(v); err != nil || checkStatus(z.Status) != nil || z.Status == 0 {
		return d.Errf("zone %q: status must be from 400 to 599, got %q", name, v)
	}
	return nil
}

// unmarshalShed reads
//
//	shed <group> [{
//	    priority       <0-4>
//	    capacity       <n>
//	    latency_target <duration>
//	}]
//
// in a handler (all three) or in the global options (capacity and
// latency_target: the group's, for every handler of the file that names
// it).
func unmarshalShed(d *caddyfile.Dispenser, global bool) (*Shed, error) {
	if !d.NextArg() {
		return nil, d.ArgErr()
	}
	s := &Shed{Group: d.Val()}
	if d.NextArg() {
		return nil, d.Errf("shed takes one group name, got another: %q (priority, capacity and latency_target go in its block)", d.Val())
	}
	w := fmt.Sprintf("shed %q", s.Group)
	seen := map[string]bool{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		opt := d.Val()
		if seen[opt] {
			return nil, d.Errf("%s: %s already specified", w, opt)
		}
		seen[opt] = true
		var err error
		switch {
		case opt == "capacity":
			s.Capacity, err = positiveArg(d, w, opt)
		case opt == "latency_target":
			var dur time.Duration
			dur, err = durationArg(d, w, opt)
			s.LatencyTarget = caddy.Duration(dur)
		case opt == "priority" && !global:
			s.Priority, err = intArg(d, w, opt, 0, MaxShedPriority)
		case opt == "priority":
			return nil, d.Errf("%s: priority is a route's, not the group's: set it in the rate_limit handler of each route", w)
		default:
			return nil, d.Errf("%s: unrecognized option %q (want priority, capacity or latency_target)", w, opt)
		}
		if err != nil {
			return nil, err
		}
	}
	if global && s.Capacity == 0 && s.LatencyTarget == 0 {
		return nil, d.Errf("%s: capacity or latency_target is required", w)
	}
	return s, nil
}

// applyGlobalShed gives a handler's group the capacity and latency target
// the global options set for it.
func applyGlobalShed(d *caddyfile.Dispenser, s *Shed, groups map[string]*Shed) error {
	if s == nil {
		return nil
	}
	g, ok := groups[s.Group]
	if !ok {
		if s.Capacity == 0 && s.LatencyTarget == 0 {
			return d.Errf("shed %q: no capacity: set it in the global options (rate_limit { shed %s { capacity <n> } }) or in this block (or latency_target alone, to shed on latency)", s.Group, s.Group)
		}
		return nil
	}
	switch {
	case s.Capacity != 0 && s.Capacity != g.Capacity:
		return d.Errf("shed %q: capacity %d here, %d in the global options: a group has one capacity (remove it here)", s.Group, s.Capacity, g.Capacity)
	case s.LatencyTarget != 0 && s.LatencyTarget != g.LatencyTarget:
		return d.Errf("shed %q: latency_target %s here, %s in the global options: a group has one target (remove it here)", s.Group, time.Duration(s.LatencyTarget), time.Duration(g.LatencyTarget))
	}
	s.Capacity, s.LatencyTarget = g.Capacity, g.LatencyTarget
	return nil
}

// unmarshalTarpit reads `tarpit <duration>` and `tarpit_max <n>`.
func (h *Handler) unmarshalTarpit(d *caddyfile.Dispenser, opt string) error {
	if opt == "tarpit_max" {
		n, err := positiveArg(d, "", opt)
		if err != nil {
			return err
		}
		if n > MaxTarpitMax {
			return d.Errf("tarpit_max must be from 1 to %d, got %d", MaxTarpitMax, n)
		}
		h.TarpitMax = n
		return nil
	}
	dur, err := durationArg(d, "", opt)
	if err != nil {
		return err
	}
	if caddy.Duration(dur) > MaxTarpit {
		return d.Errf("tarpit must be at most 1m, got %s", dur)
	}
	h.Tarpit = caddy.Duration(dur)
	return nil
}
