package redis

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"time"

	"github.com/sony/gobreaker/v2"
	"go.uber.org/zap"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
)

// Breaker settings. A dead Redis would otherwise cost every request the
// full timeout; once open, a call fails at once. Three failures in a row
// open it: one timeout can be a hiccup, three are an outage. It probes
// with one request every half second, so a Redis that comes back is used
// again within a second.
const (
	breakerTrips   = 3
	breakerOpenFor = 500 * time.Millisecond
)

// breaker guards the calls to one Redis. It is shared, with the client,
// by every handler and config that names that Redis, so a reload neither
// forgets an outage nor sends a fresh wave of requests into the timeout.
// gobreaker runs no goroutine: its state moves on when it is called.
type breaker struct {
	cb       *gobreaker.CircuitBreaker[bool]
	openFor  time.Duration
	openedAt atomic.Int64 // Unix ns of the last opening
}

func newBreaker(logger *zap.Logger, openFor time.Duration) *breaker {
	b := &breaker{openFor: openFor}
	b.cb = gobreaker.NewCircuitBreaker[bool](gobreaker.Settings{
		Name:        "redis",
		MaxRequests: 1,
		Timeout:     openFor,
		ReadyToTrip: func(c gobreaker.Counts) bool { return c.ConsecutiveFailures >= breakerTrips },
		IsExcluded:  func(err error) bool { return errors.As(err, new(callerGone)) },
		// Redis answered: one request's keys it could not decide say
		// nothing about the others, whose calls must not fail with it.
		IsSuccessful: func(err error) bool { return err == nil || errors.As(err, new(keyFailed)) },
		OnStateChange: func(_ string, from, to gobreaker.State) {
			if to == gobreaker.StateOpen {
				b.openedAt.Store(time.Now().UnixNano())
			}
			// A failed probe reopens it every half second while Redis
			// is down: log the outage's start and end only.
			switch {
			case from == gobreaker.StateClosed && to == gobreaker.StateOpen:
				logger.Error("redis unreachable: rate limit zones follow their fail policy until it answers again",
					zap.Duration("probe_interval", openFor))
			case to == gobreaker.StateClosed:
				logger.Info("redis answers again: rate limits are shared again")
			}
		},
	})
	return b
}

// callerGone is a failure caused by the request's own context (its client
// left): it says nothing about Redis.
type callerGone struct{ error }

func (c callerGone) Unwrap() error { return c.error }

// keyFailed is Redis's refusal of one request's keys, one holding a value
// of another type: Redis answered, and other keys can be decided. (Other
// errors a script meets, such as READONLY after a failover or OOM, are
// Redis's and count against it.)
type keyFailed struct{ error }

func (k keyFailed) Unwrap() error { return k.error }

// asKeyFailed marks err as a failure of the request's keys when Redis
// refused them for their type: a reply to the call, or the message the
// batch script caught for the one request.
func asKeyFailed(err error) error {
	if err != nil && strings.HasPrefix(err.Error(), "WRONGTYPE ") {
		return keyFailed{err}
	}
	return err
}

// do runs call through the breaker. Its errors become
// backend.UnavailableError, except those of a caller that left.
func (b *breaker) do(ctx context.Context, call func() (bool, error)) (bool, error) {
	ok, err := b.cb.Execute(func() (bool, error) {
		ok, err := call()
		if err != nil && ctx.Err() != nil {
			return ok, callerGone{err}
		}
		return ok, err
	})
	switch {
	case err == nil:
		return ok, nil
	case errors.As(err, new(callerGone)):
		return false, err
	case errors.Is(err, gobreaker.ErrOpenState):
		return false, &backend.UnavailableError{Err: err, RetryAfter: b.remaining()}
	}
	return false, &backend.UnavailableError{Err: err}
}

// remaining is how long the breaker stays open.
func (b *breaker) remaining() time.Duration {
	return max(time.Duration(b.openedAt.Load()+int64(b.openFor)-time.Now().UnixNano()), 0)
}

// Decide decides through the leases and the breaker (backend.Store).
func (m *Module) Decide(ctx context.Context, reqs []backend.Request, out []algorithms.Result) (bool, error) {
	return m.leases.decide(ctx, reqs, out, viaBreaker{m})
}

// Refund refunds through the leases and the breaker (backend.Store).
func (m *Module) Refund(ctx context.Context, reqs []backend.Request, granted []algorithms.Result) error {
	return m.leases.refund(ctx, reqs, granted, viaBreaker{m})
}

// viaBreaker calls Redis through the breaker.
type viaBreaker struct{ m *Module }

func (v viaBreaker) Decide(ctx context.Context, reqs []backend.Request, out []algorithms.Result) (bool, error) {
	return v.m.breaker.do(ctx, func() (bool, error) { return v.m.Store.Decide(ctx, reqs, out) })
}

func (v viaBreaker) Refund(ctx context.Context, reqs []backend.Request, granted []algorithms.Result) error {
	_, err := v.m.breaker.do(ctx, func() (bool, error) { return true, v.m.Store.Refund(ctx, reqs, granted) })
	return err
}
