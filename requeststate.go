package sluice

import (
	"sync"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/internal/keys"
)

// requestState is one request's working memory while it is decided: a
// store request per limit it matched, the limits themselves, the store's
// answers and what its shadow zones would have refused. The slices are
// handed to Store.Decide, an interface method, so they would escape to the
// heap if they lived in ServeHTTP's frame; they come from a pool instead,
// and a request that matches as many limits as an earlier one allocates
// nothing for them.
//
// A request state goes back to the pool before the request is handed on,
// so nothing that outlives the decision may point into it: placeholders
// and headers are set from values, never from its slices.
type requestState struct {
	reqs   []backend.Request
	limits []*limit
	out    []algorithms.Result
	shadow []shadowNote
	body   *keys.Body
	store  backend.Store // the store that decided
	// decided is set once every limit's decision is in out, and allowed
	// is that decision: every limit allows the request.
	decided, allowed bool
	// refused is the request's refusal, kept here so that a refused
	// request allocates nothing for it (see refuse).
	refused refusal
	conc    []concReq // the concurrency limits matched, with their keys
	adapt   []*adaptiveLimit
	// at is the handler's clock just before the decision, read when a
	// spend budget may reserve: no reservation it made expires before
	// at plus its reservation_ttl.
	at int64
}

// stateLimits is how many limits a pooled request state has room for at
// first; it grows for a request that matches more.
const stateLimits = 8

// maxPooledLimits bounds what a request state keeps when it goes back to
// the pool: one request matching many limits must not leave large slices
// pinned there for the life of the process.
const maxPooledLimits = 64

var statePool = sync.Pool{New: func() any {
	return &requestState{
		reqs:   make([]backend.Request, 0, stateLimits),
		limits: make([]*limit, 0, stateLimits),
		out:    make([]algorithms.Result, 0, stateLimits),
	}
}}

func getRequestState() *requestState { return statePool.Get().(*requestState) }

// release returns s to the pool, dropping its references (keys, limits,
// the body) so the pool keeps no request's data alive.
func (s *requestState) release() {
	if cap(s.reqs) > maxPooledLimits || cap(s.limits) > maxPooledLimits || cap(s.out) > maxPooledLimits || cap(s.shadow) > maxPooledLimits || cap(s.conc) > maxPooledLimits || cap(s.adapt) > maxPooledLimits {
		return
	}
	clear(s.reqs[:cap(s.reqs)])
	clear(s.limits[:cap(s.limits)])
	clear(s.shadow[:cap(s.shadow)])
	clear(s.conc[:cap(s.conc)])
	clear(s.adapt[:cap(s.adapt)])
	s.reqs, s.limits, s.out, s.shadow, s.conc, s.adapt = s.reqs[:0], s.limits[:0], s.out[:0], s.shadow[:0], s.conc[:0], s.adapt[:0]
	s.body, s.store, s.at, s.decided, s.allowed = nil, nil, 0, false, false
	if s.refused.zone != nil { // every refusal names its zone
		s.refused = refusal{}
	}
	statePool.Put(s)
}

// refuse keeps f as the request's refusal and returns it. It is written
// (respond) before the request state goes back to the pool.
func (s *requestState) refuse(f refusal) *refusal {
	s.refused = f
	return &s.refused
}
