package sluice

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
)

func init() {
	caddy.RegisterModule(AdminAPI{})
}

// AdminAPI serves the rate limits on Caddy's admin endpoint, under
// /rate_limit/, so that an operator can see every zone and look at, reset
// or give units back to one client's key without a reload:
//
//	GET    /rate_limit/zones
//	GET    /rate_limit/zones/<zone>/keys/<key>[?scope=<scope>][&form=final]
//	DELETE /rate_limit/zones/<zone>/keys/<key>[?scope=<scope>][&form=final]
//	POST   /rate_limit/zones/<zone>/keys/<key>/grant?units=<n>[&scope=<scope>][&form=final]
//
// <key> is the raw identifier (an address, an email), made into the key the
// way the zone makes a request's (prefixes, normalizers, hash), or with
// form=final the key as stored. Without scope, a key operation applies to
// every limit of the zone that counts the zone's key. The zone and the key
// are path segments: escape a "/" in them as %2F.
type AdminAPI struct{}

// CaddyModule returns the Caddy module information.
func (AdminAPI) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "admin.api.rate_limit",
		New: func() caddy.Module { return new(AdminAPI) },
	}
}

// Routes returns the admin routes of the rate limits.
func (a *AdminAPI) Routes() []caddy.AdminRoute {
	return []caddy.AdminRoute{{Pattern: adminPrefix, Handler: caddy.AdminHandlerFunc(a.serve)}}
}

const adminPrefix = "/rate_limit/"

// The zones of every running config, by name, so that the admin API finds
// a zone whichever handler and config defined it. A reload adds the new
// config's zones before the old config's leave, and zones of one name
// share their state, so the newest use of a name stands for all.
var publishedZones = caddy.NewUsagePool()

type zoneUses struct {
	mu   sync.Mutex
	uses []zoneUse // oldest first
}

// zoneUse is a running zone and the handler that holds its store.
type zoneUse struct {
	z *zone
	h *plan
}

func (*zoneUses) Destruct() error { return nil }

// publish makes the handler's zones visible to the admin API.
func (h *plan) publish() {
	for _, z := range h.zones {
		v, _ := publishedZones.LoadOrStore(z.name, new(zoneUses))
		u := v.(*zoneUses)
		u.mu.Lock()
		u.uses = append(u.uses, zoneUse{z, h})
		u.mu.Unlock()
	}
}

// unpublish takes the handler's zones out of the admin API; it may run
// for a handler that failed before publishing them.
func (h *plan) unpublish() {
	for _, z := range h.zones {
		v, _ := publishedZones.LoadOrStore(z.name, new(zoneUses))
		u := v.(*zoneUses)
		u.mu.Lock()
		i := slices.Index(u.uses, zoneUse{z, h})
		if i >= 0 {
			u.uses = slices.Delete(u.uses, i, i+1)
		}
		u.mu.Unlock()
		// Once for the reference just taken, and once for publish's.
		_, _ = publishedZones.Delete(z.name)
		if i >= 0 {
			_, _ = publishedZones.Delete(z.name)
		}
	}
}

// zoneNamed returns the newest running zone of that name.
func zoneNamed(name string) (found zoneUse) {
	publishedZones.Range(func(k, v any) bool {
		if k.(string) != name {
			return true
		}
		u := v.(*zoneUses)
		u.mu.Lock()
		if len(u.uses) > 0 {
			found = u.uses[len(u.uses)-1]
		}
		u.mu.Unlock()
		return false
	})
	return found
}

// othersForget tells every running use of the zone other than use, whose
// store changed key in the limit of that scope, to forget what it
// remembers of the key: a site (or an old config still draining) with a
// store of its own would otherwise keep refusing it from its cache.
func othersForget(use zoneUse, scope, key string) {
	var others []zoneUse
	publishedZones.Range(func(k, v any) bool {
		if k.(string) != use.z.name {
			return true
		}
		u := v.(*zoneUses)
		u.mu.Lock()
		others = append(others, u.uses...)
		u.mu.Unlock()
		return false
	})
	for _, o := range others {
		f, ok := o.h.store.(backend.Forgetter)
		if !ok || o.h.store == use.h.store {
			continue
		}
		for _, l := range o.z.limits {
			if l.scope == scope {
				f.Forget(l.handle, key)
			}
		}
	}
}

