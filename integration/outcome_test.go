package integration

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddytest"
	"github.com/sluicehq/sluice/internal/redistest"
)

// outcomeBackends runs f on the memory store and on a real Redis.
func outcomeBackends(t *testing.T, f func(t *testing.T, backend, zonePrefix string)) {
	t.Run("memory", func(t *testing.T) { f(t, "", "outcome_mem_") })
	t.Run("redis", func(t *testing.T) {
		redis := redistest.Standalone(t, "")
		prefix := fmt.Sprintf("outcome%d:", time.Now().UnixNano())
		// A loaded machine (the race detector, other packages' tests)
		// keeps Redis past the default 100 ms timeout now and then: these
		// tests are about outcomes, not about a Redis that fails.
		f(t, fmt.Sprintf("backend redis {\n\t\t\taddress %s\n\t\t\tkey_prefix %s\n\t\t\ttimeout 2s\n\t\t}", redis.Addr, prefix), "outcome_redis_")
	})
}

// loginSite proxies every request to the upstream behind one zone with
// the given options, keyed by client address.
func loginSite(t *testing.T, backend, zone, opts string, u *loginUpstream) *caddytest.Tester {
	return newTester(t, caddyfileServer(fmt.Sprintf(`
	rate_limit {
		%s
		zone %s {
			by ip
			%s
		}
	}
	reverse_proxy %s`, backend, zone, opts, u.addr)), "caddyfile")
}

func login(t *testing.T, tester *caddytest.Tester, password string) int {
	t.Helper()
	code, _, _ := do(t, tester, "POST", "/login", "X-Password", password)
	return code
}

// Only failed logins count: 20 right passwords from the same address pass
// among 5 wrong ones, the sixth wrong one is refused, and once locked out
// the address reaches the application no more.
func TestOutcomeCountWhenLogin(t *testing.T) {
	outcomeBackends(t, func(t *testing.T, backend, prefix string) {
		u := newLoginUpstream(t, false)
		tester := loginSite(t, backend, prefix+"count", "rate 5/15m\n\t\t\tcount_when status 401 403", u)
		wrong := 0
		for i := range 20 {
			if got := login(t, tester, "right"); got != http.StatusOK {
				t.Fatalf("right password #%d: %d, want 200", i+1, got)
			}
			if i%4 == 3 {
				wrong++
				if got := login(t, tester, "wrong"); got != http.StatusUnauthorized {
					t.Fatalf("wrong password #%d: %d, want 401", wrong, got)
				}
			}
		}
		if got := login(t, tester, "wrong"); got != http.StatusTooManyRequests {
			t.Fatalf("sixth wrong password: %d, want 429", got)
		}
		if got := login(t, tester, "right"); got != http.StatusTooManyRequests {
			t.Fatalf("a right password while locked out: %d, want 429", got)
		}
		if u.right.Load() != 20 || u.wrong.Load() != 5 {
			t.Fatalf("upstream saw %d right and %d wrong passwords, want 20 and 5", u.right.Load(), u.wrong.Load())
		}
	})
}

// A right password forgives the failures before it.
func TestOutcomeResetWhenLogin(t *testing.T) {
	outcomeBackends(t, func(t *testing.T, backend, prefix string) {
		u := newLoginUpstream(t, false)
		tester := loginSite(t, backend, prefix+"reset", "rate 5/15m\n\t\t\tcount_when status 4xx\n\t\t\treset_when status 2xx", u)
		for round := range 3 {
			for i := range 4 {
				if got := login(t, tester, "wrong"); got != http.StatusUnauthorized {
					t.Fatalf("round %d: wrong password #%d: %d, want 401", round, i+1, got)
				}
			}
			if got := login(t, tester, "right"); got != http.StatusOK {
				t.Fatalf("round %d: right password: %d, want 200", round, got)
			}
		}
		for i := range 5 {
			if got := login(t, tester, "wrong"); got != http.StatusUnauthorized {
				t.Fatalf("wrong password #%d after the last success: %d, want 401", i+1, got)
			}
		}
		if got := login(t, tester, "wrong"); got != http.StatusTooManyRequests {
			t.Fatalf("sixth wrong password in a row: %d, want 429", got)
		}
	})
}

