package redis

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"math/bits"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/caddyserver/caddy/v2"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
)

// MaxSpan is the longest span, in nanoseconds, that the script computes
// exactly (about 52 days): Lua numbers are doubles, exact for integers up to
// 2^53, and the script adds at most two spans to a time relative to now.
// 2^40 ns (18 minutes) of headroom absorb a Redis clock that steps back.
const MaxSpan int64 = 1<<52 - 1<<40

const maxSpanText = "52 days (2^52 − 2^40 ns)"

// maxCost caps the cost sent to the script: above every limit the script
// accepts, so a larger cost decides the same (it can never pass).
const maxCost int64 = 1 << 52

// historyLen is how many policy changes of a zone the script is told
// about: a key untouched across more reloads than this is rebased from the
// oldest change it is told about onwards.
const historyLen = 32

// zoneStates keeps each zone's policy history across config reloads, the
// way the memory store keeps its tables: a reload registers the new policy
// before the old config lets go, and the change is recorded with its time
// so that every key is rebased exactly as the memory store would.
var zoneStates = caddy.NewUsagePool()

type poolKey struct {
	prefix, name, scope string
	kind                byte
}

// zoneState is the shared history of one (zone, scope, kind of state).
type zoneState struct {
	lineage string // tells this history from other processes' histories

	mu      sync.Mutex
	regs    []*registration
	changes []change
	maxDebt int64 // bucket kinds: the largest debt a state can hold now

	conf atomic.Pointer[zoneConf]
	// from are the other kinds of state of the zone whose keys may hold
	// usage when this kind was first registered (carryFrom).
	from []carried
	// seen is the newest generation a call has decided or refunded with:
	// keys may have been written under it.
	seen atomic.Int64
}

type registration struct {
	alg     string
	policy  algorithms.Policy
	lockout backend.Lockout
	lk      string // the script's lk argument (lockoutArg)
	owner   any
	cal     *algorithms.Calendar // a calendar window's (budget.go)
	last    *zoneConf            // the conf it last made current
}

func (r *registration) RegisteredBy() any                   { return r.owner }
func (r *registration) RegisteredPolicy() algorithms.Policy { return r.policy }
func (r *registration) RegisteredLockout() backend.Lockout  { return r.lockout }

type change struct {
	at    int64
	gen   int
	param int64
	// most is the largest debt a bucket is rebased to under the new
	// policy, as the algorithm bounds it: 2^52, or a queue's slots given
	// out when they reach further.
	most int64
}

// zoneConf is what the script decides with: the newest live registration's
// algorithm and policy, as script arguments.
type zoneConf struct {
	policy algorithms.Policy
	kind   string
	p1, p2 string
	param  int64
	lin    string
	gen    string
	hist   string
	from   string // the script's from argument
	lk     string // the script's lk argument: "" without lockout
	steps  backend.Lockout
	// boxed holds the zone's script arguments at their places (keyArgKind,
	// keyArgP1, ...; the request's, keyArgCost, keyArgX1 and keyArgX2, are
	// left nil), boxed once: boxing them per call allocated each.
	boxed [keyArgs]any

	genN    int64
	maxDebt int64 // the zone's maxDebt when this conf was made
	cal     *calendarArg
}

// use notes that a call decides or refunds with c.
func (z *zoneState) use(c *zoneConf) {
	for {
		seen := z.seen.Load()
		if c.genN <= seen || z.seen.CompareAndSwap(seen, c.genN) {
			return
		}
	}
}

func (z *zoneState) Destruct() error { return nil }

func newZoneState() *zoneState {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return &zoneState{lineage: hex.EncodeToString(b[:])}
}

// stateKind is the kind of state an algorithm keeps.
func stateKind(alg string) byte {
	switch alg {
	case algorithms.NameSlidingWindow:
		return kindLog
	case algorithms.NameFixedWindow:
		return kindWindow
	case algorithms.NameSlidingCounter:
		return kindCounter
	}
	return kindBucket
}

// scriptKind is the kind the script decides p with.
func scriptKind(alg string, p algorithms.Policy) byte {
	if alg == algorithms.NameLeakyBucket && p.MaxDelay > 0 {
		return kindQueue
	}
	return stateKind(alg)
}

func burstOf(p algorithms.Policy) int64 {
	if p.Burst > 0 {
		return p.Burst
	}
	return p.Limit
}