// allZones returns the newest running zone of each name, by name.
func allZones() []zoneUse {
	var zones []zoneUse
	publishedZones.Range(func(_, v any) bool {
		u := v.(*zoneUses)
		u.mu.Lock()
		if len(u.uses) > 0 {
			zones = append(zones, u.uses[len(u.uses)-1])
		}
		u.mu.Unlock()
		return true
	})
	slices.SortFunc(zones, func(a, b zoneUse) int { return strings.Compare(a.z.name, b.z.name) })
	return zones
}

func apiError(status int, format string, args ...any) error {
	err := fmt.Errorf(format, args...)
	return caddy.APIError{HTTPStatus: status, Err: err, Message: err.Error()}
}

func (a *AdminAPI) serve(w http.ResponseWriter, r *http.Request) error {
	// Split the escaped path, so that an escaped "/" stays inside its
	// segment (a key that is a URL path).
	rest := strings.TrimPrefix(r.URL.EscapedPath(), adminPrefix)
	parts := strings.Split(rest, "/")
	for i, p := range parts {
		s, err := url.PathUnescape(p)
		if err != nil {
			return apiError(http.StatusBadRequest, "bad escape in path segment %q: %v", p, err)
		}
		parts[i] = s
	}
	switch {
	case len(parts) == 1 && parts[0] == "zones":
		if r.Method != http.MethodGet {
			return apiError(http.StatusMethodNotAllowed, "method %s not allowed: use GET", r.Method)
		}
		return writeJSON(w, map[string]any{"zones": listZones()})
	case (len(parts) == 4 || len(parts) == 5 && parts[4] == "grant") && parts[0] == "zones" && parts[2] == "keys":
		return a.serveKey(w, r, parts[1], parts[3], len(parts) == 5, false)
	case (len(parts) == 3 || len(parts) == 4 && parts[3] == "grant") && parts[0] == "zones" && parts[2] == "missing":
		// The bucket that requests without a key share ("missing
		// shared"): no key names it, yet its clients may need
		// unblocking as much as anyone's.
		return a.serveKey(w, r, parts[1], "", len(parts) == 4, true)
	}
	return apiError(http.StatusNotFound, "no such rate_limit endpoint %q: use /rate_limit/zones, /rate_limit/zones/<zone>/keys/<key> or /rate_limit/zones/<zone>/missing", r.URL.Path)
}

// keyState is one limit's state for one key, as the admin API answers it.
type keyState struct {
	Zone  string `json:"zone"`
	Scope string `json:"scope"`
	// Key is the key as stored (after normalizing and hashing).
	Key       string `json:"key"`
	Algorithm string `json:"algorithm"`
	Limit     int64  `json:"limit"`
	Remaining int64  `json:"remaining"`
	// ResetAfter is the number of seconds until the key has its full
	// quota again; RetryAfter until a request of one unit can pass (0:
	// now).
	ResetAfter float64 `json:"reset_after"`
	RetryAfter float64 `json:"retry_after"`
	// LockoutLevel is the step of the key's current or last lock-out,
	// from 1 (absent: none, or forgotten); LockedOut the seconds its
	// lock-out still lasts (absent: not locked out). A reset clears both.
	LockoutLevel int32   `json:"lockout_level,omitempty"`
	LockedOut    float64 `json:"locked_out,omitempty"`
}

