package sluice

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/internal/keys"
)

// refuseRecorded runs respond for f under a handler answering with
// respond, and returns the response, the error and the log.
func refuseRecorded(t *testing.T, respond, method string, f refusal) (*httptest.ResponseRecorder, *caddy.Replacer, []observer.LoggedEntry, error) {
	t.Helper()
	core, logs := observer.New(zapcore.DebugLevel)
	h := &plan{Handler: &Handler{Respond: respond, LogKey: true}, denyLog: zap.New(core)}
	repl := caddy.NewReplacer()
	r := httptest.NewRequest(method, "http://example.com/otp", nil)
	r = r.WithContext(context.WithValue(r.Context(), caddy.ReplacerCtxKey, repl))
	rec := httptest.NewRecorder()
	err := h.respond(rec, r, &f)
	return rec, repl, logs.All(), err
}

func TestRefusalPaths(t *testing.T) {
	z := &zone{Zone: &Zone{}, name: "otp_send"}
	quota := &zone{Zone: &Zone{}, name: "otp_send", status: 402}
	ip := &limit{Limit: &Limit{}, zone: z, scope: "ip"}
	secret := errors.New("key is missing: {http.request.body.json.phone}: absent")
	// Scopes with statuses of their own: a monthly quota under a zone of
	// 429, a 503 under a zone of 402.
	monthly := &limit{Limit: &Limit{Status: 402}, zone: z, scope: "monthly"}
	shed := &limit{Limit: &Limit{Status: 503}, zone: quota, scope: "shed"}
	if monthly.provisionStatus(429) != nil || shed.provisionStatus(402) != nil {
		t.Fatal("provisionStatus")
	}
	tests := []struct {
		name   string
		f      refusal
		status int
		code   string
		retry  string // Retry-After, and the body's retry_after
	}{
		{"rate limited", refusal{reason: reasonRateLimited, zone: z, limit: ip, retryAfter: 42, key: "hmac:x"}, 429, "rate_limit_exceeded", "42"},
		{"quota of another status", refusal{reason: reasonRateLimited, zone: quota, retryAfter: 7}, 402, "rate_limit_exceeded", "7"},
		{"cost that never passes", refusal{reason: reasonRateLimited, zone: z, retryAfter: -1}, 429, "rate_limit_exceeded", ""},
		{"a scope's quota", refusal{reason: monthly.denyReason, zone: z, limit: monthly, retryAfter: 86400}, 402, "quota_exceeded", "86400"},
		{"a quota that never passes", refusal{reason: monthly.denyReason, zone: z, limit: monthly, retryAfter: -1}, 402, "quota_exceeded", ""},
		{"a scope's own status", refusal{reason: shed.denyReason, zone: quota, limit: shed, retryAfter: 3}, 503, "rate_limit_exceeded", "3"},
		{"backend down", refusal{reason: reasonUnavailable, zone: z, retryAfter: 1}, 503, "backend_unavailable", "1"},
		{"missing key", refusal{reason: reasonMissingKey, zone: z, retryAfter: -1, detail: secret}, 400, "missing_key", ""},
		{"bad cost", refusal{reason: reasonBadCost, zone: z, retryAfter: -1, detail: fmt.Errorf("cost {http.request.header.X-Units}: %w", keys.ErrAmbiguous)}, 400, "bad_cost", ""},
		{"deny list", refusal{reason: reasonDenylisted, zone: z, retryAfter: -1}, 403, "denylisted", ""},
	}
	for _, tt := range tests {
		for _, respond := range []string{"", RespondJSON, RespondProblem, RespondText} {
			t.Run(tt.name+"/"+respond, func(t *testing.T) {
				rec, repl, logs, err := refuseRecorded(t, respond, "GET", tt.f)
				h := rec.Header()
				if h.Get("Cache-Control") != "no-store" || h.Get("Retry-After") != tt.retry {
					t.Fatalf("Cache-Control %q, Retry-After %q", h.Get("Cache-Control"), h.Get("Retry-After"))
				}
				// The placeholders an error page reads are always set.
				wantRetry := tt.retry
				if wantRetry == "" {
					wantRetry = "-1"
				}
				denylisted := ""
				if tt.code == "denylisted" {
					denylisted = "otp_send"
				}
				for ph, want := range map[string]string{phReason: tt.code, phName: "otp_send", phScope: tt.f.scope(), phRetryAfter: wantRetry, phDenylisted: denylisted} {
					if got, ok := repl.GetString(ph); !ok || got != want {
						t.Fatalf("{%s} = %q (set %v), want %q", ph, got, ok, want)
					}
				}
				if tt.code != "rate_limit_exceeded" {
					for _, ph := range []string{phKey, phZone, phLimit, phRemaining, phReset} {
						if _, ok := repl.GetString(ph); !ok {
							t.Fatalf("{%s} not set", ph)
						}
					}
				}
				if len(logs) != 1 || logs[0].ContextMap()["reason"] != tt.code || logs[0].ContextMap()["zone"] != "otp_send" {
					t.Fatalf("log: %v", logs)
				}
				if respond == "" {
					he, ok := err.(caddyhttp.HandlerError)
					if !ok || he.StatusCode != tt.status || rec.Body.Len() != 0 {
						t.Fatalf("error %#v, body %q: want a caddyhttp.Error %d and no body", err, rec.Body, tt.status)
					}
					if msg := he.Err.Error(); strings.Contains(msg, "{") || strings.Contains(msg, "otp_send") {
						t.Fatalf("{http.error.message} %q shows the config", msg)
					}
					return
				}
				if err != nil || rec.Code != tt.status {
					t.Fatalf("err %v, status %d", err, rec.Code)
				}
				body := rec.Body.String()
				if strings.Contains(body, "{http") || strings.Contains(body, "phone") || strings.Contains(body, "X-Units") || strings.Contains(body, "hmac") {
					t.Fatalf("body %q shows the config or the key", body)
				}
				var doc map[string]any
				switch respond {
				case RespondText:
					if h.Get("Content-Type") != "text/plain; charset=utf-8" || !strings.HasSuffix(body, ".\n") || strings.Contains(body, "quota") != (tt.code == "quota_exceeded") {
						t.Fatalf("%q %q", h.Get("Content-Type"), body)
					}
					return
				case RespondJSON:
					var env struct{ Error map[string]any }
					if json.Unmarshal([]byte(body), &env) != nil || h.Get("Content-Type") != "application/json" {
						t.Fatalf("%q %q", h.Get("Content-Type"), body)
					}
					doc = env.Error
					if doc["code"] != tt.code || doc["zone"] != "otp_send" || doc["message"] == "" {
						t.Fatalf("body %q", body)
					}
				case RespondProblem:
					if json.Unmarshal([]byte(body), &doc) != nil || h.Get("Content-Type") != "application/problem+json" || doc["status"] != float64(tt.status) {
						t.Fatalf("%q %q", h.Get("Content-Type"), body)
					}
				}
				if got := fmt.Sprint(doc["retry_after"]); tt.retry != "" && got != tt.retry || tt.retry == "" && doc["retry_after"] != nil {
					t.Fatalf("retry_after %v, want %q", doc["retry_after"], tt.retry)
				}
			})
		}
	}
}

