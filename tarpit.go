package sluice

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/sluicehq/sluice/algorithms"
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

// Every tarpit of the process shares one ceiling: half the open-file
// limit. Each held denial keeps a connection open, and held ones must
// never take the descriptors that other clients' connections, upstream
// connections and files need: with tarpit_max above the limit, one client
// opening connections and getting denied would make Caddy refuse everyone.
var (
	tarpitHeldAll atomic.Int64 // denials every tarpit holds now
	tarpitCeiling atomic.Int64 // 0: no ceiling known
)

// tarpitState is a handler's tarpit: how many denials it holds, and a
// channel closed when the config stops serving, which lets them all go.
type tarpitState struct {
	delay, max int64
	held       atomic.Int64
	done       chan struct{}
	once       sync.Once
}

// stop lets every held denial go, at once; further ones are not held.
func (t *tarpitState) stop() {
	if t != nil {
		t.once.Do(func() { close(t.done) })
	}
}

// provisionTarpit checks tarpit and tarpit_max, and arranges for held
// denials to go when the server begins to shut down (a reload or a stop:
// a graceful shutdown waits for every request, held ones included) and
// when this config is cleaned up.
func (h *Handler) provisionTarpit(ctx caddy.Context) error {
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
	t := &tarpitState{delay: int64(h.Tarpit), max: cmp.Or(h.TarpitMax, DefaultTarpitMax), done: make(chan struct{})}
	if ceiling := openFileLimit() / 2; ceiling > 0 {
		tarpitCeiling.Store(ceiling)
		if t.max > ceiling {
			h.logger.Warn("tarpit_max is above half the process's open-file limit: all tarpits together hold at most that many denials, so that held connections never take the descriptors other clients need (raise the limit, e.g. LimitNOFILE, to hold more)",
				zap.Int64("tarpit_max", t.max), zap.Int64("open_file_limit", ceiling*2), zap.Int64("held_at_most", ceiling))
		}
	}
	h.tarpit = t
	if srv, ok := ctx.Value(caddyhttp.ServerCtxKey).(*caddyhttp.Server); ok {
		srv.RegisterOnShutdown(t.stop)
	}
	return nil
}

// denies tells whether some limit of h may deny a request for its rate.
func (h *Handler) denies() bool {
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
func (h *Handler) holdInTarpit(r *http.Request) int64 {
	t := h.tarpit
	if t == nil {
		return 0
	}
	if !t.take() {
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
			t.held.Add(-1)
			tarpitHeldAll.Add(-1)
		}()
		random := h.jitterFn
		if random == nil {
			random = rand.Float64
		}
		// Jittered, so held scrapers are not let go, and do not come back,
		// in one wave, and the delay does not tell a tarpit from a slow
		// server.
		d := time.Duration(t.delay/2 + int64(random()*float64(t.delay-t.delay/2)))
		newTimer := h.newTimer
		if newTimer == nil {
			newTimer = systemTimer
		}
		fired, stop := newTimer(d)
		defer stop()
		select {
		case <-fired:
		case <-r.Context().Done():
		case <-t.done:
		}
		held = max(h.now()-start, 0)
	})
	return held
}

// elapse takes d (ns) off the waits of out, decided d ago: a client told
// to retry in 30 s after a 10 s hold would otherwise wait 10 s too long.
func elapse(out []algorithms.Result, d int64) {
	for i := range out {
		if out[i].RetryAfter != algorithms.Never {
			out[i].RetryAfter = max(out[i].RetryAfter-d, 0)
		}
		out[i].ResetAfter = max(out[i].ResetAfter-d, 0)
	}
}

// take counts one more held request, unless max are held by this
// tarpit or the ceiling by all of them.
func (t *tarpitState) take() bool {
	for {
		n := t.held.Load()
		if n >= t.max {
			return false
		}
		if t.held.CompareAndSwap(n, n+1) {
			break
		}
	}
	if c := tarpitCeiling.Load(); tarpitHeldAll.Add(1) > c && c > 0 {
		tarpitHeldAll.Add(-1)
		t.held.Add(-1)
		return false
	}
	return true
}

// unmarshalTarpit reads `tarpit <duration>` and `tarpit_max <n>`.
func (h *Handler) unmarshalTarpit(d *caddyfile.Dispenser, opt string) error {
	if opt == "tarpit_max" {
		n, err := positiveArg(d, "", opt)
		if err != nil {
			return err
		}
		if n > MaxTarpitMax {
			return d.Errf("tarpit_max must be from 1 to %d, got %d", MaxTarpitMax, n)
		}
		h.TarpitMax = n
		return nil
	}
	dur, err := durationArg(d, "", opt)
	if err != nil {
		return err
	}
	if caddy.Duration(dur) > MaxTarpit {
		return d.Errf("tarpit must be at most 1m, got %s", dur)
	}
	h.Tarpit = caddy.Duration(dur)
	return nil
}
