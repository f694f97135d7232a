package integration

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
)

// The admin API takes the methods it names, spelled in full: a request
// whose method is a fragment of one ("ST", "POS", "G") is a 405 and
// changes nothing.
func TestAttack3AdminMethodsExact(t *testing.T) {
	tester := newTester(t, jsonServer(`{
		"handler": "rate_limit",
		"rate_limits": {"a3_methods": {"key": "{http.request.header.X-User}", "window": "1h", "max_events": 3}}
	}, `+okHandler, ""), "json")
	expectN(t, tester, 3, http.StatusOK, "GET", "/", "X-User", "m")
	base := "/rate_limit/zones/a3_methods/keys/m"
	for _, m := range []string{"ST", "POS", "P", "OST"} {
		if code, body := adminCall(t, m, base+"/grant?units=2"); code != http.StatusMethodNotAllowed {
			t.Errorf("%s .../grant: %d %s, want 405", m, code, body)
		}
	}
	for _, m := range []string{"G", "ET", "DEL", "E"} {
		if code, body := adminCall(t, m, base); code != http.StatusMethodNotAllowed {
			t.Errorf("%s .../keys/m: %d %s, want 405", m, code, body)
		}
	}
	if ls := keyOp(t, "GET", base); ls[0].Remaining != 0 {
		t.Fatalf("after the refused methods: %+v, want nothing given back", ls)
	}
}

// The command reaches the keys "." and "..": as path segments an HTTP
// client or server would resolve them away (and the command would ask for
// another endpoint).
func TestAttack3CommandDotKeys(t *testing.T) {
	tester := newTester(t, jsonServer(`{
		"handler": "rate_limit",
		"rate_limits": {"a3_dots": {"key": "{http.request.header.X-User}", "window": "1h", "max_events": 3}}
	}, `+okHandler, ""), "json")
	for _, k := range []string{".", ".."} {
		expectN(t, tester, 3, http.StatusOK, "GET", "/", "X-User", k)
		for _, args := range [][]string{
			{"inspect", "a3_dots", k},
			{"grant", "a3_dots", k, "1"},
			{"reset", "a3_dots", k},
		} {
			out, err := runCaddy(t, append(append([]string{"rate-limit"}, args...), "--address", adminAddr)...)
			if err != nil || !strings.Contains(out, "a3_dots") {
				t.Fatalf("caddy rate-limit %v: %v\n%s", args, err, out)
			}
		}
		expectN(t, tester, 3, http.StatusOK, "GET", "/", "X-User", k)
	}
}

// A request whose keys Redis cannot decide (here a key of another type)
// fails alone: its failures are Redis's answers, not an outage, so they do
// not open the circuit breaker on every other key of the fleet.
func TestAttack3RedisKeyFailureFailsOnlyItself(t *testing.T) {
	addr, c := perfRedis(t)
	tester := newTester(t, caddyfileServerWith(fmt.Sprintf(`	rate_limit {
		backend redis {
			address %s
			timeout 10s
		}
	}`, addr), `	rate_limit {
		zone a3_poison {
			by header X-Key
			rate 100/1h
			algorithm token_bucket
			fail closed
		}
	}
	respond "ok"`), "caddyfile")
	if err := c.HSet(t.Context(), "sluice:a3_poison//b{poison}", "f", "1").Err(); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		if code, _, _ := do(t, tester, "GET", "/", "X-Key", "poison"); code != http.StatusServiceUnavailable {
			t.Fatalf("the poisoned key: %d, want 503 (fail closed)", code)
		}
	}
	for i := range 5 {
		if code, _, _ := do(t, tester, "GET", "/", "X-Key", fmt.Sprintf("healthy%d", i)); code != http.StatusOK {
			t.Fatalf("a healthy key after the poisoned one failed: %d, want 200", code)
		}
	}
}
