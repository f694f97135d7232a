package sluice

import (
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
// not counting it) divided by the capacity. A request of priority p is
// shed when p > 5 − (load − 0.8) × 10: nothing up to a load of 0.9,
// priority 4 above 0.9, 3 above 1.0, 2 above 1.1, 1 above 1.2; priority 0
// never. So at a load of 1.1 (11 in flight for a capacity of 10) the
// threshold is 3 and priorities above 2 are refused.
type Shed struct {
	// Group names the shedding group: handlers that name the same group
	// share its count of requests in flight, across sites and config
	// reloads. Required.
	Group string `json:"group,omitempty"`

	// Capacity is how many requests the group can have in flight at a
	// load of 1.0: what the upstreams behind it serve at their usual
	// latency. Handlers of one config that name the same group must give
	// the same capacity. Required; from 1 to 2^30.
	Capacity int64 `json:"capacity,omitempty"`

	// Priority is how early this handler's requests are shed: 0 never
	// (they still count toward the load), 1 last, … 4 first. Default: 0.
	Priority int `json:"priority,omitempty"`
}

// shedGroup is the state one group's handlers share: the requests in
// flight, and each config's capacity for the metric.
type shedGroup struct {
	name     string
	inFlight atomic.Int64
	// varKey names the request var that marks a request this group
	// counts, so that a handler nested in another of the same group (a
	// site-wide one and a route's) does not count it again.
	varKey string

	mu   sync.Mutex
	regs []*shedReg // oldest first
}

// shedReg is one handler's use of a group.
type shedReg struct {
	owner    any // the config
	capacity int64
}

func (*shedGroup) Destruct() error { return nil }

// shedGroups holds every group some running config uses. A group's
// requests in flight outlive a reload: requests still served under the
// old config count against the new one.
var shedGroups = caddy.NewUsagePool()

// sheds reports whether a request of the given priority is refused with
// inFlight requests in flight for capacity. It is the rule
// priority > 5 − (inFlight/capacity − 0.8) × 10 multiplied through by
// capacity, in integers: in floats, (1.1 − 0.8) × 10 is
// 3.0000000000000004, which would shed priority 2 at a load of exactly
// 1.1. No allocation, no lock, no store call.
func sheds(inFlight, capacity int64, priority int) bool {
	return priority > 0 && int64(priority)*capacity+10*inFlight > 13*capacity
}

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
	case s.Capacity < 1 || s.Capacity > MaxConcurrency:
		return fmt.Errorf("shed %q: capacity must be from 1 to %d, got %d", s.Group, MaxConcurrency, s.Capacity)
	case s.Priority < 0 || s.Priority > MaxShedPriority:
		return fmt.Errorf("shed %q: priority must be from 0 (never shed) to %d (shed first), got %d", s.Group, MaxShedPriority, s.Priority)
	}
	v, _ := shedGroups.LoadOrStore(s.Group, &shedGroup{name: s.Group, varKey: "rate_limit.shed." + s.Group})
	g := v.(*shedGroup)
	g.mu.Lock()
	for _, o := range g.regs {
		if owner != nil && o.owner == owner && o.capacity != s.Capacity {
			g.mu.Unlock()
			_, _ = shedGroups.Delete(s.Group)
			return fmt.Errorf("shed %q: capacity given twice in this config, %d and %d: handlers of one group share one count, so give them the same capacity", s.Group, o.capacity, s.Capacity)
		}
	}
	h.shedReg = &shedReg{owner: owner, capacity: s.Capacity}
	g.regs = append(g.regs, h.shedReg)
	g.mu.Unlock()
	h.shed = g
	z := &Zone{name: s.Group, status: http.StatusServiceUnavailable, nameValue: s.Group}
	z.errs[reasonShed] = caddyhttp.HandlerError{StatusCode: http.StatusServiceUnavailable, Err: ErrShed}
	if !h.DisableMetrics {
		z.refused[reasonShed] = metrics.refused.WithLabelValues(s.Group, reasonInfo[reasonShed].name)
	}
	h.shedZone = z
	h.shedDetail = shedEdge(s)
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
func (h *Handler) shedding(counted bool) bool {
	if h.shed == nil {
		return false
	}
	n := h.shed.inFlight.Load()
	if counted {
		n--
	}
	return sheds(n, h.Shed.Capacity, h.Shed.Priority)
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
	g, _ := vars[h.shed.varKey].(*shedGroup)
	return vars, g == h.shed
}

