package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
)

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

// A refusal's placeholders are the refusal's own, even when an earlier
// rate_limit handler of the same request allowed it and set the decision
// placeholders first: an error page reports the zone that denied, its
// numbers and its key, never the earlier zone's.
func TestRefusalPlaceholdersAfterAnAllowedHandler(t *testing.T) {
	tester := newTester(t, caddyfileServer(`
	route {
		rate_limit {
			zone deny_ph_first {
				key static
				rate 100/1h
			}
		}
		rate_limit {
			zone deny_ph_second {
				key {http.request.header.X-User}
				rate 1/1h
			}
		}
		respond "ok"
	}
	handle_errors {
		respond "{http.rate_limit.zone} {http.rate_limit.limit} {http.rate_limit.remaining} {http.rate_limit.exceeded.name} {http.rate_limit.exceeded.key} {http.rate_limit.reason} {http.rate_limit.exceeded.retry_after}"
	}`), "caddyfile")

	expectN(t, tester, 1, http.StatusOK, "GET", "/", "X-User", "alice")
	code, retry, body := do(t, tester, "GET", "/", "X-User", "alice")
	if code != http.StatusTooManyRequests {
		t.Fatalf("status %d, want 429", code)
	}
	if want := "deny_ph_second 1 0 deny_ph_second alice rate_limit_exceeded " + retry; body != want {
		t.Fatalf("error page %q, want %q", body, want)
	}
}

// The placeholders of decided requests hold their numbers whether they are
// small (taken from a table made once) or large (converted per request),
// and a 429 is a Caddy error without an error ID or trace: error routes
// see the status and the zone, and {http.error.id} is empty.
func TestDecisionPlaceholdersSmallAndLarge(t *testing.T) {
	const numbers = `{"handler": "headers", "response": {"set": {
		"X-Zone": ["{http.rate_limit.zone}"],
		"X-Limit": ["{http.rate_limit.limit}"],
		"X-Remaining": ["{http.rate_limit.remaining}"],
		"X-Reset": ["{http.rate_limit.reset}"]}}}`
	tester := newTester(t, jsonServer(`{
		"handler": "rate_limit",
		"rate_limits": {"hotpath_numbers": {"key": "static", "cost": "{http.request.header.X-Cost}", "window": "2h", "max_events": 5000}}
	}, `+numbers+`, `+okHandler, `[{"handle": [{"handler": "static_response", "status_code": "{http.error.status_code}",
		"body": "id={http.error.id} trace={http.error.trace} zone={http.rate_limit.exceeded.name} key={http.rate_limit.exceeded.key} retry={http.rate_limit.exceeded.retry_after} remaining={http.rate_limit.remaining} limit={http.rate_limit.limit}"}]}]`), "json")

	for _, step := range []struct {
		cost, limit, remaining, reset string
	}{
		{"1", "5000", "4999", "7200"},   // beyond the table
		{"4000", "5000", "999", "7200"}, // a limit beyond it, a count within it
		{"999", "5000", "0", "7200"},
	} {
		req, _ := http.NewRequest("GET", httpBase+"/", nil)
		req.Header.Set("X-Cost", step.cost)
		resp, err := tester.Client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		h := resp.Header
		if resp.StatusCode != http.StatusOK || h.Get("X-Zone") != "hotpath_numbers" || h.Get("X-Limit") != step.limit || h.Get("X-Remaining") != step.remaining || h.Get("X-Reset") != step.reset {
			t.Fatalf("cost %s: %d zone=%q limit=%q remaining=%q reset=%q; want 200 hotpath_numbers %s %s %s", step.cost, resp.StatusCode,
				h.Get("X-Zone"), h.Get("X-Limit"), h.Get("X-Remaining"), h.Get("X-Reset"), step.limit, step.remaining, step.reset)
		}
	}
	code, ra, body := do(t, tester, "GET", "/", "X-Cost", "1")
	const want = "id= trace= zone=hotpath_numbers key=static retry=7200 remaining=0 limit=5000"
	if code != http.StatusTooManyRequests || ra != "7200" || body != want {
		t.Fatalf("over the limit: %d, Retry-After %q, %q; want 429, 7200, %q", code, ra, body, want)
	}
}

