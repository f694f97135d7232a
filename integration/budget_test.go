package integration

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddytest"
	"github.com/sluicehq/sluice/internal/redistest"
)

// budgetSite is a spend budget of rate for the whole site, in front of u,
// whose answers the proxy waits for up to timeout.
func budgetSite(t *testing.T, backend, zone, rate, timeout string, u *paidUpstream) *caddytest.Tester {
	return newTester(t, caddyfileServer(fmt.Sprintf(`
	rate_limit {
		%s
		respond json
		zone %s {
			key sms
			rate %s
			charge_when status 2xx
		}
	}
	reverse_proxy %s {
		transport http {
			response_header_timeout %s
		}
	}`, backend, zone, rate, u.addr, timeout)), "caddyfile")
}

func paidSend(t *testing.T, tester *caddytest.Tester, answer string) (int, string, string) {
	t.Helper()
	return do(t, tester, "POST", "/sms", "X-Answer", answer)
}

// spend sends 2xx answers until the budget of 2 is spent, then requires
// the next request to be refused with the budget's 503 without reaching
// the upstream.
func spend(t *testing.T, tester *caddytest.Tester, u *paidUpstream) {
	t.Helper()
	for i := range 2 {
		if code, _, body := paidSend(t, tester, "200"); code != http.StatusOK {
			t.Fatalf("paid request #%d: %d %q, want 200", i+1, code, body)
		}
	}
	before := u.hits.Load()
	code, retry, body := paidSend(t, tester, "200")
	if code != http.StatusServiceUnavailable || retry == "" || !strings.Contains(body, `"code":"budget_exhausted"`) || !strings.Contains(body, "budget for this is spent") {
		t.Fatalf("a spent budget: %d, Retry-After %q, %q; want 503 with Retry-After and a body saying the budget is spent", code, retry, body)
	}
	if u.hits.Load() != before {
		t.Fatal("a request refused by the spent budget reached the upstream")
	}
}

// A 2xx commits the unit: two paid requests spend the budget of two.
func TestBudgetCommittedOn2xx(t *testing.T) {
	outcomeBackends(t, func(t *testing.T, backend, prefix string) {
		u := newPaidUpstream(t)
		spend(t, budgetSite(t, backend, prefix+"budget_2xx", "2/1d", "10s", u), u)
	})
}

// An upstream's failure gives the unit back: its 502, or no answer in
// time (the proxy's 504). Ten failed sends spend nothing.
func TestBudgetRefundedOnUpstreamFailure(t *testing.T) {
	for _, tc := range []struct {
		name, answer string
		want         int
	}{{"502", "502", http.StatusBadGateway}, {"timeout", "hang", http.StatusGatewayTimeout}} {
		t.Run(tc.name, func(t *testing.T) {
			outcomeBackends(t, func(t *testing.T, backend, prefix string) {
				u := newPaidUpstream(t)
				tester := budgetSite(t, backend, prefix+"budget_failed_"+tc.name, "2/1d", "300ms", u)
				for i := range 10 {
					if code, _, _ := paidSend(t, tester, tc.answer); code != tc.want {
						t.Fatalf("failed send #%d: %d, want %d", i+1, code, tc.want)
					}
				}
				spend(t, tester, u)
			})
		})
	}
}

// leaveAfter sends a paid request on a raw connection and closes it
// after wait, as a client that hangs up does; it returns the status that
// came back before (0 when none did).
func leaveAfter(t *testing.T, answer, work string, wait time.Duration) int {
	t.Helper()
	return leaveRaw(t, fmt.Sprintf("POST /sms HTTP/1.1\r\nHost: localhost\r\nX-Answer: %s\r\nX-Work: %s\r\nContent-Length: 0\r\n\r\n", answer, work), wait)
}

// leaveRaw writes req on a raw connection and closes it after wait.
func leaveRaw(t *testing.T, req string, wait time.Duration) int {
	t.Helper()
	c, err := net.Dial("tcp", "127.0.0.1:"+strconv.Itoa(httpPort))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(wait))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// waitAnswered waits until the upstream finished every request it got.
func waitAnswered(t *testing.T, u *paidUpstream) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); u.answered.Load() < u.hits.Load(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the upstream finished %d of %d requests in 10s", u.answered.Load(), u.hits.Load())
		}
	}
}

