package redis

import (
	"context"
	_ "embed"
	"fmt"
	"strings"

	goredis "github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
)

//go:embed lua/admin.lua
var adminLua string

// adminMarker is where the script (lua/14-decide.lua) takes the admin
// modes.
const adminMarker = "-- ADMIN MODES: the admin script (admin.lua) is inserted here.\n"

// adminSource is the script with the operator's modes (peek, grant): a
// script of its own, so the script every request runs stays as it is.
var adminSource = func() string {
	if !strings.Contains(scriptSource, adminMarker) {
		panic("redis backend: the script lost the line where admin.lua goes: " + adminMarker)
	}
	return strings.Replace(scriptSource, adminMarker, protocol.Inline(adminLua), 1)
}()

var adminScript = goredis.NewScript(adminSource)

// adminItem is the script's view of one key of l.
func adminItem(l backend.Limit, key string, cost int64) (item, error) {
	z, ok := l.(*zone)
	if !ok {
		return item{}, fmt.Errorf("zone %q was not registered with the redis backend", l.Name())
	}
	conf := z.conf()
	z.st.use(conf)
	return item{key: z.stateKey(key), conf: conf, cost: min(cost, maxCost)}, nil
}

// runAdmin runs the admin script once: a grant must not be sent again
// after it may have run (once), and a NOSCRIPT reply means it did not run.
func (s *Store) runAdmin(ctx context.Context, mode string, items []item) *goredis.Cmd {
	for i := range items {
		s.budgetItem(&items[i], backend.Request{}) // a calendar window's boundaries
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	keys := make([]string, len(items))
	args := s.header(mode)
	for i := range items {
		keys[i] = items[i].key
		args = itemArgs(args, &items[i], decideCounted, "")
	}
	a := append([]any{"evalsha", adminScript.Hash(), len(keys)}, toAny(keys)...)
	cmd := goredis.NewCmd(ctx, append(a, args...)...)
	_ = s.client.Process(ctx, once{cmd})
	if goredis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
		a[0], a[1] = "eval", adminSource
		cmd = goredis.NewCmd(ctx, append(a, args...)...)
		_ = s.client.Process(ctx, once{cmd})
	}
	return cmd
}

func toAny(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}

// Inspect reads the key's state without writing anything (backend.Admin):
// one call peeks at it for a cost of 0 (what it holds) and of 1 (how long
// until a request can pass).
func (s *Store) Inspect(ctx context.Context, l backend.Limit, key string) (algorithms.Usage, error) {
	it, err := adminItem(l, key, 0)
	if err != nil {
		return algorithms.Usage{}, err
	}
	one := it
	one.cost = 1
	items := []item{it, one}
	results := make([]algorithms.Result, 2)
	if _, err := parseDecision(s.runAdmin(ctx, modePeek, items), false, []int{0, 1}, items, results); err != nil {
		return algorithms.Usage{}, fmt.Errorf("redis backend: inspect: %w", err)
	}
	u := algorithms.Usage{Limit: results[0].Limit, Remaining: results[0].Remaining, ResetAfter: results[0].ResetAfter}
	if !results[1].Allowed {
		u.RetryAfter = results[1].RetryAfter
	}
	return u, nil
}

// Reset deletes the key's state and lock-out record (backend.Admin). Other instances of a
// fleet that remember the key as over its limit (their over-limit caches)
// keep refusing it until the retry time they were told; other stores of
// this process are told to forget it (Forget).
func (s *Store) Reset(ctx context.Context, l backend.Limit, key string) error {
	it, err := adminItem(l, key, 0)
	if err != nil {
		return err
	}
	lk, _, err := lockoutKey(l, key)
	if err != nil {
		return err
	}
	s.forget(it)
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	// One command: the record and the open reservations (released
	// later, they would give back units of the fresh state) have the
	// state's hash tag, whatever the key (clientKey): one cluster slot.
	err = s.client.Del(ctx, it.key, lk, reservationsKey(it.key)).Err()
	s.forget(it)
	if err != nil {
		return fmt.Errorf("redis backend: reset: %w", err)
	}
	return nil
}

// Grant gives units back to the key (backend.Admin) and returns its state.
func (s *Store) Grant(ctx context.Context, l backend.Limit, key string, units int64) (algorithms.Usage, error) {
	it, err := adminItem(l, key, units)
	if err != nil {
		return algorithms.Usage{}, err
	}
	s.forget(it)
	err = s.runAdmin(ctx, modeGrant, []item{it}).Err()
	s.forget(it)
	if err != nil && err != goredis.Nil {
		return algorithms.Usage{}, fmt.Errorf("redis backend: grant: %w", err)
	}
	return s.Inspect(ctx, l, key)
}

// Forget drops what this store's over-limit cache remembers of the key
// (backend.Forgetter), after another store changed it.
func (s *Store) Forget(l backend.Limit, key string) {
	if it, err := adminItem(l, key, 0); err == nil {
		s.forget(it)
	}
}

// forget drops what the over-limit cache remembers of the key: it has
// room again.
func (s *Store) forget(it item) {
	if s.cache != nil {
		s.cache.forget([]item{it})
	}
}

// Interface guards.
var (
	_ backend.Admin     = (*Store)(nil)
	_ backend.Forgetter = (*Store)(nil)
)
