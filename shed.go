package sluice

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/sluicehq/sluice/internal/shed"
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

// provisionShed checks h.Shed and joins its group; owner is the config
// being provisioned.
func (h *plan) provisionShed(owner any) error {
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
	case s.LatencyTarget != 0 && (s.LatencyTarget < caddy.Duration(shed.MinLatencyTarget) || s.LatencyTarget > caddy.Duration(shed.MaxLatencyTarget)):
		return fmt.Errorf("shed %q: latency_target must be from %s to %s, got %s", s.Group, shed.MinLatencyTarget, shed.MaxLatencyTarget, time.Duration(s.LatencyTarget))
	case s.Priority < 0 || s.Priority > MaxShedPriority:
		return fmt.Errorf("shed %q: priority must be from 0 (never shed) to %d (shed first), got %d", s.Group, MaxShedPriority, s.Priority)
	}
	g, reg, err := shed.Join(s.Group, owner, s.Capacity, int64(s.LatencyTarget), monotonic)
	if err != nil {
		return err
	}
	h.shed, h.shedReg = g, reg
	z := &zone{Zone: &Zone{}, name: s.Group, status: http.StatusServiceUnavailable, nameValue: s.Group}
	z.errs[reasonShed] = caddyhttp.HandlerError{StatusCode: http.StatusServiceUnavailable, Err: ErrShed}
	if h.metrics {
		z.refused[reasonShed] = metrics.refused.WithLabelValues(s.Group, reasonInfo[reasonShed].name)
	}
	// Made once: a shed request is refused in the group's name, from a
	// value every shed request shares and nothing changes.
	h.shedRefusal = &refusal{
		reason: reasonShed, zone: z, retryAfter: retryAfterSeconds(shedRetryAfter), wait: shedRetryAfter,
		detail: shed.Edge(s.Group, s.Capacity, s.Priority),
	}
	return nil
}

// cleanupShed leaves the group; the last handler to leave drops it.
func (h *plan) cleanupShed() {
	if h.shed != nil {
		h.shed.Leave(h.shedReg)
		h.shed = nil
	}
}

// shedding reports whether r must be shed now, before anything else is
// decided: a shed request takes no unit from any rate limit. counted
// tells that a handler r passed through before counts it already.
func (h *plan) shedding(counted bool) bool {
	return h.shed != nil && h.shed.Shedding(h.shedReg, h.Shed.Priority, counted)
}

// timedGroup is the group whose latency r is timed for by this handler,
// or nil: only with a latency target, and only by the handler that counts
// it, so that a request nested in two handlers of its group is timed once.
func (h *plan) timedGroup(counted bool) *shed.Group {
	if h.shed != nil && h.shedReg.Target > 0 && !counted {
		return h.shed
	}
	return nil
}

// shedCounted returns r's vars, and whether an outer handler of h's group
// counts r already. A request counts once in its group however many of
// the group's handlers it passes through: counted twice, a site's load
// would double for its nested routes and shed them at half the capacity.
func (h *plan) shedCounted(r *http.Request) (vars map[string]any, counted bool) {
	if h.shed == nil {
		return nil, false
	}
	vars, _ = r.Context().Value(caddyhttp.VarsCtxKey).(map[string]any)
	m := markOf(varsID(vars), h.shed.VarKey, vars[h.shed.VarKey])
	return vars, m != nil && m.group == h.shed
}

// groupMark is what a request's var of a shedding group holds while a
// handler counts the request in the group: the group, and the watcher
// that times the request for it (nil when none does). The var keeps its
// mark once the handler returns, as no handler may write the vars map
// then (shed.Group.Exit): owner, the identity of the vars map of the
// request the mark counts, is what makes it count. exit clears it, and a
// mark taken from the pool again names another request's map, so a spent
// mark counts for nobody (an error route served after the handler is a
// request of its own for the group).
type groupMark struct {
	group *shed.Group
	x     *watcher
	owner atomic.Uintptr
}

var groupMarks = sync.Pool{New: func() any { return new(groupMark) }}

// varsID is the identity of a request's vars map: no other live map has it.
func varsID(vars map[string]any) uintptr {
	if vars == nil {
		return 0
	}
	return uintptr(reflect.ValueOf(vars).UnsafePointer())
}

// enterGroup counts a request of vars in g, timed by x when x times it for
// a group, until the mark's exit.
func enterGroup(g *shed.Group, vars map[string]any, x *watcher) *groupMark {
	m := groupMarks.Get().(*groupMark)
	m.group = g
	if x != nil && x.group != nil {
		m.x = x
	}
	m.owner.Store(varsID(vars))
	g.Enter(vars, m)
	return m
}

func (m *groupMark) exit() {
	m.owner.Store(0)
	m.group.Exit()
	m.group, m.x = nil, nil
	groupMarks.Put(m)
}

// markOf is v, the var named key of the vars map whose identity is id, if
// it is a mark that counts that map's request in the group of that var;
// else nil. A spent mark left in one group's var may be taken from the
// pool again for the same request by another group's handler (an error
// route's): under the first var it counts for nobody.
func markOf(id uintptr, key string, v any) *groupMark {
	m, ok := v.(*groupMark)
	if !ok || id == 0 || m.owner.Load() != id || m.group.VarKey != key {
		return nil
	}
	return m
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
	id := varsID(vars)
	for k, v := range vars {
		if m := markOf(id, k, v); m != nil {
			m.group.InFlight.Add(-1)
			if m.x != nil {
				m.x.pausedAt = m.x.now()
			}
		}
	}
	return vars
}

func rejoinGroups(vars map[string]any) {
	id := varsID(vars)
	for k, v := range vars {
		if m := markOf(id, k, v); m != nil {
			m.group.InFlight.Add(1)
			if m.x != nil {
				m.x.paused += m.x.now() - m.x.pausedAt
			}
		}
	}
}

// untime leaves out of every group's latency a request refused after a
// handler counted it: its answer took no upstream time, and a flood of
// quick refusals would otherwise pull the p99 down and end the shedding
// that the slow upstream still needs.
func untime(r *http.Request) {
	vars, _ := r.Context().Value(caddyhttp.VarsCtxKey).(map[string]any)
	id := varsID(vars)
	for k, v := range vars {
		if m := markOf(id, k, v); m != nil && m.x != nil {
			m.x.refused = true
		}
	}
}
