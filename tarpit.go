package sluice

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/sluicehq/sluice/internal/tarpit"
)

// MaxTarpit is the longest a tarpit holds a denial: clients and proxies
// give up on an answer much later than a scraper's thread is worth
// holding.
const MaxTarpit = caddy.Duration(time.Minute)

// DefaultTarpitMax is how many denials a tarpit holds at once by default.
const DefaultTarpitMax = 1000

// MaxTarpitMax bounds tarpit_max: every held request keeps a connection
// (a file descriptor) open.
const MaxTarpitMax = 1_000_000

var (
	tarpitHeld = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: "caddy", Subsystem: "rate_limit", Name: "tarpit_held_requests",
		Help: "Denied requests whose answer a tarpit is holding now, in every handler.",
	})
	tarpitSkipped = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "rate_limit", Name: "tarpit_skipped_total",
		Help: "Denied requests answered at once because their handler's tarpit already held tarpit_max.",
	})
)

// provisionTarpit checks tarpit and tarpit_max, and arranges for held
// denials to go when the server begins to shut down (a reload or a stop:
// a graceful shutdown waits for every request, held ones included) and
// when this config is cleaned up.
func (h *plan) provisionTarpit(ctx caddy.Context) error {
	switch {
	case h.Tarpit < 0 || h.Tarpit > MaxTarpit:
		return fmt.Errorf("tarpit must be from 0 to 1m, got %s", time.Duration(h.Tarpit))
	case h.TarpitMax < 0 || h.TarpitMax > MaxTarpitMax:
		return fmt.Errorf("tarpit_max must be from 1 to %d, got %d", MaxTarpitMax, h.TarpitMax)
	case h.TarpitMax != 0 && h.Tarpit == 0:
		return fmt.Errorf("tarpit_max would do nothing without tarpit")
	case h.Tarpit == 0:
		return nil
	case !h.denies():
		return fmt.Errorf("tarpit would do nothing: it holds the denials of a rate limit, and this handler has no zone with a rate that is not shadow (shed, concurrency and the other refusals are answered at once)")
	}
	// All tarpits together hold at most half the open-file limit: held
	// denials must never take the descriptors other clients need.
	t := tarpit.New(int64(h.Tarpit), cmp.Or(h.TarpitMax, DefaultTarpitMax))
	if ceiling := openFileLimit() / 2; ceiling > 0 {
		tarpit.SetCeiling(ceiling)
		if t.Max() > ceiling {
			h.logger.Warn("tarpit_max is above half the process's open-file limit: all tarpits together hold at most that many denials, so that held connections never take the descriptors other clients need (raise the limit, e.g. LimitNOFILE, to hold more)",
				zap.Int64("tarpit_max", t.Max()), zap.Int64("open_file_limit", ceiling*2), zap.Int64("held_at_most", ceiling))
		}
	}
	h.tarpit = t
	if srv, ok := ctx.Value(caddyhttp.ServerCtxKey).(*caddyhttp.Server); ok {
		srv.RegisterOnShutdown(t.Stop)
	}
	return nil
}

// denies tells whether some limit of h may deny a request for its rate.
func (h *plan) denies() bool {
	for _, z := range h.zones {
		if z.Shadow {
			continue
		}
		for _, l := range z.keyed {
			if !l.concOnly() {
				return true
			}
		}
	}
	return false
}

// holdInTarpit delays the answer to a denied request, by between half and
// all of the tarpit, unless the tarpit holds tarpit_max already, and
// returns how long it held it (ns). It ends early when the client goes
// away or the config stops serving. A held request costs what it already
// had, its connection and this goroutine: the timer starts no goroutine of
// its own. It is out of the shedding groups meanwhile.
func (h *plan) holdInTarpit(r *http.Request) int64 {
	t := h.tarpit
	if t == nil {
		return 0
	}
	if !t.Take() {
		tarpitSkipped.Inc()
		return 0
	}
	start := h.now()
	var held int64
	outsideGroups(r, func() {
		tarpitHeld.Inc()
		defer func() {
			// The gauge first: released the other way round, a request
			// taking the freed place could count itself before this one
			// was uncounted, and the gauge would read tarpit_max + 1.
			tarpitHeld.Dec()
			t.Release()
		}()
		random := h.jitterFn
		if random == nil {
			random = rand.Float64
		}
		d := t.Delay(random())
		newTimer := h.newTimer
		if newTimer == nil {
			newTimer = systemTimer
		}
		fired, stop := newTimer(d)
		defer stop()
		select {
		case <-fired:
		case <-r.Context().Done():
		case <-t.Done():
		}
		held = max(h.now()-start, 0)
	})
	return held
}
