package sluice

import (
	"strings"
	"sync/atomic"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/sluicehq/sluice/internal/keys"
)

// Placeholders that only another handler fills in: authentication sets
// {http.auth.user.*}, and handlers such as vars set {http.vars.*}. When
// that handler runs after rate_limit (the Caddyfile's default order puts
// rate_limit before basic_auth), the value is empty for every request, and
// all clients silently share one quota. A handler cannot see the route it
// is in, so this is found at the first request that has the value empty,
// and said once.
const (
	authPrefix = "http.auth."
	varsPrefix = "http.vars."
)

// handlerPlaceholder is one such placeholder of a handler, warned about at
// most once however many limits read it.
type handlerPlaceholder struct {
	name   string
	warned atomic.Bool
}

// setByHandler reports whether placeholder name is set only by a handler
// that must run before rate_limit: one of {http.auth.*} or {http.vars.*},
// or a name outside the namespaces Caddy and Sluice define (a map's
// destination, another module's placeholder). Caddy's server sets
// client_ip and trusted_proxy itself, before any handler.
func setByHandler(name string) bool {
	switch name {
	case varsPrefix + caddyhttp.ClientIPVarKey, varsPrefix + caddyhttp.TrustedProxyVarKey:
		return false
	}
	return strings.HasPrefix(name, authPrefix) || strings.HasPrefix(name, varsPrefix) || !keys.Owned(name)
}

// watchHandlerPlaceholders finds the placeholders of l's key and cost that
// another handler must set first, sharing one watch per placeholder
// through seen.
func (l *limit) watchHandlerPlaceholders(seen map[string]*handlerPlaceholder) {
	watch := func(names []string) []*handlerPlaceholder {
		var ws []*handlerPlaceholder
		for _, name := range names {
			if !setByHandler(name) {
				continue
			}
			w := seen[name]
			if w == nil {
				w = &handlerPlaceholder{name: name}
				seen[name] = w
			}
			ws = append(ws, w)
		}
		return ws
	}
	l.keyByHandler = watch(l.keyer.Template().Placeholders())
	if l.Cost != nil {
		l.costByHandler = watch(l.Cost.tmpl.Placeholders())
	}
}

// warnEmpty logs, once per placeholder, that one of ws, l's placeholders
// in part that an earlier handler must set, is empty.
func (l *limit) warnEmpty(logger *zap.Logger, repl *caddy.Replacer, ws []*handlerPlaceholder, part string) {
	for _, w := range ws {
		if w.warned.Load() {
			continue
		}
		if v, _ := repl.GetString(w.name); v != "" {
			continue
		}
		if !w.warned.CompareAndSwap(false, true) {
			continue
		}
		effect := "every request without it shares one quota (or is skipped or denied, as `missing` says)"
		switch part {
		case "cost":
			effect = "the cost it should give is never read"
		case "tier":
			effect = "every request gets the default tier"
		}
		fix := "make the handler that sets it run before rate_limit: inside `route { … }` handlers run in the order they are written"
		if strings.HasPrefix(w.name, authPrefix) {
			fix = "authentication must run before rate_limit: add `order rate_limit after basic_auth` to the global options (or after the directive that authenticates), or write both inside `route { … }`, authentication first"
		}
		logger.Warn("a rate limit reads a placeholder that is empty when rate_limit runs: "+effect+". To fix it, "+fix,
			zap.String("placeholder", "{"+w.name+"}"),
			zap.String("in", part),
			zap.String("zone", l.zone.name),
			zap.String("scope", l.scope))
	}
}
