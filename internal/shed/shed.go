// Package shed is load shedding by group: the handlers that name a group
// share its count of requests in flight and the p99 latency of those that
// finished, and a request is shed by its priority once the group's load
// (the greater of in flight ÷ capacity and p99 ÷ latency target) is high
// enough. Groups outlive config reloads.
package shed

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/internal/latency"
)

// Group is the state one group's handlers share: the requests in flight,
// the latency of those that finished, and each config's capacity and
// target for the metrics.
type Group struct {
	Name     string
	InFlight atomic.Int64
	// VarKey names the request var that marks a request this group
	// counts, so that a handler nested in another of the same group (a
	// site-wide one and a route's) does not count it again.
	VarKey string
	// Latency is the group's, like the count, so that it outlives a
	// reload. It is fed only while a config sets a target.
	Latency latency.Window
	// Now is the monotonic clock (ns) the latency is read by.
	Now func() int64

	mu   sync.Mutex
	regs []*Reg // oldest first
}

// Reg is one handler's use of a group.
type Reg struct {
	owner    any // the config
	Capacity int64
	Target   int64 // ns; 0 without a latency target
}

// Destruct lets a group live in a caddy.UsagePool; it holds nothing to
// release.
func (*Group) Destruct() error { return nil }

// groups holds every group some running config uses. A group's requests
// in flight outlive a reload: requests still served under the old config
// count against the new one.
var groups = caddy.NewUsagePool()

// Registered tells whether some handler uses the group name.
func Registered(name string) bool {
	_, ok := groups.References(name)
	return ok
}

// Sheds reports whether a request of the given priority is refused at a
// load of used ÷ capacity: requests in flight for a capacity, or a p99
// latency for a target (both in ns: at most an hour for the target, and
// the histogram's top bucket, under 2^47, for the p99, so nothing
// overflows). It is the rule
// priority > 5 − (used/capacity − 0.8) × 10 multiplied through by
// capacity, in integers: in floats, (1.1 − 0.8) × 10 is
// 3.0000000000000004, which would shed priority 2 at a load of exactly
// 1.1. The load being the greater of two ratios, a request is shed when
// either ratio alone sheds it. No allocation, no lock, no store call.
func Sheds(used, capacity int64, priority int) bool {
	return priority > 0 && int64(priority)*capacity+10*used > 13*capacity
}

// Bounds of a latency target: below a millisecond the histogram's
// microsecond steps and the clock's cost are a large part of it; above an
// hour no request is an answer anyone waits for.
const (
	MinLatencyTarget = time.Millisecond
	MaxLatencyTarget = time.Hour
)

// Join registers a handler of owner (the config being provisioned) in the
// group name, with its capacity and latency target (ns), making the group
// when no running config uses it. now is the clock a new group reads.
// Handlers of one config must give a group the same capacity and target.
func Join(name string, owner any, capacity, target int64, now func() int64) (*Group, *Reg, error) {
	v, _ := groups.LoadOrStore(name, &Group{Name: name, VarKey: "rate_limit.shed." + name, Now: now})
	g := v.(*Group)
	g.mu.Lock()
	for _, o := range g.regs {
		if owner == nil || o.owner != owner {
			continue
		}
		var err error
		switch {
		case o.Capacity != capacity:
			err = fmt.Errorf("shed %q: capacity given twice in this config, %d and %d: handlers of one group share one count, so give them the same capacity", name, o.Capacity, capacity)
		case o.Target != target:
			err = fmt.Errorf("shed %q: latency_target given twice in this config, %s and %s: handlers of one group share one latency, so give them the same target", name, time.Duration(o.Target), time.Duration(target))
		}
		if err != nil {
			g.mu.Unlock()
			_, _ = groups.Delete(name)
			return nil, nil, err
		}
	}
	reg := &Reg{owner: owner, Capacity: capacity, Target: target}
	g.regs = append(g.regs, reg)
	g.mu.Unlock()
	return g, reg, nil
}

// Leave takes reg out of the group; the last handler to leave drops it.
func (g *Group) Leave(reg *Reg) {
	g.mu.Lock()
	if i := slices.Index(g.regs, reg); i >= 0 {
		g.regs = slices.Delete(g.regs, i, i+1)
	}
	g.mu.Unlock()
	_, _ = groups.Delete(g.Name)
}

