package sluice

import (
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
)

func init() {
	httpcaddyfile.RegisterHandlerDirective("rate_limit", parseCaddyfile)
	// Ordered by default, so no `order` global option is needed: before
	// basic_auth, as mholt/caddy-ratelimit does, so floods are refused
	// before any password is checked.
	httpcaddyfile.RegisterDirectiveOrder("rate_limit", httpcaddyfile.Before, "basic_auth")
}

func parseCaddyfile(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	var handler Handler
	err := handler.UnmarshalCaddyfile(h.Dispenser)
	return &handler, err
}

// UnmarshalCaddyfile sets up the handler from Caddyfile tokens. Syntax:
//
//	rate_limit [<matcher>] {
//	    zone <name> {
//	        match {
//	            <matchers>
//	        }
//	        key        <string>
//	        rate       <events>/<duration>
//	        events     <max_events>
//	        window     <duration>
//	        burst      <n>
//	        algorithm  sliding_window|sliding_window_counter|fixed_window|token_bucket|gcra|leaky_bucket
//	        max_delay  <duration>
//	        cost       <n>|<placeholder>
//	        ipv4_prefix <bits>
//	        ipv6_prefix <bits>
//	        max_keys   <n>
//	        shadow
//	    }
//	    jitter         <fraction>
//	    sweep_interval <duration>
//	    log_key
//	    disable_metrics
//	    distributed {
//	        read_interval  <duration>
//	        write_interval <duration>
//	        purge_age      <duration>
//	    }
//	    storage <module...>
//	}
//
// `rate 100/1m` is short for `events 100` and `window 1m`; a zone needs one
// of the two forms. The syntax of mholt/caddy-ratelimit is accepted as is.
// Every option may appear once; anything unknown is an error.
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // directive name
	if d.NextArg() {
		return d.ArgErr()
	}
	seen := map[string]bool{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		opt := d.Val()
		if opt != "zone" {
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
			if err != nil || math.IsNaN(j) || math.IsInf(j, 0) || j < 0 {
				return d.Errf("invalid jitter %q: want a fraction ≥ 0 such as 0.2", v)
			}
			h.Jitter = j

		case "sweep_interval":
			dur, err := durationArg(d, opt)
			if err != nil {
				return err
			}
			h.SweepInterval = caddy.Duration(dur)

		case "log_key":
			if d.NextArg() {
				return d.ArgErr()
			}
			h.LogKey = true

		case "disable_metrics":
			if d.NextArg() {
				return d.ArgErr()
			}
			h.DisableMetrics = true

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
	seen := map[string]bool{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		opt := d.Val()
		if opt != "match" {
			if seen[opt] {
				return nil, d.Errf("zone %q: %s already specified", name, opt)
			}
			seen[opt] = true
		}
		var err error
		switch opt {
		case "match":
			var set caddy.ModuleMap
			set, err = caddyhttp.ParseCaddyfileNestedMatcherSet(d)
			if err != nil {
				return nil, d.Errf("zone %q: failed to parse match: %v", name, err)
			}
			z.MatcherSetsRaw = append(z.MatcherSetsRaw, set)
		case "key":
			z.Key, err = oneArg(d)
		case "events":
			z.MaxEvents, err = positiveArg(d, name, opt)
		case "window":
			var dur time.Duration
			dur, err = durationArg(d, opt)
			z.Window = caddy.Duration(dur)
		case "rate":
			var v string
			if v, err = oneArg(d); err == nil {
				var window time.Duration
				z.MaxEvents, window, err = ParseRate(v)
				if err != nil {
					return nil, d.Errf("zone %q: %v", name, err)
				}
				z.Window = caddy.Duration(window)
			}
		case "burst":
			z.Burst, err = positiveArg(d, name, opt)
		case "algorithm":
			z.Algorithm, err = oneArg(d)
		case "max_delay":
			var dur time.Duration
			dur, err = durationArg(d, opt)
			z.MaxDelay = caddy.Duration(dur)
		case "cost":
			var v string
			if v, err = oneArg(d); err == nil {
				if z.Cost, err = ParseCost(v); err != nil {
					return nil, d.Errf("zone %q: %v", name, err)
				}
			}
		case "ipv4_prefix":
			z.IPv4Prefix, err = intArg(d, name, opt, 0, 32)
		case "ipv6_prefix":
			z.IPv6Prefix, err = intArg(d, name, opt, 0, 128)
		case "max_keys":
			var n int64
			n, err = positiveArg(d, name, opt)
			z.MaxKeys = int(n)
		case "shadow":
			if d.NextArg() {
				return nil, d.ArgErr()
			}
			z.Shadow = true
		default:
			return nil, d.Errf("zone %q: unrecognized subdirective %q", name, opt)
		}
		if err != nil {
			return nil, err
		}
	}
	switch {
	case seen["rate"] && (seen["events"] || seen["window"]):
		return nil, d.Errf("zone %q: use either rate or events and window, not both", name)
	case z.MaxEvents == 0 || z.Window == 0:
		return nil, d.Errf("zone %q: a rate limit zone requires both a window and maximum events (rate 100/1m, or events and window)", name)
	}
	return z, nil
}

func unmarshalDistributed(d *caddyfile.Dispenser) (json.RawMessage, error) {
	if d.NextArg() {
		return nil, d.ArgErr()
	}
	fields := map[string]caddy.Duration{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		opt := d.Val()
		switch opt {
		case "read_interval", "write_interval", "purge_age":
		default:
			return nil, d.Errf("distributed: unrecognized subdirective %q", opt)
		}
		if _, dup := fields[opt]; dup {
			return nil, d.Errf("distributed: %s already specified", opt)
		}
		dur, err := durationArg(d, opt)
		if err != nil {
			return nil, err
		}
		fields[opt] = caddy.Duration(dur)
	}
	return json.Marshal(fields)
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
	if per != "" && (per[0] < '0' || per[0] > '9') && per[0] != '.' {
		per = "1" + per
	}
	window, err := caddy.ParseDuration(per)
	if err != nil || window <= 0 {
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

func durationArg(d *caddyfile.Dispenser, opt string) (time.Duration, error) {
	v, err := oneArg(d)
	if err != nil {
		return 0, err
	}
	dur, err := caddy.ParseDuration(v)
	if err != nil {
		return 0, d.Errf("invalid %s %q: %v", opt, v, err)
	}
	if dur <= 0 {
		return 0, d.Errf("%s must be positive, got %q", opt, v)
	}
	return dur, nil
}

func positiveArg(d *caddyfile.Dispenser, zone, opt string) (int64, error) {
	v, err := oneArg(d)
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 1 {
		return 0, d.Errf("zone %q: %s must be a whole number ≥ 1, got %q", zone, opt, v)
	}
	return n, nil
}

func intArg(d *caddyfile.Dispenser, zone, opt string, lo, hi int) (int, error) {
	v, err := oneArg(d)
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < lo || n > hi {
		return 0, d.Errf("zone %q: %s must be a whole number from %d to %d, got %q", zone, opt, lo, hi, v)
	}
	return n, nil
}

// Interface guard.
var _ caddyfile.Unmarshaler = (*Handler)(nil)
