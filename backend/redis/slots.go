package redis

// Concurrency slots shared by a fleet (docs/protection.md, docs/redis.md).
//
// The slots of one key of a limit are a sorted set, <prefix><zone>/<scope>/s{<key>}
// (the client's key as the hash tag, made by clientKey like the rate
// state's), whose members are slot ids scored by their expiry in
// milliseconds on the Redis server's clock. Acquiring prunes the expired members and adds one when fewer than
// the limit remain, atomically in one script call; releasing removes the
// member. The instance holding a slot renews its expiry every third of the
// slot's TTL, so a slot outlives a request that runs long but is alive, and
// one of an instance that died is free again within the TTL.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/sluicehq/sluice/backend"
)

// ---- Lua: concurrency slots (acquire and renew) ----

// slotAcquireSource takes a slot. KEYS[1] is the key's set; ARGV: the
// limit, the TTL in ms, the new slot's id. It returns 1 when the slot was
// taken, 0 when every slot is held. The set's own expiry is the TTL from
// now: no member expires later.
const slotAcquireSource = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then
	return 0
end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
`

// slotRenewSource pushes the expiry of the slots ARGV[2:] of KEYS[1] to
// ARGV[1] ms from now. A slot already gone (released, or expired while this
// instance could not reach Redis) is not brought back: another request may
// hold its place now. It returns how many were renewed.
const slotRenewSource = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local n = 0
for i = 2, #ARGV do
	n = n + redis.call('ZADD', KEYS[1], 'XX', 'CH', now + tonumber(ARGV[1]), ARGV[i])
end
if n > 0 then
	redis.call('PEXPIRE', KEYS[1], ARGV[1])
end
return n
`

// ---- end of Lua ----

var (
	slotAcquire = goredis.NewScript(slotAcquireSource)
	slotRenew   = goredis.NewScript(slotRenewSource)
)

// MinSlotTTL and MaxSlotTTL bound a slot's TTL: renewed every third of it,
// a TTL under a second would cost Redis a call per slot several times a
// second; one over an hour would keep a dead instance's slots longer than
// any request lasts.
const (
	MinSlotTTL = time.Second
	MaxSlotTTL = time.Hour
)

// instanceID starts every slot id this process makes, so that ids of
// different instances never collide.
var instanceID = func() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b) + "."
}()

// slotSeq numbers the slots of the process: ids must differ across every
// store of the process too.
var slotSeq atomic.Uint64

// slotZone is the store's handle on one limit's slots.
type slotZone struct {
	s      *Store
	prefix string // the set's key before the client's key
	ttl    time.Duration
	ttlMs  string
	// The limit and the TTL in ms as command arguments, converted once;
	// the limit is a boxed string in limitArg, replaced whole by SetLimit.
	limitArg atomic.Value
	ttlArg   any
	guard    guard
}

// guard runs a call to Redis (through the breaker, for the module).
type guard func(ctx context.Context, call func() (bool, error)) (bool, error)

func direct(_ context.Context, call func() (bool, error)) (bool, error) { return call() }

// slotHolder is what one store holds: the ids of the slots it acquired and
// has not released, by set, renewed by one goroutine that runs only while
// some are held.
type slotHolder struct {
	mu      sync.Mutex
	sets    map[string]*heldSet
	running bool
	closed  bool
	// shorter wakes the goroutine when a slot of a shorter TTL than it
	// sleeps for is taken: that slot must be renewed sooner.
	shorter chan struct{}
	logger  *zap.Logger
	every   time.Duration // how often the goroutine renews: the shortest TTL held ÷ 3
	renewed time.Time     // when the goroutine last renewed
	// unfreed are the slots whose release did not reach Redis (a timeout,
	// the open breaker): the goroutine tries again every
	// slotReleaseRetry until Redis takes them or they expire. Left to
	// their TTL, a second of trouble would refuse a key whose requests
	// had all ended for up to slot_ttl after Redis came back.
	unfreed []unfreedSlot
}

type unfreedSlot struct {
	z       *slotZone
	set, id string
	until   time.Time // its expiry at the latest: no use freeing it after
}

// slotReleaseRetry is how often a release that failed is tried again.
const slotReleaseRetry = 250 * time.Millisecond

type heldSet struct {
	z   *slotZone
	ids []string // few: the requests of one key in flight here
}

// RegisterSlots registers cfg's slots (backend.SlotStore).
func (s *Store) RegisterSlots(cfg backend.SlotConfig) (backend.Slots, error) {
	return s.registerSlots(cfg, direct)
}

func (s *Store) registerSlots(cfg backend.SlotConfig, g guard) (*slotZone, error) {
	switch {
	case cfg.Limit < 1:
		return nil, fmt.Errorf("concurrency must be at least 1, got %d", cfg.Limit)
	case cfg.TTL < MinSlotTTL || cfg.TTL > MaxSlotTTL:
		return nil, fmt.Errorf("slot_ttl must be from %v to %v, got %v", MinSlotTTL, MaxSlotTTL, cfg.TTL)
	}
	z := &slotZone{
		s: s, prefix: zonePrefix(s.prefix, cfg.Name, cfg.Scope, kindSlots),
		ttl: cfg.TTL, ttlMs: strconv.FormatInt(cfg.TTL.Milliseconds(), 10),
		guard: g,
	}
	z.ttlArg = z.ttlMs
	z.limitArg.Store(any(strconv.FormatInt(cfg.Limit, 10)))
	return z, nil
}

