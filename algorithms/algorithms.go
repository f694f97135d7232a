// Package algorithms holds the limiting math of Sluice: pure functions of
// (state, now, cost, policy). Nothing here reads a clock, locks or does I/O:
// the memory store calls these functions under its own locks with its own
// time. The Redis backend runs the same math as a Lua script inside Redis
// (backend/redis/lua), and its differential test holds it to these
// functions, field by field, on the same requests at the same instants.
//
// Times and durations are int64 nanoseconds. A zero state is always a fresh
// key, so a store may drop any state whose IdleAt has passed.
package algorithms

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
)

// MaxSpan bounds every duration an algorithm may store or add to a time
// (window, max_delay, burst × interval, the queue's max_delay + interval):
// 2^61 ns, about 73 years. An algorithm adds at most two spans to a time,
// so now + span + span stays within int64 for Unix times before 2^62 ns
// (early 2116).
const MaxSpan int64 = 1 << 61

// MaxEvents bounds max_events and burst: 10^15 units, a petabyte per
// window when the cost is in bytes. With it, a count plus a cost (each at
// most MaxEvents, since a larger cost is refused before it is added) and
// window + max_events stay far below 2^63. It is also below 2^53, the
// largest whole number that a JSON number keeps exactly through Caddy's
// admin API, which decodes numbers as float64.
const MaxEvents int64 = 1_000_000_000_000_000

// Never is the RetryAfter of a request that cannot pass however long the
// client waits: its cost is larger than the zone can ever hold.
const Never int64 = -1

// Policy is the rate every algorithm is parameterized by: Limit units per
// Window, with Burst as the capacity of the bucket algorithms.
type Policy struct {
	// Limit is the sustained number of units per Window (max_events).
	Limit int64
	// Window is the length of the window in nanoseconds.
	Window int64
	// Burst is the bucket capacity (token bucket, GCRA, leaky bucket).
	// Zero means Limit.
	Burst int64
	// MaxDelay makes the leaky bucket a queue: requests wait up to this
	// long (ns) for their slot instead of being denied. Zero: a meter.
	MaxDelay int64
}

// String writes p as a Caddyfile would: "10 per 1m, burst 20".
func (p Policy) String() string {
	s := fmt.Sprintf("%d per %s", p.Limit, FormatSpan(p.Window))
	if p.Burst > 0 {
		s += fmt.Sprintf(", burst %d", p.Burst)
	}
	if p.MaxDelay > 0 {
		s += fmt.Sprintf(", max_delay %s", FormatSpan(p.MaxDelay))
	}
	return s
}

// Validate reports what is wrong with p, naming the field as users write it.
func (p Policy) Validate() error {
	switch {
	case p.Limit <= 0:
		return fieldErrorf("max_events", "max_events must be at least 1, got %d", p.Limit)
	case p.Limit > MaxEvents:
		return fieldErrorf("max_events", "max_events must be at most %d, got %d", MaxEvents, p.Limit)
	case p.Window <= 0:
		return fieldErrorf("window", "window must be positive, got %s", FormatSpan(p.Window))
	case p.Window > MaxSpan:
		return fieldErrorf("window", "window must be at most %v, got %s", spanText, FormatSpan(p.Window))
	case p.Burst < 0:
		return fieldErrorf("burst", "burst must be at least 1, got %d", p.Burst)
	case p.Burst > MaxEvents:
		return fieldErrorf("burst", "burst must be at most %d, got %d", MaxEvents, p.Burst)
	case p.MaxDelay < 0 || p.MaxDelay > MaxSpan:
		return fieldErrorf("max_delay", "max_delay must be between 0 and %v, got %s", spanText, FormatSpan(p.MaxDelay))
	}
	// The bucket algorithms store burst × interval as a time span.
	if hi, lo := bits.Mul64(uint64(p.burst()), uint64(p.Interval())); hi != 0 || lo > uint64(MaxSpan) {
		return fieldErrorf("burst", "burst %d × interval %s exceeds %v: lower burst or raise max_events", p.burst(), FormatSpan(p.Interval()), spanText)
	}
	// A queued request can wait max_delay for its slot and then hold the
	// queue for up to one more interval per unit.
	if p.MaxDelay > 0 && p.MaxDelay+p.Interval() > MaxSpan {
		return fieldErrorf("max_delay", "max_delay %s + interval %s exceeds %v: lower max_delay or raise max_events", FormatSpan(p.MaxDelay), FormatSpan(p.Interval()), spanText)
	}
	return nil
}

