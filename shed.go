package sluice

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/sluicehq/sluice/internal/latency"
)

// ErrShed is the error behind a 503 answer to a request shed because the
// server is overloaded: its shedding group has too many requests in
// flight for the request's priority.
var ErrShed = errors.New("server overloaded: request shed")

// MaxShedPriority is the lowest priority, shed first; 0 is never shed.
const MaxShedPriority = 4

// shedRetryAfter is the Retry-After of a shed request. Load changes from
// one second to the next: a client that comes back finds the answer of
// that moment, and a longer wait would turn a short spike into a long
// outage for the lower priorities.
const shedRetryAfter = time.Second

// Shed makes a handler's requests part of a shedding group: every handler
// that names the group counts its requests in flight in one shared count,
// and when that count nears the group's capacity the requests of the
// lowest priorities are refused with 503 Service Unavailable, so the site
// gets slower for what matters instead of going down for everything.
//
// The load is the group's requests in flight (when the request arrives,
// not counting it) divided by the capacity; with a latency target, the
// greater of that and the p99 latency of the group's requests over the
// last 8 to 10 seconds divided by the target. A request of priority p is
// shed when p > 5 − (load − 0.8) × 10: nothing up to a load of 0.9,
// priority 4 above 0.9, 3 above 1.0, 2 above 1.1, 1 above 1.2; priority 0
// never. So at a load of 1.1 (11 in flight for a capacity of 10, or a p99
// of 220ms for a target of 200ms) the threshold is 3 and priorities above
// 2 are refused.
type Shed struct {
	// Group names the shedding group: handlers that name the same group
	// share its count of requests in flight, across sites and config
	// reloads. Required.
	Group string `json:"group,omitempty"`

	// Capacity is how many requests the group can have in flight at a
	// load of 1.0: what the upstreams behind it serve at their usual
	// latency. Handlers of one config that name the same group must give
	// the same capacity. From 1 to 2^30; required unless LatencyTarget is
	// set (without a capacity, only latency loads the group).
	Capacity int64 `json:"capacity,omitempty"`

	// LatencyTarget is the p99 latency of the group's requests at a load
	// of 1.0: what its upstreams answer in when they are healthy. With
	// it, the load is the greater of in flight ÷ capacity and p99 ÷
	// target, so a group whose upstream slows down sheds before its
	// requests pile up. The p99 is taken over the requests the group
	// admitted that finished in the last 8 to 10 seconds (a window of
	// five 2-second parts), timed like an adaptive limit's (the handlers
	// after rate_limit, less the time spent reading the client's body or
	// writing to the client), rounded up by at most 6.25%; without a
	// finished request in the window, latency adds nothing to the load.
	// Handlers of one config that name the same group must give the
	// same target. Default: unset, latency is not watched; from 1ms to
	// 1h.
	LatencyTarget caddy.Duration `json:"latency_target,omitempty"`

	// Priority is how early this handler's requests are shed: 0 never
	// (they still count toward the load), 1 last, … 4 first. Default: 0.
	Priority int `json:"priority,omitempty"`
}

