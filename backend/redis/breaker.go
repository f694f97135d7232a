package redis

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"
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
	cb *gobreaker.CircuitBreaker[bool]
	// clear is set while the breaker is closed and no failure was counted
	// since a success: a call that succeeds then would change nothing that
	// trips it (three failures in a row), so it skips gobreaker, whose two
	// locked updates and clock reads cost about a tenth of a batched
	// decision's client CPU. A failure always goes through gobreaker;
	// fails counts them, so that a success whose call overlapped one
	// does not set clear.
	clear    atomic.Bool
	fails    atomic.Uint64
	openFor  time.Duration
	openedAt atomic.Int64 // Unix ns of the last opening
	// recovered, when set (before the first call), is called when Redis
	// answers again after an outage; it must not block.
	recovered func()
}

func newBreaker(logger *zap.Logger, openFor time.Duration) *breaker {
	b := &breaker{openFor: openFor}
	b.clear.Store(true)
	b.cb = gobreaker.NewCircuitBreaker[bool](gobreaker.Settings{
		Name:         "redis",
		MaxRequests:  1,
		Timeout:      openFor,
		ReadyToTrip:  func(c gobreaker.Counts) bool { return c.ConsecutiveFailures >= breakerTrips },
		IsExcluded:   excluded,
		IsSuccessful: succeeded,
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
				if b.recovered != nil {
					b.recovered()
				}
			}
		},
	})
	return b
}

// excluded reports whether the breaker leaves err out of its counts.
// (nil first: the target errors.As gets would allocate on every call.)
func excluded(err error) bool { return err != nil && errors.As(err, new(callerGone)) }

// succeeded reports whether the breaker counts err as a success: Redis
// answered, and one request's keys it could not decide say nothing about
// the others, whose calls must not fail with it.
func succeeded(err error) bool { return err == nil || failedAlone(err) }

// callerGone is a failure caused by the request's own context (its client
// left): it says nothing about Redis.
type callerGone struct{ error }

func (c callerGone) Unwrap() error { return c.error }

// failedAlone reports whether err is Redis's answer about one request
// alone: the script could not decide that request's keys (one holds a
// value of another type, a key of another slot, a Lua error the request's
// own state or arguments raised). Redis answered, and other requests can be
// decided: that request follows its zone's fail policy, the circuit
// breaker counts Redis as up, and the over-limit cache is kept. Anything
// else is Redis's own failure, and counts against it: no answer (a broken
// connection, a timeout, a closed pool) or an answer that Redis cannot
// serve now (LOADING, BUSY, MASTERDOWN, CLUSTERDOWN, READONLY, TRYAGAIN,
// OOM, NOAUTH, WRONGPASS, NOPERM, MISCONF, a reply of no known kind).
func failedAlone(err error) bool {
	var reply goredis.Error
	if err == nil || !errors.As(err, &reply) {
		return false
	}
	return repliedAlone(reply.Error())
}

// serverCodes are the error codes of a Redis that cannot serve now, whoever
// asks: found inside a script's error, they are still Redis's failure.
var serverCodes = map[string]bool{
	"LOADING": true, "BUSY": true, "MASTERDOWN": true, "CLUSTERDOWN": true, "READONLY": true,
	"TRYAGAIN": true, "OOM": true, "NOAUTH": true, "WRONGPASS": true, "NOPERM": true,
	"MISCONF": true, "NOREPLICAS": true, "NOSCRIPT": true, "MOVED": true, "ASK": true,
}

// repliedAlone classifies an error reply (or the message the batch script
// caught for one request) by its code. A script's error comes in three
// forms: the code of the command that failed in it ("WRONGTYPE …"), a Lua
// error of the script ("ERR user_script:12: attempt to …", or
// user_function run as a Function, without "ERR " when caught), and, before Redis 7, either one inside "ERR Error running
// script (call to f_…): @user_script:12: …".
func repliedAlone(msg string) bool {
	msg = strings.TrimPrefix(msg, "-")
	code, rest, _ := strings.Cut(msg, " ")
	switch {
	case code == "WRONGTYPE" || code == "CROSSSLOT":
		return true
	case code == "ERR" && strings.HasPrefix(rest, "Script attempted to access a non local key"):
		return true
	case code == "ERR" && strings.HasPrefix(rest, "Error running script"):
		if _, inner, ok := strings.Cut(rest, "): "); ok {
			return scriptFailedAlone(inner)
		}
		return true
	case code == "ERR" && isScriptPlace(rest):
		return scriptFailedAlone(rest)
	case isScriptPlace(msg):
		return scriptFailedAlone(msg)
	}
	return false
}

// scriptFailedAlone reads the error a script raised, after the places in
// the script Lua and Redis put before it: a command's error inside it
// keeps its code, and one of a Redis that cannot serve is still Redis's.
func scriptFailedAlone(msg string) bool {
	for isScriptPlace(msg) {
		_, msg, _ = strings.Cut(msg, ": ")
		msg = strings.TrimPrefix(msg, "-")
	}
	code, _, _ := strings.Cut(msg, " ")
	return !serverCodes[code]
}

// isScriptPlace reports whether msg starts with the place of a Lua error
// in the script: "user_script:12:" or "@user_script:12:" ("user_function"
// for the script loaded as a Function).
func isScriptPlace(msg string) bool {
	place, _, ok := strings.Cut(msg, ": ")
	if !ok {
		return false
	}
	place = strings.TrimPrefix(place, "@")
	line, ok := strings.CutPrefix(place, "user_script:")
	if !ok {
		line, ok = strings.CutPrefix(place, "user_function:") // the script loaded as a Function
	}
	if !ok || line == "" {
		return false
	}
	for i := 0; i < len(line); i++ {
		if line[i] < '0' || line[i] > '9' {
			return false
		}
	}
	return true
}

// scriptError is the message the batch script caught for one request: a
// reply of Redis, as the same request's call of its own would have had.
type scriptError string

func (e scriptError) Error() string { return string(e) }
func (scriptError) RedisError()     {}

// do runs call through the breaker. Its errors become
// backend.UnavailableError, except those of a caller that left.
func (b *breaker) do(ctx context.Context, call func() (bool, error)) (bool, error) {
	guarded := func() (bool, error) {
		ok, err := call()
		if err != nil && ctx.Err() != nil {
			return ok, callerGone{err}
		}
		return ok, err
	}
	var ok bool
	var err error
	if b.clear.Load() {
		ok, err = guarded()
		if err != nil && !excluded(err) && !succeeded(err) {
			// Counted as gobreaker counts a failure; the calls after
			// it go through gobreaker until one succeeds.
			b.fails.Add(1)
			b.clear.Store(false)
			b.cb.Execute(func() (bool, error) { return ok, err })
		}
	} else {
		f := b.fails.Load()
		ok, err = b.cb.Execute(guarded)
		switch {
		case !succeeded(err) && !excluded(err):
			b.fails.Add(1)
		case succeeded(err):
			if b.cb.State() == gobreaker.StateClosed && b.fails.Load() == f {
				b.clear.Store(true)
			}
		}
	}
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
