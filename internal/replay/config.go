package replay

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
)

// Module names of the replay's own parts, registered only by a process
// that replays (Register), never by a serving Caddy.
const (
	storeModule     = "sluice_replay"
	responderModule = "sluice_replay_response"
)

// Plan is a config made ready for replaying, and what it says about the
// replay.
type Plan struct {
	// JSON is the config to provision: its http app alone, each
	// rate_limit handler on the replay's memory store, every handler that
	// would reach outside (a proxy, files, a response) replaced by the
	// log's answer.
	JSON []byte
	// Zones are the zones replayed, by name (zones of one name share
	// their state, as they do when served).
	Zones map[string]*ZoneInfo
	// NotReplayed are the zones left out, with why.
	NotReplayed []Excluded
	// Notes say what the replay does differently from a serving Caddy.
	Notes []string
	// Loggers maps an access logger name to the server that writes it.
	Loggers map[string]string
	// Servers are the servers' names, sorted.
	Servers []string
	// Response is whether a limit reads the response (count_when,
	// reset_when, charge_when, settle).
	Response bool
	// Headers are the request header fields that keys, costs and tiers
	// read (canonical names).
	Headers []string
}

// Excluded is a zone the log cannot replay.
type Excluded struct {
	Zone   string `json:"zone"`
	Reason string `json:"reason"`
}

// ZoneInfo is a zone as configured.
type ZoneInfo struct {
	Name   string
	Shadow bool
	Limits []*LimitInfo // the zone's own (if it has a rate) first, then scopes by name
	// raw is the zone's JSON after the replay's changes.
	raw map[string]any
	// Source is the zone's JSON as configured (for recommend's block).
	Source json.RawMessage
}

// LimitInfo is one limit of a zone.
type LimitInfo struct {
	Zone, Scope string
	Algorithm   string
	MaxEvents   int64
	Window      int64 // ns
	Burst       int64 // 0: the algorithm's default
	Tiered      bool
	Key         string
	Headers     []string // header fields its key, cost or tier read
	Response    bool     // reads the response
}

// Rate is the limit as "N/window".
func (l *LimitInfo) Rate() string {
	if l.Tiered {
		return "tiers"
	}
	return fmt.Sprintf("%d/%s", l.MaxEvents, FormatWindow(l.Window))
}