const spanText = "73 years"

func (p Policy) burst() int64 {
	if p.Burst > 0 {
		return p.Burst
	}
	return p.Limit
}

// Interval is the emission interval Window/Limit in nanoseconds, rounded up
// so that rounding can only ever admit less, never more, than the policy.
// It is written so that it cannot overflow, even for a policy that
// Validate refuses.
func (p Policy) Interval() int64 {
	if p.Limit <= 0 || p.Window <= 0 {
		return 0
	}
	return (p.Window-1)/p.Limit + 1
}

// Result is the answer to one request against one key.
type Result struct {
	// Allowed reports whether the request may proceed (after Delay).
	Allowed bool
	// Limit is the quota a client is told about: the burst for the bucket
	// algorithms, max_events for the window algorithms.
	Limit int64
	// Remaining is how many units are left once this decision is applied.
	Remaining int64
	// RetryAfter is how long a denied request must wait before the same
	// request can pass: 0 when allowed, Never when it can never pass.
	RetryAfter int64
	// ResetAfter is how long until the key is back to its full quota.
	ResetAfter int64
	// Delay is how long an allowed request waits before it proceeds (the
	// leaky bucket's queue mode); 0 for every other algorithm.
	Delay int64
	// At is when the decision was taken; stores fill it in, and Refund
	// reads it to undo exactly that request.
	At int64
}

// counted is the part the window algorithms share: cost units asked of a
// limit of which used are taken. done reports a final answer (allowed, or a
// cost that can never pass); otherwise the caller fills in RetryAfter.
func counted(limit, used, cost, resetAfter int64) (r Result, done bool) {
	r = Result{Limit: limit, Remaining: max(limit-used, 0), ResetAfter: resetAfter}
	switch {
	case cost == 0: // free: allowed even when over a lowered limit
		r.Allowed = true
		return r, true
	case cost > limit:
		r.RetryAfter = Never
		return r, true
	case used+cost <= limit:
		r.Allowed = true
		r.Remaining = limit - used - cost
		return r, true
	}
	return r, false
}

// Algorithm is one limiting algorithm bound to one policy, over state S.
// A store looks a key's S up, calls Decide, and only when it decides to
// admit the request (every zone allowed it) calls Take and stores the S it
// returns. The zero S is a fresh key. States are passed by value so that a
// store calling through this interface does not move them to the heap.
type Algorithm[S any] interface {
	// Decide answers whether cost units can be taken from s at now. It
	// consumes nothing; a pointer state (the sliding log) may drop expired
	// events, which never changes an answer.
	Decide(s S, now, cost int64) Result
	// Take returns s with cost units consumed at now. Call it only after
	// Decide allowed the same (s, now, cost).
	Take(s S, now, cost int64) S
	// IdleAt is the time from which s is equivalent to the zero S and may be
	// forgotten.
	IdleAt(s S) int64
	// Refund returns s, at now, with the cost units that the decision
	// granted (allowed, taken at granted.At) took given back, as if the
	// request had not happened (a queued request whose client left). It
	// never gives back more than was taken, and gives back nothing it cannot
	// tell apart from what other requests took.
	Refund(s S, now int64, granted Result, cost int64) S
	// Rebase returns s, written under policy old, rewritten for this
	// algorithm's policy as of the moment at when the policy changed (a
	// config reload). Each period then drains at the rate that was in force
	// during it. States that record events rather than a rate come back
	// as they are.
	Rebase(s S, at int64, old Policy) S
	// Policy is the policy the algorithm was built with.
	Policy() Policy
	// Available returns how many units a request could take from s at
	// now: 0 when a request of one unit would be refused. Stores evict the
	// keys with the most available first.
	Available(s S, now int64) int64
	// Usage describes s at now in terms every algorithm shares.
	Usage(s S, now int64) Usage
	// FromUsage returns a state of this algorithm that, at now, leaves no
	// more than u's share of its quota and resets no sooner than u, as far
	// as the algorithm can hold a state that long (usage.go says where it
	// cannot). Usage then FromUsage moves a key between algorithms.
	FromUsage(u Usage, now int64) S
}