// enter counts an admitted request in the group until leave. The caller
// holds on to g: a reload cleans the handler up while its last requests
// are still being served.
func (g *shedGroup) enter(vars map[string]any) {
	g.inFlight.Add(1)
	if vars != nil {
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

// leaveGroups takes r out of every shedding group that a handler before
// this one counts it in, for a wait that loads no upstream (a tarpit, a
// concurrency queue, a max_delay): otherwise a flood of waiting or held
// requests would raise the load and shed everyone else's. rejoinGroups
// with the vars it returns puts r back.
func leaveGroups(r *http.Request) map[string]any {
	vars, _ := r.Context().Value(caddyhttp.VarsCtxKey).(map[string]any)
	for _, v := range vars {
		if g, ok := v.(*shedGroup); ok {
			g.inFlight.Add(-1)
		}
	}
	return vars
}

func rejoinGroups(vars map[string]any) {
	for _, v := range vars {
		if g, ok := v.(*shedGroup); ok {
			g.inFlight.Add(1)
		}
	}
}

// refuseShed answers a shed request: 503 with Retry-After, through the
// path of every refusal, in the name of the group.
func (h *Handler) refuseShed(w http.ResponseWriter, r *http.Request) error {
	return unlessAnswered(h.refuse(w, r, refusal{
		reason: reasonShed, zone: h.shedZone, retryAfter: retryAfterSeconds(shedRetryAfter), wait: shedRetryAfter,
		detail: h.shedDetail,
	}))
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

// shedCollector reports each group's requests in flight and capacity at
// scrape time, so that counting a request costs two atomic adds and no
// metric update.
type shedCollector struct {
	inFlight, capacity *prometheus.Desc
}

var shedMetrics = shedCollector{
	inFlight: prometheus.NewDesc("caddy_rate_limit_shed_in_flight_requests",
		"Requests in flight in a load shedding group, counted by every handler that names it.", []string{"group"}, nil),
	capacity: prometheus.NewDesc("caddy_rate_limit_shed_capacity_requests",
		"The capacity of a load shedding group: requests in flight at a load of 1.0 (the newest config's).", []string{"group"}, nil),
}

func (c shedCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.inFlight
	ch <- c.capacity
}

func (c shedCollector) Collect(ch chan<- prometheus.Metric) {
	shedGroups.Range(func(_, v any) bool {
		g := v.(*shedGroup)
		g.mu.Lock()
		var capacity int64
		if n := len(g.regs); n > 0 {
			capacity = g.regs[n-1].capacity
		}
		g.mu.Unlock()
		if capacity > 0 {
			ch <- prometheus.MustNewConstMetric(c.inFlight, prometheus.GaugeValue, float64(g.inFlight.Load()), g.name)
			ch <- prometheus.MustNewConstMetric(c.capacity, prometheus.GaugeValue, float64(capacity), g.name)
		}
		return true
	})
}

// unmarshalShed reads
//
//	shed <group> [{
//	    priority <0-4>
//	    capacity <n>
//	}]
//
// in a handler (priority and capacity) or in the global options (capacity
// alone: the group's, for every handler of the file that names it).
func unmarshalShed(d *caddyfile.Dispenser, global bool) (*Shed, error) {
	if !d.NextArg() {
		return nil, d.ArgErr()
	}
	s := &Shed{Group: d.Val()}
	if d.NextArg() {
		return nil, d.Errf("shed takes one group name, got another: %q (priority and capacity go in its block)", d.Val())
	}
	seen := map[string]bool{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		opt := d.Val()
		if seen[opt] {
			return nil, d.Errf("shed %q: %s already specified", s.Group, opt)
		}
		seen[opt] = true
		var err error
		switch {
		case opt == "capacity":
			s.Capacity, err = positiveArg(d, fmt.Sprintf("shed %q", s.Group), opt)
		case opt == "priority" && !global:
			s.Priority, err = intArg(d, fmt.Sprintf("shed %q", s.Group), opt, 0, MaxShedPriority)
		case opt == "priority":
			return nil, d.Errf("shed %q: priority is a route's, not the group's: set it in the rate_limit handler of each route", s.Group)
		default:
			return nil, d.Errf("shed %q: unrecognized option %q (want priority or capacity)", s.Group, opt)
		}
		if err != nil {
			return nil, err
		}
	}
	if global && s.Capacity == 0 {
		return nil, d.Errf("shed %q: capacity is required", s.Group)
	}
	return s, nil
}

// applyGlobalShed gives a handler's group the capacity the global options
// set for it.
func applyGlobalShed(d *caddyfile.Dispenser, s *Shed, groups map[string]int64) error {
	if s == nil {
		return nil
	}
	capacity, ok := groups[s.Group]
	switch {
	case ok && s.Capacity != 0 && s.Capacity != capacity:
		return d.Errf("shed %q: capacity %d here, %d in the global options: a group has one capacity (remove it here)", s.Group, s.Capacity, capacity)
	case ok:
		s.Capacity = capacity
	case s.Capacity == 0:
		return d.Errf("shed %q: no capacity: set it in the global options (rate_limit { shed %s { capacity <n> } }) or in this block", s.Group, s.Group)
	}
	return nil
}
