package backend

import (
	"context"

	"github.com/sluicehq/sluice/algorithms"
)

// Settler is implemented by stores that can settle a request's cost once
// its response told the real one: the units an LLM call reserved as
// max_tokens, settled at the tokens it used.
type Settler interface {
	// Settle replaces, for each request of reqs that granted allowed, the
	// cost it took (reqs[i].Cost, the estimate) by actual[i] (at most
	// algorithms.MaxSettle): the difference is given back, never more than
	// was taken, or charged even past the limit (the key then owes it and
	// waits). Each key is settled on its own; settling only moves one
	// key's state, so it needs no all-or-nothing.
	Settle(ctx context.Context, reqs []Request, granted []algorithms.Result, actual []int64) error
}