// Two zones share a key and the second denies: the first must not be
// charged for the denied requests (mholt/caddy-ratelimit charges it).
func TestDeniedRequestChargesNoZone(t *testing.T) {
	tester := newTester(t, jsonServer(`{
		"handler": "rate_limit",
		"rate_limits": {
			"aon_site": {"key": "{http.request.remote.host}", "window": "1h", "max_events": 5},
			"aon_upload": {"match": [{"path": ["/upload"]}], "key": "{http.request.remote.host}", "window": "1h", "max_events": 1, "algorithm": "token_bucket"}
		}
	}, `+okHandler, ""), "json")

	expectN(t, tester, 1, http.StatusOK, "POST", "/upload")
	for i := 0; i < 10; i++ {
		expect429(t, tester, 3599, 3600, "POST", "/upload")
	}
	// aon_site was charged once: 4 left for other pages.
	expectN(t, tester, 4, http.StatusOK, "GET", "/page")
	expect429(t, tester, 3599, 3600, "GET", "/page")
}

// handle_errors shapes the 429 and reads the zone's name and the wait.
func TestHandleErrorsPage(t *testing.T) {
	tester := newTester(t, caddyfileServer(`	rate_limit {
		zone errpage_login {
			key {remote_host}
			rate 2/1m
		}
	}
	handle_errors 429 {
		respond "zone={http.rate_limit.exceeded.name} retry={http.rate_limit.exceeded.retry_after} msg={err.message}" 429
	}
	respond "welcome"`), "caddyfile")
	expectN(t, tester, 2, http.StatusOK, "GET", "/")
	body := expect429(t, tester, 59, 60, "GET", "/")
	if !strings.HasPrefix(body, "zone=errpage_login retry=") || !strings.HasSuffix(body, " msg=rate limit exceeded") {
		t.Fatalf("error page %q does not show the zone, the wait and the message", body)
	}
}

func TestShadowZoneNeverDenies(t *testing.T) {
	zone := freshZone("shadow_zone") // Prometheus counters are the process's
	tester := newTester(t, jsonServer(`{
		"handler": "rate_limit",
		"rate_limits": {"`+zone+`": {"key": "static", "window": "1h", "max_events": 1, "shadow": true}}
	}, `+okHandler, ""), "json")
	expectN(t, tester, 5, http.StatusOK, "GET", "/")
	metrics := adminRequest(t, "GET", "/metrics", "", "")
	if !strings.Contains(metrics, `caddy_rate_limit_shadow_declined_requests_total{scope="",zone="`+zone+`"} 4`) {
		t.Fatalf("shadow denials not counted:\n%s", grep(metrics, "shadow"))
	}
}

// A shadow zone refuses nothing: not over its rate, not for a missing
// key, not for its deny list.
func TestShadowZoneRefusesNothing(t *testing.T) {
	tester := newTester(t, jsonServer(`{
		"handler": "rate_limit",
		"rate_limits": {
			"shadow_listed": {"key": "static", "deny": ["127.0.0.0/8", "::1"], "window": "1h", "max_events": 100, "shadow": true},
			"shadow_strict": {"key": "{http.request.header.X-User}", "missing": "deny", "cost": "{http.request.header.X-Cost}", "window": "1h", "max_events": 1, "shadow": true}
		}
	}, `+okHandler, ""), "json")
	expectN(t, tester, 3, http.StatusOK, "GET", "/")
	expectN(t, tester, 3, http.StatusOK, "GET", "/", "X-User", "u", "X-Cost", "lots")
}

// Two zones that both deny: the answer names the one with the longest wait
// and its Retry-After, the earliest time the request can pass. mholt's
// stopped at the first zone that denied (the most permissive first, by its
// sort), so it said "za, 10 s" and denied the retry again for zb.
func TestSeveralZonesDenyLongestWait(t *testing.T) {
	tester := newTester(t, caddyfileServer(`	rate_limit {
		zone several_za {
			key    static
			events 2
			window 10s
		}
		zone several_zb {
			key    static
			events 2
			window 1m
		}
	}
	handle_errors {
		respond "{http.rate_limit.exceeded.name}"
	}
	respond "ok"`), "caddyfile")
	expectN(t, tester, 2, http.StatusOK, "GET", "/")
	if body := expect429(t, tester, 59, 60, "GET", "/"); body != "several_zb" {
		t.Fatalf("exceeded.name %q, want several_zb (the longest wait)", body)
	}
}