// A client that hangs up while the provider works does not get its send
// for free: the upstream call goes on, and its 2xx commits the unit. Six
// clients in a row, each leaving after 0.6 s of a send that takes 1 s,
// against a budget of 3, get exactly 3 messages sent; the rest are
// refused before reaching the provider, and the budget stays spent.
func TestBudgetKeptWhenClientLeaves(t *testing.T) {
	outcomeBackends(t, func(t *testing.T, backend, prefix string) {
		u := newPaidUpstream(t)
		tester := budgetSite(t, backend, prefix+"budget_left", "3/1h", "10s", u)
		var codes []int
		for range 6 {
			codes = append(codes, leaveAfter(t, "200", "1s", 600*time.Millisecond))
		}
		waitAnswered(t, u)
		if got := u.hits.Load(); got != 3 {
			t.Fatalf("%d messages sent to clients that hung up at 0.6 s (answers %v), want the budget of 3", got, codes)
		}
		// Committed, not released: nothing comes back.
		for deadline := time.Now().Add(500 * time.Millisecond); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			if code, _, body := paidSend(t, tester, "200"); code != http.StatusServiceUnavailable {
				t.Fatalf("a send once the clients that left were answered: %d %q, want 503", code, body)
			}
		}
	})
}

// A client that left is settled by what the upstream answers, once it
// answers: a 502 gives the unit back then, and not before.
func TestBudgetClientLeftReleasedByFailure(t *testing.T) {
	outcomeBackends(t, func(t *testing.T, backend, prefix string) {
		u := newPaidUpstream(t)
		tester := budgetSite(t, backend, prefix+"budget_left_502", "1/1h", "10s", u)
		if code := leaveAfter(t, "502", "1s", 300*time.Millisecond); code != 0 {
			t.Fatalf("the client that left got %d", code)
		}
		if u.answered.Load() == 0 {
			if code, _, body := paidSend(t, tester, "200"); code != http.StatusServiceUnavailable {
				t.Fatalf("while the upstream still works for a client that left: %d %q, want 503", code, body)
			}
		}
		waitAnswered(t, u)
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			code, _, body := paidSend(t, tester, "200")
			if code == http.StatusOK {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the unit of a send that failed after its client left never came back: %d %q", code, body)
			}
		}
		if code, _, _ := paidSend(t, tester, "200"); code != http.StatusServiceUnavailable {
			t.Fatalf("after the paid send: %d, want 503", code)
		}
	})
}

// A client that left and no status from the upstream: the reservation
// is kept until reservation_ttl, never released early, and then comes
// back by expiry. An upstream that never answers has its call given up
// then, not when the proxy's own timeout (10 s) would end it. The
// proxy's 504 (its response_header_timeout, shorter than the
// reservation) and its 502 for a body the client stopped sending
// half-way (the provider got the request and works on it) are not
// answers of the upstream's either.
func TestBudgetClientLeftUnansweredExpires(t *testing.T) {
	const ttl = 2 * time.Second
	for _, tc := range []struct {
		name, timeout, req string
		givenUp            time.Duration // when the upstream's hanging call must end (0: not checked)
	}{
		{"never answered", "10s", "POST /sms HTTP/1.1\r\nHost: localhost\r\nX-Answer: hang\r\nContent-Length: 0\r\n\r\n", ttl},
		{"proxy timeout", "500ms", "POST /sms HTTP/1.1\r\nHost: localhost\r\nX-Answer: hang\r\nContent-Length: 0\r\n\r\n", 500 * time.Millisecond},
		{"body cut short", "10s", "POST /sms HTTP/1.1\r\nHost: localhost\r\nX-Answer: 200\r\nX-Work: 1s\r\nTransfer-Encoding: chunked\r\nContent-Type: application/json\r\n\r\n10\r\n{\"phone\":\"0171\"}\r\n", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			outcomeBackends(t, func(t *testing.T, backend, prefix string) {
				u := newPaidUpstream(t)
				tester := newTester(t, caddyfileServer(fmt.Sprintf(`
	rate_limit {
		%s
		respond json
		zone %sbudget_left_%s {
			key sms
			rate 1/1h
			charge_when status 2xx
			reservation_ttl %s
		}
	}
	reverse_proxy %s {
		transport http {
			response_header_timeout %s
		}
	}`, backend, prefix, strings.ReplaceAll(tc.name, " ", "_"), ttl, u.addr, tc.timeout)), "caddyfile")
				reserved := time.Now()
				leaveRaw(t, tc.req, 300*time.Millisecond)
				for deadline := time.Now().Add(5 * time.Second); u.hits.Load() != 1; time.Sleep(10 * time.Millisecond) {
					if time.Now().After(deadline) {
						t.Fatalf("the upstream got %d requests, want 1", u.hits.Load())
					}
				}
				for {
					code, _, body := paidSend(t, tester, "200")
					elapsed := time.Since(reserved)
					if code == http.StatusOK {
						if elapsed < ttl-250*time.Millisecond {
							t.Fatalf("the unit of a client that left came back after %v, before its reservation_ttl %v", elapsed, ttl)
						}
						t.Logf("the unit came back %v after it was reserved (reservation_ttl %v)", elapsed.Round(time.Millisecond), ttl)
						break
					}
					if code != http.StatusServiceUnavailable {
						t.Fatalf("while the reservation of a client that left is kept: %d %q, want 503", code, body)
					}
					if elapsed > ttl+5*time.Second {
						t.Fatalf("the unit did not come back %v after it was reserved", elapsed)
					}
					time.Sleep(50 * time.Millisecond)
				}
				if tc.givenUp == 0 {
					return
				}
				select {
				case held := <-u.hangEnded:
					if held < tc.givenUp-250*time.Millisecond || held > tc.givenUp+3*time.Second {
						t.Fatalf("the upstream call of a client that left was given up after %v, want about %v", held, tc.givenUp)
					}
				case <-time.After(10 * time.Second):
					t.Fatal("the upstream call of a client that left was never given up")
				}
			})
		})
	}
}

