package redis

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// A Redis with maxmemory and an evicting policy makes room by deleting
// keys, and every Sluice key has an expiry, so the volatile-* policies
// pick among them too: a denied client whose state is evicted starts over
// with a full quota. It is the coldest key of all, since the over-limit
// cache answers its requests without asking Redis. A Redis that does not
// evict (noeviction) refuses writes when full, and the decisions fail,
// each by its zone's fail policy. Nothing in a request tells either, so
// the policy is read when a config loads and when Redis answers again
// after an outage, and an evicting one is logged as a warning.

// evictionTimeout bounds one reading of the policy; it runs in the
// background, so a config load never waits for it.
const evictionTimeout = 5 * time.Second

// evictionRetry is the first wait, doubled up to evictionRetryMax, before
// the policy is asked again of a Redis that did not answer.
const (
	evictionRetry    = time.Second
	evictionRetryMax = time.Minute
)

// evictionCheck reads the memory policy of the Redis servers of one
// connection pool and logs what it means for the limits.
type evictionCheck struct {
	client  goredis.UniversalClient
	logger  *zap.Logger
	running atomic.Bool
	refused sync.Once     // CONFIG GET refused (an ACL, a managed Redis): said once
	again   chan struct{} // a reading waiting to ask again asks now
	done    chan struct{}
	stop    sync.Once
}

func newEvictionCheck(client goredis.UniversalClient, logger *zap.Logger) *evictionCheck {
	return &evictionCheck{client: client, logger: logger, again: make(chan struct{}, 1), done: make(chan struct{})}
}

// close ends a check that waits to ask again; it is called when the pool
// is closed.
func (e *evictionCheck) close() { e.stop.Do(func() { close(e.done) }) }

// start reads the policy in the background, with logger (a config's own,
// or nil for the pool's); a reading under way that waits to ask again asks
// now instead. A Redis that does not answer is asked again, less and less
// often, until it does or the pool is closed.
func (e *evictionCheck) start(logger *zap.Logger) {
	if e == nil {
		return
	}
	if !e.running.CompareAndSwap(false, true) {
		select {
		case e.again <- struct{}{}:
		default:
		}
		return
	}
	if logger == nil {
		logger = e.logger
	}
	go func() {
		defer e.running.Store(false)
		wait := evictionRetry
		for !e.once(logger) {
			t := time.NewTimer(wait)
			select {
			case <-e.done:
				t.Stop()
				return
			case <-e.again:
				t.Stop()
			case <-t.C:
			}
			wait = min(2*wait, evictionRetryMax)
		}
	}()
}

// nodePolicy is what one Redis server said of its memory.
type nodePolicy struct {
	addr      string
	policy    string
	maxmemory int64
}

// once reads the policy of every server (every master of a cluster) and
// logs it; it reports false when some server did not answer, to be asked
// again.
func (e *evictionCheck) once(logger *zap.Logger) bool {
	ctx, cancel := context.WithTimeout(context.Background(), evictionTimeout)
	defer cancel()
	var mu sync.Mutex
	var nodes []nodePolicy
	read := func(ctx context.Context, c *goredis.Client) error {
		p, err := readPolicy(ctx, c)
		if err != nil {
			return err
		}
		mu.Lock()
		nodes = append(nodes, p)
		mu.Unlock()
		return nil
	}
	var err error
	switch c := e.client.(type) {
	case *goredis.ClusterClient:
		err = c.ForEachMaster(ctx, read)
	case *goredis.Client:
		err = read(ctx, c)
	default:
		return true
	}
	for _, n := range nodes {
		logPolicy(logger, n)
	}
	switch {
	case err == nil:
		return true
	case refusedForGood(err):
		e.refused.Do(func() {
			logger.Warn("cannot read Redis's maxmemory-policy (CONFIG GET refused): check that this Redis does not evict keys, or a denied client whose state is evicted starts over with a full quota (docs/redis.md, Memory and eviction)",
				zap.Error(err))
		})
		return true
	}
	return false
}

// readPolicy asks one server for its maxmemory and maxmemory-policy, with
// a pattern that Redis before 7 (one parameter per CONFIG GET) takes too.
func readPolicy(ctx context.Context, c *goredis.Client) (nodePolicy, error) {
	m, err := c.ConfigGet(ctx, "maxmemory*").Result()
	if err != nil {
		return nodePolicy{}, err
	}
	limit, _ := strconv.ParseInt(m["maxmemory"], 10, 64)
	return nodePolicy{addr: c.Options().Addr, policy: m["maxmemory-policy"], maxmemory: limit}, nil
}

// logPolicy says what n's memory policy does to the limits: a warning
// when it can evict, a note when a full Redis would fail the decisions.
func logPolicy(logger *zap.Logger, n nodePolicy) {
	fields := []zap.Field{zap.String("address", n.addr), zap.String("maxmemory_policy", n.policy), zap.Int64("maxmemory", n.maxmemory)}
	switch {
	case n.maxmemory <= 0:
		// No limit: Redis grows, and evicts nothing.
	case n.policy == "noeviction":
		logger.Info("redis refuses writes once it holds maxmemory: rate limit decisions then fail, and each zone follows its fail policy; keep headroom (docs/redis.md, Memory and eviction)", fields...)
	default:
		logger.Warn("redis evicts keys once it holds maxmemory, and every rate limit key has an expiry: "+
			"a denied client whose state is evicted starts over with a full quota, and denied clients' keys are the coldest. "+
			"Use maxmemory-policy noeviction with headroom, or a Redis of its own for the limits (docs/redis.md, Memory and eviction)", fields...)
	}
}

// refusedForGood reports whether Redis refused the command itself, so
// that asking again would not help: an ACL without it (NOPERM), or a
// managed Redis that renamed or disabled it.
func refusedForGood(err error) bool {
	return goredis.HasErrorPrefix(err, "NOPERM") || goredis.HasErrorPrefix(err, "unknown command")
}