// checkExact refuses a policy whose numbers the script cannot compute
// exactly, naming the field and the bound.
func checkExact(alg string, p algorithms.Policy) error {
	switch {
	case p.Window > MaxSpan:
		return fmt.Errorf("window %s is longer than the redis backend computes exactly: at most %s", algorithms.FormatSpan(p.Window), maxSpanText)
	case p.Limit > MaxSpan:
		return fmt.Errorf("max_events %d is more than the redis backend counts exactly: at most %d", p.Limit, MaxSpan)
	}
	switch scriptKind(alg, p) {
	case kindQueue:
		if p.MaxDelay > MaxSpan-p.Interval() {
			return fmt.Errorf("max_delay %s plus the interval %s is longer than the redis backend computes exactly: at most %s", algorithms.FormatSpan(p.MaxDelay), algorithms.FormatSpan(p.Interval()), maxSpanText)
		}
	case kindBucket:
		if hi, lo := mulU(burstOf(p), p.Interval()); hi != 0 || lo > uint64(MaxSpan) {
			return fmt.Errorf("burst %d × interval %s is longer than the redis backend computes exactly: at most %s; lower burst or raise max_events", burstOf(p), algorithms.FormatSpan(p.Interval()), maxSpanText)
		}
	}
	return nil
}

// debtBound is the largest debt a bucket state written under p holds.
func debtBound(alg string, p algorithms.Policy) int64 {
	if scriptKind(alg, p) == kindQueue {
		return p.MaxDelay + (p.MaxDelay/p.Interval()+1)*p.Interval()
	}
	return burstOf(p) * p.Interval()
}

// debtLimit is the largest debt the script decides exactly under p: the
// meter adds a cost of at most its capacity to the debt.
func debtLimit(alg string, p algorithms.Policy) int64 {
	if scriptKind(alg, p) == kindQueue {
		return 2 * MaxSpan
	}
	return MaxSpan
}

// rebased is the debt d written at interval from, after a change to
// interval to (rounded up, as algorithms rebase it), saturating past
// 2·MaxSpan.
func rebased(d, from, to int64) int64 {
	hi, lo := mulU(d, to)
	if hi >= uint64(from) {
		return 2*MaxSpan + 1
	}
	q, r := bits.Div64(hi, lo, uint64(from))
	if r != 0 {
		q++
	}
	return int64(min(q, uint64(2*MaxSpan+1)))
}

// register adds a config's use of the zone and makes it decide. It refuses
// a second policy from the same config, and a change of rate after which a
// bucket's debt would leave the exact range (a reload from a large burst
// at a fast rate to a very slow rate).
func (z *zoneState) register(r *registration, now int64) error {
	z.mu.Lock()
	defer z.mu.Unlock()
	if err := backend.CheckRates(z.regs, r); err != nil {
		return err
	}
	if err := backend.CheckLockouts(z.regs, r); err != nil {
		return err
	}
	if stateKind(r.alg) == kindBucket {
		if err := z.checkRebase(r); err != nil {
			return err
		}
	}
	z.regs = append(z.regs, r)
	z.apply(r, now)
	return nil
}

// checkRebase verifies that the debts carried into r, and from r back into
// any policy a reload could return to, stay exact. The caller holds z.mu.
func (z *zoneState) checkRebase(r *registration) error {
	cur := z.conf.Load()
	if cur == nil {
		return nil
	}
	m := max(debtBound(r.alg, r.policy), rebased(z.maxDebt, cur.policy.Interval(), r.policy.Interval()))
	if m > debtLimit(r.alg, r.policy) {
		return fmt.Errorf("changing the rate from %v to %v would carry debts of up to %s into the new rate, longer than the redis backend computes exactly (at most %s); change the rate in smaller steps", cur.policy, r.policy, algorithms.FormatSpan(m), maxSpanText)
	}
	for _, o := range z.regs {
		if back := rebased(m, r.policy.Interval(), o.policy.Interval()); back > debtLimit(o.alg, o.policy) {
			return fmt.Errorf("a config still running %v could not take back the debts of %v exactly (up to %s, at most %s)", o.policy, r.policy, algorithms.FormatSpan(back), maxSpanText)
		}
	}
	return nil
}

// unregister removes a config's use; if it was deciding, the newest
// remaining registration decides again (a failed reload is undone).
func (z *zoneState) unregister(r *registration, now int64) {
	z.mu.Lock()
	defer z.mu.Unlock()
	i := slices.Index(z.regs, r)
	if i < 0 {
		return
	}
	z.regs = slices.Delete(z.regs, i, i+1)
	if i == len(z.regs) && len(z.regs) > 0 {
		if n := z.regs[len(z.regs)-1]; !z.restore(n) {
			z.apply(n, now)
		}
	}
}

// restore makes n decide again with the conf it last made current, and
// forgets the policy changes recorded since, when no call has used them:
// then no key was written under the rates of the configs that came after
// n (all gone, n being the newest left), and putting n's conf back is
// exact, where rebasing there and back would round twice (and fold a
// sliding window counter's previous window into the current one). The
// memory store undoes a failed reload the same way. The caller holds z.mu.
func (z *zoneState) restore(n *registration) bool {
	d := n.last
	if d == nil || z.seen.Load() > d.genN || int(d.genN) > len(z.changes) {
		return false
	}
	z.changes = z.changes[:d.genN]
	z.maxDebt = d.maxDebt
	z.conf.Store(d)
	return true
}