// Releases never give back more than was reserved: 60 concurrent sends,
// two in three failing, against a budget of 5, then sends until it is
// spent, commit exactly 5 messages in all.
func TestBudgetConcurrentNeverMoreThanReserved(t *testing.T) {
	outcomeBackends(t, func(t *testing.T, backend, prefix string) {
		u := newPaidUpstream(t)
		tester := budgetSite(t, backend, prefix+"budget_concurrent", "5/1d", "10s", u)
		var sent, other atomic.Int64
		var wg sync.WaitGroup
		for i := range 60 {
			wg.Go(func() {
				answer := "502"
				if i%3 == 0 {
					answer = "200"
				}
				req, _ := http.NewRequest("POST", httpBase+"/sms", nil)
				req.Header.Set("X-Answer", answer)
				resp, err := tester.Client.Do(req)
				if err != nil {
					other.Add(1)
					return
				}
				resp.Body.Close()
				switch resp.StatusCode {
				case http.StatusOK:
					sent.Add(1)
				case http.StatusBadGateway, http.StatusServiceUnavailable:
				default:
					other.Add(1)
				}
			})
		}
		wg.Wait()
		// A failed send's unit comes back once Caddy has its answer, which
		// may be after the client read it: sends go on until the budget is
		// spent (or 10 s pass), then five more must all be refused.
		for deadline := time.Now().Add(10 * time.Second); sent.Load() < 5 && time.Now().Before(deadline); {
			if code, _, _ := paidSend(t, tester, "200"); code == http.StatusOK {
				sent.Add(1)
			} else {
				time.Sleep(20 * time.Millisecond)
			}
		}
		for range 5 {
			if code, _, _ := paidSend(t, tester, "200"); code == http.StatusOK {
				sent.Add(1)
			}
		}
		if sent.Load() != 5 || other.Load() != 0 {
			t.Fatalf("%d messages sent (%d other answers), want exactly the budget of 5", sent.Load(), other.Load())
		}
	})
}