// 50 wrong passwords at once, while the application is slow to answer:
// the units are taken before the request is handed on, so exactly the
// limit reaches the application and the rest are refused at once.
func TestOutcomeConcurrentWrongPasswords(t *testing.T) {
	outcomeBackends(t, func(t *testing.T, backend, prefix string) {
		u := newLoginUpstream(t, true)
		tester := loginSite(t, backend, prefix+"flood", "rate 5/15m\n\t\t\tcount_when status 401", u)
		const n = 50
		var wg sync.WaitGroup
		var denied, unauthorized, other atomic.Int64
		for range n {
			wg.Go(func() {
				req, _ := http.NewRequest("POST", httpBase+"/login", nil)
				req.Header.Set("X-Password", "wrong")
				resp, err := tester.Client.Do(req)
				if err != nil {
					other.Add(1)
				} else {
					resp.Body.Close()
					switch resp.StatusCode {
					case http.StatusTooManyRequests:
						denied.Add(1)
					case http.StatusUnauthorized:
						unauthorized.Add(1)
					default:
						other.Add(1)
					}
				}
			})
		}
		// The application answers once every request was either refused
		// or is waiting in it: none can still slip in. Polled, since the
		// last to arrive may be one reaching the application after every
		// refusal came back. A request that did neither would hold the
		// gate shut: it opens after a while regardless.
		go func() {
			for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(2 * time.Millisecond) {
				if denied.Load()+u.wrong.Load() >= n {
					break
				}
			}
			u.open()
		}()
		wg.Wait()
		if u.wrong.Load() != 5 || unauthorized.Load() != 5 || denied.Load() != n-5 || other.Load() != 0 {
			t.Fatalf("upstream saw %d; answers: %d 401, %d 429, %d other; want 5, 5, %d, 0", u.wrong.Load(), unauthorized.Load(), denied.Load(), other.Load(), n-5)
		}
	})
}

// Giving back the units of successes never gives back more than they took:
// after many right passwords, in series and at once, mixed with wrong
// ones, the wrong ones still stop at exactly the limit, on every
// algorithm.
func TestOutcomeRefundNeverMoreThanTaken(t *testing.T) {
	outcomeBackends(t, func(t *testing.T, backend, prefix string) {
		for _, alg := range []string{"sliding_window", "sliding_window_counter", "fixed_window", "token_bucket", "gcra"} {
			t.Run(alg, func(t *testing.T) {
				u := newLoginUpstream(t, false)
				tester := loginSite(t, backend, prefix+"refund_"+alg, "rate 5/15m\n\t\t\talgorithm "+alg+"\n\t\t\tcount_when status 401", u)
				for i := range 3 {
					if got := login(t, tester, "wrong"); got != http.StatusUnauthorized {
						t.Fatalf("wrong password #%d: %d, want 401", i+1, got)
					}
				}
				var wg sync.WaitGroup
				var wrongAdmitted atomic.Int64
				for i := range 40 {
					wg.Go(func() {
						pw := "right"
						if i%10 == 0 {
							pw = "wrong"
						}
						code := login(t, tester, pw)
						if pw == "wrong" && code == http.StatusUnauthorized {
							wrongAdmitted.Add(1)
						}
					})
				}
				wg.Wait()
				left := 2 - wrongAdmitted.Load()
				if left < 0 {
					t.Fatalf("%d wrong passwords admitted at once after 3, want at most 2", wrongAdmitted.Load())
				}
				for i := range left {
					if got := login(t, tester, "wrong"); got != http.StatusUnauthorized {
						t.Fatalf("wrong password #%d of the %d left: %d, want 401", i+1, left, got)
					}
				}
				if got := login(t, tester, "wrong"); got != http.StatusTooManyRequests {
					t.Fatalf("wrong password past the limit: %d, want 429", got)
				}
				if u.wrong.Load() != 5 {
					t.Fatalf("upstream saw %d wrong passwords, want 5", u.wrong.Load())
				}
			})
		}
	})
}

