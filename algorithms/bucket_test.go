package algorithms

import (
	"math"
	"strings"
	"testing"
	"time"
)

const (
	ms = int64(time.Millisecond)
	s  = int64(time.Second)
)

// step is a batch of identical requests at one instant and what the
// worked example says happens to them.
type step struct {
	at           int64
	n            int     // requests at this instant
	cost         int64   // per request; 0 means 1
	wantAllowed  int     // how many of the n pass
	tokensBefore float64 // after refill, before the batch (NaN: not checked)
	tokensAfter  float64 // after the batch (NaN: not checked)
	retryAfter   int64   // of the first denied request (-2: none denied)
}

const noDeny = -2

var unchecked = math.NaN()

func runBucket(t *testing.T, b bucket, steps []step) {
	t.Helper()
	var st Bucket
	for _, sp := range steps {
		cost := sp.cost
		if cost == 0 {
			cost = 1
		}
		if !math.IsNaN(sp.tokensBefore) {
			if got := b.Tokens(st, sp.at); math.Abs(got-sp.tokensBefore) > 1e-9 {
				t.Errorf("t=%v: tokens before = %v, want %v", time.Duration(sp.at), got, sp.tokensBefore)
			}
		}
		allowed, retry := 0, int64(noDeny)
		for i := 0; i < sp.n; i++ {
			r := b.Decide(st, sp.at, cost)
			if r.Allowed {
				st = b.Take(st, sp.at, cost)
				allowed++
			} else if retry == noDeny {
				retry = r.RetryAfter
			}
		}
		if allowed != sp.wantAllowed {
			t.Errorf("t=%v: %d of %d allowed, want %d", time.Duration(sp.at), allowed, sp.n, sp.wantAllowed)
		}
		if retry != sp.retryAfter {
			t.Errorf("t=%v: retry after = %v, want %v", time.Duration(sp.at), time.Duration(retry), time.Duration(sp.retryAfter))
		}
		if !math.IsNaN(sp.tokensAfter) {
			if got := b.Tokens(st, sp.at); math.Abs(got-sp.tokensAfter) > 1e-9 {
				t.Errorf("t=%v: tokens after = %v, want %v", time.Duration(sp.at), got, sp.tokensAfter)
			}
		}
	}
}

// base is an arbitrary Unix time; the algorithms only see differences.
const base = int64(1_767_225_600) * s

func TestTokenBucketWorkedExamples(t *testing.T) {
	tests := []struct {
		name   string
		policy Policy
		steps  []step
	}{
		{
			// docs/algorithms.md's table: capacity 10, refill 5/s, full at t=0.
			name:   "capacity 10 at 5/s",
			policy: Policy{Limit: 5, Window: s, Burst: 10},
			steps: []step{
				{at: base, n: 12, wantAllowed: 10, tokensBefore: 10, tokensAfter: 0, retryAfter: 200 * ms},
				{at: base + 400*ms, n: 1, wantAllowed: 1, tokensBefore: 2, tokensAfter: 1, retryAfter: noDeny},
				{at: base + 1000*ms, n: 4, wantAllowed: 4, tokensBefore: 4, tokensAfter: 0, retryAfter: noDeny},
				// 0.5 < 1: denied, deficit 0.5 token at 5/s = 0.1 s.
				{at: base + 1100*ms, n: 1, wantAllowed: 0, tokensBefore: 0.5, tokensAfter: 0.5, retryAfter: 100 * ms},
				{at: base + 1300*ms, n: 1, wantAllowed: 1, tokensBefore: 1.5, tokensAfter: 0.5, retryAfter: noDeny},
			},
		},
		{
			// Capacity 20, refill 2/s, 25 at t=0.
			name:   "25 into capacity 20",
			policy: Policy{Limit: 2, Window: s, Burst: 20},
			steps: []step{
				{at: base, n: 25, wantAllowed: 20, tokensBefore: 20, tokensAfter: 0, retryAfter: 500 * ms},
			},
		},
		{
			// Capacity 50, refill 10/s; 60 at t=0, 30 more at t=2.
			name:   "capacity 50 at 10/s",
			policy: Policy{Limit: 10, Window: s, Burst: 50},
			steps: []step{
				{at: base, n: 60, wantAllowed: 50, tokensBefore: 50, tokensAfter: 0, retryAfter: 100 * ms},
				{at: base + 2*s, n: 30, wantAllowed: 20, tokensBefore: 20, tokensAfter: 0, retryAfter: 100 * ms},
			},
		},
		{
			// Cost in tokens: 100 per minute, a report costs 50.
			name:   "cost",
			policy: Policy{Limit: 100, Window: 60 * s},
			steps: []step{
				{at: base, n: 3, cost: 50, wantAllowed: 2, tokensBefore: 100, tokensAfter: 0, retryAfter: 30 * s},
				{at: base + 15*s, n: 1, cost: 25, wantAllowed: 1, tokensBefore: 25, tokensAfter: 0, retryAfter: noDeny},
			},
		},
		{
			// Capacity 10, rate 5; 10 pass, the 11th is denied, and one
			// second later 5 more pass.
			name:   "one second later",
			policy: Policy{Limit: 5, Window: s, Burst: 10},
			steps: []step{
				{at: base, n: 11, wantAllowed: 10, tokensBefore: unchecked, tokensAfter: unchecked, retryAfter: 200 * ms},
				{at: base + s, n: 6, wantAllowed: 5, tokensBefore: 5, tokensAfter: 0, retryAfter: 200 * ms},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.policy.Validate(); err != nil {
				t.Fatal(err)
			}
			runBucket(t, NewTokenBucket(tt.policy).bucket, tt.steps)
		})
	}
}

