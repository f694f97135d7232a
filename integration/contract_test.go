package integration

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddytest"
	"github.com/dunglas/httpsfv"
)

// response is one answer: status, headers, body.
type response struct {
	code   int
	header http.Header
	body   string
}

func fetch(t *testing.T, tester *caddytest.Tester, method, path string, header ...string) response {
	t.Helper()
	req, err := http.NewRequest(method, httpBase+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := tester.Client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return response{resp.StatusCode, resp.Header, string(body)}
}

// sfItem is one item of a RateLimit or RateLimit-Policy field, parsed back
// with the structured-field parser.
type sfItem struct {
	name   string
	params map[string]any
}

func parseSFList(t *testing.T, h http.Header, field string) []sfItem {
	t.Helper()
	values := h.Values(field)
	if len(values) == 0 {
		return nil
	}
	list, err := httpsfv.UnmarshalList(values)
	if err != nil {
		t.Fatalf("%s: %q is not a structured-field list: %v", field, values, err)
	}
	var items []sfItem
	for _, m := range list {
		it, ok := m.(httpsfv.Item)
		if !ok {
			t.Fatalf("%s: %q holds an inner list", field, values)
		}
		name, ok := it.Value.(string)
		if !ok {
			t.Fatalf("%s: %q: item %v is not a String", field, values, it.Value)
		}
		p := map[string]any{}
		for _, k := range it.Params.Names() {
			p[k], _ = it.Params.Get(k)
		}
		items = append(items, sfItem{name, p})
	}
	return items
}

func intParam(t *testing.T, it sfItem, k string) int64 {
	t.Helper()
	v, ok := it.params[k].(int64)
	if !ok {
		t.Fatalf("item %q: parameter %s is %#v, want an Integer", it.name, k, it.params[k])
	}
	return v
}

// rateLimit is the one item of the RateLimit field.
func rateLimit(t *testing.T, r response) sfItem {
	t.Helper()
	items := parseSFList(t, r.header, "RateLimit")
	if len(items) != 1 {
		t.Fatalf("RateLimit: %q, want one item", r.header.Values("RateLimit"))
	}
	return items[0]
}

// Every algorithm sends its quota, window, remaining units and reset time
// as the draft's structured fields and as X-RateLimit-*, on allowed and
// denied responses, and on a denial t is Retry-After.
func TestRateLimitHeadersEveryAlgorithm(t *testing.T) {
	type want struct {
		q, w       int64
		tLo, tHi   int64 // t after the first request
		raLo, raHi int64 // Retry-After of the denial
	}
	cases := map[string]struct {
		opts string
		want
	}{
		// 4 per 8 s: one event leaves the window 8 s after it happened.
		"sliding_window": {"", want{4, 8, 8, 8, 7, 8}},
		// The counter's reset and retry depend on where in its window the
		// test falls.
		"sliding_window_counter": {"algorithm sliding_window_counter", want{4, 8, 1, 16, 1, 16}},
		"fixed_window":           {"algorithm fixed_window", want{4, 8, 1, 8, 1, 8}},
		// A token every 2 s: one used comes back in 2 s; w is the time the
		// whole bucket takes to refill.
		"token_bucket": {"algorithm token_bucket", want{4, 8, 2, 2, 1, 2}},
		"gcra":         {"algorithm gcra", want{4, 8, 2, 2, 1, 2}},
		"leaky_bucket": {"algorithm leaky_bucket", want{4, 8, 2, 2, 1, 2}},
		// A bucket of 2 at 4 per 8 s is full again 4 s after it is empty.
		"token_bucket_burst": {"algorithm token_bucket\n\t\t\tburst 2", want{2, 4, 2, 2, 1, 2}},
	}
	site := "\trate_limit {\n\t\theaders both\n"
	for name, c := range cases {
		site += "\t\tzone hdr_alg_" + name + " {\n\t\t\tmatch {\n\t\t\t\tpath /" + name + "\n\t\t\t}\n\t\t\tkey static\n\t\t\trate 4/8s\n\t\t\t" + c.opts + "\n\t\t}\n"
	}
	tester := newTester(t, caddyfileServer(site+"\t}\n\trespond \"ok\""), "caddyfile")

	for name, c := range cases {
		zone := "hdr_alg_" + name
		for i := int64(1); i <= c.q+1; i++ {
			r := fetch(t, tester, "GET", "/"+name)
			allowed := i <= c.q
			if allowed != (r.code == http.StatusOK) || !allowed && r.code != http.StatusTooManyRequests {
				t.Fatalf("%s #%d: status %d", name, i, r.code)
			}
			policy := parseSFList(t, r.header, "RateLimit-Policy")
			if len(policy) != 1 || policy[0].name != zone || intParam(t, policy[0], "q") != c.q || intParam(t, policy[0], "w") != c.w || len(policy[0].params) != 2 {
				t.Fatalf("%s #%d: RateLimit-Policy %q, want %q;q=%d;w=%d", name, i, r.header.Get("RateLimit-Policy"), zone, c.q, c.w)
			}
			rl := rateLimit(t, r)
			remaining, reset := intParam(t, rl, "r"), intParam(t, rl, "t")
			if rl.name != zone || remaining != max(c.q-i, 0) {
				t.Fatalf("%s #%d: RateLimit %q, want %q with r=%d", name, i, r.header.Get("RateLimit"), zone, max(c.q-i, 0))
			}
			switch {
			case i == 1 && (reset < c.tLo || reset > c.tHi):
				t.Fatalf("%s #1: t=%d, want %d to %d", name, reset, c.tLo, c.tHi)
			case !allowed:
				ra, err := strconv.ParseInt(r.header.Get("Retry-After"), 10, 64)
				if err != nil || ra < c.raLo || ra > c.raHi || reset != ra {
					t.Fatalf("%s denied: Retry-After %q, t=%d; want t = Retry-After, from %d to %d", name, r.header.Get("Retry-After"), reset, c.raLo, c.raHi)
				}
			}
			legacy := []string{strconv.FormatInt(c.q, 10), strconv.FormatInt(remaining, 10), strconv.FormatInt(reset, 10)}
			got := []string{r.header.Get("X-RateLimit-Limit"), r.header.Get("X-RateLimit-Remaining"), r.header.Get("X-RateLimit-Reset")}
			if strings.Join(got, " ") != strings.Join(legacy, " ") {
				t.Fatalf("%s #%d: X-RateLimit-Limit, -Remaining, -Reset = %q, want %q", name, i, got, legacy)
			}
		}
	}
}

// Several zones and scopes: every enforcing limit is in RateLimit-Policy,
// RateLimit reports the closest to denying, and a zone with headers none
// (a login) is in no field; when it is the one that denies, no RateLimit
// is sent at all.
func TestRateLimitHeadersSeveralZonesHideOne(t *testing.T) {
	tester := newTester(t, caddyfileServer(`
	rate_limit {
		headers draft
		zone hdr_multi_api {
			key static
			rate 10/1m
			algorithm token_bucket
			scope per_ip {
				by ip
				rate 6/1m
			}
		}
		zone hdr_multi_login {
			match {
				path /login
			}
			key static
			rate 2/1m
			headers none
		}
		zone hdr_multi_shadow {
			key static
			rate 1/1h
			shadow
		}
	}
	respond "ok"`), "caddyfile")

	wantPolicy := `"hdr_multi_api";q=10;w=60, "hdr_multi_api.per_ip";q=6;w=60`
	check := func(r response, code int, rl string) {
		t.Helper()
		if r.code != code {
			t.Fatalf("status %d, want %d", r.code, code)
		}
		// Re-serialized by the library: the field is what the draft says.
		list, err := httpsfv.UnmarshalList(r.header.Values("RateLimit-Policy"))
		if err != nil {
			t.Fatal(err)
		}
		if s, _ := httpsfv.Marshal(list); s != wantPolicy {
			t.Fatalf("RateLimit-Policy %q, want %q", s, wantPolicy)
		}
		if got := r.header.Get("RateLimit"); got != rl {
			t.Fatalf("RateLimit %q, want %q", got, rl)
		}
		for k, v := range r.header {
			if strings.Contains(strings.Join(v, ","), "login") || strings.Contains(strings.Join(v, ","), "shadow") {
				t.Fatalf("header %s: %q names a hidden or shadow zone", k, v)
			}
		}
	}
	// The per-IP scope has 5 of 6 left, the zone 9 of 10: the scope is
	// closer to denying. Its sliding window is whole again 60 s after its
	// newest event.
	check(fetch(t, tester, "GET", "/x"), 200, `"hdr_multi_api.per_ip";r=5;t=60`)
	check(fetch(t, tester, "GET", "/login"), 200, `"hdr_multi_api.per_ip";r=4;t=60`)
	check(fetch(t, tester, "GET", "/login"), 200, `"hdr_multi_api.per_ip";r=3;t=60`)
	// The login zone denies: Retry-After is its wait; the policies are
	// sent, but no RateLimit: the other limits' numbers would tell a
	// client reading them that it has quota left.
	r := fetch(t, tester, "GET", "/login")
	if ra, _ := strconv.Atoi(r.header.Get("Retry-After")); ra < 59 || ra > 60 {
		t.Fatalf("login denial: Retry-After %q", r.header.Get("Retry-After"))
	}
	check(r, 429, "")
	check(fetch(t, tester, "GET", "/x"), 200, `"hdr_multi_api.per_ip";r=2;t=60`)
	check(fetch(t, tester, "GET", "/x"), 200, `"hdr_multi_api.per_ip";r=1;t=60`)
	// The token bucket of the zone is now the closer: 4 of 10 left after
	// the scope's 6 (and it refills a token every 6 s).
	check(fetch(t, tester, "GET", "/x"), 200, `"hdr_multi_api.per_ip";r=0;t=60`)
	// The scope denies: t is its Retry-After, the time until its oldest
	// event leaves the window.
	r = fetch(t, tester, "GET", "/x")
	check(r, 429, `"hdr_multi_api.per_ip";r=0;t=`+r.header.Get("Retry-After"))
	if ra, _ := strconv.Atoi(r.header.Get("Retry-After")); ra < 59 || ra > 60 {
		t.Fatalf("scope denial: Retry-After %q, want 60", r.header.Get("Retry-After"))
	}
}

// A zone that hashes its keys sends the HMAC as the partition key; one that
// does not never sends its key. The default sends no field at all, as
// mholt/caddy-ratelimit does.
func TestRateLimitHeadersPartitionKeyAndDefault(t *testing.T) {
	t.Setenv("SLUICE_TEST_PK_SECRET", "a-secret-of-enough-length")
	tester := newTester(t, caddyfileServer(`
	rate_limit /hashed {
		headers draft
		zone hdr_pk_hashed {
			by header X-User
			hash {env.SLUICE_TEST_PK_SECRET}
			rate 5/1m
		}
	}
	rate_limit /plain {
		headers draft
		zone hdr_pk_plain {
			by header X-User
			rate 5/1m
		}
	}
	rate_limit /default {
		zone hdr_pk_default {
			key static
			rate 1/1m
		}
	}
	respond "ok"`), "caddyfile")

	pk := func(user string) []byte {
		r := fetch(t, tester, "GET", "/hashed", "X-User", user)
		for _, field := range []string{"RateLimit-Policy", "RateLimit"} {
			items := parseSFList(t, r.header, field)
			if len(items) != 1 {
				t.Fatalf("%s: %q", field, r.header.Values(field))
			}
			b, ok := items[0].params["pk"].([]byte)
			if !ok || len(b) != 32 {
				t.Fatalf("%s: %q, want a 32-byte partition key", field, r.header.Values(field))
			}
			if field == "RateLimit" {
				return b
			}
		}
		return nil
	}
	alice, alice2, bob := pk("alice"), pk("alice"), pk("bob")
	if string(alice) != string(alice2) || string(alice) == string(bob) {
		t.Fatalf("partition keys: alice %x, alice again %x, bob %x", alice, alice2, bob)
	}
	r := fetch(t, tester, "GET", "/plain", "X-User", "carol")
	if h := r.header.Get("RateLimit-Policy") + r.header.Get("RateLimit"); strings.Contains(h, ";pk=") || strings.Contains(h, "carol") {
		t.Fatalf("an unhashed key must not be sent: %q", h)
	}
	for i := 0; i < 2; i++ {
		r := fetch(t, tester, "GET", "/default")
		for k := range r.header {
			if strings.Contains(strings.ToLower(k), "ratelimit") {
				t.Fatalf("default (headers none), status %d: header %s sent", r.code, k)
			}
		}
	}
}

// The built-in bodies: JSON, problem details and text, with no-store, the
// zone's own status, and nothing of the config.
func TestRespondBuiltInBodies(t *testing.T) {
	site := func(format string) string {
		return `
	rate_limit /` + format + `/* {
		respond ` + format + `
		zone resp_` + format + ` {
			match {
				path /` + format + `/limited
			}
			key static
			rate 1/1h
		}
		zone resp_` + format + `_quota {
			match {
				path /` + format + `/quota
			}
			key static
			rate 1/1h
			status 402
		}
		zone resp_` + format + `_id {
			match {
				path /` + format + `/id
			}
			by header X-Secret-Id
			missing deny
			rate 100/1h
		}
		zone resp_` + format + `_cost {
			match {
				path /` + format + `/cost
			}
			key static
			rate 10/1h
			cost {http.request.header.X-Units}
		}
		zone resp_` + format + `_deny {
			match {
				path /` + format + `/banned
			}
			key static
			rate 10/1h
			deny 127.0.0.0/8 ::1
		}
	}`
	}
	tester := newTester(t, caddyfileServer(site("json")+site("problem")+site("text")+"\n\trespond \"ok\""), "caddyfile")

	type expect struct {
		path       string
		header     []string
		status     int
		code       string // the JSON body's error code
		retryAfter bool
	}
	for _, format := range []string{"json", "problem", "text"} {
		zone := "resp_" + format
		if r := fetch(t, tester, "GET", "/"+format+"/limited"); r.code != 200 {
			t.Fatalf("%s: first request %d", format, r.code)
		}
		if r := fetch(t, tester, "GET", "/"+format+"/quota"); r.code != 200 {
			t.Fatalf("%s: first request %d", format, r.code)
		}
		for _, e := range []expect{
			{path: "/limited", status: 429, code: "rate_limit_exceeded", retryAfter: true},
			{path: "/quota", status: 402, code: "quota_exceeded", retryAfter: true},
			{path: "/cost", header: []string{"X-Units", "11"}, status: 429, code: "rate_limit_exceeded"},
			{path: "/id", status: 400, code: "missing_key"},
			{path: "/id", header: []string{"X-Secret-Id", "a"}, status: 200},
			{path: "/cost", header: []string{"X-Units", "lots"}, status: 400, code: "bad_cost"},
			{path: "/banned", status: 403, code: "denylisted"},
		} {
			r := fetch(t, tester, "GET", "/"+format+e.path, e.header...)
			what := format + " " + e.path + " " + strings.Join(e.header, "=")
			if r.code != e.status {
				t.Fatalf("%s: status %d (%q), want %d", what, r.code, r.body, e.status)
			}
			if e.status == 200 {
				continue
			}
			if cc := r.header.Get("Cache-Control"); cc != "no-store" {
				t.Fatalf("%s: Cache-Control %q, want no-store", what, cc)
			}
			ra := r.header.Get("Retry-After")
			if e.retryAfter != (ra != "") {
				t.Fatalf("%s: Retry-After %q", what, ra)
			}
			if strings.Contains(r.body, "{") && strings.Contains(r.body, "http.") || strings.Contains(r.body, "X-Secret-Id") || strings.Contains(r.body, "X-Units") {
				t.Fatalf("%s: body %q shows the config", what, r.body)
			}
			ctype := r.header.Get("Content-Type")
			switch format {
			case "text":
				if ctype != "text/plain; charset=utf-8" || !strings.HasSuffix(r.body, ".\n") || e.retryAfter && !strings.Contains(r.body, "Retry in "+ra+map[bool]string{true: " second.", false: " seconds"}[ra == "1"]) {
					t.Fatalf("%s: %q %q", what, ctype, r.body)
				}
			case "json":
				var doc struct {
					Error struct {
						Code       string `json:"code"`
						Message    string `json:"message"`
						RetryAfter *int   `json:"retry_after"`
						Zone       string `json:"zone"`
					} `json:"error"`
				}
				if err := json.Unmarshal([]byte(r.body), &doc); err != nil || ctype != "application/json" {
					t.Fatalf("%s: %q %q: %v", what, ctype, r.body, err)
				}
				wantZone := zone + map[string]string{"/limited": "", "/quota": "_quota", "/cost": "_cost", "/id": "_id", "/banned": "_deny"}[e.path]
				if doc.Error.Code != e.code || doc.Error.Message == "" || doc.Error.Zone != wantZone ||
					e.retryAfter != (doc.Error.RetryAfter != nil) || e.retryAfter && strconv.Itoa(*doc.Error.RetryAfter) != ra {
					t.Fatalf("%s: %q, want code %s, zone %s, retry_after = Retry-After", what, r.body, e.code, wantZone)
				}
			case "problem":
				var doc map[string]any
				if err := json.Unmarshal([]byte(r.body), &doc); err != nil || ctype != "application/problem+json" {
					t.Fatalf("%s: %q %q: %v", what, ctype, r.body, err)
				}
				wantType := "about:blank"
				if e.code == "rate_limit_exceeded" || e.code == "quota_exceeded" {
					wantType = "https://iana.org/assignments/http-problem-types#quota-exceeded"
					if v, _ := doc["violated-policies"].([]any); len(v) != 1 || !strings.HasPrefix(v[0].(string), zone) {
						t.Fatalf("%s: violated-policies in %q", what, r.body)
					}
				}
				if doc["type"] != wantType || doc["status"] != float64(e.status) || doc["detail"] == "" {
					t.Fatalf("%s: %q, want type %s and status %d", what, r.body, wantType, e.status)
				}
			}
		}
	}
}

// Without respond, every refusal is a Caddy error: handle_errors shapes the
// page, every placeholder it reads is set (retry_after too, -1 when waiting
// cannot help, so a JSON page stays valid), and the error message names
// nothing of the config.
func TestRefusalsGoThroughHandleErrors(t *testing.T) {
	tester := newTester(t, caddyfileServer(`
	rate_limit {
		zone refuse_he_id {
			match {
				path /id
			}
			by header X-Secret-Id
			missing deny
			rate 100/1h
		}
		zone refuse_he_cost {
			match {
				path /cost
			}
			key static
			rate 10/1h
			cost {http.request.header.X-Units}
		}
		zone refuse_he_deny {
			match {
				path /banned
			}
			key static
			rate 10/1h
			deny 127.0.0.0/8 ::1
		}
		zone refuse_he_limit {
			match {
				path /limited
			}
			key static
			rate 1/1h
		}
	}
	handle_errors {
		header Content-Type application/json
		respond `+"`"+`{"status":{http.error.status_code},"reason":"{http.rate_limit.reason}","zone":"{http.rate_limit.exceeded.name}","retry_after":{http.rate_limit.exceeded.retry_after},"message":"{http.error.message}"}`+"`"+`
	}
	respond "ok"`), "caddyfile")

	expectN(t, tester, 1, 200, "GET", "/limited")
	for _, c := range []struct {
		path   string
		header []string
		status int
		reason string
		zone   string
		retry  bool
	}{
		{"/id", nil, 400, "missing_key", "refuse_he_id", false},
		{"/cost", []string{"X-Units", "lots"}, 400, "bad_cost", "refuse_he_cost", false},
		{"/cost", []string{"X-Units", "99999999999999999999"}, 429, "rate_limit_exceeded", "refuse_he_cost", false},
		{"/banned", nil, 403, "denylisted", "refuse_he_deny", false},
		{"/limited", nil, 429, "rate_limit_exceeded", "refuse_he_limit", true},
	} {
		r := fetch(t, tester, "GET", c.path, c.header...)
		var page struct {
			Status     int    `json:"status"`
			Reason     string `json:"reason"`
			Zone       string `json:"zone"`
			RetryAfter int    `json:"retry_after"`
			Message    string `json:"message"`
		}
		if err := json.Unmarshal([]byte(r.body), &page); err != nil {
			t.Fatalf("%s: error page %q is not JSON: %v", c.path, r.body, err)
		}
		ra := r.header.Get("Retry-After")
		if r.code != c.status || page.Status != c.status || page.Reason != c.reason || page.Zone != c.zone ||
			c.retry != (page.RetryAfter > 0) || !c.retry && page.RetryAfter != -1 || c.retry && strconv.Itoa(page.RetryAfter) != ra {
			t.Fatalf("%s %q: %d %q (Retry-After %q)", c.path, c.header, r.code, r.body, ra)
		}
		if strings.Contains(page.Message, "http.") || strings.Contains(page.Message, "X-") || strings.Contains(page.Message, "refuse_he") || page.Message == "" {
			t.Fatalf("%s: message %q shows the config", c.path, page.Message)
		}
		if r.header.Get("Cache-Control") != "no-store" {
			t.Fatalf("%s: Cache-Control %q", c.path, r.header.Get("Cache-Control"))
		}
	}
	metrics := adminRequest(t, "GET", "/metrics", "", "")
	for _, want := range []string{
		`caddy_rate_limit_refused_requests_total{reason="missing_key",zone="refuse_he_id"} 1`,
		`caddy_rate_limit_refused_requests_total{reason="bad_cost",zone="refuse_he_cost"} 1`,
		`caddy_rate_limit_refused_requests_total{reason="rate_limit_exceeded",zone="refuse_he_cost"} 1`,
		`caddy_rate_limit_refused_requests_total{reason="denylisted",zone="refuse_he_deny"} 1`,
		`caddy_rate_limit_refused_requests_total{reason="rate_limit_exceeded",zone="refuse_he_limit"} 1`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %s:\n%s", want, grep(metrics, "refused"))
		}
	}
}

