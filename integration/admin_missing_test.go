package integration

import (
	"net/http"
	"strings"
	"testing"
)

// Requests without a usable key share one bucket ("missing shared"). No
// key names it, so the admin API and the command name it as /missing: an
// operator can inspect it, give it units and unblock its clients as for
// any key, without touching the keys of named clients.
func TestAdminMissingBucket(t *testing.T) {
	name := freshZone("admin_missing")
	tester := newTester(t, adminConfig(name, "", "v1"), "json")
	expectN(t, tester, 3, http.StatusOK, "GET", "/")
	expect429(t, tester, 3599, 3600, "GET", "/")
	expectN(t, tester, 1, http.StatusOK, "GET", "/", "X-User", "bob")

	ls := keyOp(t, "GET", "/rate_limit/zones/"+name+"/missing")
	if len(ls) != 1 || ls[0].Scope != "" || ls[0].Key != "" || ls[0].Remaining != 0 {
		t.Fatalf("inspect missing: %+v, want the own limit's empty key, spent", ls)
	}
	if ls := keyOp(t, "POST", "/rate_limit/zones/"+name+"/missing/grant?units=1"); ls[0].Remaining != 1 {
		t.Fatalf("grant 1 to missing: %+v", ls)
	}
	expectN(t, tester, 1, http.StatusOK, "GET", "/")
	expect429(t, tester, 3599, 3600, "GET", "/")

	out, err := runCaddy(t, "rate-limit", "reset", name, "--missing", "--address", adminAddr)
	if err != nil || !strings.Contains(out, "3 of 3") {
		t.Fatalf("caddy rate-limit reset %s --missing: %v\n%s", name, err, out)
	}
	expectN(t, tester, 3, http.StatusOK, "GET", "/")
	expect429(t, tester, 3599, 3600, "GET", "/")
	if got := remaining(t, name, "bob"); got != 2 {
		t.Fatalf("bob: %d remaining, want 2: the keyless bucket is not his", got)
	}

	for _, tc := range []struct {
		method, path string
		want         int
	}{
		{"GET", "/rate_limit/zones/" + name + "/missing?form=final", 400},
		{"GET", "/rate_limit/zones/" + name + "/missing?scope=nope", 404},
		{"PUT", "/rate_limit/zones/" + name + "/missing", 405},
		{"GET", "/rate_limit/zones/no_such_zone/missing", 404},
	} {
		if code, body := adminCall(t, tc.method, tc.path); code != tc.want {
			t.Errorf("%s %s: %d %s, want %d", tc.method, tc.path, code, body, tc.want)
		}
	}
}

// A zone whose key is a constant is never missing: naming its keyless
// bucket is an error, not an empty answer.
func TestAdminMissingConstantKey(t *testing.T) {
	name := freshZone("admin_missing_const")
	newTester(t, jsonServer(`{"handler": "rate_limit", "rate_limits": {"`+name+`": {
		"key": "static", "window": "1h", "max_events": 3}}}, `+okHandler, ""), "json")
	if code, body := adminCall(t, "GET", "/rate_limit/zones/"+name+"/missing"); code != http.StatusBadRequest || !strings.Contains(body, "constant") {
		t.Fatalf("missing of a constant key: %d %s, want 400", code, body)
	}
}
