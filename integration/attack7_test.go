package integration

import (
	"net/http"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/redistest"
)

// On a Redis Cluster, the requests that share one quota because they lack
// their key (missing shared, the empty key) are locked out like any key:
// their state and lock-out record live in one slot. They used to be in two
// ("a7x//l{}" and "a7x//o{}" hash whole, here to two masters): every such
// request failed in the script ("non local key"), tripped the circuit
// breaker, and the whole backend failed open for every key and zone.
func TestAttack7ClusterMissingKeyLockout(t *testing.T) {
	nodes := redistest.Cluster(t)
	tester := newTester(t, caddyfileServer(`
	rate_limit {
		backend redis {
			address `+strings.Join(nodes, " ")+`
			cluster
			key_prefix a7:
			timeout 2s
		}
		zone a7x {
			key {http.request.header.X-Key}
			rate 2/1h
			lockout 1m 5m
		}
	}
	respond ok`), "caddyfile")
	expectN(t, tester, 2, http.StatusOK, "GET", "/")
	expect429(t, tester, 59, 60, "GET", "/")
	expect429(t, tester, 59, 60, "GET", "/")
	// The keyless requests broke nothing for the keys that have one.
	expectN(t, tester, 2, http.StatusOK, "GET", "/", "X-Key", "victim")
	expect429(t, tester, 59, 60, "GET", "/", "X-Key", "victim")
}