// A missing key's built-in body says which way the value was unusable,
// never where the limit reads it.
func TestRespondMissingKeyReasons(t *testing.T) {
	tester := newTester(t, caddyfileServer(`
	rate_limit {
		respond json
		zone resp_missing_number {
			by json phone
			normalize phone BD
			missing deny
			rate 3/10m
		}
	}
	respond "sent"`), "caddyfile")
	for bad, reason := range map[string]string{
		`{"mobile": "01712345678"}`:        "it is missing",
		`{"phone": "hello"}`:               "it is not valid",
		`phone=01712345678`:                "the body cannot be read",
		`{"phone": "017", "phone": "018"}`: "given more than once",
	} {
		code, body := post(t, tester, "/", "application/json", bad)
		var doc struct {
			Error struct{ Code, Message string }
		}
		if code != http.StatusBadRequest || json.Unmarshal([]byte(body), &doc) != nil || doc.Error.Code != "missing_key" ||
			!strings.Contains(doc.Error.Message, reason) || strings.Contains(body, "phone") {
			t.Fatalf("body %s: %d %q; want 400 saying %q and not where the key is read", bad, code, body, reason)
		}
	}
}

// A zone that fails closed answers 503 through the same path when its
// backend cannot decide: the built-in body with Retry-After and no-store.
func TestRespondBackendUnavailable(t *testing.T) {
	tester := newTester(t, caddyfileServer(`
	rate_limit {
		respond problem
		backend redis {
			address 127.0.0.1:1
			timeout 50ms
		}
		zone resp_closed {
			key static
			rate 10/1m
			fail closed
		}
	}
	respond "ok"`), "caddyfile")
	r := fetch(t, tester, "GET", "/")
	var doc map[string]any
	if r.code != http.StatusServiceUnavailable || json.Unmarshal([]byte(r.body), &doc) != nil ||
		doc["type"] != "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity" ||
		r.header.Get("Retry-After") == "" || r.header.Get("Cache-Control") != "no-store" {
		t.Fatalf("%d %q %v", r.code, r.body, r.header)
	}
}

