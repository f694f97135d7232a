package integration

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddytest"
)

// Lock-outs through a real Caddy proxying to a login application, on the
// memory store and on a real Redis. The integration harness has no
// injected clock, so the steps are short (1s 2s 4s) and the tests poll
// the admin API for a lock-out's end; the escalation on a fake clock with
// the real steps (1m 5m 24h) is in the package's and the stores' tests.

type lockoutState struct {
	Remaining    int64
	RetryAfter   float64 `json:"retry_after"`
	LockoutLevel int32   `json:"lockout_level"`
	LockedOut    float64 `json:"locked_out"`
}

// lockoutOf reads the key's state through the admin API. A 503 (Redis
// slower than the backend's timeout on a loaded machine) is asked again.
func lockoutOf(t *testing.T, zone, key string) lockoutState {
	t.Helper()
	var code int
	var body string
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		code, body = adminCall(t, "GET", "/rate_limit/zones/"+zone+"/keys/"+key)
		if code != http.StatusServiceUnavailable || time.Now().After(deadline) {
			break
		}
	}
	var v struct{ Limits []lockoutState }
	if code != http.StatusOK || json.Unmarshal([]byte(body), &v) != nil || len(v.Limits) != 1 {
		t.Fatalf("inspect %s %s: %d %s", zone, key, code, body)
	}
	return v.Limits[0]
}

// waitUnlocked polls the admin API until the key's lock-out has ended.
func waitUnlocked(t *testing.T, zone, key string) {
	t.Helper()
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if lockoutOf(t, zone, key).LockedOut == 0 {
			return
		}
	}
	t.Fatalf("%s %s still locked out after 15s", zone, key)
}

// wrongRetry sends a wrong password that must be refused with 429 and
// Retry-After want, without reaching the application.
func wrongRetry(t *testing.T, tester *caddytest.Tester, u *loginUpstream, want string) {
	t.Helper()
	before := u.wrong.Load()
	code, ra, body := do(t, tester, "POST", "/login", "X-Password", "wrong")
	if code != http.StatusTooManyRequests || ra != want || u.wrong.Load() != before {
		t.Fatalf("wrong password: %d Retry-After %q (%q), reached the application: %v; want 429 Retry-After %s without reaching it", code, ra, body, u.wrong.Load() != before, want)
	}
}

// lockedLogin is a login site of zone (a limit of 3 failures with opts)
// whose address has failed 3 times and then been locked out for 1s.
func lockedLogin(t *testing.T, backend, zone, opts string) (*caddytest.Tester, *loginUpstream) {
	t.Helper()
	u := newLoginUpstream(t, false)
	tester := loginSite(t, backend, zone, opts, u)
	for range 3 {
		if got := login(t, tester, "wrong"); got != http.StatusUnauthorized {
			t.Fatalf("wrong password: %d, want 401", got)
		}
	}
	wrongRetry(t, tester, u, "1")
	return tester, u
}

// Escalation 1s → 2s → 4s → 4s: each time the address is denied again
// after a lock-out ended (the three failures still fill the window), the
// next lock-out is longer, and the last repeats. 50 wrong passwords at
// once during a lock-out are all refused, none reaching the application
// nor escalating. The admin API shows the lock-out, and a reset lifts it.
func TestLockoutEscalation(t *testing.T) {
	outcomeBackends(t, func(t *testing.T, backend, prefix string) {
		zone := prefix + "lockout_esc"
		tester, u := lockedLogin(t, backend, zone, "rate 3/1m\n\t\t\tcount_when status 401\n\t\t\tlockout 1s 2s 4s")
		if st := lockoutOf(t, zone, "127.0.0.1"); st.LockoutLevel != 1 || st.LockedOut <= 0 || st.LockedOut > 1 || st.Remaining != 0 {
			t.Fatalf("admin API during the first lock-out: %+v", st)
		}
		for _, want := range []string{"2", "4", "4"} {
			waitUnlocked(t, zone, "127.0.0.1")
			wrongRetry(t, tester, u, want)
		}

		// 50 wrong passwords at once during the 4s lock-out.
		var wg sync.WaitGroup
		var refused, other atomic.Int64
		for range 50 {
			wg.Go(func() {
				req, _ := http.NewRequest("POST", httpBase+"/login", nil)
				req.Header.Set("X-Password", "wrong")
				resp, err := tester.Client.Do(req)
				if err != nil {
					other.Add(1)
					return
				}
				resp.Body.Close()
				if secs, err := strconv.Atoi(resp.Header.Get("Retry-After")); resp.StatusCode == http.StatusTooManyRequests && err == nil && secs >= 1 && secs <= 4 {
					refused.Add(1)
				} else {
					other.Add(1)
				}
			})
		}
		wg.Wait()
		st := lockoutOf(t, zone, "127.0.0.1")
		if refused.Load() != 50 || other.Load() != 0 || u.wrong.Load() != 3 || st.LockoutLevel != 3 {
			t.Fatalf("flood during a lock-out: %d refused with Retry-After ≤ 4, %d other, application saw %d wrong passwords, level %d; want 50, 0, 3, level 3",
				refused.Load(), other.Load(), u.wrong.Load(), st.LockoutLevel)
		}

		// An operator's reset lifts the lock-out with the failures.
		code, body := adminCall(t, "DELETE", "/rate_limit/zones/"+zone+"/keys/127.0.0.1")
		if code != http.StatusOK {
			t.Fatalf("reset: %d %s", code, body)
		}
		if st := lockoutOf(t, zone, "127.0.0.1"); st.LockoutLevel != 0 || st.LockedOut != 0 || st.Remaining != 3 {
			t.Fatalf("after the reset: %+v", st)
		}
		if got := login(t, tester, "right"); got != http.StatusOK {
			t.Fatalf("right password after the reset: %d, want 200", got)
		}
	})
}

