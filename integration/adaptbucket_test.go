package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/redistest"
)

// adaptiveLimit reads the adaptive limit of the instance's zone from its admin API.
func (in *slotInstance) adaptiveLimit(t *testing.T, zone string) int64 {
	t.Helper()
	resp, err := http.Get(in.admin + "/rate_limit/zones")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var listing struct {
		Zones []struct {
			Name   string `json:"name"`
			Limits []struct {
				Adaptive *adaptiveState `json:"adaptive"`
			} `json:"limits"`
		} `json:"zones"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&listing); err != nil {
		t.Fatal(err)
	}
	for _, z := range listing.Zones {
		for _, l := range z.Limits {
			if z.Name == zone && l.Adaptive != nil {
				return l.Adaptive.Limit
			}
		}
	}
	t.Fatalf("%s: zone %q has no adaptive limit", in.admin, zone)
	return 0
}

// startLoadOn runs clients spread over the sites at bases, each sending
// requests back to back until the test ends, pausing 10 ms after a refusal
// so that refused clients do not spin, and counts the answers by status.
func startLoadOn(t *testing.T, clients int, bases ...string) *load {
	l := &load{stop: make(chan struct{}), counts: map[int]int{}}
	for i := range clients {
		base := bases[i%len(bases)]
		l.wg.Go(func() {
			for {
				select {
				case <-l.stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				code := status(ctx, base)
				cancel()
				l.mu.Lock()
				l.counts[code]++
				l.mu.Unlock()
				if code != http.StatusOK {
					time.Sleep(10 * time.Millisecond)
				}
			}
		})
	}
	t.Cleanup(l.end)
	return l
}

// drainedPeak waits 3 s, twice the length of the slow requests admitted
// before a cap fell (a lower bound: they have drained), then measures over
// window the most requests the upstream served at once and the answers.
func drainedPeak(u *sickUpstream, l *load, window time.Duration) (int64, map[int]int) {
	time.Sleep(3 * time.Second)
	u.peak.Store(u.now.Load())
	l.take()
	time.Sleep(window)
	return u.peak.Load(), l.take()
}

// Two Caddy instances share a concurrency cap's slots through Redis, each
// adapting the cap it sends from what its own requests meet. When the
// upstream slows, both caps fall to their min, and the upstream then never
// serves more requests at once than the largest cap of the fleet (the slot
// set is one: an acquire succeeds while the set holds fewer than the
// caller's cap); when it is fast again, both caps climb back.
func TestAdaptiveRedisSlotsFleet(t *testing.T) {
	redis := redistest.Standalone(t, "")
	u := newSickUpstream(t)
	const zone = "adaptbucket_slots"
	opts := `key static
				concurrency 8
				adaptive {
					min 2
					max 8
					increase 2
					decrease 0.5
					interval 1s
					latency_p99 300ms 1s
				}`
	a := startSlotInstance(t, redis.Addr, zone, opts, u.URL)
	b := startSlotInstance(t, redis.Addr, zone, opts, u.URL)
	l := startLoadOn(t, 16, a.base, b.base)

	time.Sleep(1500 * time.Millisecond) // at least one interval of healthy traffic, a lower bound
	if la, lb := a.adaptiveLimit(t, zone), b.adaptiveLimit(t, zone); la != 8 || lb != 8 {
		t.Fatalf("healthy upstream: caps %d and %d, want 8 and 8", la, lb)
	}
	if peak := u.peak.Load(); peak > 8 {
		t.Fatalf("healthy upstream: %d at once at the upstream, above the cap of 8", peak)
	}

	u.delay.Store(int64(1500 * time.Millisecond))
	deadline := time.Now().Add(30 * time.Second)
	var pathA, pathB []int64
	for {
		la, lb := a.adaptiveLimit(t, zone), b.adaptiveLimit(t, zone)
		if len(pathA) == 0 || pathA[len(pathA)-1] != la {
			pathA = append(pathA, la)
		}
		if len(pathB) == 0 || pathB[len(pathB)-1] != lb {
			pathB = append(pathB, lb)
		}
		if la == 2 && lb == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("during the spike the caps went %v and %v, want both at 2", pathA, pathB)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("during the spike the caps went %v (instance a) and %v (instance b)", pathA, pathB)
	// The requests admitted under the larger caps finish within 1.5 s;
	// from then on the fleet holds at most 2 slots.
	peak, c := drainedPeak(u, l, 3*time.Second)
	t.Logf("with both caps at 2: at most %d at once at the upstream; answers in 3 s %v", peak, c)
	if peak > 2 {
		t.Fatalf("with both caps at 2, the upstream served %d at once", peak)
	}
	if c[http.StatusServiceUnavailable] == 0 || c[http.StatusOK] == 0 {
		t.Fatalf("16 clients against a fleet cap of 2: %v", c)
	}

	u.delay.Store(int64(5 * time.Millisecond))
	deadline = time.Now().Add(30 * time.Second)
	for a.adaptiveLimit(t, zone) != 8 || b.adaptiveLimit(t, zone) != 8 {
		if time.Now().After(deadline) {
			t.Fatalf("after the spike the caps are %d and %d, want 8 and 8", a.adaptiveLimit(t, zone), b.adaptiveLimit(t, zone))
		}
		time.Sleep(50 * time.Millisecond)
	}
	u.peak.Store(u.now.Load())
	time.Sleep(time.Second) // a window of load to measure over
	if peak := u.peak.Load(); peak > 8 || peak < 3 {
		t.Fatalf("recovered: %d at once at the upstream, want more than the spike's 2 and at most 8", peak)
	}
	l.end()
}

// adaptiveBackend is the backend block of a rate_limit handler for store:
// none for memory, a real redis-server for redis, with a generous timeout
// (a call that times out on a loaded machine would be admitted, fail open,
// and the limit would count nothing).
func adaptiveBackend(t *testing.T, store string) string {
	if store != "redis" {
		return ""
	}
	redis := redistest.Standalone(t, "")
	return "backend redis {\n\t\t\taddress " + redis.Addr + "\n\t\t\ttimeout 5s\n\t\t}"
}

// A bucket rate (token_bucket, gcra, leaky_bucket as a meter or a queue)
// follows the upstream's errors through a real Caddy, on the memory store
// and on Redis: max_events falls to its min, the burst with it (40 at 400
// a second, 2 at 20), and the upstream then gets about 20 requests a
// second; answering 200 again, the limit grows back to 400.
func TestAdaptiveBucketRates(t *testing.T) {
	for _, c := range []struct{ store, alg, extra string }{
		{"memory", "token_bucket", "burst 40"},
		{"redis", "gcra", "burst 40"},
		{"memory", "leaky_bucket", "burst 40"},
		{"redis", "leaky_bucket", "max_delay 200ms"},
	} {
		t.Run(c.store+"_"+c.alg+"_"+strings.Fields(c.extra)[0], func(t *testing.T) {
			backend := adaptiveBackend(t, c.store)
			u := newSickUpstream(t)
			zone := "adaptbucket_" + c.store + "_" + c.alg + "_" + strings.Fields(c.extra)[0]
			tester := newTester(t, caddyfileServer(fmt.Sprintf(`
	rate_limit {
		%s
		zone %s {
			key static
			rate 400/1s
			algorithm %s
			%s
			adaptive {
				min 20
				increase 200
				decrease 0.5
				interval 1s
				error_rate 1%% 5%%
			}
		}
	}
	reverse_proxy %s`, backend, zone, c.alg, c.extra, strings.TrimPrefix(u.URL, "http://"))), "caddyfile")
			l := startLoad(t, 4)
			u.fail.Store(true)
			path := awaitLimit(t, zone, "", "while the upstream fails", 20*time.Second, func(n int64) bool { return n == 20 })
			t.Logf("while the upstream failed the limit went %v", path)
			expectMetric(t, `caddy_rate_limit_adaptive_limit{scope="",zone="`+zone+`"}`, 20)
			l.take()
			u.served.Store(0)
			time.Sleep(2 * time.Second) // a window of load to measure over
			served, answers := u.served.Load(), l.take()
			t.Logf("with the limit at 20/s: the upstream got %d requests in 2 s; answers %v", served, answers)
			// 20 a second for 2 s, and the burst of 2 (a queue: its 5 slots).
			if served > 2*20+5 || served < 20 {
				t.Fatalf("with the limit at 20/s: the upstream got %d requests in 2 s (answers %v)", served, answers)
			}
			if c.extra == "burst 40" && answers[http.StatusTooManyRequests] == 0 {
				t.Fatalf("4 clients back to back at 20/s: no 429 (%v)", answers)
			}
			l.end()
			if c.extra == "burst 40" {
				// A fresh look after the load: the burst shrank with the
				// rate (2 of 40 at 20 of 400), it is full again.
				time.Sleep(200 * time.Millisecond)
				passed := 0
				start := time.Now()
				for range 10 {
					// The upstream still answers 502: what counts is that
					// the limit let the request through.
					if code, _, _ := do(t, tester, "GET", "/"); code != http.StatusTooManyRequests {
						passed++
					}
				}
				// The burst of 2, and what 20/s refills while the ten
				// requests are sent (a busy machine sends them slowly).
				refilled := int(time.Since(start) * 20 / time.Second)
				if passed < 2 || passed > 2+refilled {
					t.Fatalf("a full bucket at 20/s passed %d of 10 requests sent in %v, want its burst of 2 and at most the %d refilled meanwhile", passed, time.Since(start), refilled)
				}
			}
			u.fail.Store(false)
			l = startLoad(t, 4)
			path = awaitLimit(t, zone, "", "after the failures", 20*time.Second, func(n int64) bool { return n == 400 })
			t.Logf("after the failures the limit went %v", path)
			l.end()
		})
	}
}

// A config reload in the middle of an incident, under load: a bucket rate
// that backed off stays where it is (and its burst with it) in the new
// config, on the memory backend and on Redis; the upstream keeps getting
// about the backed-off rate through the reload.
func TestAdaptiveBucketReloadMidLoad(t *testing.T) {
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			backend := adaptiveBackend(t, store)
			u := newSickUpstream(t)
			u.fail.Store(true)
			zone := "adaptbucket_reload_" + store
			cfg := func(header string) string {
				return caddyfileServer(fmt.Sprintf(`
	header X-Config %s
	rate_limit {
		%s
		zone %s {
			key static
			rate 400/1s
			algorithm token_bucket
			burst 40
			adaptive {
				min 20
				decrease 0.1
				interval 1s
			}
		}
	}
	reverse_proxy %s`, header, backend, zone, strings.TrimPrefix(u.URL, "http://")))
			}
			tester := newTester(t, cfg("one"), "caddyfile")
			l := startLoad(t, 4)
			awaitLimit(t, zone, "", "while the upstream fails", 20*time.Second, func(n int64) bool { return n == 20 })
			tester.InitServer(withPorts(cfg("two")), "caddyfile") // a reload: the zone stays
			if s := adaptiveNow(t, zone, ""); s.Limit != 20 {
				t.Fatalf("after the reload the limit is %d, want the 20 it backed off to", s.Limit)
			}
			l.take()
			u.served.Store(0)
			time.Sleep(2 * time.Second) // a window of load to measure over
			served, answers := u.served.Load(), l.take()
			t.Logf("after the reload, at 20/s: the upstream got %d requests in 2 s; answers %v", served, answers)
			if served > 2*20+2+2 || answers[http.StatusTooManyRequests] == 0 {
				t.Fatalf("after the reload, at 20/s: the upstream got %d requests in 2 s (answers %v)", served, answers)
			}
			l.end()
		})
	}
}