// A config error points at the option's line, not at its zone's.
func TestConfigErrorNamesTheOptionsLine(t *testing.T) {
	cfg := caddyfileServer(`
	rate_limit {
		zone line_of_option {
			key static
			rate 10/1m
			algorithm tokenbucket
		}
	}
	respond "ok"`)
	line := 0
	for i, l := range strings.Split(cfg, "\n") {
		if strings.Contains(l, "algorithm tokenbucket") {
			line = i + 1
		}
	}
	assertLoadError(t, cfg, "caddyfile", `tokenbucket\" (choose one of`)
	assertLoadError(t, cfg, "caddyfile", "Caddyfile:"+strconv.Itoa(line)+`"}`)
}

// A header replacement on one site's refusals (Caddy edits header values
// in place) leaves every other refusal's headers as they were.
func TestRefusalHeadersSurviveAnotherRoutesEdits(t *testing.T) {
	tester := newTester(t, caddyfileServer(`
	header /edit/* {
		Cache-Control no-store private
		defer
	}
	rate_limit {
		respond json
		zone resp_edit {
			key {path}
			rate 1/1h
		}
	}
	respond "ok"`), "caddyfile")
	for _, path := range []string{"/edit/a", "/plain/a", "/edit/b", "/plain/b"} {
		expectN(t, tester, 1, 200, "GET", path)
		r := fetch(t, tester, "GET", path)
		want := "no-store"
		if strings.HasPrefix(path, "/edit/") {
			want = "private"
		}
		if r.code != 429 || r.header.Get("Cache-Control") != want {
			t.Fatalf("%s: %d, Cache-Control %q, want %q", path, r.code, r.header.Get("Cache-Control"), want)
		}
	}
}

