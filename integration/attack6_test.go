package integration

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddytest"
)

// slowUpstream answers each request with the status in X-Answer (200 when
// absent) after X-Sleep milliseconds, and signals each request it gets.
type slowUpstream struct {
	srv *httptest.Server
	got chan struct{}
}

func newSlowUpstream(t *testing.T) *slowUpstream {
	u := &slowUpstream{got: make(chan struct{}, 64)}
	u.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.got <- struct{}{}
		if ms, _ := strconv.Atoi(r.Header.Get("X-Sleep")); ms > 0 {
			select {
			case <-time.After(time.Duration(ms) * time.Millisecond):
			case <-r.Context().Done():
				return
			}
		}
		code, _ := strconv.Atoi(r.Header.Get("X-Answer"))
		w.WriteHeader(max(code, http.StatusOK))
		fmt.Fprint(w, "sent")
	}))
	t.Cleanup(u.srv.Close)
	return u
}

func (u *slowUpstream) addr() string { return strings.TrimPrefix(u.srv.URL, "http://") }

// a6send sends one request with the given upstream answer and delay, and
// gives up on it after abandon (0: never).
func a6send(tester *caddytest.Tester, sleep string, abandon time.Duration) int {
	ctx := context.Background()
	if abandon > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, abandon)
		defer cancel()
	}
	req, _ := http.NewRequestWithContext(ctx, "POST", httpBase+"/sms", nil)
	req.Header.Set("X-Sleep", sleep)
	resp, err := tester.Client.Do(req)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// A request that a budget allowed and another limit then refused after
// the decision (a concurrency cap, or a client leaving a leaky_bucket
// queue) gives its units back by releasing its reservation: its expiry
// then gives nothing more. Each round below commits one paid call and
// has one such request refused; with the budget of 2, only two rounds
// may reach the provider, however long the game goes on.
func TestAttack6BudgetRefusedAfterDecisionReleasesOnce(t *testing.T) {
	rounds := func(t *testing.T, tester *caddytest.Tester, u *slowUpstream, refused func() int) {
		t.Helper()
		sent := 0
		for round := range 5 {
			codes := make(chan int, 1)
			go func() { codes <- a6send(tester, "400", 0) }()
			select {
			case <-u.got:
			case code := <-codes:
				if code == http.StatusOK {
					t.Fatalf("round %d: 200 without reaching the provider", round+1)
				}
				continue // the budget is spent
			}
			if code := refused(); code == http.StatusOK {
				t.Fatalf("round %d: the second request passed", round+1)
			}
			if <-codes == http.StatusOK {
				sent++
			}
			// Past the refused request's reservation_ttl: its expiry
			// must not give its unit back a second time.
			time.Sleep(1200 * time.Millisecond)
		}
		if sent != 2 {
			t.Fatalf("%d paid calls committed, want the budget of 2", sent)
		}
	}
	t.Run("concurrency", func(t *testing.T) {
		u := newSlowUpstream(t)
		tester := newTester(t, caddyfileServer(fmt.Sprintf(`
	rate_limit {
		zone attack6_conc {
			key sms
			rate 2/1h
			algorithm fixed_window
			charge_when status 2xx
			reservation_ttl 1s
			concurrency 1
		}
	}
	reverse_proxy %s`, u.addr())), "caddyfile")
		rounds(t, tester, u, func() int { return a6send(tester, "0", 0) })
	})
	t.Run("queue", func(t *testing.T) {
		outcomeBackends(t, func(t *testing.T, backend, prefix string) {
			u := newSlowUpstream(t)
			tester := newTester(t, caddyfileServer(fmt.Sprintf(`
	rate_limit {
		%s
		zone %sattack6_budget {
			key sms
			rate 2/1h
			algorithm fixed_window
			charge_when status 2xx
			reservation_ttl 1s
		}
		zone %sattack6_queue {
			key sms
			rate 1/1s
			algorithm leaky_bucket
			max_delay 5s
		}
	}
	reverse_proxy %s`, backend, prefix, prefix, u.addr())), "caddyfile")
			// The second request waits for its slot in the queue, and
			// its client leaves before it comes.
			rounds(t, tester, u, func() int { return a6send(tester, "0", 200*time.Millisecond) })
		})
	})
}