func TestRefusalHeadHasNoBody(t *testing.T) {
	rec, _, _, err := refuseRecorded(t, RespondJSON, "HEAD", refusal{reason: reasonRateLimited, zone: &zone{Zone: &Zone{}, name: "z"}, retryAfter: 3})
	if err != nil || rec.Code != 429 || rec.Body.Len() != 0 || rec.Header().Get("Content-Length") == "0" {
		t.Fatalf("HEAD: %d %q %v", rec.Code, rec.Body, rec.Header())
	}
}

func TestProblemNamesViolatedPolicies(t *testing.T) {
	z := &zone{Zone: &Zone{}, name: "login"}
	own, ip := &limit{Limit: &Limit{}, zone: z}, &limit{Limit: &Limit{}, zone: z, scope: "ip"}
	rec, _, _, _ := refuseRecorded(t, RespondProblem, "GET", refusal{reason: reasonRateLimited, zone: z, retryAfter: 9, violated: []*limit{own, ip}})
	var doc struct {
		Type     string
		Violated []string `json:"violated-policies"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &doc); err != nil || doc.Type != problemQuotaExceeded || strings.Join(doc.Violated, ",") != "login,login.ip" {
		t.Fatalf("%s", rec.Body)
	}
}

// BenchmarkRefuse is a refusal's own cost, body included: what a flood of
// denied requests pays on top of deciding them.
func BenchmarkRefuse(b *testing.B) {
	z := &zone{Zone: &Zone{}, name: "api"}
	z.nameValue = z.name
	for _, respond := range []string{"", RespondJSON, RespondProblem, RespondText} {
		b.Run("respond="+respond, func(b *testing.B) {
			h := &plan{Handler: &Handler{Respond: respond}, denyLog: zap.NewNop()}
			repl := caddy.NewReplacer()
			r := httptest.NewRequest("GET", "http://example.com/", nil)
			r = r.WithContext(context.WithValue(r.Context(), caddy.ReplacerCtxKey, repl))
			w := headerWriter{http.Header{}}
			f := refusal{reason: reasonRateLimited, zone: z, limit: &limit{Limit: &Limit{}, zone: z, scope: "ip", scopeName: "ip"}, retryAfter: 42}
			fresh := freshReplacer(r)
			b.ReportAllocs()
			for b.Loop() {
				fresh()
				_ = h.respond(w, r, &f)
			}
		})
	}
}

// Zone names are the operator's, but any of them makes valid JSON.
func TestAppendJSONString(t *testing.T) {
	for _, s := range []string{"api", `a"b`, `back\slash`, "<script>&", "ঢাকা", "tab\there", "nul\x00", "bad\xffutf8", ""} {
		var got string
		b := appendJSONString(nil, s)
		if err := json.Unmarshal(b, &got); err != nil || got != strings.ToValidUTF8(s, "\uFFFD") {
			t.Errorf("%q: %s read back as %q (%v)", s, b, got, err)
		}
	}
}