// UnmarshalJSON reads a shed object strictly, as Caddy reads a module, and
// names latency_target in the error of a value that is not a duration
// ("0.2" has no unit), which caddy.Duration alone does not.
func (s *Shed) UnmarshalJSON(b []byte) error {
	type plain Shed
	var v struct {
		plain
		LatencyTarget json.RawMessage `json:"latency_target,omitempty"` // shadows plain's
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil {
		return err
	}
	*s = Shed(v.plain)
	if len(v.LatencyTarget) > 0 {
		if err := s.LatencyTarget.UnmarshalJSON(v.LatencyTarget); err != nil {
			return fmt.Errorf("shed %q: latency_target %s: %v", s.Group, v.LatencyTarget, err)
		}
	}
	return nil
}

// shedGroup is the state one group's handlers share: the requests in
// flight, the latency of those that finished, and each config's capacity
// and target for the metrics.
type shedGroup struct {
	name     string
	inFlight atomic.Int64
	// varKey names the request var that marks a request this group
	// counts, so that a handler nested in another of the same group (a
	// site-wide one and a route's) does not count it again.
	varKey string
	// latency is the group's, like the count, so that it outlives a
	// reload. It is fed only while a config sets a target.
	latency latency.Window
	now     func() int64

	mu   sync.Mutex
	regs []*shedReg // oldest first
}

// shedReg is one handler's use of a group.
type shedReg struct {
	owner    any // the config
	capacity int64
	target   int64 // ns; 0 without a latency target
}

func (*shedGroup) Destruct() error { return nil }

// shedGroups holds every group some running config uses. A group's
// requests in flight outlive a reload: requests still served under the
// old config count against the new one.
var shedGroups = caddy.NewUsagePool()

// sheds reports whether a request of the given priority is refused at a
// load of used ÷ capacity: requests in flight for a capacity, or a p99
// latency for a target (both in ns: at most an hour for the target, and
// the histogram's top bucket, under 2^47, for the p99, so nothing
// overflows). It is the rule
// priority > 5 − (used/capacity − 0.8) × 10 multiplied through by
// capacity, in integers: in floats, (1.1 − 0.8) × 10 is
// 3.0000000000000004, which would shed priority 2 at a load of exactly
// 1.1. The load being the greater of two ratios, a request is shed when
// either ratio alone sheds it. No allocation, no lock, no store call.
func sheds(used, capacity int64, priority int) bool {
	return priority > 0 && int64(priority)*capacity+10*used > 13*capacity
}

// Bounds of a latency target: below a millisecond the histogram's
// microsecond steps and the clock's cost are a large part of it; above an
// hour no request is an answer anyone waits for.
const (
	minShedLatencyTarget = time.Millisecond
	maxShedLatencyTarget = time.Hour
)

// provisionShed checks h.Shed and joins its group; owner is the config
// being provisioned.
func (h *Handler) provisionShed(owner any) error {
	s := h.Shed
	if s == nil {
		return nil
	}
	switch {
	case s.Group == "":
		return fmt.Errorf("shed: group is required: handlers that name the same group share its requests in flight")
	case s.Capacity == 0 && s.LatencyTarget == 0:
		return fmt.Errorf("shed %q: capacity is required (or latency_target, to shed on latency alone)", s.Group)
	case s.Capacity < 0 || s.Capacity > MaxConcurrency:
		return fmt.Errorf("shed %q: capacity must be from 1 to %d, got %d", s.Group, MaxConcurrency, s.Capacity)
	case s.LatencyTarget != 0 && (s.LatencyTarget < caddy.Duration(minShedLatencyTarget) || s.LatencyTarget > caddy.Duration(maxShedLatencyTarget)):
		return fmt.Errorf("shed %q: latency_target must be from %s to %s, got %s", s.Group, minShedLatencyTarget, maxShedLatencyTarget, time.Duration(s.LatencyTarget))
	case s.Priority < 0 || s.Priority > MaxShedPriority:
		return fmt.Errorf("shed %q: priority must be from 0 (never shed) to %d (shed first), got %d", s.Group, MaxShedPriority, s.Priority)
	}
	v, _ := shedGroups.LoadOrStore(s.Group, &shedGroup{name: s.Group, varKey: "rate_limit.shed." + s.Group, now: monotonic})
	g := v.(*shedGroup)
	target := int64(s.LatencyTarget)
	g.mu.Lock()
	for _, o := range g.regs {
		if owner == nil || o.owner != owner {
			continue
		}
		var err error
		switch {
		case o.capacity != s.Capacity:
			err = fmt.Errorf("shed %q: capacity given twice in this config, %d and %d: handlers of one group share one count, so give them the same capacity", s.Group, o.capacity, s.Capacity)
		case o.target != target:
			err = fmt.Errorf("shed %q: latency_target given twice in this config, %s and %s: handlers of one group share one latency, so give them the same target", s.Group, time.Duration(o.target), time.Duration(target))
		}
		if err != nil {
			g.mu.Unlock()
			_, _ = shedGroups.Delete(s.Group)
			return err
		}
	}
	h.shedReg = &shedReg{owner: owner, capacity: s.Capacity, target: target}
	g.regs = append(g.regs, h.shedReg)
	g.mu.Unlock()
	h.shed = g
	z := &Zone{name: s.Group, status: http.StatusServiceUnavailable, nameValue: s.Group}
	z.errs[reasonShed] = caddyhttp.HandlerError{StatusCode: http.StatusServiceUnavailable, Err: ErrShed}
	if !h.DisableMetrics {
		z.refused[reasonShed] = metrics.refused.WithLabelValues(s.Group, reasonInfo[reasonShed].name)
	}
	// Made once: a shed request is refused in the group's name, from a
	// value every shed request shares and nothing changes.
	h.shedRefusal = &refusal{
		reason: reasonShed, zone: z, retryAfter: retryAfterSeconds(shedRetryAfter), wait: shedRetryAfter,
		detail: shedEdge(s),
	}
	return nil
}

// cleanupShed leaves the group; the last handler to leave drops it.
func (h *Handler) cleanupShed() {
	g := h.shed
	if g == nil {
		return
	}
	g.mu.Lock()
	if i := slices.Index(g.regs, h.shedReg); i >= 0 {
		g.regs = slices.Delete(g.regs, i, i+1)
	}
	g.mu.Unlock()
	_, _ = shedGroups.Delete(g.name)
	h.shed = nil
}

// shedding reports whether r must be shed now, before anything else is
// decided: a shed request takes no unit from any rate limit. counted
// tells that a handler r passed through before counts it already: the
// load is the others' requests in flight, so r is taken out of it.
// Priority 0 is never shed, so it reads neither the count nor the clock.
func (h *Handler) shedding(counted bool) bool {
	g := h.shed
	if g == nil || h.Shed.Priority == 0 {
		return false
	}
	n := g.inFlight.Load()
	if counted {
		n--
	}
	if c := h.Shed.Capacity; c > 0 && sheds(n, c, h.Shed.Priority) {
		return true
	}
	// The p99 read without the clock is the last worked out: one that
	// does not shed the request stands (requests that finish bring it up
	// to date), one that does is brought up to date first, so that a p99
	// from before a quiet spell cannot shed anything.
	t := h.shedReg.target
	return t > 0 && sheds(g.latency.Last(), t, h.Shed.Priority) &&
		sheds(g.latency.P99At(g.now()), t, h.Shed.Priority)
}

// timedGroup is the group whose latency r is timed for by this handler,
// or nil: only with a latency target, and only by the handler that counts
// it, so that a request nested in two handlers of its group is timed once.
func (h *Handler) timedGroup(counted bool) *shedGroup {
	if h.shed != nil && h.shedReg.target > 0 && !counted {
		return h.shed
	}
	return nil
}

// shedCounted returns r's vars, and whether an outer handler of h's group
// counts r already. A request counts once in its group however many of
// the group's handlers it passes through: counted twice, a site's load
// would double for its nested routes and shed them at half the capacity.
func (h *Handler) shedCounted(r *http.Request) (vars map[string]any, counted bool) {
	if h.shed == nil {
		return nil, false
	}
	vars, _ = r.Context().Value(caddyhttp.VarsCtxKey).(map[string]any)
	return vars, inGroup(vars[h.shed.varKey]) == h.shed
}

// inGroup is the group a request var of a group's names: the group, or
// the watcher that times the request for it.
func inGroup(v any) *shedGroup {
	switch v := v.(type) {
	case *shedGroup:
		return v
	case *watcher:
		return v.group
	}
	return nil
}

// enter counts an admitted request in the group until leave; timer, when
// the request is timed for the group, is the watcher timing it, which the
// request's var then holds (one map write either way). The caller holds
// on to g: a reload cleans the handler up while its last requests are
// still being served.
func (g *shedGroup) enter(vars map[string]any, timer *watcher) {
	g.inFlight.Add(1)
	switch {
	case vars == nil:
	case timer != nil:
		vars[g.varKey] = timer
	default:
		vars[g.varKey] = g
	}
}

func (g *shedGroup) leave(vars map[string]any) {
	g.inFlight.Add(-1)
	if vars != nil {
		// An error route served after this handler returns is a request
		// of its own for the group.
		delete(vars, g.varKey)
	}
}

// outsideGroups runs wait, a wait that loads no upstream (a tarpit, a
// concurrency queue, a max_delay), with r taken out of every shedding
// group that a handler before this one counts it in: otherwise a flood of
// waiting or held requests would raise the load and shed everyone
// else's, and their waits would raise the groups' latency. Every wait of
// a request goes through it.
func outsideGroups(r *http.Request, wait func()) {
	defer rejoinGroups(leaveGroups(r))
	wait()
}

// leaveGroups takes r out of every shedding group that a handler before
// this one counts it in (see outsideGroups); rejoinGroups with the vars it
// returns puts r back.
func leaveGroups(r *http.Request) map[string]any {
	vars, _ := r.Context().Value(caddyhttp.VarsCtxKey).(map[string]any)
	for _, v := range vars {
		if g := inGroup(v); g != nil {
			g.inFlight.Add(-1)
		}
		if t, ok := v.(*watcher); ok {
			t.pausedAt = t.now()
		}
	}
	return vars
}

func rejoinGroups(vars map[string]any) {
	for _, v := range vars {
		if g := inGroup(v); g != nil {
			g.inFlight.Add(1)
		}
		if t, ok := v.(*watcher); ok {
			t.paused += t.now() - t.pausedAt
		}
	}
}

// untime leaves out of every group's latency a request refused after a
// handler counted it: its answer took no upstream time, and a flood of
// quick refusals would otherwise pull the p99 down and end the shedding
// that the slow upstream still needs.
func untime(r *http.Request) {
	vars, _ := r.Context().Value(caddyhttp.VarsCtxKey).(map[string]any)
	for _, v := range vars {
		if t, ok := v.(*watcher); ok {
			t.refused = true
		}
	}
}

// shedEdge is the error the log line of a shed request carries: when this
// handler's priority is shed. Made once, so a shed request allocates
// nothing for it.
func shedEdge(s *Shed) error {
	// Shed when 10 × in flight > (13 − priority) × capacity.
	edge := (13 - int64(s.Priority)) * s.Capacity
	return fmt.Errorf("priority %d is shed while more than %d requests are in flight in group %q (load above %.1f of capacity %d)",
		s.Priority, edge/10, s.Group, float64(13-s.Priority)/10, s.Capacity)
}

// shedCollector reports each group's requests in flight, capacity,
// latency and target at scrape time, so that counting a request costs two
// atomic adds and no metric update.
type shedCollector struct {
	inFlight, capacity, p99, target *prometheus.Desc
}

var shedMetrics = shedCollector{
	inFlight: prometheus.NewDesc("caddy_rate_limit_shed_in_flight_requests",
		"Requests in flight in a load shedding group, counted by every handler that names it.", []string{"group"}, nil),
	capacity: prometheus.NewDesc("caddy_rate_limit_shed_capacity_requests",
		"The capacity of a load shedding group: requests in flight at a load of 1.0 (the newest config's).", []string{"group"}, nil),
	p99: prometheus.NewDesc("caddy_rate_limit_shed_latency_p99_seconds",
		"The 99th percentile latency of a load shedding group's requests that finished in the last 8 to 10 seconds (0 without any), for a group with a latency target.", []string{"group"}, nil),
	target: prometheus.NewDesc("caddy_rate_limit_shed_latency_target_seconds",
		"The latency target of a load shedding group: its p99 latency at a load of 1.0 (the newest config's).", []string{"group"}, nil),
}

func (c shedCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.inFlight
	ch <- c.capacity
	ch <- c.p99
	ch <- c.target
}

func (c shedCollector) Collect(ch chan<- prometheus.Metric) {
	shedGroups.Range(func(_, v any) bool {
		g := v.(*shedGroup)
		g.mu.Lock()
		var newest shedReg
		if n := len(g.regs); n > 0 {
			newest = *g.regs[n-1]
		}
		g.mu.Unlock()
		if newest.capacity == 0 && newest.target == 0 {
			return true // every handler left
		}
		ch <- prometheus.MustNewConstMetric(c.inFlight, prometheus.GaugeValue, float64(g.inFlight.Load()), g.name)
		if newest.capacity > 0 {
			ch <- prometheus.MustNewConstMetric(c.capacity, prometheus.GaugeValue, float64(newest.capacity), g.name)
		}
		if newest.target > 0 {
			ch <- prometheus.MustNewConstMetric(c.p99, prometheus.GaugeValue, float64(g.latency.P99At(g.now()))/1e9, g.name)
			ch <- prometheus.MustNewConstMetric(c.target, prometheus.GaugeValue, float64(newest.target)/1e9, g.name)
		}
		return true
	})
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
