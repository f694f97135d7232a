// Package backend defines the Store: where the state of every rate-limit key
// lives and where a request is decided, once and atomically, across all the
// zones it matched.
package backend

import (
	"context"
	"time"

	"go.uber.org/zap"

	"github.com/sluicehq/sluice/algorithms"
)

// Namespace is the Caddy module namespace of stores: a handler's "backend"
// names one of its modules ("memory", "redis").
const Namespace = "http.rate_limit.backends"

// LimitConfig is what a store needs to hold the state of one limit: a zone's
// own rate or one of its scopes.
type LimitConfig struct {
	// Name is the zone name. Zones of the same name and scope (and the
	// same kind of state) share their state, across handlers and across
	// config reloads.
	Name string
	// Scope names one of the zone's limits; "" is the zone's own.
	Scope string
	// Algorithm is the canonical algorithm name (see algorithms.Check).
	Algorithm string
	// Policy is the zone's rate.
	Policy algorithms.Policy
	// MaxKeys caps the number of keys the zone tracks; 0 picks a default
	// sized for about 100 MB.
	MaxKeys int
	// Cost is the cost of every request when the zone's cost is a
	// constant, 0 when it varies (a placeholder). The default MaxKeys of a
	// sliding window depends on it: the events a key can hold, and whether
	// each must record its own cost.
	Cost int64
	// Lease is how many units an instance takes from a shared store at
	// once and then spends locally (0: every request asks the store). A
	// store that decides in-process refuses it: it would change nothing.
	Lease int64
	// Calendar, for a fixed window, cuts time into the hours, days or
	// months of a time zone instead of windows from the Unix epoch; nil
	// for epoch-aligned windows.
	Calendar *algorithms.Calendar
	// Lockout locks a key its limit denies out for a while, longer each
	// time (nil: never). The store writes the lock-out in the operation
	// that denies, so that concurrent requests see it at once.
	Lockout Lockout
	// MostEvents is the largest max_events the limit may be adjusted to
	// while it runs (Adjustable); stores size what a key may hold by it.
	// 0: Policy.Limit.
	MostEvents int64
	// Owner identifies the config that registers the zone. One config may
	// register a name twice only with the same policy: two rates for one
	// state would make whichever registered last apply to both.
	Owner any
}

// Limit is a store's handle on one limit's state (a zone or one of its
// scopes), made at provision time.
type Limit interface {
	// Name is the zone name.
	Name() string
}

// Request asks for Cost units of Key in Limit.
type Request struct {
	Limit Limit
	Key   string
	Cost  int64
	// Shadow requests are decided and counted but never make the request
	// deny: they are taken only when they allow.
	Shadow bool
	// Reserve, when positive, holds the units taken as a reservation that
	// lasts Reserve nanoseconds (see Reserver); Token tells it apart.
	Reserve int64
	Token   uint64
}

// Store decides requests against stored state.
type Store interface {
	// Register registers a limit and returns its handle. It fails when the
	// config cannot be served (for example an unknown algorithm).
	Register(cfg LimitConfig) (Limit, error)
	// Decide answers every request in reqs into out (len(out) ≥ len(reqs)),
	// all or nothing: when a non-shadow request is denied, no request is
	// taken; otherwise every allowed request is taken. It reports whether the
	// request as a whole may proceed.
	Decide(ctx context.Context, reqs []Request, out []algorithms.Result) (bool, error)
	// Refund gives back what an allowed Decide of the same requests took,
	// for a request that did not happen after all (a queued request whose
	// client left); granted holds that Decide's results. It never gives
	// back more than was taken: a request that reserved (Request.Reserve)
	// has its reservation released, as Reserver.Settle does, so that its
	// expiry does not give the units back a second time.
	Refund(ctx context.Context, reqs []Request, granted []algorithms.Result) error
	// Close releases the zones this store registered.
	Close() error
}

// LimitStats counts what a store holds for one limit (a zone or one of its
// scopes).
type LimitStats struct {
	Zone, Scope string
	// Keys is how many keys the store tracks now.
	Keys int64
	// Evictions counts keys dropped before they were idle, to stay under
	// max_keys; DenyingEvictions those of them that were denying.
	Evictions        uint64
	DenyingEvictions uint64
}

// StatsReporter is implemented by stores that can tell what they hold, for
// the metrics. A store whose state lives elsewhere (a shared server) may
// not: counting its keys would cost a scan.
type StatsReporter interface {
	Stats() []LimitStats
}

// Setup is what the handler that loads a store passes on to it.
type Setup struct {
	// Now is the handler's clock, Unix nanoseconds (tests inject a fake
	// one). A store that keeps its own time decides with it; one that
	// decides with a shared server's clock may ignore it.
	Now func() int64
	// SweepInterval is the handler's sweep_interval: how often a store
	// that keeps state in this process drops idle keys (0: its default).
	SweepInterval time.Duration
	// Logger is the handler's logger.
	Logger *zap.Logger
}

// Configurable is implemented by stores that take the handler's Setup. The
// handler calls Configure once, after the store is provisioned and before
// it registers any zone.
type Configurable interface {
	Configure(Setup)
}

// Admin is implemented by stores whose keys an operator can look at and
// change by hand (the admin API): to unblock a client without a restart.
// key is the key as the zone builds it (normalized and hashed).
type Admin interface {
	// Inspect returns the key's state at now without consuming anything.
	Inspect(ctx context.Context, l Limit, key string) (algorithms.Usage, error)
	// Reset forgets the key's state: its next request finds a full quota.
	Reset(ctx context.Context, l Limit, key string) error
	// Grant gives units back to the key, never more than its full quota,
	// and returns its state after.
	Grant(ctx context.Context, l Limit, key string, units int64) (algorithms.Usage, error)
}

// Forgetter is implemented by stores that remember answers in this process
// (the Redis store's cache of denied keys). After an operator changed a key
// through one store, Forget is called on every other store of the zone, so
// that none keeps refusing the key from what it remembers.
type Forgetter interface {
	Forget(l Limit, key string)
}