// An upstream that cannot be reached answers 502 through Caddy's error
// path, before anything is written: the limits see that status, so a
// limit counting 5xx counts it and one counting 401 does not.
func TestOutcomeUpstreamError(t *testing.T) {
	tester := newTester(t, caddyfileServer(`
	route /fivexx {
		rate_limit {
			zone outcome_bad_gateway {
				key static
				rate 2/1m
				count_when status 5xx
			}
		}
		reverse_proxy 127.0.0.1:1
	}
	route /unauthorized {
		rate_limit {
			zone outcome_bad_gateway_401 {
				key static
				rate 2/1m
				count_when status 401
			}
		}
		reverse_proxy 127.0.0.1:1
	}`), "caddyfile")
	expectN(t, tester, 2, http.StatusBadGateway, "GET", "/fivexx")
	expect429(t, tester, 1, 60, "GET", "/fivexx")
	expectN(t, tester, 10, http.StatusBadGateway, "GET", "/unauthorized")
}

// A streamed response goes out as it is written: the client reads the
// first chunk while the application has not finished.
func TestOutcomeStreamNotBuffered(t *testing.T) {
	release := make(chan struct{})
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		fmt.Fprint(w, "first;")
		http.NewResponseController(w).Flush()
		select {
		case <-release:
		case <-time.After(10 * time.Second):
		}
		fmt.Fprint(w, "last")
	}))
	defer upstream.Close()
	tester := newTester(t, caddyfileServer(fmt.Sprintf(`
	rate_limit {
		zone outcome_stream {
			key static
			rate 1/1m
			count_when status 4xx
		}
	}
	reverse_proxy %s {
		flush_interval -1
	}`, strings.TrimPrefix(upstream.URL, "http://"))), "caddyfile")
	for i := range 2 {
		resp, err := tester.Client.Get(httpBase + "/")
		if err != nil {
			t.Fatal(err)
		}
		first := make([]byte, len("first;"))
		start := time.Now()
		if _, err := io.ReadFull(resp.Body, first); err != nil || string(first) != "first;" {
			t.Fatalf("request %d: first chunk %q, %v", i+1, first, err)
		}
		if waited := time.Since(start); waited > 5*time.Second {
			t.Fatalf("request %d: the first chunk came after %v, only once the response ended", i+1, waited)
		}
		release <- struct{}{}
		rest, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(rest) != "last" {
			t.Fatalf("request %d: rest %q", i+1, rest)
		}
	}
}

func TestOutcomeConfigErrors(t *testing.T) {
	for _, tc := range []struct{ name, opts, want string }{
		{"unknown matcher", "count_when method GET", "unrecognized response matcher method"},
		{"bad status", "count_when status 4x", "bad status value"},
		{"status out of range", "count_when status 700", "count_when: status 700 is neither"},
		{"no argument", "reset_when", "give a status or a header"},
		{"queue", "algorithm leaky_bucket\n\t\t\tmax_delay 1s\n\t\t\tcount_when status 401", "count_when cannot be used with max_delay"},
		{"twice", "count_when status 401\n\t\t\tcount_when status 403", "count_when already specified"},
		{"lease", "lease 2\n\t\t\tcount_when status 401", "count_when and reset_when cannot be used with lease"},
		{"cooldown and rate", "cooldown 1m", "cooldown sets the rate and algorithm: use it without rate"},
		{"cooldown not a duration", "cooldown soon", "cooldown"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assertLoadError(t, caddyfileServer(`
	rate_limit {
		zone outcome_bad {
			key static
			rate 500/1m
			`+tc.opts+`
		}
	}
	respond "ok"`), "caddyfile", tc.want)
		})
	}
}

// cooldown is the least time between two requests of a key: a 1-per-
// interval GCRA, so the second request within the interval is refused
// and the first after it passes. With count_when, only the requests that
// succeeded start the interval: a failed send does not make the client
// wait.
func TestOutcomeCooldown(t *testing.T) {
	outcomeBackends(t, func(t *testing.T, backend, prefix string) {
		u := newLoginUpstream(t, false)
		tester := newTester(t, caddyfileServer(fmt.Sprintf(`
	rate_limit {
		%s
		zone %scooldown {
			scope gap {
				by ip
				cooldown 1s
				count_when status 2xx
			}
		}
	}
	reverse_proxy %s`, backend, prefix, u.addr)), "caddyfile")
		expectN(t, tester, 3, http.StatusUnauthorized, "POST", "/send", "X-Password", "wrong")
		expectN(t, tester, 1, http.StatusOK, "POST", "/send", "X-Password", "right")
		start := time.Now()
		expect429(t, tester, 1, 1, "POST", "/send", "X-Password", "right")
		expect429(t, tester, 1, 1, "POST", "/send", "X-Password", "wrong")
		// A sleep only as a lower bound: the interval is over.
		time.Sleep(time.Second - time.Since(start) + 50*time.Millisecond)
		expectN(t, tester, 1, http.StatusOK, "POST", "/send", "X-Password", "right")
		expect429(t, tester, 1, 1, "POST", "/send", "X-Password", "right")
	})
}

