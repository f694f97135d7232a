package sluice

import (
	"errors"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/sluicehq/sluice/internal/keys"
)

// A placeholder cost: absent costs 1; given twice or unreadable is an
// error, never a cost of 1.
func TestCostEval(t *testing.T) {
	tests := []struct {
		name, cost, ctype, body string
		header                  []string
		want                    int64
		err                     error // nil: no error; errNotWhole: not a whole number
	}{
		{"constant", "7", "", "", nil, 7, nil},
		{"json", "{http.request.body.json.tokens}", "application/json", `{"tokens": 1000}`, nil, 1000, nil},
		{"json exponent", "{http.request.body.json.tokens}", "application/json", `{"tokens": 1e3}`, nil, 1000, nil},
		{"json string", "{http.request.body.json.tokens}", "application/json", `{"tokens": " 12 "}`, nil, 12, nil},
		{"absent", "{http.request.body.json.tokens}", "application/json", `{"prompt": "hi"}`, nil, 1, nil},
		{"null", "{http.request.body.json.tokens}", "application/json", `{"tokens": null}`, nil, 1, nil},
		{"no body", "{http.request.body.json.tokens}", "", "", nil, 1, nil},
		{"huge", "{http.request.body.json.tokens}", "application/json", `{"tokens": 1e30}`, nil, math.MaxInt64, nil},
		{"duplicated", "{http.request.body.json.tokens}", "application/json", `{"tokens": 1, "tokens": 1000}`, nil, 0, keys.ErrAmbiguous},
		{"BOM", "{http.request.body.json.tokens}", "application/json", "\uFEFF{\"tokens\": 1000}", nil, 0, keys.ErrUnreadable},
		{"over the limit", "{http.request.body.json.tokens}", "application/json", `{"tokens": 1000, "pad": "` + strings.Repeat("x", 100) + `"}`, nil, 0, keys.ErrUnreadable},
		{"wrong type", "{http.request.body.json.tokens}", "text/plain", `{"tokens": 1000}`, nil, 0, keys.ErrUnreadable},
		{"invalid JSON", "{http.request.body.json.tokens}", "application/json", `{"tokens": 1000`, nil, 0, keys.ErrUnreadable},
		{"header", "{http.request.header.X-Cost}", "", "", []string{"X-Cost", "3"}, 3, nil},
		{"absent header", "{http.request.header.X-Cost}", "", "", nil, 1, nil},
		{"repeated header", "{http.request.header.X-Cost}", "", "", []string{"X-Cost", "1", "X-Cost", "1000"}, 0, keys.ErrAmbiguous},
		{"fraction", "{http.request.body.json.tokens}", "application/json", `{"tokens": 1.5}`, nil, 0, errNotWhole},
		{"negative", "{http.request.body.json.tokens}", "application/json", `{"tokens": -1}`, nil, 0, errNotWhole},
		// An estimate made of parts: the prompt's tokens plus max_tokens.
		{"sum", "{http.request.header.X-Input-Tokens} + {http.request.body.json.max_tokens}", "application/json", `{"max_tokens": 4000}`, []string{"X-Input-Tokens", "1000"}, 5000, nil},
		{"sum with a number", "{http.request.body.json.max_tokens}+1000", "application/json", `{"max_tokens": 4000}`, nil, 5000, nil},
		{"sum, one absent", "{http.request.header.X-Input-Tokens}+{http.request.body.json.max_tokens}", "application/json", `{"max_tokens": 4000}`, nil, 4000, nil},
		{"sum, all absent", "{http.request.header.X-Input-Tokens}+{http.request.body.json.max_tokens}", "application/json", `{}`, nil, 1, nil},
		{"sum, a number and an absent", "{http.request.body.json.max_tokens}+1000", "application/json", `{}`, nil, 1000, nil},
		{"sum saturates", "{http.request.body.json.max_tokens}+{http.request.header.X-Input-Tokens}", "application/json", `{"max_tokens": 1e30}`, []string{"X-Input-Tokens", "5"}, math.MaxInt64, nil},
		{"sum, a bad term", "{http.request.header.X-Input-Tokens}+{http.request.body.json.max_tokens}", "application/json", `{"max_tokens": 4000}`, []string{"X-Input-Tokens", "5k"}, 0, errNotWhole},
		{"sum, a negative term", "{http.request.header.X-Input-Tokens}+{http.request.body.json.max_tokens}", "application/json", `{"max_tokens": -4000}`, []string{"X-Input-Tokens", "5000"}, 0, errNotWhole},
		{"sum, a repeated term", "{http.request.header.X-Input-Tokens}+{http.request.body.json.max_tokens}", "application/json", `{"max_tokens": 4000}`, []string{"X-Input-Tokens", "1", "X-Input-Tokens", "2"}, 0, keys.ErrAmbiguous},
	}
	for _, tt := range tests {
		c, err := ParseCost(tt.cost)
		if err != nil {
			t.Fatal(err)
		}
		r, _ := http.NewRequest("POST", "/", strings.NewReader(tt.body))
		if tt.ctype != "" {
			r.Header.Set("Content-Type", tt.ctype)
		}
		repl := caddy.NewEmptyReplacer()
		for i := 0; i+1 < len(tt.header); i += 2 {
			r.Header.Add(tt.header[i], tt.header[i+1])
			repl.Set("http.request.header."+tt.header[i], tt.header[i+1])
		}
		got, err := c.eval(r, repl, keys.ReadBody(r, 64, nil))
		switch {
		case tt.err == errNotWhole:
			if err == nil || !strings.Contains(err.Error(), "not a whole number") {
				t.Errorf("%s: %d, %v; want not a whole number", tt.name, got, err)
			}
		case got != tt.want || (tt.err == nil) != (err == nil) || tt.err != nil && !errors.Is(err, tt.err):
			t.Errorf("%s: %d, %v; want %d, %v", tt.name, got, err, tt.want, tt.err)
		}
	}
}

