package redis

import (
	"errors"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// giveBackFailures counts the give-backs Redis did not take. It is made
// once and registered into every config's registry, so that it carries on
// across reloads, as the handler's own metrics do.
var giveBackFailures = prometheus.NewCounterVec(prometheus.CounterOpts{
	Namespace: "caddy", Subsystem: "rate_limit", Name: "redis_give_back_failures_total",
	Help: "Give-backs to Redis that failed, whose units stay charged until their keys expire: undo (what a request took on one hash slot when another slot denied it or failed) or lease (the unused units of a lease, returned when the last config using it unloads).",
}, []string{"op"})

var (
	undoFailures  = giveBackFailures.WithLabelValues("undo")
	leaseFailures = giveBackFailures.WithLabelValues("lease")
)

// dropsLogEvery is how often failed give-backs are logged at most: when
// Redis fails, every request of a multi-slot zone can fail its give-back,
// and a line each would flood the log.
const dropsLogEvery = time.Minute

// giveBacks reports the give-backs of one store that failed: each is
// counted, and logged at most once a minute with how many failed since
// the last line.
type giveBacks struct {
	mu     sync.Mutex
	logger *zap.Logger      // nil: not logged (a store made without a module)
	now    func() time.Time // tests; nil: time.Now
	logged time.Time
	since  int    // failures since the last line, this one included
	total  uint64 // failures in all, for the tests
}

// provision sets the logger and registers the metric into the config's
// registry.
func (g *giveBacks) provision(ctx caddy.Context) {
	logger := ctx.Logger()
	g.mu.Lock()
	g.logger = logger
	g.mu.Unlock()
	if reg := ctx.GetMetricsRegistry(); reg != nil {
		if err := reg.Register(giveBackFailures); err != nil {
			if _, ok := errors.AsType[prometheus.AlreadyRegisteredError](err); !ok {
				logger.Warn("redis: the metric of failed give-backs is not exported", zap.Error(err))
			}
		}
	}
}

// failed reports a give-back of op that Redis did not take.
func (g *giveBacks) failed(op string, err error) {
	if op == "lease" {
		leaseFailures.Inc()
	} else {
		undoFailures.Inc()
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.total++
	g.since++
	now := time.Now
	if g.now != nil {
		now = g.now
	}
	t := now()
	if !g.logged.IsZero() && t.Sub(g.logged) < dropsLogEvery {
		return
	}
	if g.logger != nil {
		g.logger.Error("redis: giving back units failed: what requests that did not happen took stays charged until the keys expire (logged once a minute at most)",
			zap.String("op", op), zap.Int("failed", g.since), zap.Error(err))
	}
	g.logged, g.since = t, 0
}

// failures is how many give-backs failed in all.
func (g *giveBacks) failures() uint64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.total
}