// The fields go out spelled as the draft and the older convention spell
// them (RateLimit-Policy, not Go's canonical Ratelimit-Policy).
func TestRateLimitHeaderNamesAsSpelled(t *testing.T) {
	newTester(t, caddyfileServer(`
	rate_limit {
		headers both
		zone hdr_spelling {
			key static
			rate 10/1m
		}
	}
	@hidden path /hidden
	header @hidden -RateLimit*
	header @hidden -X-RateLimit-*
	respond "ok"`), "caddyfile")
	head := func(path string) string {
		conn, err := net.Dial("tcp", strings.TrimPrefix(httpBase, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n", path)
		conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		raw, _ := io.ReadAll(conn)
		h, _, _ := strings.Cut(string(raw), "\r\n\r\n")
		return h
	}
	names := []string{"RateLimit-Policy", "RateLimit", "X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset"}
	h := head("/")
	for _, name := range names {
		if !strings.Contains(h, "\r\n"+name+": ") {
			t.Errorf("no field spelled %q in\n%s", name, h)
		}
	}
	// Caddy's wildcard deletes, which ignore case, still remove them.
	if h := head("/hidden"); strings.Contains(strings.ToLower(h), "ratelimit") {
		t.Errorf("header -RateLimit* left a field:\n%s", h)
	}
}
