// Command protection is the load of bench/protection.sh: an upstream whose
// latency steps from -fast to -slow partway through, and an open-loop
// client that sends -rps requests a second to the Caddy instances in front
// of it (round robin), whatever the answers take. It prints what the
// upstream saw in flight and what the clients got.
package main

import (
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

func main() {
	listen := flag.String("upstream", "127.0.0.1:18090", "address the upstream listens on")
	targets := flag.String("targets", "http://127.0.0.1:18080/", "comma-separated URLs of the Caddy instances")
	rps := flag.Int("rps", 500, "requests per second, sent on schedule (open loop)")
	fast := flag.Duration("fast", 200*time.Millisecond, "upstream latency before the step")
	slow := flag.Duration("slow", 2*time.Second, "upstream latency after the step")
	step := flag.Duration("step", 5*time.Second, "when the upstream slows down")
	duration := flag.Duration("duration", 15*time.Second, "how long requests are sent")
	name := flag.String("name", "run", "label of the printed line")
	flag.Parse()

	var inFlight, peak, slowSum, slowN atomic.Int64
	var slowAfter atomic.Int64 // Unix ns of the step
	slowAfter.Store(time.Now().Add(time.Hour).UnixNano())
	latency := func() time.Duration {
		if time.Now().UnixNano() >= slowAfter.Load() {
			return *slow
		}
		return *fast
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	go func() {
		_ = http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			n := inFlight.Add(1)
			for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
			}
			select {
			case <-time.After(latency()):
			case <-r.Context().Done():
			}
			inFlight.Add(-1)
			_, _ = io.WriteString(w, "ok")
		}))
	}()
	// Sample the upstream's requests in flight once the slow phase has
	// filled up (one slow latency after the step), until the sending stops.
	var endAt atomic.Int64
	endAt.Store(time.Now().Add(time.Hour).UnixNano())
	stop := make(chan struct{})
	go func() {
		t := time.NewTicker(10 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case now := <-t.C:
				if t := now.UnixNano(); t >= slowAfter.Load()+int64(*slow) && t < endAt.Load() {
					slowSum.Add(inFlight.Load())
					slowN.Add(1)
				}
			}
		}
	}()

	urls := strings.Split(*targets, ",")
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 4096}}
	type answer struct {
		code    int
		latency time.Duration
		slowPh  bool
	}
	var mu sync.Mutex
	var answers []answer
	var wg sync.WaitGroup
	start := time.Now()
	slowAfter.Store(start.Add(*step).UnixNano())
	endAt.Store(start.Add(*duration).UnixNano())
	total := int(duration.Seconds() * float64(*rps))
	interval := time.Second / time.Duration(*rps)
	for i := range total {
		time.Sleep(time.Until(start.Add(time.Duration(i) * interval)))
		wg.Go(func() {
			sent := time.Now()
			code := 0
			if resp, err := client.Get(urls[i%len(urls)]); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				code = resp.StatusCode
			}
			mu.Lock()
			answers = append(answers, answer{code, time.Since(sent), sent.UnixNano() >= slowAfter.Load()})
			mu.Unlock()
		})
	}
	wg.Wait()
	close(stop)

	codes := map[int]int{}
	var okLat, refusedLat []time.Duration
	queued := 0
	for _, a := range answers {
		codes[a.code]++
		switch a.code {
		case http.StatusOK:
			okLat = append(okLat, a.latency)
			// Served after waiting for a slot: longer than the upstream's
			// latency by more than a scheduling hiccup.
			if up := *fast; a.slowPh {
				up = *slow
				if a.latency > up+50*time.Millisecond {
					queued++
				}
			} else if a.latency > up+50*time.Millisecond {
				queued++
			}
		case http.StatusServiceUnavailable:
			refusedLat = append(refusedLat, a.latency)
		}
	}
	mean := 0.0
	if n := slowN.Load(); n > 0 {
		mean = float64(slowSum.Load()) / float64(n)
	}
	fmt.Printf("| %s | %d | %.0f | %d | %d | %d | %s | %s | %v |\n", *name, peak.Load(), mean, codes[200], queued, codes[503],
		pct(okLat, 50)+" / "+pct(okLat, 99), pct(refusedLat, 50)+" / "+pct(refusedLat, 99), others(codes))
}

func pct(d []time.Duration, p int) string {
	if len(d) == 0 {
		return "–"
	}
	slices.Sort(d)
	return d[(len(d)-1)*p/100].Round(time.Millisecond).String()
}

func others(codes map[int]int) string {
	var s []string
	for c, n := range codes {
		if c != 200 && c != 503 {
			s = append(s, fmt.Sprintf("%d×%d", n, c))
		}
	}
	if len(s) == 0 {
		return "none"
	}
	slices.Sort(s)
	return strings.Join(s, " ")
}