func (a *AdminAPI) serveKey(w http.ResponseWriter, r *http.Request, zoneName, raw string, grant, missing bool) error {
	want, ok := http.MethodGet+" or "+http.MethodDelete, r.Method == http.MethodGet || r.Method == http.MethodDelete
	if grant {
		want, ok = http.MethodPost, r.Method == http.MethodPost
	}
	if !ok {
		return apiError(http.StatusMethodNotAllowed, "method %s not allowed: use %s", r.Method, want)
	}
	q := r.URL.Query()
	for name, vals := range q {
		switch {
		case name != "scope" && name != "form" && name != "units":
			return apiError(http.StatusBadRequest, "unknown query parameter %q (scope, form and units are known)", name)
		case len(vals) > 1:
			return apiError(http.StatusBadRequest, "query parameter %q given %d times", name, len(vals))
		}
	}
	var units int64
	if grant {
		n, err := strconv.ParseInt(q.Get("units"), 10, 64)
		if err != nil || n < 1 || n > algorithms.MaxEvents {
			return apiError(http.StatusBadRequest, "units must be a whole number from 1 to %d, got %q", algorithms.MaxEvents, q.Get("units"))
		}
		units = n
	} else if q.Has("units") {
		return apiError(http.StatusBadRequest, "units applies only to .../grant")
	}
	final := false
	switch q.Get("form") {
	case "", "raw":
	case "final":
		final = true
	default:
		return apiError(http.StatusBadRequest, "form must be raw or final, got %q", q.Get("form"))
	}
	if missing && q.Has("form") {
		return apiError(http.StatusBadRequest, "form does not apply to the bucket of requests without a key")
	}
	if raw == "" && !missing {
		return apiError(http.StatusBadRequest, "empty key")
	}
	use := zoneNamed(zoneName)
	z := use.z
	if z == nil {
		return apiError(http.StatusNotFound, "no zone named %q is running", zoneName)
	}
	limits, err := z.limitsFor(q.Has("scope"), q.Get("scope"))
	if err != nil {
		return err
	}
	if missing {
		if limits = sharingMissing(limits); len(limits) == 0 {
			return apiError(http.StatusBadRequest, "zone %q: its key is a constant, never missing", zoneName)
		}
	}
	adm, ok := use.h.store.(backend.Admin)
	if !ok {
		return apiError(http.StatusNotImplemented, "zone %q: backend %s cannot inspect or change keys", zoneName, backendName(use.h.store))
	}
	states := make([]keyState, 0, len(limits))
	for _, l := range limits {
		key := raw
		if !final && !missing {
			if key, err = l.keyOf(raw); err != nil {
				return apiError(http.StatusBadRequest, "%s: %v", l.displayName(), err)
			}
		}
		var u algorithms.Usage
		switch {
		case grant:
			u, err = adm.Grant(r.Context(), l.handle, key, units)
		case r.Method == http.MethodDelete:
			if err = adm.Reset(r.Context(), l.handle, key); err == nil {
				u, err = adm.Inspect(r.Context(), l.handle, key)
			}
		default:
			u, err = adm.Inspect(r.Context(), l.handle, key)
		}
		if err != nil {
			return apiError(http.StatusServiceUnavailable, "%s: %v", l.displayName(), err)
		}
		if r.Method != http.MethodGet {
			othersForget(use, l.scope, key)
		}
		st := keyState{
			Zone: z.name, Scope: l.scope, Key: key, Algorithm: l.algorithm,
			Limit: u.Limit, Remaining: u.Remaining,
			ResetAfter: seconds(u.ResetAfter), RetryAfter: seconds(u.RetryAfter),
		}
		if err := lockoutState(r.Context(), use.h.store, l, key, &st); err != nil {
			return apiError(http.StatusServiceUnavailable, "%s: %v", l.displayName(), err)
		}
		states = append(states, st)
	}
	return writeJSON(w, map[string]any{"limits": states})
}

// limitsFor returns the zone's limits a key operation applies to: the
// named scope ("" is the zone's own limit), or every limit counting the
// zone's key.
func (z *zone) limitsFor(named bool, scope string) ([]*limit, error) {
	var out []*limit
	for _, l := range z.limits {
		// A scope with tiers names all of its tiers' limits.
		if named && (l.scope == scope || l.tier != "" && l.base == scope) || !named && l.Key == z.Key {
			out = append(out, l)
		}
	}
	if len(out) > 0 {
		return out, nil
	}
	var scopes []string
	for _, l := range z.limits {
		scopes = append(scopes, strconv.Quote(l.scope))
	}
	if named {
		return nil, apiError(http.StatusNotFound, "zone %q has no scope %q (its limits: %s)", z.name, scope, strings.Join(scopes, ", "))
	}
	return nil, apiError(http.StatusBadRequest, "zone %q: its scopes count other keys; name one with ?scope= (its limits: %s)", z.name, strings.Join(scopes, ", "))
}

// sharingMissing keeps the limits that may count requests without a usable
// key together, under the empty key: with missing shared, and with missing
// skip for values given twice or refused by a normalizer. A constant key
// is never missing.
func sharingMissing(limits []*limit) []*limit {
	var out []*limit
	for _, l := range limits {
		if len(l.keyer.Template().Placeholders()) > 0 {
			out = append(out, l)
		}
	}
	return out
}

