// Package backend defines the Store: where the state of every rate-limit key
// lives and where a request is decided, once and atomically, across all the
// zones it matched.
package backend

import (
	"context"

	"github.com/sluicehq/sluice/algorithms"
)

// ZoneConfig is what a store needs to hold the state of one zone.
type ZoneConfig struct {
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
	// Owner identifies the config that registers the zone. One config may
	// register a name twice only with the same policy: two rates for one
	// state would make whichever registered last apply to both.
	Owner any
}

// Zone is a store's handle on one zone's state, made at provision time.
type Zone interface {
	// Name is the zone name.
	Name() string
}

// Request asks for Cost units of Key in Zone.
type Request struct {
	Zone Zone
	Key  string
	Cost int64
	// Shadow requests are decided and counted but never make the request
	// deny: they are taken only when they allow.
	Shadow bool
}

// Store decides requests against stored state.
type Store interface {
	// Zone registers a zone and returns its handle. It fails when the
	// config cannot be served (for example an unknown algorithm).
	Zone(cfg ZoneConfig) (Zone, error)
	// Decide answers every request in reqs into out (len(out) ≥ len(reqs)),
	// all or nothing: when a non-shadow request is denied, no request is
	// taken; otherwise every allowed request is taken. It reports whether the
	// request as a whole may proceed.
	Decide(ctx context.Context, reqs []Request, out []algorithms.Result) (bool, error)
	// Refund gives back what an allowed Decide of the same requests took,
	// for a request that did not happen after all (a queued request whose
	// client left); granted holds that Decide's results. It never gives
	// back more than was taken.
	Refund(ctx context.Context, reqs []Request, granted []algorithms.Result) error
	// Close releases the zones this store registered.
	Close() error
}
