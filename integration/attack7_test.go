package integration

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

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

// A reservation the refill paid off while its request was held cannot be
// cashed as a second burst: a bucket of 10 refilled while A (10 reserved,
// 0 used) was held, B spent it (10 used), and A's settle used to fill it again, so
// C passed too (20 units in an instant from a bucket of 10; measured with
// the built binary: 4 held reservations cashed 550 units in 1.6 s from a
// bucket of 100 at 50/s, which allows 180). Memory and Redis alike.
func TestAttack7SettleRefundAfterRefill(t *testing.T) {
	release := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("hold") != "" {
			<-release
		}
		w.Header().Set("X-Used", r.URL.Query().Get("used"))
		w.Write([]byte("done"))
	}))
	defer up.Close()
	defer func() {
		select {
		case <-release:
		default:
			close(release)
		}
	}()
	addr := redistest.Standalone(t, "").Addr
	for _, c := range []struct{ zone, backend string }{
		{"a7refill_mem", ""},
		{"a7refill_redis", "backend redis {\n\t\t\taddress " + addr + "\n\t\t\ttimeout 2s\n\t\t}"},
	} {
		t.Run(c.zone, func(t *testing.T) {
			release = make(chan struct{})
			tester := newTester(t, caddyfileServer(`
	rate_limit {
		`+c.backend+`
		zone `+c.zone+` {
			key {http.request.header.X-Key}
			rate 10/1s
			algorithm token_bucket
			cost {http.request.header.X-Cost}
			settle {http.response.header.X-Used}
		}
	}
	reverse_proxy `+strings.TrimPrefix(up.URL, "http://")), "caddyfile")
			held := make(chan int, 1)
			go func() {
				code, _, _ := do(t, tester, "GET", "/?hold=1&used=0", "X-Key", "k", "X-Cost", "10")
				held <- code
			}()
			time.Sleep(1200 * time.Millisecond) // the bucket refills while A is held
			expectN(t, tester, 1, http.StatusOK, "GET", "/?used=10", "X-Key", "k", "X-Cost", "10")
			close(release)
			if code := <-held; code != http.StatusOK {
				t.Fatalf("the held request got %d", code)
			}
			if code, _, _ := do(t, tester, "GET", "/", "X-Key", "k", "X-Cost", "10"); code != http.StatusTooManyRequests {
				t.Fatalf("a third burst right after the settle got %d, want 429", code)
			}
		})
	}
}

// A cost whose numbers alone add up past what the limit holds refuses
// every request, as a constant cost that large does: a config error, not
// a zone that answers 429 to everyone.
func TestAttack7CostSumNeverPasses(t *testing.T) {
	for _, cost := range []string{"6+6", "{http.request.header.X-Cost}+11", "5+{http.request.header.X-Cost}+3+3"} {
		assertLoadError(t, caddyfileServer(`
	rate_limit {
		zone a7sum {
			key {remote_host}
			rate 10/1m
			cost `+cost+`
		}
	}
	respond ok`), "caddyfile", "can never pass")
	}
}
