package backend

import (
	"context"
	"time"
)

// SlotConfig is what a store needs to hold the concurrency slots of one
// limit (a zone or one of its scopes) for every instance that shares it.
type SlotConfig struct {
	// Name is the zone name and Scope the scope's ("" for the zone's own);
	// limits of the same name and scope share their slots.
	Name, Scope string
	// Limit is the most slots of one key held at once.
	Limit int64
	// TTL is how long a slot lasts unless its holder renews it: a slot of
	// an instance that died mid-request is free again after it.
	TTL time.Duration
}

// Slots is a store's handle on one limit's shared concurrency slots.
type Slots interface {
	// Acquire takes a slot of key when fewer than the limit are held. It
	// returns the slot's id, or "" when every slot is taken. While the id
	// is held (until Release), the store renews it so that it never
	// expires under a request that is still running.
	Acquire(ctx context.Context, key string) (id string, err error)
	// Release frees the slot id of key and stops renewing it.
	Release(ctx context.Context, key, id string) error
}

// SlotStore is implemented by stores whose concurrency slots are shared by
// every instance that uses the same store (the Redis store). A store that
// does not implement it has no shared slots: the handler then counts them
// in its own process.
type SlotStore interface {
	RegisterSlots(cfg SlotConfig) (Slots, error)
}

// AdjustableSlots is implemented by the slots whose limit can change while
// they are held: an adaptive limit moves it every interval. The limit is
// the one this process sends with each acquire; every instance of a fleet
// sets its own, and the slot set is one: an acquire succeeds when fewer
// slots than the caller's limit are held, by every instance together.
// Lowered, the slots held stay held until released.
type AdjustableSlots interface {
	SetLimit(n int64) error
}