// A budget fails closed unless its zone says otherwise: with Redis gone,
// the budget refuses (503) while a plain limit lets requests through.
func TestBudgetFailsClosed(t *testing.T) {
	dead := fmt.Sprintf("backend redis {\n\t\t\taddress 127.0.0.1:%d\n\t\t\ttimeout 50ms\n\t\t}", freePort(t))
	tester := newTester(t, caddyfileServer(fmt.Sprintf(`
	rate_limit {
		%s
		zone budget_dead {
			match {
				path /sms
			}
			key sms
			rate 2/1d
			charge_when status 2xx
		}
		zone budget_dead_open {
			match {
				path /open
			}
			key sms
			rate 2/1d
			charge_when status 2xx
			fail open
		}
		zone budget_dead_plain {
			match {
				path /plain
			}
			key sms
			rate 2/1d
		}
	}
	respond "ok"`, dead)), "caddyfile")
	if code, _, _ := do(t, tester, "GET", "/sms"); code != http.StatusServiceUnavailable {
		t.Fatalf("a budget with its store down: %d, want 503", code)
	}
	expectN(t, tester, 3, http.StatusOK, "GET", "/open")
	expectN(t, tester, 3, http.StatusOK, "GET", "/plain")
}

// The budget's status is the zone's when it sets one, and its answer
// keeps the numbers of the limit for the error page.
func TestBudgetZoneStatus(t *testing.T) {
	u := newPaidUpstream(t)
	tester := newTester(t, caddyfileServer(fmt.Sprintf(`
	rate_limit {
		respond problem
		zone budget_status {
			key sms
			rate 1/1d
			charge_when status 2xx
			status 402
		}
	}
	reverse_proxy %s`, u.addr)), "caddyfile")
	if code, _, _ := paidSend(t, tester, "200"); code != http.StatusOK {
		t.Fatalf("paid send: %d", code)
	}
	code, retry, body := paidSend(t, tester, "200")
	if code != http.StatusPaymentRequired || retry == "" || !strings.Contains(body, "budget for this is spent") || !strings.Contains(body, `"status":402`) {
		t.Fatalf("spent: %d %q %q, want 402 with Retry-After", code, retry, body)
	}
}

// Spend budgets and calendar windows that cannot work are refused when
// the config loads, naming the option.
func TestBudgetConfigErrors(t *testing.T) {
	for _, tt := range []struct{ opts, want string }{
		{"rate 5/1d\n\t\t\talign day", "align applies only to algorithm fixed_window, not sliding_window"},
		{"rate 5/1h\n\t\t\talgorithm fixed_window\n\t\t\talign day", "align day needs a window of 1d (such as rate 100/1d), got 1h"},
		{"rate 5/1d\n\t\t\talgorithm fixed_window\n\t\t\talign day\n\t\t\ttimezone Asia/Dacca_", `timezone: unknown time zone \"Asia/Dacca_\"`},
		{"rate 5/1d\n\t\t\talgorithm fixed_window\n\t\t\ttimezone Asia/Dhaka", "timezone applies only with align"},
		{"rate 5/1d\n\t\t\treservation_ttl 1m", "reservation_ttl applies only with charge_when"},
		{"rate 5/1d\n\t\t\tcharge_when status 2xx\n\t\t\treservation_ttl 10ms", "reservation_ttl must be from 1s to 24h0m0s, got 10ms"},
		{"rate 5/1d\n\t\t\tcharge_when status 2xx\n\t\t\tcount_when status 2xx", "charge_when cannot be used with count_when or reset_when"},
		{"rate 5/1d\n\t\t\tcharge_when", "charge_when"},
	} {
		assertLoadError(t, caddyfileServer(`
	rate_limit {
		zone budget_bad {
			key sms
			`+tt.opts+`
		}
	}
	respond "ok"`), "caddyfile", tt.want)
	}
}