// docOutcomeSite is the documented Caddyfile of docs/outcomes.md that
// contains marker, proxying to addr.
func docOutcomeSite(t *testing.T, marker, addr string) string {
	return strings.Replace(docSite(t, "../docs/outcomes.md", marker), `respond "ok"`, "reverse_proxy "+addr, 1)
}

// The login example of docs/outcomes.md, as written.
func TestDocsOutcomeLogin(t *testing.T) {
	t.Setenv("SLUICE_KEY_SECRET", "an-example-secret-of-32-bytes!!!")
	addr, hits := bodyUpstream(t, `"password":"right"`, http.StatusUnauthorized)
	tester := newTester(t, docOutcomeSite(t, "zone login {", addr), "caddyfile")
	attempt := func(user, password string) int {
		code, _ := post(t, tester, "/login", "application/json", `{"username":"`+user+`","password":"`+password+`"}`)
		return code
	}
	for i := range 20 {
		if got := attempt("Rakib", "right"); got != http.StatusOK {
			t.Fatalf("good login #%d: %d", i+1, got)
		}
	}
	for i := range 5 {
		if got := attempt(" rakib", "wrong"); got != http.StatusUnauthorized {
			t.Fatalf("failure #%d: %d, want 401", i+1, got)
		}
	}
	before := hits.Load()
	if got := attempt("RAKIB", "right"); got != http.StatusTooManyRequests || hits.Load() != before {
		t.Fatalf("after 5 failures: %d (upstream reached: %v), want 429 without reaching it", got, hits.Load() != before)
	}
	// Another username from the same address is not locked; its good
	// password forgives its own failures.
	for round := range 2 {
		for i := range 4 {
			if got := attempt("karim", "wrong"); got != http.StatusUnauthorized {
				t.Fatalf("karim round %d failure #%d: %d, want 401", round, i+1, got)
			}
		}
		if got := attempt("karim", "right"); got != http.StatusOK {
			t.Fatalf("karim round %d good login: %d", round, got)
		}
	}
}

// The text message example of docs/outcomes.md, as written: a send the
// provider failed does not start the cooldown, one that went does.
func TestDocsOutcomeOTP(t *testing.T) {
	t.Setenv("SLUICE_KEY_SECRET", "an-example-secret-of-32-bytes!!!")
	addr, _ := bodyUpstream(t, `"deliver":true`, http.StatusBadGateway)
	tester := newTester(t, docOutcomeSite(t, "cooldown 60s", addr), "caddyfile")
	send := func(phone string, deliver bool) (int, string) {
		return post(t, tester, "/otp/send", "application/json", fmt.Sprintf(`{"phone":%q,"deliver":%v}`, phone, deliver))
	}
	for i := range 3 {
		if code, body := send("01712345678", false); code != http.StatusBadGateway {
			t.Fatalf("failed send #%d: %d %q, want 502", i+1, code, body)
		}
	}
	if code, body := send("+8801712345678", true); code != http.StatusOK {
		t.Fatalf("send: %d %q", code, body)
	}
	if code, body := send("8801712345678", true); code != http.StatusTooManyRequests || !strings.Contains(body, `"retry_after":60`) {
		t.Fatalf("within the cooldown: %d %q, want 429 with retry_after 60", code, body)
	}
}

// An application that answers 200 to a failed login says so in a header:
// count_when matches the header, whatever the status.
func TestOutcomeCountWhenHeader(t *testing.T) {
	tester := newTester(t, caddyfileServer(`
	rate_limit {
		zone outcome_header {
			by ip
			rate 2/15m
			count_when {
				header X-Login-Result failed
			}
		}
	}
	@failed query pw=wrong
	header @failed X-Login-Result failed
	respond "page"`), "caddyfile")
	expectN(t, tester, 10, http.StatusOK, "GET", "/?pw=right")
	expectN(t, tester, 2, http.StatusOK, "GET", "/?pw=wrong")
	expect429(t, tester, 1, 900, "GET", "/?pw=wrong")
}