// A good password (reset_when) clears the level with the failures: the
// next lock-out is the first step again, not the third. The window is
// short enough (3 per 3s) to have room again once the second lock-out
// ends, so the good password can reach the application.
func TestLockoutResetWhenClearsLevel(t *testing.T) {
	outcomeBackends(t, func(t *testing.T, backend, prefix string) {
		zone := prefix + "lockout_reset"
		tester, u := lockedLogin(t, backend, zone, "rate 3/3s\n\t\t\tcount_when status 401\n\t\t\treset_when status 2xx\n\t\t\tlockout 1s 2s 1h")
		waitUnlocked(t, zone, "127.0.0.1")
		wrongRetry(t, tester, u, "2")
		waitUnlocked(t, zone, "127.0.0.1")
		if got := login(t, tester, "right"); got != http.StatusOK {
			t.Fatalf("right password once the lock-out ended and the window emptied: %d, want 200", got)
		}
		if st := lockoutOf(t, zone, "127.0.0.1"); st.LockoutLevel != 0 {
			t.Fatalf("level %d after a good password, want 0", st.LockoutLevel)
		}
		for range 3 {
			if got := login(t, tester, "wrong"); got != http.StatusUnauthorized {
				t.Fatalf("wrong password after the good one: %d, want 401", got)
			}
		}
		wrongRetry(t, tester, u, "1") // the first step again, not 1h
	})
}

// Lock-outs that cannot work are refused when the config loads, naming
// the option.
func TestLockoutConfigErrors(t *testing.T) {
	for _, tc := range []struct{ name, opts, want string }{
		{"decreasing", "rate 3/1m\n\t\t\tlockout 5m 1m", "lockout: each step must be at least as long as the one before"},
		{"zero", "rate 3/1m\n\t\t\tlockout 0s", "lockout: step 1 must be positive"},
		{"shadow", "rate 3/1m\n\t\t\tlockout 1m\n\t\t\tshadow", "lockout: a shadow zone never denies"},
		{"queue", "rate 3/1m\n\t\t\talgorithm leaky_bucket\n\t\t\tmax_delay 1s\n\t\t\tlockout 1m", "lockout cannot be used with max_delay"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assertLoadError(t, caddyfileServer("rate_limit {\n\t\tzone lockout_bad {\n\t\t\tby ip\n\t\t\t"+tc.opts+"\n\t\t}\n\t}\n\trespond \"ok\""), "caddyfile", tc.want)
		})
	}
}

// The login with lock-outs of docs/outcomes.md, as written.
func TestDocsOutcomeLockout(t *testing.T) {
	t.Setenv("SLUICE_KEY_SECRET", "an-example-secret-of-32-bytes!!!")
	addr, hits := bodyUpstream(t, `"password":"right"`, http.StatusUnauthorized)
	tester := newTester(t, docOutcomeSite(t, "lockout 1m 5m 24h", addr), "caddyfile")
	attempt := func(user, password string) (int, string) {
		req, _ := http.NewRequest("POST", httpBase+"/login", strings.NewReader(`{"username":"`+user+`","password":"`+password+`"}`))
		req.Header.Set("Content-Type", "application/json")
		resp, err := tester.Client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode, resp.Header.Get("Retry-After")
	}
	for i := range 5 {
		if code, _ := attempt("Nadia", "wrong"); code != http.StatusUnauthorized {
			t.Fatalf("failure #%d: %d, want 401", i+1, code)
		}
	}
	before := hits.Load()
	if code, ra := attempt(" nadia", "wrong"); code != http.StatusTooManyRequests || ra != "60" {
		t.Fatalf("sixth failure: %d Retry-After %q, want 429 and 60", code, ra)
	}
	var wg sync.WaitGroup
	var refused atomic.Int64
	for range 50 {
		wg.Go(func() {
			if code, ra := attempt("NADIA", "wrong"); code == http.StatusTooManyRequests && (ra == "60" || ra == "59") {
				refused.Add(1)
			}
		})
	}
	wg.Wait()
	if code, _ := attempt("nadia", "right"); code != http.StatusTooManyRequests || refused.Load() != 50 || hits.Load() != before {
		t.Fatalf("during the lock-out: right password %d, %d of 50 wrong ones refused, application reached %d times; want 429, 50, 0",
			code, refused.Load(), hits.Load()-before)
	}
	if code, _ := attempt("karim", "right"); code != http.StatusOK {
		t.Fatalf("another username: %d, want 200", code)
	}
	if code, body := adminCall(t, "DELETE", "/rate_limit/zones/login/keys/Nadia"); code != http.StatusOK {
		t.Fatalf("reset: %d %s", code, body)
	}
	if code, _ := attempt("nadia", "right"); code != http.StatusOK {
		t.Fatalf("after an operator's reset: %d, want 200", code)
	}
}
