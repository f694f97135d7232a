package backend

import (
	"context"

	"github.com/sluicehq/sluice/algorithms"
)

// Reserver is implemented by stores that hold units as reservations, for
// spend budgets: a request's units are reserved when Decide allows it
// (Request.Reserve), then committed once the upstream call succeeded or
// released when it failed. A reservation neither committed nor released
// within its Reserve nanoseconds is released by the store itself, so that
// the units of a Caddy that died mid-request come back with no Caddy
// left to give them: the usage a decision sees is what was committed
// plus the reservations still live.
type Reserver interface {
	// SettleReservations commits (commit true: the units stay taken) or releases
	// (the units come back) the reservations that an allowed Decide of
	// the same requests made; granted holds its results. A reservation
	// that expired or was settled before is left alone: nothing is ever
	// given back twice, nor more than was reserved.
	SettleReservations(ctx context.Context, reqs []Request, granted []algorithms.Result, commit bool) error
}