// keyOf makes raw, an identifier as a request would carry it, into the
// limit's key. A key of one placeholder takes the value; a constant key
// takes itself; a key of several placeholders must be given in its final
// form.
func (l *limit) keyOf(raw string) (string, error) {
	names := l.keyer.Template().Placeholders()
	switch {
	case len(names) == 1:
		return l.keyer.FromValues([]string{raw})
	case len(names) == 0 && raw == l.keyer.Template().String():
		return l.keyer.FromValues(nil)
	case len(names) == 0:
		return "", fmt.Errorf("the key is the constant %q", l.keyer.Template().String())
	}
	return "", fmt.Errorf("the key %s has %d placeholders: give the key as stored, with form=final", l.keyer.Template(), len(names))
}

func seconds(ns int64) float64 {
	if ns == algorithms.Never {
		return -1
	}
	return time.Duration(ns).Seconds()
}

// limitInfo is one limit in the zones listing.
type limitInfo struct {
	Scope     string  `json:"scope"`
	Key       string  `json:"key"`
	Algorithm string  `json:"algorithm"`
	MaxEvents int64   `json:"max_events"`
	Window    string  `json:"window"`
	Burst     int64   `json:"burst,omitempty"`
	MaxDelay  string  `json:"max_delay,omitempty"`
	Fail      string  `json:"fail"`
	Keys      *int64  `json:"keys"` // null when the backend does not count them
	Requests  float64 `json:"requests"`
	Declined  float64 `json:"declined"`
	// ShadowDeclined counts the requests a shadow zone would have denied.
	ShadowDeclined float64 `json:"shadow_declined"`
	Concurrency    int64   `json:"concurrency,omitempty"`
	// Adaptive is where an adaptive limit is now, and why.
	Adaptive *adaptiveInfo `json:"adaptive,omitempty"`
}

type zoneInfo struct {
	Name    string      `json:"name"`
	Backend string      `json:"backend"`
	Shadow  bool        `json:"shadow"`
	Limits  []limitInfo `json:"limits"`
}

func listZones() []zoneInfo {
	out := []zoneInfo{}
	for _, use := range allZones() {
		z := use.z
		zi := zoneInfo{Name: z.name, Backend: backendName(use.h.store), Shadow: z.Shadow, Limits: []limitInfo{}}
		var stats []backend.LimitStats
		if src, ok := use.h.store.(backend.StatsReporter); ok {
			stats = src.Stats()
		}
		for _, l := range listedLimits(z) {
			p := l.policy()
			li := limitInfo{
				Scope: l.scope, Key: l.Key, Algorithm: l.algorithm, MaxEvents: p.Limit,
				Window: time.Duration(p.Window).String(), Burst: p.Burst, Fail: l.fail,
				Requests: counterValue(l.metrics.requests), Declined: counterValue(l.metrics.declinedC),
				ShadowDeclined: counterValue(l.metrics.shadowC),
			}
			if p.MaxDelay > 0 {
				li.MaxDelay = time.Duration(p.MaxDelay).String()
			}
			if l.concOnly() {
				li.Window = ""
			}
			li.Concurrency, li.Adaptive = l.Concurrency, l.adapt.info()
			for _, st := range stats {
				if st.Zone == z.name && st.Scope == l.scope {
					li.Keys = &st.Keys
				}
			}
			zi.Limits = append(zi.Limits, li)
		}
		out = append(out, zi)
	}
	return out
}

// counterValue reads a counter of the process's metrics; 0 when the
// handler's metrics are off.
func counterValue(c prometheus.Counter) float64 {
	if c == nil {
		return 0
	}
	var m dto.Metric
	if err := c.Write(&m); err != nil || m.Counter == nil {
		return 0
	}
	return m.Counter.GetValue()
}

func backendName(s backend.Store) string {
	if m, ok := s.(caddy.Module); ok {
		return m.CaddyModule().ID.Name()
	}
	return fmt.Sprintf("%T", s)
}

func writeJSON(w http.ResponseWriter, v any) error {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return apiError(http.StatusInternalServerError, "encoding: %v", err)
	}
	return nil
}

// Interface guards.
var _ caddy.AdminRouter = (*AdminAPI)(nil)
