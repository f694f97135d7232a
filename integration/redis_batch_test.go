package integration

import (
	"fmt"
	"io"
	"net/http"
	"sync"
	"testing"
)

// 64 clients at once through one Caddy: their decisions are gathered into
// shared script calls (far fewer calls than requests), and each key still
// admits exactly its limit. (A long timeout and fail closed: on a loaded
// machine a timed-out call must show as a failure, not as an admission.)
func TestRedisBatchedDecisions(t *testing.T) {
	addr, c := perfRedis(t)
	tester := newTester(t, caddyfileServerWith(fmt.Sprintf(`	rate_limit {
		backend redis {
			address %s
			local_cache off
			timeout 10s
		}
	}`, addr), `	rate_limit {
		zone batch_exact {
			by header X-Key
			rate 100/1h
			fail closed
		}
	}
	respond "ok"`), "caddyfile")
	const clients, each, keys = 64, 40, 16 // 160 requests per key
	before := scriptCalls(t, c)
	var mu sync.Mutex
	admitted := make(map[string]int)
	var failed []string
	var wg sync.WaitGroup
	for g := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := fmt.Sprintf("k%d", g%keys)
			for range each {
				req, _ := http.NewRequest("GET", httpBase+"/", nil)
				req.Header.Set("X-Key", key)
				resp, err := tester.Client.Do(req)
				if err != nil {
					mu.Lock()
					failed = append(failed, err.Error())
					mu.Unlock()
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				mu.Lock()
				switch resp.StatusCode {
				case http.StatusOK:
					admitted[key]++
				case http.StatusTooManyRequests:
				default:
					failed = append(failed, resp.Status)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(failed) > 0 {
		t.Fatalf("%d requests failed: %v", len(failed), failed[:min(len(failed), 5)])
	}
	for k := range keys {
		if n := admitted[fmt.Sprintf("k%d", k)]; n != 100 {
			t.Errorf("key k%d: %d admitted, want exactly 100", k, n)
		}
	}
	requests := clients * each
	calls := scriptCalls(t, c) - before
	t.Logf("%d requests, %d script calls (%.2f per request)", requests, calls, float64(calls)/float64(requests))
	if calls > requests*3/4 {
		t.Fatalf("%d script calls for %d concurrent requests: decisions are not batched", calls, requests)
	}
}