// heapAfterGC is the live heap of this process, where caddytest runs Caddy.
func heapAfterGC() int64 {
	var m runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

// A flood of keys through a budget, each request settled, leaves no
// memory behind beyond the zone's max_keys: the keys without a live
// reservation are dropped at once, not at the next pass over every key
// (once per reservation_ttl, here a day).
func TestAttack6BudgetKeyFloodMemory(t *testing.T) {
	tester := newTester(t, caddyfileServer(`
	rate_limit {
		zone attack6_flood {
			key {http.request.header.X-K}
			rate 10/1d
			algorithm fixed_window
			charge_when status 2xx
			reservation_ttl 24h
			max_keys 100
		}
	}
	respond "ok"`), "caddyfile")
	flood := func(from, n int) {
		var wg sync.WaitGroup
		var next atomic.Int64
		for range 16 {
			wg.Go(func() {
				for i := next.Add(1); i <= int64(n); i = next.Add(1) {
					req, _ := http.NewRequest("GET", httpBase+"/", nil)
					req.Header.Set("X-K", "k"+strconv.Itoa(from+int(i)))
					resp, err := tester.Client.Do(req)
					if err != nil {
						t.Error(err)
						return
					}
					resp.Body.Close()
					if resp.StatusCode != http.StatusOK {
						t.Errorf("key %d: %d", from+int(i), resp.StatusCode)
						return
					}
				}
			})
		}
		wg.Wait()
	}
	flood(0, 2000) // connections and pools warmed up
	before := heapAfterGC()
	const keys = 20000
	flood(1_000_000, keys)
	grown := heapAfterGC() - before
	t.Logf("heap grew by %d bytes for %d keys", grown, keys)
	if grown > 1<<20 {
		t.Fatalf("heap grew by %d bytes (%d per key) for %d settled keys with max_keys 100, want under 1 MiB", grown, grown/keys, keys)
	}
}

// A budget's call is charged when its status is written, not when its
// body ends: a 2xx streamed for longer than reservation_ttl (a long LLM
// answer, or a client that reads it slowly) is committed all the same,
// where its reservation used to expire mid-stream and the commit at the
// end to find nothing left to charge.
func TestAttack6BudgetStreamOutlivesReservation(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		fmt.Fprint(w, "first tokens ")
		_ = http.NewResponseController(w).Flush()
		select {
		case <-time.After(1300 * time.Millisecond):
		case <-r.Context().Done():
		}
		fmt.Fprint(w, "last tokens")
	}))
	t.Cleanup(upstream.Close)
	outcomeBackends(t, func(t *testing.T, backend, prefix string) {
		tester := newTester(t, caddyfileServer(fmt.Sprintf(`
	rate_limit {
		%s
		zone %sattack6_stream {
			key llm
			rate 2/1h
			algorithm fixed_window
			charge_when status 2xx
			reservation_ttl 1s
		}
	}
	reverse_proxy %s {
		flush_interval -1
	}`, backend, prefix, strings.TrimPrefix(upstream.URL, "http://"))), "caddyfile")
		// Each call is decided while the one before still streams, past
		// its reservation's deadline: the decision that releases expired
		// reservations sees it.
		codes := make([]int, 4)
		var wg sync.WaitGroup
		for i := range codes {
			wg.Go(func() { codes[i], _, _ = do(t, tester, "POST", "/chat") })
			time.Sleep(1100 * time.Millisecond)
		}
		wg.Wait()
		if codes[0] != http.StatusOK || codes[1] != http.StatusOK || codes[2] != http.StatusServiceUnavailable || codes[3] != http.StatusServiceUnavailable {
			t.Fatalf("four streamed answers against a budget of 2: %v, want [200 200 503 503]", codes)
		}
	})
}

// A key reset through the admin API while one of its budget's calls is
// in flight starts afresh: that call's release afterwards gives back
// nothing of the fresh budget.
func TestAttack6BudgetResetDropsReservations(t *testing.T) {
	outcomeBackends(t, func(t *testing.T, backend, prefix string) {
		u := newSlowUpstream(t)
		name := prefix + "attack6_reset"
		tester := newTester(t, caddyfileServer(fmt.Sprintf(`
	rate_limit {
		%s
		zone %s {
			key {http.request.header.X-K}
			rate 3/1h
			algorithm fixed_window
			charge_when status 2xx
			reservation_ttl 1m
		}
	}
	reverse_proxy %s`, backend, name, u.addr())), "caddyfile")
		failed := make(chan int, 1)
		go func() {
			req, _ := http.NewRequest("POST", httpBase+"/sms", nil)
			req.Header.Set("X-K", "acme")
			req.Header.Set("X-Sleep", "800")
			req.Header.Set("X-Answer", "500")
			resp, err := tester.Client.Do(req)
			if err != nil {
				failed <- 0
				return
			}
			resp.Body.Close()
			failed <- resp.StatusCode
		}()
		<-u.got
		adminRequest(t, "DELETE", "/rate_limit/zones/"+name+"/keys/acme", "", "")
		var codes []int
		for range 3 {
			code, _, _ := do(t, tester, "POST", "/sms", "X-K", "acme")
			codes = append(codes, code)
		}
		if code := <-failed; code != http.StatusInternalServerError {
			t.Fatalf("the failing call: %d, want 500", code)
		}
		code, _, _ := do(t, tester, "POST", "/sms", "X-K", "acme")
		codes = append(codes, code)
		if fmt.Sprint(codes) != "[200 200 200 503]" {
			t.Fatalf("after a reset: %v, want [200 200 200 503]: the budget of 3, and no more", codes)
		}
	})
}
