package integration

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// A client that sends its body slowly is waited for by the upstream, but
// the wait is the client's: a few such uploads a second must not drive an
// adaptive limit down for everyone (before, five a second took a cap of
// 100 to 12 in six seconds).
func TestAttack8SlowUploadDoesNotShrinkAdaptive(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = io.WriteString(w, "ok")
	}))
	t.Cleanup(up.Close)
	newTester(t, caddyfileServer(fmt.Sprintf(`
	rate_limit {
		zone attack8_slow_upload {
			key static
			concurrency 50
			adaptive {
				min 5
				interval 1s
				latency_p99 300ms 800ms
			}
		}
	}
	reverse_proxy %s`, strings.TrimPrefix(up.URL, "http://"))), "caddyfile")
	const zone = "attack8_slow_upload"
	// Ordinary traffic, 20 requests a second: the slow uploads are more
	// than 1% of it, as a few hostile clients are on a quiet site.
	stop := make(chan struct{})
	var normal sync.WaitGroup
	normal.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			if resp, err := http.Get(httpBase + "/"); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}
	})
	defer func() { close(stop); normal.Wait() }()

	// Hostile uploads: 10 bytes, one every 150 ms (1.5 s each), five
	// started a second for four seconds.
	var wg sync.WaitGroup
	deadline := time.Now().Add(4 * time.Second)
	for time.Now().Before(deadline) {
		wg.Go(func() {
			c, err := net.Dial("tcp", strings.TrimPrefix(httpBase, "http://"))
			if err != nil {
				return
			}
			defer c.Close()
			_, _ = io.WriteString(c, "POST / HTTP/1.1\r\nHost: localhost\r\nContent-Length: 10\r\n\r\n")
			for range 10 {
				time.Sleep(150 * time.Millisecond)
				if _, err := c.Write([]byte("x")); err != nil {
					return
				}
			}
			_, _ = c.Read(make([]byte, 512))
		})
		time.Sleep(200 * time.Millisecond)
	}
	wg.Wait()
	s := adaptiveNow(t, zone, "")
	t.Logf("after 4 s of slow uploads: limit %d, last p99 %.3fs", s.Limit, s.LatencyP99)
	if s.Limit != 50 {
		t.Fatalf("slow uploads drove the adaptive cap to %d (p99 %.3fs): the client's wait was counted as the upstream's", s.Limit, s.LatencyP99)
	}
}