// Names of the algorithms, as written in the `algorithm` zone field.
const (
	NameSlidingWindow  = "sliding_window"
	NameSlidingCounter = "sliding_window_counter"
	NameFixedWindow    = "fixed_window"
	NameTokenBucket    = "token_bucket"
	NameGCRA           = "gcra"
	NameLeakyBucket    = "leaky_bucket"
)

// ErrUnknown is returned for an algorithm name Sluice does not know.
var ErrUnknown = errors.New("unknown algorithm")

// Names lists the algorithms that zones can choose, default first.
func Names() []string {
	return []string{NameSlidingWindow, NameSlidingCounter, NameFixedWindow, NameTokenBucket, NameGCRA, NameLeakyBucket}
}

// UsesBurst reports whether the named algorithm reads Policy.Burst.
func UsesBurst(name string) bool {
	switch name {
	case NameTokenBucket, NameGCRA, NameLeakyBucket:
		return true
	}
	return false
}

// Check validates p for the named algorithm and returns the canonical name
// ("" means the default sliding window).
func Check(name string, p Policy) (string, error) {
	if name == "" {
		name = NameSlidingWindow
	}
	known := false
	for _, n := range Names() {
		known = known || n == name
	}
	if !known {
		return "", fieldErrorf("algorithm", "%w %q (choose one of %v)", ErrUnknown, name, Names())
	}
	if err := p.Validate(); err != nil {
		return "", err
	}
	if p.Burst > 0 && !UsesBurst(name) {
		return "", fieldErrorf("burst", "burst does not apply to algorithm %s (only to token_bucket, gcra and leaky_bucket)", name)
	}
	if p.MaxDelay > 0 {
		if name != NameLeakyBucket {
			return "", fieldErrorf("max_delay", "max_delay applies only to algorithm leaky_bucket, not %s", name)
		}
		if p.Burst > 0 {
			return "", fieldErrorf("burst", "burst does not apply to a leaky_bucket queue: max_delay sizes the queue")
		}
	}
	if name == NameSlidingWindow && p.Limit > math.MaxUint32 {
		return "", fieldErrorf("max_events", "max_events must be at most %d for sliding_window, got %d", uint32(math.MaxUint32), p.Limit)
	}
	return name, nil
}

// MaxCost is the largest cost one request can ever be granted under the
// named algorithm and policy; a constant cost above it is a config error.
func MaxCost(name string, p Policy) int64 {
	switch {
	case name == NameLeakyBucket && p.MaxDelay > 0:
		return NewLeakyBucket(p).queueSize()
	case UsesBurst(name):
		return p.burst()
	}
	return p.Limit
}

// Kind names the kind of state an algorithm keeps. Algorithms of one kind
// read each other's state (token_bucket, gcra and leaky_bucket all keep one
// theoretical arrival time), so a store may keep a key's state when a zone
// switches between them; between kinds, state must be translated (Usage).
type Kind string

// The kinds of state.
const (
	KindBucket  Kind = "bucket"  // Bucket: token_bucket, gcra, leaky_bucket
	KindLog     Kind = "log"     // *Log: sliding_window
	KindWindow  Kind = "window"  // Window: fixed_window
	KindCounter Kind = "counter" // Counter: sliding_window_counter
)

// KindOf returns the kind of state of the named algorithm ("" for the
// default), or "" for a name Sluice does not know.
func KindOf(name string) Kind {
	switch name {
	case NameTokenBucket, NameGCRA, NameLeakyBucket:
		return KindBucket
	case NameSlidingWindow, "":
		return KindLog
	case NameFixedWindow:
		return KindWindow
	case NameSlidingCounter:
		return KindCounter
	}
	return ""
}

// NewBucketAlgorithm returns the named algorithm of kind KindBucket for p,
// or nil when name is of another kind. p must be valid.
func NewBucketAlgorithm(name string, p Policy) Algorithm[Bucket] {
	switch name {
	case NameTokenBucket:
		return NewTokenBucket(p)
	case NameGCRA:
		return NewGCRA(p)
	case NameLeakyBucket:
		return NewLeakyBucket(p)
	}
	return nil
}
