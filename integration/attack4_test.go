package integration

import (
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// slowSender is an application that does its work (sends a message) as
// soon as a request arrives, then takes a while to answer 200, whether
// the client is still there or not, as most applications do.
func slowSender(t *testing.T, delay time.Duration) (addr string, sent *atomic.Int64) {
	sent = new(atomic.Int64)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sent.Add(1)
		time.Sleep(delay)
		fmt.Fprint(w, "sent")
	}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://"), sent
}

// A client that hangs up after its request reached the application, but
// before the answer, does not learn the outcome, and neither does the
// limit: the unit it took stays taken. Before, the proxy's 499 for the
// cancelled request did not match count_when 2xx, the unit was given
// back, and a client could have a text message sent as often as it liked
// through a one-minute cooldown by hanging up each time.
func TestAttack4ClientLeavesBeforeAnswer(t *testing.T) {
	addr, sent := slowSender(t, 400*time.Millisecond)
	newTester(t, caddyfileServer(`
	rate_limit {
		zone attack4_abort {
			scope gap {
				by ip
				cooldown 60s
				count_when status 2xx
			}
		}
	}
	reverse_proxy `+addr), "caddyfile")
	impatient := &http.Client{Timeout: 150 * time.Millisecond}
	for range 5 {
		resp, err := impatient.Post(fmt.Sprintf("http://localhost:%d/otp/send", httpPort), "text/plain", nil)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusTooManyRequests {
				continue
			}
		}
		// Let the proxy see the client leave and settle.
		time.Sleep(400 * time.Millisecond)
	}
	if got := sent.Load(); got != 1 {
		t.Fatalf("the application sent %d messages within a 60s cooldown to a client that hung up each time, want 1", got)
	}
}

// The same client, hanging up in the middle of a chunked body it has
// sent most of: the application has the request, the proxy fails to
// read the rest of the body.
func TestAttack4ClientLeavesMidBody(t *testing.T) {
	addr, sent := slowSender(t, 400*time.Millisecond)
	newTester(t, caddyfileServer(`
	rate_limit {
		zone attack4_abort_body {
			scope gap {
				by ip
				cooldown 60s
				count_when status 2xx
			}
		}
	}
	reverse_proxy `+addr), "caddyfile")
	for range 5 {
		c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", httpPort))
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(c, "POST /otp/send HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\nContent-Type: application/json\r\n\r\n10\r\n{\"phone\":\"0171\"}\r\n")
		time.Sleep(150 * time.Millisecond)
		c.Close()
		time.Sleep(400 * time.Millisecond)
	}
	if got := sent.Load(); got != 1 {
		t.Fatalf("the application was reached %d times within a 60s cooldown by a client that hung up mid-body each time, want 1", got)
	}
}

// Caddy's own placeholders for the whole request body read the body as
// much as a field does: a limit keyed by them guards what the body says,
// and leases no more than one keyed by a field.
func TestAttack4LeaseWholeBodyKey(t *testing.T) {
	for _, key := range []string{"{http.request.body}", "{http.request.body_base64}"} {
		t.Run(key, func(t *testing.T) {
			assertLoadError(t, caddyfileServer(`	rate_limit {
		backend redis {
			address 127.0.0.1:1
		}
		zone attack4_lease_body {
			key `+key+`
			rate 1000/1m
			lease 10
		}
	}
	respond "ok"`), "caddyfile", "read from the request body")
		})
	}
}

// count_when and reset_when set on a zone made only of scopes would do
// nothing (a scope does not inherit them): every failed login and every
// success would count alike, and no success would forgive. The config is
// refused at the option's line, as the zone's other own options are.
func TestAttack4OutcomeOnZoneOfScopes(t *testing.T) {
	assertLoadError(t, caddyfileServer(`	rate_limit {
		zone attack4_scopes_only {
			count_when status 401
			reset_when status 2xx
			scope user {
				key {http.request.header.X-User}
				rate 5/15m
			}
		}
	}
	respond "ok"`), "caddyfile", "count_when, reset_when would do nothing on a zone without a rate of its own")
}

// An application that says a login failed in a header the site keeps to
// itself (`header -X-Login-Result`, applied as the response goes out):
// count_when matches the header as the application wrote it. Before, the
// header was gone by the time the limit settled, no failure matched, and
// every wrong password was given back: unlimited guesses.
func TestAttack4CountWhenHiddenHeader(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("pw") != "right" {
			w.Header().Set("X-Login-Result", "failed")
		}
		fmt.Fprint(w, "page")
	}))
	t.Cleanup(srv.Close)
	tester := newTester(t, caddyfileServer(`
	header -X-Login-Result
	rate_limit {
		zone attack4_hidden_header {
			by ip
			rate 2/15m
			count_when header X-Login-Result failed
		}
	}
	reverse_proxy `+strings.TrimPrefix(srv.URL, "http://")), "caddyfile")
	expectN(t, tester, 5, http.StatusOK, "GET", "/?pw=right")
	for i := range 2 {
		if code, _, _ := do(t, tester, "GET", "/?pw=wrong"); code != http.StatusOK {
			t.Fatalf("failure #%d: %d", i+1, code)
		}
	}
	resp, err := http.Get(fmt.Sprintf("http://localhost:%d/?pw=wrong", httpPort))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.Header.Get("X-Login-Result") != "" {
		t.Fatalf("the header reached the client")
	}
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("third failure: %d, want 429", resp.StatusCode)
	}
}