// SetLimit makes this process's acquires of z's slots succeed while fewer
// than n are held (backend.AdjustableSlots). The other instances keep the
// limit they send; the set is counted whole, whoever took its slots.
func (z *slotZone) SetLimit(n int64) error {
	if n < 1 {
		return fmt.Errorf("concurrency must be at least 1, got %d", n)
	}
	z.limitArg.Store(any(strconv.FormatInt(n, 10)))
	return nil
}

var _ backend.AdjustableSlots = (*slotZone)(nil)

// Acquire takes a slot of key (backend.Slots).
func (z *slotZone) Acquire(ctx context.Context, key string) (string, error) {
	set := clientKey(z.prefix, key)
	id := instanceID + strconv.FormatUint(slotSeq.Add(1), 36)
	var sent bool
	// The deadline is the call's own: the breaker tells a caller that left
	// (ctx ended) from a Redis that did not answer in time.
	ok, err := z.guard(ctx, func() (bool, error) {
		sent = true
		tctx, cancel := context.WithTimeout(ctx, z.s.timeout)
		defer cancel()
		n, err := z.acquireOnce(tctx, set, id)
		return n == 1, err
	})
	switch {
	case err != nil && sent:
		// The call may have run and taken the slot: give it back, or it
		// would stay taken until its TTL.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), z.s.timeout)
		_ = z.s.client.ZRem(rctx, set, id).Err()
		cancel()
		return "", err
	case err != nil || !ok:
		return "", err
	}
	z.s.slots.hold(z, set, id)
	return id, nil
}

// Release frees the slot id of key (backend.Slots). The slot is no longer
// renewed, whether or not Redis could be told: then it expires after its
// TTL.
func (z *slotZone) Release(ctx context.Context, key, id string) error {
	set := clientKey(z.prefix, key)
	z.s.slots.drop(set, id)
	_, err := z.guard(ctx, func() (bool, error) {
		tctx, cancel := context.WithTimeout(ctx, z.s.timeout)
		defer cancel()
		return true, z.s.client.ZRem(tctx, set, id).Err()
	})
	if err != nil {
		z.s.slots.retryRelease(z, set, id)
	}
	return err
}

// The acquire script's digest and source as command arguments, converted
// to interface values once.
var slotAcquireHash, slotAcquireArg any = slotAcquire.Hash(), slotAcquireSource

// acquireOnce runs the acquire script on set, never retried after it may
// have run (see once), with the source sent again after NOSCRIPT.
func (z *slotZone) acquireOnce(ctx context.Context, set, id string) (int64, error) {
	limit := z.limitArg.Load()
	cmd := goredis.NewCmd(ctx, "evalsha", slotAcquireHash, 1, set, limit, z.ttlArg, id)
	_ = z.s.client.Process(ctx, once{cmd})
	if goredis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
		cmd = goredis.NewCmd(ctx, "eval", slotAcquireArg, 1, set, limit, z.ttlArg, id)
		_ = z.s.client.Process(ctx, once{cmd})
	}
	return cmd.Int64()
}

func (h *slotHolder) hold(z *slotZone, set, id string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.sets == nil {
		h.sets = make(map[string]*heldSet)
	}
	hs := h.sets[set]
	if hs == nil {
		hs = &heldSet{z: z}
		h.sets[set] = hs
	}
	hs.ids = append(hs.ids, id)
	if h.shorter == nil {
		h.shorter = make(chan struct{}, 1)
	}
	if every := z.ttl / 3; h.every == 0 || every < h.every {
		h.every = every
		select {
		case h.shorter <- struct{}{}:
		default:
		}
	}
	if !h.running {
		h.running = true
		go h.renewLoop(h.shorter)
	}
}

// retryRelease has the goroutine free the slot id of set once Redis
// answers again.
func (h *slotHolder) retryRelease(z *slotZone, set, id string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return
	}
	h.unfreed = append(h.unfreed, unfreedSlot{z: z, set: set, id: id, until: time.Now().Add(z.ttl)})
	if h.shorter == nil {
		h.shorter = make(chan struct{}, 1)
	}
	if !h.running {
		h.running = true
		go h.renewLoop(h.shorter)
		return
	}
	select {
	case h.shorter <- struct{}{}:
	default:
	}
}

func (h *slotHolder) drop(set, id string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if hs := h.sets[set]; hs != nil {
		if i := slices.Index(hs.ids, id); i >= 0 {
			last := len(hs.ids) - 1
			hs.ids[i] = hs.ids[last]
			hs.ids = hs.ids[:last]
		}
		if len(hs.ids) == 0 {
			delete(h.sets, set)
		}
	}
}

