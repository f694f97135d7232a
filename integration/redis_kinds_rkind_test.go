package integration

import (
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// On the Redis backend as in memory: 20 reloads that switch the algorithm,
// through every kind of state, under steady traffic, never give a key more
// than its 100 a day.
func TestRedisReloadSwitchingAlgorithmKeepsUsage(t *testing.T) {
	untilMidnightUTC(2 * time.Minute) // the day-long fixed windows
	addr, _ := perfRedis(t)
	algs := switchingAlgs
	cfg := func(alg string) string {
		return caddyfileServerWith(fmt.Sprintf(`	rate_limit {
		backend redis {
			address %s
			local_cache off
			timeout 10s
		}
	}`, addr), `	rate_limit {
		zone redis_reload_kinds {
			key static
			rate 100/24h
			algorithm `+alg+`
			fail closed
		}
	}
	respond "ok"`)
	}
	newTester(t, cfg(algs[0]), "caddyfile")
	reloadsKeepTheLimit(t, "text/caddyfile", cfg, algs)
}

// switchingAlgs go through every kind of state, each reload to another.
var switchingAlgs = []string{"sliding_window", "token_bucket", "sliding_window", "fixed_window", "gcra", "sliding_window_counter", "leaky_bucket", "fixed_window", "token_bucket", "sliding_window_counter"}

// reloadsKeepTheLimit sends two clients' steady traffic to a key limited
// to 100 a day while 20 reloads switch between algs, then more, and
// requires at most 100 admitted in all, some denied, none failed.
func reloadsKeepTheLimit(t *testing.T, contentType string, cfg func(alg string) string, algs []string) {
	t.Helper()
	var admitted, denied, failed atomic.Int64
	send := func(client *http.Client) {
		resp, err := client.Get(httpBase + "/")
		if err != nil {
			return // a connection cut by the reload
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		switch resp.StatusCode {
		case http.StatusOK:
			admitted.Add(1)
		case http.StatusTooManyRequests:
			denied.Add(1)
		default:
			failed.Add(1)
		}
	}
	// Two clients, one request each per 20 ms: the quota runs out over
	// the reloads, so most of them translate a key that is part used.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			client := &http.Client{Timeout: 10 * time.Second}
			for {
				select {
				case <-stop:
					return
				case <-time.After(20 * time.Millisecond):
					send(client)
				}
			}
		}()
	}
	for i := 1; i <= 20; i++ {
		time.Sleep(50 * time.Millisecond)
		adminRequest(t, "POST", "/load", contentType, cfg(algs[i%len(algs)]))
		t.Logf("reload %d (%s): %d admitted so far", i, algs[i%len(algs)], admitted.Load())
	}
	close(stop)
	wg.Wait()
	during := admitted.Load()
	client := &http.Client{Timeout: 10 * time.Second}
	for range 150 {
		send(client)
	}
	t.Logf("%d admitted during 20 reloads, %d in all; %d denied, %d failed", during, admitted.Load(), denied.Load(), failed.Load())
	// 100 per day: a bucket refills one unit per 864 s, so nothing comes
	// back during the test.
	if got := admitted.Load(); got > 100 {
		t.Fatalf("%d requests admitted across 20 reloads that switch algorithm; the limit is 100", got)
	}
	if denied.Load() == 0 {
		t.Fatal("no request was denied: the traffic did not reach the limit")
	}
	if failed.Load() > 0 {
		t.Fatalf("%d requests failed", failed.Load())
	}

}
