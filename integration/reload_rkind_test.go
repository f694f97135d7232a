package integration

import (
	"bufio"
	"net"
	"net/http"
	"strconv"
	"testing"
	"time"
)

// Caddy cleans up the old config on a reload without waiting for the
// requests its servers still hold. A request whose body (its key) was
// still arriving at the reload is decided by the old config's handler
// after that: it must be counted against the key under the new algorithm
// too, so that the limit holds across the switch.
func TestRequestInFlightAcrossAKindChangeIsCounted(t *testing.T) {
	cfg := func(alg string) string {
		return jsonServer(`{"handler": "rate_limit", "rate_limits": {
			"straggler_kinds": {"key": "{http.request.body.form.u}", "window": "24h", "max_events": 3, "algorithm": "`+alg+`"}
		}}, `+okHandler, "")
	}
	tester := newTester(t, cfg("sliding_window"), "json")

	// The old server has begun reading this request: it will answer it.
	conn, err := net.Dial("tcp", "localhost:"+strconv.Itoa(httpPort))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	const form = "application/x-www-form-urlencoded"
	if _, err := conn.Write([]byte("POST / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Type: " + form + "\r\nContent-Length: 3\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		if code, body := post(t, tester, "/", form, "u=a"); code != http.StatusOK {
			t.Fatalf("request %d: %d %s, want 200", i+1, code, body)
		}
	}

	adminRequest(t, "POST", "/load", "application/json", cfg("token_bucket"))
	if _, err := conn.Write([]byte("u=a")); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("the request in flight got %d, want 200 (the third of 3)", resp.StatusCode)
	}
	// Three of three used, one of them through the old config after its
	// clean-up.
	if code, _ := post(t, tester, "/", form, "u=a"); code != http.StatusTooManyRequests {
		t.Fatalf("a fourth request got %d, want 429", code)
	}
}