func TestGCRAWorkedExamples(t *testing.T) {
	tests := []struct {
		name   string
		policy Policy
		steps  []step
	}{
		{
			// docs/algorithms.md's table: 10/minute, burst 3: T = 6 s, τ = 12 s.
			name:   "10 per minute burst 3",
			policy: Policy{Limit: 10, Window: 60 * s, Burst: 3},
			steps: []step{
				{at: base, n: 4, wantAllowed: 3, tokensBefore: unchecked, tokensAfter: unchecked, retryAfter: 6 * s},
				{at: base + 3*s, n: 1, wantAllowed: 0, tokensBefore: unchecked, tokensAfter: unchecked, retryAfter: 3 * s},
				{at: base + 6*s, n: 1, wantAllowed: 1, tokensBefore: unchecked, tokensAfter: unchecked, retryAfter: noDeny},
			},
		},
		{
			// 20/minute, burst 4: T = 3 s, τ = 9 s; of 6 at t=0, 4 pass
			// and the 6th waits 3 s.
			name:   "20 per minute burst 4",
			policy: Policy{Limit: 20, Window: 60 * s, Burst: 4},
			steps: []step{
				{at: base, n: 4, wantAllowed: 4, tokensBefore: unchecked, tokensAfter: unchecked, retryAfter: noDeny},
				{at: base, n: 1, wantAllowed: 0, tokensBefore: unchecked, tokensAfter: unchecked, retryAfter: 3 * s},
				{at: base, n: 1, wantAllowed: 0, tokensBefore: unchecked, tokensAfter: unchecked, retryAfter: 3 * s},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			runBucket(t, NewGCRA(tt.policy).bucket, tt.steps)
		})
	}
}

// docs/algorithms.md's GCRA table row by row: TAT before and after each request, in
// seconds after t=0.
func TestGCRATATColumn(t *testing.T) {
	g := NewGCRA(Policy{Limit: 10, Window: 60 * s, Burst: 3})
	if g.interval != 6*s || g.capacity-g.interval != 12*s {
		t.Fatalf("T = %v, τ = %v; want 6s and 12s", time.Duration(g.interval), time.Duration(g.capacity-g.interval))
	}
	rows := []struct {
		at                  int64
		tatBefore, tatAfter int64
		allow               bool
	}{
		{0, 0, 6, true},
		{0, 6, 12, true},
		{0, 12, 18, true},
		{0, 18, 18, false},
		{3, 18, 18, false},
		{6, 18, 24, true},
	}
	st := Bucket{TAT: base}
	for _, row := range rows {
		now := base + row.at*s
		if got := max(st.TAT, now) - base; got != row.tatBefore*s && !(row.tatBefore == 0 && got == 0) {
			t.Errorf("t=%d: TAT before = %v, want %ds", row.at, time.Duration(got), row.tatBefore)
		}
		r := g.Decide(st, now, 1)
		if r.Allowed != row.allow {
			t.Fatalf("t=%d: allowed = %v, want %v", row.at, r.Allowed, row.allow)
		}
		if r.Allowed {
			st = g.Take(st, now, 1)
		}
		if got := st.TAT - base; got != row.tatAfter*s {
			t.Errorf("t=%d: TAT after = %v, want %ds", row.at, time.Duration(got), row.tatAfter)
		}
	}
}

// 30/minute with burst 5 gives T = 2 s, τ = 8 s.
func TestGCRAIntervalAndTolerance(t *testing.T) {
	g := NewGCRA(Policy{Limit: 30, Window: 60 * s, Burst: 5})
	if g.interval != 2*s {
		t.Errorf("T = %v, want 2s", time.Duration(g.interval))
	}
	if tau := g.capacity - g.interval; tau != 8*s {
		t.Errorf("τ = %v, want 8s", time.Duration(tau))
	}
}

