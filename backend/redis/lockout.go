package redis

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/backend"
)

// lockoutTrust is how long the over-limit cache answers a lock-out's
// denial without asking Redis. A lock-out may last a day, and an operator
// who lifts it (a reset through another instance's admin API) must not be
// overruled by what this instance remembers for that long: past this, one
// request per key and second asks Redis, which knows.
const lockoutTrust = int64(time.Second)

// lockoutArg is the script's lk argument of a limit: "" without lockout,
// else "<place of the kind letter in the key, from 1>|<steps in ns,
// comma-separated>".
func lockoutArg(pos int, lo backend.Lockout) string {
	if len(lo) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString(strconv.Itoa(pos))
	b.WriteByte('|')
	for i, d := range lo {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatInt(d, 10))
	}
	return b.String()
}

// lockoutKey is the key of the lock-out record of key in l.
func lockoutKey(l backend.Limit, key string) (string, *zone, error) {
	z, ok := l.(*zone)
	if !ok {
		return "", nil, fmt.Errorf("zone %q was not registered with the redis backend", l.Name())
	}
	return clientKey(z.lockPrefix, key), z, nil
}

// parseLockout reads a record; ok is false for a value that is not one.
func parseLockout(v string) (st backend.LockoutState, ok bool) {
	u, lv, found := strings.Cut(v, ":")
	if !found {
		return st, false
	}
	until, err1 := strconv.ParseInt(u, 10, 64)
	level, err2 := strconv.ParseInt(lv, 10, 32)
	if err1 != nil || err2 != nil || level < 1 {
		return st, false
	}
	return backend.LockoutState{Until: until, Level: int32(level)}, true
}

// InspectLockout reads the key's lock-out record
// (backend.LockoutInspector). How long it lasts is measured against the
// Redis server's clock, which decides (or the injected clock of tests).
func (s *Store) InspectLockout(ctx context.Context, l backend.Limit, key string) (backend.LockoutState, int64, error) {
	k, z, err := lockoutKey(l, key)
	if err != nil {
		return backend.LockoutState{}, 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	pipe := s.client.Pipeline()
	get := pipe.Get(ctx, k)
	var clock *goredis.TimeCmd
	if s.opts.now == nil {
		clock = pipe.Time(ctx)
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, goredis.Nil) {
		return backend.LockoutState{}, 0, fmt.Errorf("redis backend: inspect: %w", err)
	}
	now := s.now()
	if clock != nil {
		now = clock.Val().UnixNano()
	}
	st, ok := parseLockout(get.Val())
	lo := z.st.conf.Load().lockout()
	if !ok || lo == nil || lo.Forgotten(st, now) {
		return backend.LockoutState{}, 0, nil
	}
	return st, st.Locked(now), nil
}

// lockout is the steps of the registration that made c.
func (c *zoneConf) lockout() backend.Lockout {
	if c == nil {
		return nil
	}
	return c.steps
}

var _ backend.LockoutInspector = (*Store)(nil)