// Shedding reports whether a request of priority must be shed now under
// reg's capacity and target. counted tells that a handler the request
// passed through before counts it already: the load is the others'
// requests in flight, so it is taken out. Priority 0 is never shed, so it
// reads neither the count nor the clock.
func (g *Group) Shedding(reg *Reg, priority int, counted bool) bool {
	if priority == 0 {
		return false
	}
	n := g.InFlight.Load()
	if counted {
		n--
	}
	if c := reg.Capacity; c > 0 && Sheds(n, c, priority) {
		return true
	}
	// The p99 read without the clock is the last worked out: one that
	// does not shed the request stands (requests that finish bring it up
	// to date), one that does is brought up to date first, so that a p99
	// from before a quiet spell cannot shed anything.
	t := reg.Target
	return t > 0 && Sheds(g.Latency.Last(), t, priority) &&
		Sheds(g.Latency.P99At(g.Now()), t, priority)
}

// Enter counts an admitted request in the group until Exit; mark is what
// the request's var then holds (one map write, before the request is
// handed on). The caller holds on to g: a reload cleans the handler up
// while its last requests are still being served.
func (g *Group) Enter(vars map[string]any, mark any) {
	g.InFlight.Add(1)
	if vars != nil {
		vars[g.VarKey] = mark
	}
}

// Exit counts a request entered out. It leaves the request's var as it is:
// the vars map is read by goroutines that outlive the handlers (the
// reverse proxy's dial reads it after a request that gave up on it), so
// no handler may write it once the request was handed on; the caller's
// mark says it is spent instead.
func (g *Group) Exit() {
	g.InFlight.Add(-1)
}

// Observe adds the latency (ns) of a request that finished at end, and
// brings the p99 up to date for the checks that read it without the clock.
func (g *Group) Observe(ns, end int64) {
	g.Latency.Add(ns, end)
	g.Latency.P99At(end)
}

// Edge is the error the log line of a shed request carries: when a
// handler of priority and capacity in group is shed. Made once, so a shed
// request allocates nothing for it.
func Edge(group string, capacity int64, priority int) error {
	// Shed when 10 × in flight > (13 − priority) × capacity.
	edge := (13 - int64(priority)) * capacity
	return fmt.Errorf("priority %d is shed while more than %d requests are in flight in group %q (load above %.1f of capacity %d)",
		priority, edge/10, group, float64(13-priority)/10, capacity)
}

// collector reports each group's requests in flight, capacity, latency
// and target at scrape time, so that counting a request costs two atomic
// adds and no metric update.
type collector struct {
	inFlight, capacity, p99, target *prometheus.Desc
}

// Metrics are every group's gauges.
var Metrics prometheus.Collector = collector{
	inFlight: prometheus.NewDesc("caddy_rate_limit_shed_in_flight_requests",
		"Requests in flight in a load shedding group, counted by every handler that names it.", []string{"group"}, nil),
	capacity: prometheus.NewDesc("caddy_rate_limit_shed_capacity_requests",
		"The capacity of a load shedding group: requests in flight at a load of 1.0 (the newest config's).", []string{"group"}, nil),
	p99: prometheus.NewDesc("caddy_rate_limit_shed_latency_p99_seconds",
		"The 99th percentile latency of a load shedding group's requests that finished in the last 8 to 10 seconds (0 without any), for a group with a latency target.", []string{"group"}, nil),
	target: prometheus.NewDesc("caddy_rate_limit_shed_latency_target_seconds",
		"The latency target of a load shedding group: its p99 latency at a load of 1.0 (the newest config's).", []string{"group"}, nil),
}

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.inFlight
	ch <- c.capacity
	ch <- c.p99
	ch <- c.target
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	groups.Range(func(_, v any) bool {
		g := v.(*Group)
		g.mu.Lock()
		var newest Reg
		if n := len(g.regs); n > 0 {
			newest = *g.regs[n-1]
		}
		g.mu.Unlock()
		if newest.Capacity == 0 && newest.Target == 0 {
			return true // every handler left
		}
		ch <- prometheus.MustNewConstMetric(c.inFlight, prometheus.GaugeValue, float64(g.InFlight.Load()), g.Name)
		if newest.Capacity > 0 {
			ch <- prometheus.MustNewConstMetric(c.capacity, prometheus.GaugeValue, float64(newest.Capacity), g.Name)
		}
		if newest.Target > 0 {
			ch <- prometheus.MustNewConstMetric(c.p99, prometheus.GaugeValue, float64(g.Latency.P99At(g.Now()))/1e9, g.Name)
			ch <- prometheus.MustNewConstMetric(c.target, prometheus.GaugeValue, float64(newest.Target)/1e9, g.Name)
		}
		return true
	})
}