// eventRecorder is an event handler module that keeps the events it is
// given, so a test sees what a subscriber of Caddy's events app sees.
type eventRecorder struct{}

var recordedEvents struct {
	sync.Mutex
	got []caddy.Event
}

func init() { caddy.RegisterModule(eventRecorder{}) }

func (eventRecorder) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "events.handlers.event_recorder", New: func() caddy.Module { return new(eventRecorder) }}
}

func (eventRecorder) Handle(_ context.Context, e caddy.Event) error {
	recordedEvents.Lock()
	defer recordedEvents.Unlock()
	recordedEvents.got = append(recordedEvents.got, e)
	return nil
}

// A denial emits the rate_limit_exceeded event with the zone, the scope,
// the wait and the peer's address, as mholt's does, so a subscriber can act
// on it; an allowed request emits nothing.
func TestDenialEmitsEvent(t *testing.T) {
	recordedEvents.Lock()
	recordedEvents.got = nil
	recordedEvents.Unlock()
	tester := newTester(t, withPorts(`{
	"admin": {"listen": "localhost:2999"},
	"logging": {"logs": {"default": {"level": "ERROR"}}},
	"apps": {
		"events": {"subscriptions": [{"events": ["rate_limit_exceeded"], "handlers": [{"handler": "event_recorder"}]}]},
		"http": {"http_port": 9080, "servers": {"srv": {
			"listen": [":9080"],
			"routes": [{"handle": [
				{"handler": "rate_limit", "rate_limits": {"denial_event": {"key": "{http.request.remote.host}", "window": "1m", "max_events": 2}}},
				`+okHandler+`
			]}]
		}}}
	}
}`), "json")
	expectN(t, tester, 2, http.StatusOK, "GET", "/")
	recordedEvents.Lock()
	n := len(recordedEvents.got)
	recordedEvents.Unlock()
	if n != 0 {
		t.Fatalf("%d events for allowed requests", n)
	}
	expect429(t, tester, 59, 60, "GET", "/")
	recordedEvents.Lock()
	defer recordedEvents.Unlock()
	if len(recordedEvents.got) != 1 {
		t.Fatalf("%d events for one denial, want 1", len(recordedEvents.got))
	}
	e := recordedEvents.got[0]
	wait, _ := e.Data["wait"].(time.Duration)
	if e.Name() != "rate_limit_exceeded" || e.Origin() == nil || e.Origin().CaddyModule().ID != "http.handlers.rate_limit" ||
		e.Data["zone"] != "denial_event" || e.Data["scope"] != "" || e.Data["remote_ip"] != "127.0.0.1" ||
		wait <= 59*time.Second || wait > time.Minute {
		t.Fatalf("event %s from %v: %v; want rate_limit_exceeded from http.handlers.rate_limit, zone denial_event, scope \"\", remote_ip 127.0.0.1, a wait just under 1m", e.Name(), e.Origin(), e.Data)
	}
}

// Requests refused as invalid (no usable key, an unreadable cost) charge
// no limit: a client's typos do not use up its quota.
func TestInvalidRequestsChargeNothing(t *testing.T) {
	tester := newTester(t, caddyfileServer(`
	rate_limit {
		zone seeds_invalid_ip {
			by ip
			rate 3/1m
			cost {http.request.header.X-Units}
		}
		zone seeds_invalid_phone {
			by json phone
			normalize phone BD
			missing deny
			rate 3/10m
		}
	}
	respond "ok"`), "caddyfile")
	for i, body := range []string{`{}`, `{"phone":"not a number"}`, `{"phone":"017"}`, `not json`, `{"phone":["01712345678"]}`} {
		wantStatus(t, fmt.Sprintf("invalid request #%d", i+1), postFull(t, tester, "/otp", body), 400, 0, 0)
	}
	wantStatus(t, "unreadable cost", postFull(t, tester, "/otp", `{"phone":"01712345678"}`, "X-Units", "lots"), 400, 0, 0)
	for i, phone := range []string{"01712345678", "01812345678", "01912345678"} {
		wantStatus(t, fmt.Sprintf("valid request #%d", i+1), postFull(t, tester, "/otp", `{"phone":"`+phone+`"}`), 200, 0, 0)
	}
	wantStatus(t, "4th valid request", postFull(t, tester, "/otp", `{"phone":"01612345678"}`), 429, 59, 60)
}