// slowSender is an application that does its work (sends a message) as
// soon as a request arrives, then takes a while to answer 200, whether
// the client is still there or not, as most applications do.
func slowSender(t *testing.T, delay time.Duration) (addr string, sent *atomic.Int64) {
	sent = new(atomic.Int64)
	_, upAddr := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		sent.Add(1)
		time.Sleep(delay)
		fmt.Fprint(w, "sent")
	})
	return upAddr, sent
}

// A client that hangs up after its request reached the application, but
// before the answer, does not learn the outcome, and neither does the
// limit: the unit it took stays taken. Taken as the outcome, the proxy's
// 499 for the cancelled request would not match count_when 2xx, the unit
// would be given back, and a client could have a text message sent as
// often as it liked through a one-minute cooldown by hanging up each time.
func TestOutcomeClientLeavesBeforeAnswer(t *testing.T) {
	addr, sent := slowSender(t, 400*time.Millisecond)
	newTester(t, caddyfileServer(`
	rate_limit {
		zone outcome_abort {
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
func TestOutcomeClientLeavesMidBody(t *testing.T) {
	addr, sent := slowSender(t, 400*time.Millisecond)
	newTester(t, caddyfileServer(`
	rate_limit {
		zone outcome_abort_body {
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

// count_when and reset_when set on a zone made only of scopes would do
// nothing (a scope does not inherit them): every failed login and every
// success would count alike, and no success would forgive. The config is
// refused at the option's line, as the zone's other own options are.
func TestOutcomeOnZoneOfScopesRefused(t *testing.T) {
	assertLoadError(t, caddyfileServer(`	rate_limit {
		zone outcome_scopes_only {
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
// count_when matches the header as the application wrote it. Read after
// the site's edits, the header would be gone, no failure would match, and
// every wrong password would be given back: unlimited guesses.
func TestOutcomeCountWhenHiddenHeader(t *testing.T) {
	_, addr := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("pw") != "right" {
			w.Header().Set("X-Login-Result", "failed")
		}
		fmt.Fprint(w, "page")
	})
	tester := newTester(t, caddyfileServer(`
	header -X-Login-Result
	rate_limit {
		zone outcome_hidden_header {
			by ip
			rate 2/15m
			count_when header X-Login-Result failed
		}
	}
	reverse_proxy `+addr), "caddyfile")
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

// A sliding window's refund comes after its events have left the window
// (a slow response that count_when does not count); a reload then makes
// the window longer. The events that had left are gone: the new window
// admits its whole limit. A store that kept them through the refund would
// count them again under the longer window (3 of 5 would pass); Redis lets
// the key expire, and the memory store must forget them alike.
func TestOutcomeSlidingWindowRefundThenLongerWindow(t *testing.T) {
	outcomeBackends(t, func(t *testing.T, backend, prefix string) {
		_, addr := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/slow" {
				time.Sleep(600 * time.Millisecond) // past the 300ms window
				w.WriteHeader(http.StatusOK)
				return
			}
			w.WriteHeader(http.StatusUnauthorized)
		})
		site := func(rate string) string {
			return caddyfileServer(fmt.Sprintf(`
	rate_limit {
		%s
		zone %sdiff_logrefund {
			by ip
			rate %s
			algorithm sliding_window
			count_when status 401
		}
	}
	reverse_proxy %s`, backend, prefix, rate, addr))
		}
		tester := newTester(t, site("5/300ms"), "caddyfile")
		expectN(t, tester, 2, http.StatusUnauthorized, "GET", "/fail") // counted
		expectN(t, tester, 1, http.StatusOK, "GET", "/slow")           // given back after the window
		adminRequest(t, "POST", "/load", "text/caddyfile", withPorts(site("5/1h")))
		expectN(t, tester, 5, http.StatusUnauthorized, "GET", "/fail")
		if code, _, _ := do(t, tester, "GET", "/fail"); code != http.StatusTooManyRequests {
			t.Fatalf("sixth request under 5/1h: status %d, want 429", code)
		}
	})
}