var errNotWhole = errors.New("not a whole number")

// A sum's parts are each a number or a placeholder; a part that is
// neither, or negative, is a config error.
func TestParseCostSum(t *testing.T) {
	for _, bad := range []string{"{http.request.header.A}+", "+{http.request.header.A}", "{http.request.header.A}+-3", "{http.request.header.A}++1", "1+x"} {
		if _, err := ParseCost(bad); err == nil {
			t.Errorf("cost %q accepted", bad)
		}
	}
	c, err := ParseCost("{http.request.body.json.max_tokens} + {http.request.header.Content-Length}")
	if err != nil {
		t.Fatal(err)
	}
	if !c.needsBody() || len(c.terms) != 2 {
		t.Fatalf("sum %+v: needs body %v, %d terms", c, c.needsBody(), len(c.terms))
	}
	b, _ := c.MarshalJSON()
	if string(b) != `"{http.request.body.json.max_tokens} + {http.request.header.Content-Length}"` {
		t.Fatalf("JSON %s", b)
	}
}

// The least a sum costs is its numbers, saturating; a cost that is not a
// sum has none.
func TestCostLeast(t *testing.T) {
	for expr, want := range map[string]int64{
		"6+6":                           12,
		"{http.request.header.A}+11":    11,
		"5+{http.request.header.A}+3+3": 11,
		"{http.request.header.A}":       0,
		"7":                             0,
		"9223372036854775807+1":         math.MaxInt64,
	} {
		c, err := ParseCost(expr)
		if err != nil {
			t.Fatalf("%s: %v", expr, err)
		}
		if got := c.least(); got != want {
			t.Errorf("%s: least %d, want %d", expr, got, want)
		}
	}
}

// cost_min raises an estimate below it to it, and leaves one above it as
// it is: a chunked prompt without max_tokens reserves the floor, one with
// max_tokens its bytes plus max_tokens.
func TestCostMinFloor(t *testing.T) {
	h, cleanup, err := provisionJSON([]byte(`{"body_limit": 65536, "rate_limits": {"cost_min_floor": {"key": "k", "max_events": 100000, "window": "1h", "algorithm": "fixed_window",
		"cost": "{http.request.body.size}+{http.request.body.json.max_tokens}", "cost_min": 4096}}}`), func() int64 { return fuzzStart })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cleanup)
	left := int64(100000)
	for _, tc := range []struct {
		name, body string
		chunked    bool
		want       int64
	}{
		{"chunked, no max_tokens", `{"messages": "hi"}`, true, 4096},
		{"no body", "", false, 4096},
		{"max_tokens 0", `{"max_tokens": 0}`, false, 4096},
		{"chunked, max_tokens", `{"max_tokens": 5000, "m": "` + strings.Repeat("x", 971) + `"}`, true, 6000},
		{"declared, max_tokens", `{"max_tokens": 5000, "m": "` + strings.Repeat("x", 971) + `"}`, false, 6000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, r := benchRequest(t, "http://example.com/v1/chat", "192.0.2.7:4242")
			r.Method = http.MethodPost
			r.Header.Set("Content-Type", "application/json")
			r.Body, r.ContentLength = io.NopCloser(strings.NewReader(tc.body)), int64(len(tc.body))
			if tc.chunked {
				r.ContentLength = -1
			}
			var got []byte
			next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
				got, _ = io.ReadAll(r.Body)
				return nil
			})
			if err := h.ServeHTTP(httptest.NewRecorder(), r, next); err != nil {
				t.Fatal(err)
			}
			if string(got) != tc.body {
				t.Fatalf("the next handler got %d bytes of the %d-byte body", len(got), len(tc.body))
			}
			repl := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
			left -= tc.want
			if remaining, _ := repl.GetString(phRemaining); remaining != strconv.FormatInt(left, 10) {
				t.Fatalf("%s left, want %d (%d taken)", remaining, left, tc.want)
			}
		})
	}
}

// cost_min is refused where it cannot work, naming the option.
func TestCostMinConfigErrors(t *testing.T) {
	for _, tc := range []struct{ name, fields, want string }{
		{"no cost", `"cost_min": 5`, "cost_min applies to a cost read from the request"},
		{"constant cost", `"cost": 3, "cost_min": 5`, "cost_min applies to a cost read from the request"},
		{"negative", `"cost": "{http.request.body.size}", "cost_min": -1`, "cost_min must be at least 1, got -1"},
		{"above the limit", `"cost": "{http.request.body.size}", "cost_min": 1001`, "cost_min 1001 can never pass: the limit holds at most 1000 units (raise max_events)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, cleanup, err := provisionJSON([]byte(`{"rate_limits": {"cost_min_bad": {"key": "k", "max_events": 1000, "window": "1h", `+tc.fields+`}}}`), nil)
			if err == nil {
				cleanup()
				t.Fatal("provisioned")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q, want %q", err, tc.want)
			}
		})
	}
}

// A placeholder written with a default, as in {name:default}, is refused:
// Caddy's replacer has no such syntax at run time, and it would read as a
// field no request has, costing 0.
func TestCostPlaceholderDefaultRefused(t *testing.T) {
	for _, s := range []string{"{http.request.body.json.max_tokens:4096}", "{http.request.body.size}+{http.request.body.json.max_tokens:4096}"} {
		if _, err := ParseCost(s); err == nil || !strings.Contains(err.Error(), "has no default syntax") {
			t.Errorf("cost %q: %v, want it refused for its default", s, err)
		}
	}
}