// renewLoop renews the held slots every third of the shortest TTL, frees
// those whose release failed, and ends when none is held or left to free
// (the next acquire starts it again) or when the store's client is gone.
func (h *slotHolder) renewLoop(shorter <-chan struct{}) {
	// A wake-up sent before the loop started is for a TTL it reads below.
	select {
	case <-shorter:
	default:
	}
	h.mu.Lock()
	h.renewed = time.Now()
	h.mu.Unlock()
	for {
		h.mu.Lock()
		wait := h.every
		if len(h.unfreed) > 0 && (wait == 0 || wait > slotReleaseRetry) {
			wait = slotReleaseRetry
		}
		h.mu.Unlock()
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-shorter:
			// Sleep again for the shorter third (or the retry of a
			// release); the slots already held were due no sooner.
			t.Stop()
			continue
		}
		h.mu.Lock()
		if len(h.sets) == 0 && len(h.unfreed) == 0 {
			h.running, h.every = false, 0
			h.mu.Unlock()
			return
		}
		now := time.Now()
		var batch []renewal
		if len(h.sets) > 0 && !now.Before(h.renewed.Add(h.every)) {
			h.renewed = now
			batch = make([]renewal, 0, len(h.sets))
			for set, hs := range h.sets {
				r := renewal{z: hs.z, set: set, ids: make([]any, 0, len(hs.ids)+1)}
				r.ids = append(r.ids, hs.z.ttlMs)
				for _, id := range hs.ids {
					r.ids = append(r.ids, id)
				}
				batch = append(batch, r)
			}
		}
		h.unfreed = slices.DeleteFunc(h.unfreed, func(u unfreedSlot) bool { return now.After(u.until) })
		unfreed := slices.Clone(h.unfreed)
		closed := h.closed
		h.mu.Unlock()
		var err error
		if len(batch) > 0 {
			err = renew(batch)
		}
		if len(unfreed) > 0 {
			ferr := free(unfreed)
			if ferr == nil {
				// Only this goroutine removes; releases that failed
				// meanwhile were appended after these.
				h.mu.Lock()
				h.unfreed = h.unfreed[len(unfreed):]
				done := len(h.sets) == 0 && len(h.unfreed) == 0
				if done {
					h.running, h.every = false, 0
				}
				h.mu.Unlock()
				if done {
					return
				}
			}
			err = errors.Join(err, ferr)
		}
		if err != nil {
			if closed && errors.Is(err, goredis.ErrClosed) {
				h.mu.Lock()
				h.running, h.unfreed = false, nil
				h.mu.Unlock()
				return
			}
			if h.logger != nil && len(batch) > 0 {
				h.logger.Warn("renewing concurrency slots in redis: they expire after their slot_ttl unless a later renewal reaches redis", zap.Int("sets", len(batch)), zap.Error(err))
			}
		}
	}
}

// free removes slots whose release failed, in one pipeline through the
// breaker.
func free(slots []unfreedSlot) error {
	z := slots[0].z
	_, err := z.guard(context.Background(), func() (bool, error) {
		ctx, cancel := context.WithTimeout(context.Background(), max(z.s.timeout, time.Second))
		defer cancel()
		pipe := z.s.client.Pipeline()
		for _, u := range slots {
			pipe.ZRem(ctx, u.set, u.id)
		}
		_, err := pipe.Exec(ctx)
		return true, err
	})
	return err
}

type renewal struct {
	z   *slotZone
	set string
	ids []any // the TTL in ms, then the ids
}

// renew sends the renewals, one script call per set in one pipeline,
// through the breaker.
func renew(batch []renewal) error {
	z := batch[0].z
	_, err := z.guard(context.Background(), func() (bool, error) {
		ctx, cancel := context.WithTimeout(context.Background(), max(z.s.timeout, time.Second))
		defer cancel()
		pipe := z.s.client.Pipeline()
		cmds := make([]*goredis.Cmd, len(batch))
		for i, r := range batch {
			cmds[i] = goredis.NewCmd(ctx, append([]any{"evalsha", slotRenew.Hash(), 1, r.set}, r.ids...)...)
			_ = pipe.Process(ctx, cmds[i])
		}
		_, err := pipe.Exec(ctx)
		if err == nil || !goredis.HasErrorPrefix(err, "NOSCRIPT") {
			return true, err
		}
		// Redis forgot the script: renewing twice is harmless.
		for i, r := range batch {
			if goredis.HasErrorPrefix(cmds[i].Err(), "NOSCRIPT") {
				_ = slotRenew.Run(ctx, z.s.client, []string{r.set}, r.ids...).Err()
			}
		}
		return true, nil
	})
	return err
}

// RegisterSlots registers cfg's slots, whose calls go through the breaker
// (backend.SlotStore).
func (m *Module) RegisterSlots(cfg backend.SlotConfig) (backend.Slots, error) {
	return m.Store.registerSlots(cfg, m.breaker.do)
}

// closeSlots stops renewing once the store's client is closed: the slots
// still held expire after their TTL.
func (h *slotHolder) close() {
	h.mu.Lock()
	h.closed = true
	h.mu.Unlock()
}

// Interface guards.
var (
	_ backend.SlotStore = (*Store)(nil)
	_ backend.SlotStore = (*Module)(nil)
)