func TestBucketEdges(t *testing.T) {
	p := Policy{Limit: 10, Window: 10 * s, Burst: 5}
	b := NewTokenBucket(p)

	t.Run("cost above burst never passes", func(t *testing.T) {
		var st Bucket
		r := b.Decide(st, base, 6)
		if r.Allowed || r.RetryAfter != Never || r.Remaining != 5 {
			t.Fatalf("got %+v, want denied with RetryAfter Never and 5 remaining", r)
		}
	})
	t.Run("cost zero is free", func(t *testing.T) {
		st := Bucket{}
		for i := 0; i < 5; i++ {
			st = b.Take(st, base, 1)
		}
		r := b.Decide(st, base, 0)
		if !r.Allowed || r.Remaining != 0 {
			t.Fatalf("got %+v, want a free request allowed on an empty bucket", r)
		}
	})
	t.Run("clock going backwards mints nothing", func(t *testing.T) {
		var st Bucket
		for i := 0; i < 5; i++ {
			st = b.Take(st, base, 1)
		}
		r := b.Decide(st, base-time.Hour.Nanoseconds(), 1)
		if r.Allowed {
			t.Fatalf("allowed after the clock stepped back an hour: %+v", r)
		}
		if got := b.Tokens(st, base-time.Hour.Nanoseconds()); got > 0 {
			t.Fatalf("tokens = %v after the clock stepped back, want ≤ 0", got)
		}
	})
	t.Run("idle at the TAT", func(t *testing.T) {
		var st Bucket
		st = b.Take(st, base, 3)
		if got := b.IdleAt(st); got != base+3*s {
			t.Fatalf("IdleAt = %v after base, want 3s", time.Duration(got-base))
		}
	})
	t.Run("raised rate applies at once", func(t *testing.T) {
		// 10 per minute, all used; reloaded as 20 per minute with burst 20:
		// the 60 s of debt become 30 s, so 10 tokens are left.
		oldP := Policy{Limit: 10, Window: 60 * s}
		st := NewTokenBucket(oldP).Take(Bucket{}, base, 10)
		raised := NewTokenBucket(Policy{Limit: 20, Window: 60 * s})
		st = raised.Rebase(st, base, oldP)
		r := raised.Decide(st, base, 1)
		if !r.Allowed || r.Remaining != 9 {
			t.Fatalf("after raise: %+v, want allowed with 9 remaining", r)
		}
	})
	t.Run("a changed rate is the refill rate from the change on", func(t *testing.T) {
		// 10 per minute used up at t=0; at t=6 s (one token back) the rate
		// becomes 10 per second: the 9 tokens in use refill in 0.9 s.
		oldP := Policy{Limit: 10, Window: 60 * s}
		st := NewTokenBucket(oldP).Take(Bucket{}, base, 10)
		fast := NewTokenBucket(Policy{Limit: 10, Window: s})
		st = fast.Rebase(st, base+6*s, oldP)
		if got := fast.Tokens(st, base+6*s); got != 1 {
			t.Fatalf("%v tokens at the change, want 1", got)
		}
		if got := fast.Tokens(st, base+6*s+900*ms); got != 10 {
			t.Fatalf("%v tokens 0.9 s after the change, want 10", got)
		}
		// Lowered the other way: 10 per 6 s used up, then 1 per minute: the
		// 10 tokens in use take 10 minutes to come back, one per minute.
		oldP = Policy{Limit: 10, Window: 6 * s}
		st = NewTokenBucket(oldP).Take(Bucket{}, base, 10)
		slow := NewTokenBucket(Policy{Limit: 1, Window: 60 * s, Burst: 10})
		st = slow.Rebase(st, base, oldP)
		if r := slow.Decide(st, base+59*s, 1); r.Allowed || r.RetryAfter != s {
			t.Fatalf("59 s after lowering: %+v, want denied for 1 s more", r)
		}
		if got := slow.Tokens(st, base+5*60*s); got != 5 {
			t.Fatalf("%v tokens 5 minutes after lowering, want 5", got)
		}
	})
	t.Run("rebase of an idle bucket", func(t *testing.T) {
		st := Bucket{TAT: base}
		if got := NewGCRA(Policy{Limit: 1, Window: s}).Rebase(st, base+s, Policy{Limit: 5, Window: s}); got != st {
			t.Fatalf("idle bucket changed: %+v", got)
		}
	})
	t.Run("interval rounds up", func(t *testing.T) {
		p := Policy{Limit: 3, Window: s}
		if got := p.Interval(); got != 333_333_334 {
			t.Fatalf("Interval = %d, want 333333334", got)
		}
	})
}

func TestPolicyValidate(t *testing.T) {
	tests := []struct {
		name string
		p    Policy
		want string
	}{
		{"zero events", Policy{Limit: 0, Window: s}, "max_events must be at least 1, got 0"},
		{"negative events", Policy{Limit: -1, Window: s}, "max_events must be at least 1, got -1"},
		{"zero window", Policy{Limit: 1}, "window must be positive, got 0s"},
		{"negative burst", Policy{Limit: 1, Window: s, Burst: -1}, "burst must be at least 1, got -1"},
		{"burst span overflow", Policy{Limit: 1, Window: 24 * 3600 * s, Burst: 1 << 40}, "exceeds 73 years"},
		{"fine", Policy{Limit: 100, Window: 60 * s, Burst: 200}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.p.Validate()
			if tt.want == "" {
				if err != nil {
					t.Fatalf("unexpected error %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error = %v, want it to contain %q", err, tt.want)
			}
		})
	}
}