// FormatWindow writes a window the way a Caddyfile would: 1m, 1h, 24h.
func FormatWindow(ns int64) string {
	s := time.Duration(ns).String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// Terminal handlers answer the request themselves: in the replay the
// log's answer takes their place, so that nothing leaves the process.
var terminal = map[string]bool{
	"static_response": true, "reverse_proxy": true, "file_server": true, "error": true,
	"acme_server": true, "metrics": true, "copy_response": true, "copy_response_headers": true,
}

// passThrough handlers change the request a key may read: they run.
var passThrough = map[string]bool{"vars": true, "map": true, "rewrite": true, "headers": true}

// quiet handlers change only the response or its logging: left out
// without a note. Authentication is left out too; its user id comes from
// the log's user_id.
var quiet = map[string]bool{
	"encode": true, "push": true, "tracing": true, "log_append": true, "templates": true,
	"request_body": true, "intercept": true, "authentication": true, "log_filter": true,
}

// Limit options a replay cannot honour, and what it does instead.
var unreplayedLimit = []struct{ field, note string }{
	{"concurrency", "concurrency caps are not replayed: requests are decided one at a time, none in flight together"},
	{"queue", ""}, {"queue_max", ""}, {"slot_ttl", ""},
	{"adaptive", "adaptive limits are replayed at their configured rate: the upstream's latency and errors that move them are not in the log"},
	{"lease", "leases are dropped: the memory store decides every request"},
}

// PrepareConfig makes a Caddy JSON config ready for replaying.
func PrepareConfig(cfgJSON []byte) (*Plan, error) {
	var cfg map[string]any
	if err := json.Unmarshal(cfgJSON, &cfg); err != nil {
		return nil, fmt.Errorf("reading the config: %v", err)
	}
	apps, _ := cfg["apps"].(map[string]any)
	httpApp, _ := apps["http"].(map[string]any)
	servers, _ := httpApp["servers"].(map[string]any)
	if len(servers) == 0 {
		return nil, fmt.Errorf("the config has no HTTP servers")
	}
	p := &Plan{Zones: map[string]*ZoneInfo{}, Loggers: map[string]string{}}
	notes := map[string]bool{}
	note := func(s string) {
		if s != "" && !notes[s] {
			notes[s] = true
			p.Notes = append(p.Notes, s)
		}
	}
	headers := map[string]bool{}
	handlers := 0
	for _, name := range slices.Sorted(maps.Keys(servers)) {
		srv, _ := servers[name].(map[string]any)
		if srv == nil {
			continue
		}
		p.Servers = append(p.Servers, name)
		credentials := false
		if logs, ok := srv["logs"].(map[string]any); ok {
			credentials, _ = logs["should_log_credentials"].(bool)
			names := []string{}
			if d, ok := logs["default_logger_name"].(string); ok && d != "" {
				names = append(names, d)
			}
			if ln, ok := logs["logger_names"].(map[string]any); ok {
				for _, v := range ln {
					switch v := v.(type) {
					case string:
						names = append(names, v)
					case []any:
						for _, s := range v {
							if s, ok := s.(string); ok {
								names = append(names, s)
							}
						}
					}
				}
			}
			if len(names) == 0 {
				p.addLogger(accessLogger, name)
			}
			for _, n := range names {
				p.addLogger(accessLogger+"."+n, name)
			}
		}
		for _, k := range []string{"tls_connection_policies", "listener_wrappers", "packet_conn_wrappers", "metrics", "errors", "logs", "named_routes", "listen_protocols"} {
			delete(srv, k)
		}
		if tp, ok := srv["trusted_proxies"].(map[string]any); ok && tp["source"] != "static" {
			delete(srv, "trusted_proxies")
		}
		srv["automatic_https"] = map[string]any{"disable": true}
		ctx := &walk{plan: p, note: note, credentials: credentials, headers: headers}
		srv["routes"] = ctx.routes(srv["routes"])
		handlers += ctx.handlers
	}
	if handlers == 0 {
		return nil, fmt.Errorf("the config has no rate_limit handler")
	}
	if len(p.Zones) == 0 {
		var why []string
		for _, e := range p.NotReplayed {
			why = append(why, fmt.Sprintf("zone %q: %s", e.Zone, e.Reason))
		}
		return nil, fmt.Errorf("no zone of this config can be replayed from an access log:\n  %s", strings.Join(why, "\n  "))
	}
	for h := range headers {
		p.Headers = append(p.Headers, h)
	}
	slices.Sort(p.Headers)
	out := map[string]any{
		"apps": map[string]any{"http": map[string]any{"servers": servers}},
		// Provisioning's info logs stay out of the command's output, which
		// is its answer; its errors are returned.
		"logging": map[string]any{"logs": map[string]any{"default": map[string]any{"level": "ERROR"}}},
	}
	var err error
	p.JSON, err = json.Marshal(out)
	return p, err
}

func (p *Plan) addLogger(logger, server string) {
	if prev, ok := p.Loggers[logger]; ok && prev != server {
		p.Loggers[logger] = "" // written by several servers: not a clue
		return
	}
	p.Loggers[logger] = server
}

// walk rewrites one server's routes.
type walk struct {
	plan        *Plan
	note        func(string)
	credentials bool
	headers     map[string]bool
	handlers    int
}

func (w *walk) routes(v any) any {
	routes, _ := v.([]any)
	for _, r := range routes {
		route, _ := r.(map[string]any)
		if route == nil {
			continue
		}
		list, _ := route["handle"].([]any)
		var out []any
		for _, h := range list {
			hm, _ := h.(map[string]any)
			if hm == nil {
				continue
			}
			name, _ := hm["handler"].(string)
			switch {
			case name == "rate_limit":
				w.handlers++
				if w.rateLimit(hm) {
					out = append(out, hm)
				}
			case name == "subroute":
				hm["routes"] = w.routes(hm["routes"])
				delete(hm, "errors")
				out = append(out, hm)
			case passThrough[name]:
				out = append(out, hm)
			case terminal[name]:
				out = append(out, map[string]any{"handler": responderModule})
			case quiet[name]:
			default:
				w.note(fmt.Sprintf("handler %q is not run by the replay (a request it would answer goes on to the next handler)", name))
				continue
			}
			if terminal[name] {
				break
			}
		}
		route["handle"] = out
	}
	return routes
}

var placeholderRE = regexp.MustCompile(`\{([^{}]+)\}`)

// rateLimit rewrites one rate_limit handler for the replay; false when
// none of its zones can be replayed, and it is left out.
func (w *walk) rateLimit(h map[string]any) bool {
	if b, ok := h["backend"].(map[string]any); ok && b["name"] != "memory" && b["name"] != nil {
		w.note(fmt.Sprintf("the %v backend is replayed on the memory store (one instance's view: a fleet shares nothing here)", b["name"]))
	}
	h["backend"] = map[string]any{"name": storeModule}
	if _, ok := h["distributed"]; ok {
		w.note("distributed is left out: one process replays the log")
	}
	if _, ok := h["shed"]; ok {
		w.note("load shedding is not replayed: requests are decided one at a time")
	}
	if _, ok := h["tarpit"]; ok {
		w.note("the tarpit holds nothing in the replay (no sleeping)")
	}
	for _, k := range []string{"distributed", "storage", "shed"} {
		delete(h, k)
	}
	h["disable_metrics"] = true
	zones, _ := h["rate_limits"].(map[string]any)
	for _, name := range slices.Sorted(maps.Keys(zones)) {
		z, _ := zones[name].(map[string]any)
		if z == nil {
			continue
		}
		src, _ := json.Marshal(z)
		info, reason := w.zone(name, z)
		if reason != "" {
			delete(zones, name)
			w.plan.NotReplayed = appendExcluded(w.plan.NotReplayed, Excluded{Zone: name, Reason: reason})
			continue
		}
		info.Source = src
		if _, seen := w.plan.Zones[name]; !seen {
			w.plan.Zones[name] = info
		}
	}
	return len(zones) > 0
}

func appendExcluded(list []Excluded, e Excluded) []Excluded {
	for _, x := range list {
		if x == e {
			return list
		}
	}
	return append(list, e)
}

// zone checks and rewrites one zone: the reason it cannot be replayed,
// or its info.
func (w *walk) zone(name string, z map[string]any) (*ZoneInfo, string) {
	info := &ZoneInfo{Name: name, raw: z}
	info.Shadow, _ = z["shadow"].(bool)
	scopes, _ := z["scopes"].(map[string]any)
	zoneKey, _ := z["key"].(string)
	own := hasRate(z) || len(scopes) == 0
	type lim struct {
		scope string
		m     map[string]any
	}
	var limits []lim
	if own {
		limits = append(limits, lim{"", z})
	}
	for _, s := range slices.Sorted(maps.Keys(scopes)) {
		m, _ := scopes[s].(map[string]any)
		if m != nil {
			limits = append(limits, lim{s, m})
		}
	}
	for _, l := range limits {
		where := ""
		if l.scope != "" {
			where = fmt.Sprintf("scope %q: ", l.scope)
		}
		key, _ := l.m["key"].(string)
		if key == "" && l.scope != "" {
			key = zoneKey
		}
		li := &LimitInfo{Zone: name, Scope: l.scope, Key: key}
		// Reading what the log cannot give is a reason to leave the zone
		// out: its keys or costs would be made up.
		texts := map[string]string{"key": key}
		if c, ok := l.m["cost"].(string); ok {
			texts["cost"] = c
		}
		if t, ok := l.m["tier"].(string); ok {
			texts["tier"] = t
		}
		for _, field := range slices.Sorted(maps.Keys(texts)) {
			for _, m := range placeholderRE.FindAllStringSubmatch(texts[field], -1) {
				ph := m[1]
				if why := w.unreplayable(ph); why != "" {
					return nil, fmt.Sprintf("%s%s {%s}: %s", where, field, ph, why)
				}
				if h, ok := strings.CutPrefix(ph, "http.request.header."); ok {
					h = canonicalHeader(h)
					li.Headers = append(li.Headers, h)
					w.headers[h] = true
				}
			}
		}
		for _, f := range []string{"count_when", "reset_when", "charge_when", "settle"} {
			if _, ok := l.m[f]; ok {
				li.Response = true
				w.plan.Response = true
			}
		}
		if s, ok := l.m["settle"].(string); ok {
			for _, m := range placeholderRE.FindAllStringSubmatch(s, -1) {
				if !strings.HasPrefix(m[1], "http.response.header.") && !strings.HasPrefix(m[1], "http.response.status") {
					return nil, fmt.Sprintf("%ssettle {%s}: only the response's status and header fields are in the log", where, m[1])
				}
			}
		}
		if hs, ok := l.m["hash"].(string); ok && strings.Contains(hs, "{") && caddy.NewReplacer().ReplaceAll(hs, "") == "" {
			l.m["hash"] = randomSecret()
			w.note(fmt.Sprintf("zone %q: %shash secret %s is not set here: keys are hashed with a secret of the replay's own, so they differ from the live ones", name, where, hs))
		}
		concOnly := !hasRate(l.m) && l.m["tiers"] == nil
		for _, u := range unreplayedLimit {
			if _, ok := l.m[u.field]; ok {
				w.note(u.note)
				delete(l.m, u.field)
			}
		}
		if concOnly && (l.scope != "" || len(scopes) == 0) {
			if l.scope == "" {
				return nil, "its only limit is a concurrency cap, which a replay of one request at a time cannot decide"
			}
			delete(scopes, l.scope)
			w.note(fmt.Sprintf("zone %q: scope %q is a concurrency cap alone and is not replayed", name, l.scope))
			continue
		}
		if concOnly {
			continue // a zone of scopes whose own limit was a cap
		}
		li.Algorithm, _ = l.m["algorithm"].(string)
		if li.Algorithm == "" {
			li.Algorithm = "sliding_window"
		}
		li.MaxEvents = jsonInt(l.m["max_events"])
		li.Window = jsonDuration(l.m["window"])
		li.Burst = jsonInt(l.m["burst"])
		if l.m["tiers"] != nil {
			li.Tiered = true
		}
		info.Limits = append(info.Limits, li)
	}
	if len(info.Limits) == 0 {
		return nil, "no limit of it can be replayed"
	}
	return info, ""
}

func hasRate(m map[string]any) bool {
	return m["max_events"] != nil || m["window"] != nil
}

// unreplayable tells why the log cannot give placeholder ph, or "".
func (w *walk) unreplayable(ph string) string {
	lower := strings.ToLower(ph)
	switch {
	case strings.HasPrefix(lower, "http.request.body"):
		return "the request body is not in an access log"
	case lower == "http.request.header.authorization" || lower == "http.request.header.proxy-authorization" ||
		lower == "http.request.header.cookie" || strings.HasPrefix(lower, "http.request.cookie."):
		if !w.credentials {
			return "Caddy logs this field as REDACTED unless the server sets log_credentials (servers { log_credentials })"
		}
		return ""
	case strings.HasPrefix(lower, "http.request.tls.client."):
		return "client certificates are not in an access log beyond their common name and serial"
	case strings.HasPrefix(lower, "http.request."), strings.HasPrefix(lower, "http.vars."),
		strings.HasPrefix(lower, "http.regexp."), strings.HasPrefix(lower, "env."),
		strings.HasPrefix(lower, "system."), strings.HasPrefix(lower, "time."),
		lower == "http.auth.user.id", strings.HasPrefix(lower, "http.matchers."):
		return ""
	case strings.HasPrefix(lower, "http.auth."):
		return "the log has the authenticated user's id (user_id) only"
	}
	return "this placeholder is set by something the access log does not record"
}

func canonicalHeader(h string) string {
	b := []byte(strings.ToLower(h))
	up := true
	for i, c := range b {
		if up && c >= 'a' && c <= 'z' {
			b[i] = c - 'a' + 'A'
		}
		up = c == '-'
	}
	return string(b)
}

func randomSecret() string {
	var b [24]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func jsonInt(v any) int64 {
	switch v := v.(type) {
	case float64:
		return int64(v)
	case json.Number:
		n, _ := v.Int64()
		return n
	case string:
		n, _ := strconv.ParseInt(v, 10, 64)
		return n
	}
	return 0
}

func jsonDuration(v any) int64 {
	b, _ := json.Marshal(v)
	var d caddy.Duration
	if err := d.UnmarshalJSON(b); err != nil {
		return 0
	}
	return int64(d)
}

// WithZones returns the plan's config with every rate_limit handler's
// zones replaced: each zone by what change returns for it (zones by name,
// none to drop it).
func (p *Plan) WithZones(change func(name string, zone map[string]any) map[string]map[string]any) ([]byte, error) {
	var cfg map[string]any
	if err := json.Unmarshal(p.JSON, &cfg); err != nil {
		return nil, err
	}
	var routes func(v any)
	routes = func(v any) {
		list, _ := v.([]any)
		for _, r := range list {
			route, _ := r.(map[string]any)
			hs, _ := route["handle"].([]any)
			for _, h := range hs {
				hm, _ := h.(map[string]any)
				switch hm["handler"] {
				case "rate_limit":
					// Every zone of a variant is a shadow zone: a tarpit
					// would hold nothing.
					delete(hm, "tarpit")
					delete(hm, "tarpit_max")
					zones, _ := hm["rate_limits"].(map[string]any)
					out := map[string]any{}
					for name, z := range zones {
						zm, _ := z.(map[string]any)
						for n, nz := range change(name, zm) {
							out[n] = nz
						}
					}
					hm["rate_limits"] = out
				case "subroute":
					routes(hm["routes"])
				}
			}
		}
	}
	servers := cfg["apps"].(map[string]any)["http"].(map[string]any)["servers"].(map[string]any)
	for _, s := range servers {
		routes(s.(map[string]any)["routes"])
	}
	return json.Marshal(cfg)
}