// apply makes r decide, recording a change of policy with its time. The
// caller holds z.mu.
func (z *zoneState) apply(r *registration, now int64) {
	cur := z.conf.Load()
	next := &zoneConf{policy: r.policy, lin: z.lineage}
	kind := scriptKind(r.alg, r.policy)
	next.kind = string(kind)
	switch kind {
	case kindBucket:
		next.param = r.policy.Interval()
		next.p2 = strconv.FormatInt(burstOf(r.policy), 10)
	case kindQueue:
		next.param = r.policy.Interval()
		next.p2 = strconv.FormatInt(r.policy.MaxDelay, 10)
	default:
		next.param = r.policy.Window
		next.p2 = strconv.FormatInt(r.policy.Limit, 10)
	}
	next.p1 = strconv.FormatInt(next.param, 10)
	if stateKind(r.alg) == kindBucket {
		if cur == nil {
			z.maxDebt = debtBound(r.alg, r.policy)
		} else {
			z.maxDebt = max(debtBound(r.alg, r.policy), rebased(z.maxDebt, cur.policy.Interval(), r.policy.Interval()))
		}
	}
	if cur != nil && cur.policy != r.policy {
		most := int64(1 << 52)
		if kind == kindQueue {
			most = max(most, debtBound(r.alg, r.policy))
		}
		z.changes = append(z.changes, change{at: now, gen: len(z.changes) + 1, param: next.param, most: most})
	}
	next.genN = int64(len(z.changes))
	next.gen = strconv.Itoa(len(z.changes))
	next.maxDebt = z.maxDebt
	r.last = next
	var h strings.Builder
	for _, c := range z.changes[max(len(z.changes)-historyLen, 0):] {
		if h.Len() > 0 {
			h.WriteByte(';')
		}
		fmt.Fprintf(&h, "%d,%d,%d,%d", c.at, c.gen, c.param, c.most)
	}
	next.hist = h.String()
	next.from = fromArg(z.from)
	next.lk, next.steps = r.lk, r.lockout
	next.boxed[keyArgKind-1] = next.kind
	next.boxed[keyArgP1-1], next.boxed[keyArgP2-1] = next.p1, next.p2
	next.boxed[keyArgLineage-1], next.boxed[keyArgGeneration-1] = next.lin, next.gen
	next.boxed[keyArgHistory-1], next.boxed[keyArgFrom-1] = next.hist, next.from
	next.boxed[keyArgLockout-1] = next.lk
	if r.cal != nil && kind == kindWindow {
		next.cal = &calendarArg{cal: r.cal, w: next.p1}
	}
	z.conf.Store(next)
}

// carried is a kind of state a zone may carry usage from: the script reads
// such a key when the zone's own is absent, until the old kind's keys have
// all expired.
type carried struct {
	pos    int // where the kind letter is in the key, from 1
	kind   string
	p1, p2 string
	at     int64 // when the zone changed kind: usage is translated as of then
	until  int64
}

// carryMargin is how long, past the old kind's idle span, a new kind still
// looks for keys of the old one: the old config writes them until it has
// stopped, which a reload does within moments.
const carryMargin = 3600 * 1_000_000_000

// carryFrom is what a zone registered in a new kind of state carries usage
// from: the kinds of the same zone and scope in force in this process, then
// those they were still carrying from, one entry per key letter.
func carryFrom(key poolKey, pos int, now int64) []carried {
	var out []carried
	var older []carried
	has := map[byte]bool{key.kind: true}
	zoneStates.Range(func(k, v any) bool {
		pk := k.(poolKey)
		if pk.prefix != key.prefix || pk.name != key.name || pk.scope != key.scope || pk.kind == key.kind {
			return true
		}
		st := v.(*zoneState)
		st.mu.Lock()
		c, from := st.conf.Load(), st.from
		st.mu.Unlock()
		if c == nil {
			return true
		}
		has[pk.kind] = true
		out = append(out, carried{pos: pos, kind: c.kind, p1: c.p1, p2: c.p2, at: now, until: now + idleSpan(c) + carryMargin})
		older = append(older, from...)
		return true
	})
	for _, f := range older {
		if l := keyLetter(f.kind); !has[l] && f.until > now {
			has[l] = true
			out = append(out, f)
		}
	}
	return out
}

// idleSpan bounds how long a key written under c stays in use.
func idleSpan(c *zoneConf) int64 {
	switch c.kind[0] {
	case kindBucket, kindQueue:
		return c.maxDebt
	case kindCounter:
		return 2 * c.policy.Window
	}
	return c.policy.Window
}

func fromArg(from []carried) string {
	if len(from) == 0 {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d|", from[0].pos)
	for i, f := range from {
		if i > 0 {
			b.WriteByte(';')
		}
		fmt.Fprintf(&b, "%s,%s,%s,%d,%d", f.kind, f.p1, f.p2, f.at, f.until)
	}
	return b.String()
}

// keyLetter is the letter of a script kind in the key: the queue keeps a
// bucket's state.
func keyLetter(kind string) byte {
	if kind[0] == kindQueue {
		return kindBucket
	}
	return kind[0]
}