// BenchmarkStaticResponse is Caddy's `respond "ok"` handler on the same
// request, the yardstick of the deny path: go test -run '^$' -bench
// 'StaticResponse|ContractServeHTTP' -benchmem .
func BenchmarkStaticResponse(b *testing.B) {
	_, r := benchRequest(b, "http://example.com/", "192.0.2.7:4242")
	w := headerWriter{http.Header{}}
	s := caddyhttp.StaticResponse{Body: "ok"}
	b.ReportAllocs()
	for b.Loop() {
		_ = s.ServeHTTP(w, r, okHandler)
	}
}

// Caddy's header replacements edit header values in place: one refusal's
// edited headers must not reach the next refusal's.
func TestRefusalHeadersAreTheResponsesOwn(t *testing.T) {
	f := refusal{reason: reasonRateLimited, zone: &zone{Zone: &Zone{}, name: "z"}, retryAfter: 3}
	first, _, _, _ := refuseRecorded(t, RespondJSON, "GET", f)
	for _, vals := range first.Header() {
		vals[0] = "edited"
		_ = append(vals, "more")
	}
	second, _, _, _ := refuseRecorded(t, RespondJSON, "GET", f)
	h := second.Header()
	if h.Get("Cache-Control") != "no-store" || h.Get("Content-Type") != "application/json" || h.Get("Retry-After") != "3" {
		t.Fatalf("second refusal's headers: %v", h)
	}
}

// A refusal's placeholders are read from a provider, which Caddy consults
// after the values an earlier handler set: a denial after an allowed
// decision in the same request must still report its own numbers.
func TestRefusalPlaceholdersWinOverEarlierOnes(t *testing.T) {
	z := &zone{Zone: &Zone{}, name: "login"}
	z.nameValue = z.name
	l := &limit{Limit: &Limit{}, zone: z, scope: "ip", zoneName: z.name, scopeName: "ip"}
	f := refusal{reason: reasonRateLimited, zone: z, limit: l, retryAfter: 9, key: "192.0.2.7", quota: 5, remaining: 0, reset: 5000}
	want := map[string]string{
		phReason: "rate_limit_exceeded", phName: "login", phScope: "ip", phRetryAfter: "9", phDenylisted: "",
		phKey: "192.0.2.7", phZone: "login", phLimit: "5", phRemaining: "0", phReset: "5000",
	}
	for _, earlier := range []bool{false, true} {
		h := &plan{Handler: &Handler{Respond: RespondJSON}, denyLog: zap.NewNop()}
		repl := caddy.NewReplacer()
		if earlier {
			setPlaceholders(repl, &limit{Limit: &Limit{}, zone: &zone{Zone: &Zone{}, name: "api"}, zoneName: "api"}, algorithms.Result{Allowed: true, Limit: 100, Remaining: 99, ResetAfter: int64(time.Second)})
			repl.Set(phKey, "stale")
		}
		r := httptest.NewRequest("GET", "http://example.com/", nil)
		r = r.WithContext(context.WithValue(r.Context(), caddy.ReplacerCtxKey, repl))
		if err := h.respond(httptest.NewRecorder(), r, &f); err != nil {
			t.Fatal(err)
		}
		for ph, v := range want {
			if got, ok := repl.GetString(ph); !ok || got != v {
				t.Errorf("earlier values %v: {%s} = %q (known %v), want %q", earlier, ph, got, ok, v)
			}
		}
		if got := repl.ReplaceAll("{http.rate_limit.unknown}|{system.slash}", "-"); got != "-|/" {
			t.Errorf("earlier values %v: other placeholders read %q", earlier, got)
		}
	}
}