// The reservation of a Caddy killed in the middle of a paid call comes
// back by itself after reservation_ttl, and not before, with no Caddy left
// that made it: the reservation lives in Redis with its deadline.
func TestBudgetKilledCaddyReservationExpires(t *testing.T) {
	redis := redistest.Standalone(t, "")
	u := newPaidUpstream(t)
	const ttl = 3 * time.Second
	cfg := fleetGlobals("") + fmt.Sprintf(`:@HTTP@ {
	handle /up {
		respond ok
	}
	handle /sms {
		rate_limit {
			%s
			respond json
			zone budget_killed {
				key sms
				rate 1/1d
				charge_when status 2xx
				reservation_ttl %s
			}
		}
		reverse_proxy %s
	}
}
`, redisBackend(3, "address "+redis.Addr, fmt.Sprintf("key_prefix killed%d:", time.Now().UnixNano())), ttl, u.addr)
	start := func() (base string, kill func()) {
		admin, port := freePort(t), freePort(t)
		dir := t.TempDir()
		file := filepath.Join(dir, "Caddyfile")
		text := strings.NewReplacer("@ADMIN@", strconv.Itoa(admin), "@HTTP@", strconv.Itoa(port)).Replace(cfg)
		if err := os.WriteFile(file, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		cmd := startCaddy(t, file, "XDG_DATA_HOME="+dir, "XDG_CONFIG_HOME="+dir)
		base = "http://127.0.0.1:" + strconv.Itoa(port)
		waitUp(t, base+"/up")
		return base, func() { _ = cmd.Process.Kill() } // SIGKILL: nothing settles
	}
	post := func(base, answer string) int {
		req, _ := http.NewRequest("POST", base+"/sms", nil)
		req.Header.Set("X-Answer", answer)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	first, kill := start()
	second, _ := start()
	go post(first, "hang")
	<-u.hanging // the unit is reserved, the call under way
	reserved := time.Now()
	kill()
	for {
		code := post(second, "200")
		elapsed := time.Since(reserved)
		if code == http.StatusOK {
			if elapsed < ttl-250*time.Millisecond {
				t.Fatalf("the dead Caddy's unit came back after %v, before its reservation_ttl %v", elapsed, ttl)
			}
			t.Logf("the unit came back %v after it was reserved (reservation_ttl %v)", elapsed.Round(time.Millisecond), ttl)
			break
		}
		if code != http.StatusServiceUnavailable {
			t.Fatalf("while the dead Caddy's unit is reserved: %d, want 503", code)
		}
		if elapsed > ttl+5*time.Second {
			t.Fatalf("the dead Caddy's unit did not come back %v after it was reserved", elapsed)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// Committed this time: the budget of one is spent.
	if code := post(second, "200"); code != http.StatusServiceUnavailable {
		t.Fatalf("after the committed send: %d, want 503", code)
	}
}

// The text message budget of docs/outcomes.md, as written: failed sends
// cost nothing, and the hour's 500 messages spend the hour's budget (the
// day's, 5,000 in Dhaka, is tested with a fake clock in the stores).
func TestDocsOutcomeSMSBudget(t *testing.T) {
	u := newPaidUpstream(t)
	tester := newTester(t, docOutcomeSite(t, "zone sms_budget {", u.addr), "caddyfile")
	sms := func(answer string) (int, string) {
		code, _, body := do(t, tester, "POST", "/sms/send", "X-Answer", answer)
		return code, body
	}
	for i := range 5 {
		if code, _ := sms("502"); code != http.StatusBadGateway {
			t.Fatalf("failed send #%d: %d, want 502", i+1, code)
		}
	}
	for i := range 500 {
		if code, body := sms("200"); code != http.StatusOK {
			t.Fatalf("message #%d of the hour: %d %q", i+1, code, body)
		}
	}
	before := u.hits.Load()
	code, body := sms("200")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, `"code":"budget_exhausted"`) || !strings.Contains(body, `"scope":"hour"`) {
		t.Fatalf("message 501 of the hour: %d %q, want 503 budget_exhausted by the hour's scope", code, body)
	}
	if u.hits.Load() != before {
		t.Fatal("a message over the budget reached the provider")
	}
	// Other routes of the site are not the budget's.
	if code, _, _ := do(t, tester, "GET", "/status", "X-Answer", "200"); code != http.StatusOK {
		t.Fatalf("another route: %d", code)
	}
}

// slowBudgetSend sends one request with the given upstream answer and delay, and
// gives up on it after abandon (0: never).
func slowBudgetSend(tester *caddytest.Tester, sleep string, abandon time.Duration) int {
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
func TestBudgetRefusedAfterDecisionReleasesOnce(t *testing.T) {
	rounds := func(t *testing.T, tester *caddytest.Tester, u *slowUpstream, refused func() int) {
		t.Helper()
		sent := 0
		for round := range 5 {
			codes := make(chan int, 1)
			go func() { codes <- slowBudgetSend(tester, "400", 0) }()
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
		zone budget_released_once {
			key sms
			rate 2/1h
			algorithm fixed_window
			charge_when status 2xx
			reservation_ttl 1s
			concurrency 1
		}
	}
	reverse_proxy %s`, u.addr)), "caddyfile")
		rounds(t, tester, u, func() int { return slowBudgetSend(tester, "0", 0) })
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
	reverse_proxy %s`, backend, prefix, prefix, u.addr)), "caddyfile")
			// The second request waits for its slot in the queue, and
			// its client leaves before it comes.
			rounds(t, tester, u, func() int { return slowBudgetSend(tester, "0", 200*time.Millisecond) })
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
func TestBudgetKeyFloodMemory(t *testing.T) {
	tester := newTester(t, caddyfileServer(`
	rate_limit {
		zone budget_key_flood {
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
// answer, or a client that reads it slowly) is committed all the same:
// charged when the body ends, its reservation would expire mid-stream and
// the commit at the end would find nothing left to charge.
func TestBudgetStreamOutlivesReservation(t *testing.T) {
	_, addr := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		fmt.Fprint(w, "first tokens ")
		_ = http.NewResponseController(w).Flush()
		select {
		case <-time.After(1300 * time.Millisecond):
		case <-r.Context().Done():
		}
		fmt.Fprint(w, "last tokens")
	})
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
	}`, backend, prefix, addr)), "caddyfile")
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
func TestBudgetResetDropsReservations(t *testing.T) {
	outcomeBackends(t, func(t *testing.T, backend, prefix string) {
		u := newSlowUpstream(t)
		name := prefix + "budget_reset_drops"
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
	reverse_proxy %s`, backend, name, u.addr)), "caddyfile")
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

// A spend budget with a constant key is a gauge, so an alert can fire
// before it runs out: committed units and open reservations are deducted,
// released ones are not; a budget per client makes no series.
func TestBudgetRemainingGauge(t *testing.T) {
	backends := map[string]string{"mem": ""}
	if redistest.Available(t) {
		backends["redis"] = "backend redis {\n\t\t\taddress " + redistest.Standalone(t, "").Addr + "\n\t\t}"
	}
	for name, backend := range backends {
		t.Run(name, func(t *testing.T) { testBudgetRemainingGauge(t, "seeds_gauge_"+name, backend) })
	}
}

func testBudgetRemainingGauge(t *testing.T, zone, backend string) {
	release := make(chan struct{})
	_, addr := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Query().Get("answer") {
		case "fail":
			w.WriteHeader(http.StatusBadGateway)
		case "hold":
			<-release
		}
	})
	newTester(t, caddyfileServer(`
	rate_limit {
		`+backend+`
		zone `+zone+` {
			key sms
			rate 5/1d
			algorithm fixed_window
			charge_when status 2xx
			scope hour {
				rate 4/1h
				charge_when status 2xx
			}
		}
		zone `+zone+`_per_user {
			by header X-User
			rate 5/1d
			charge_when status 2xx
		}
	}
	reverse_proxy `+addr), "caddyfile")
	gauge := func(name, scope string) float64 {
		return metricLine(adminRequest(t, "GET", "/metrics", "", ""), `caddy_rate_limit_budget_`+name+`{scope="`+scope+`",zone="`+zone+`"}`)
	}
	if r, l := gauge("remaining", ""), gauge("limit", ""); r != 5 || l != 5 {
		t.Fatalf("before any request: remaining %v of %v, want 5 of 5", r, l)
	}
	client := &http.Client{Timeout: 10 * time.Second}
	send := func(answer string) int {
		resp, err := client.Get(httpBase + "/send?answer=" + answer)
		if err != nil {
			t.Error(err)
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, answer := range []string{"ok", "fail", "ok"} {
		send(answer)
	}
	if r, h := gauge("remaining", ""), gauge("remaining", "hour"); r != 3 || h != 2 {
		t.Fatalf("after 2 sent and 1 failed: remaining %v (day) and %v (hour), want 3 and 2", r, h)
	}
	if l := gauge("limit", "hour"); l != 4 {
		t.Fatalf("hour budget's limit %v, want 4", l)
	}
	done := make(chan int)
	go func() { done <- send("hold") }()
	eventually(t, "the held request's reservation", func() bool { return gauge("remaining", "") == 2 })
	close(release)
	<-done
	if r := gauge("remaining", ""); r != 2 {
		t.Fatalf("after the held request succeeded: remaining %v, want 2", r)
	}
	if page := adminRequest(t, "GET", "/metrics", "", ""); strings.Contains(page, `caddy_rate_limit_budget_remaining{scope="",zone="`+zone+`_per_user"}`) {
		t.Fatal("a budget keyed per client has a series")
	}
}
