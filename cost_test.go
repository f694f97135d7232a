package sluice

import (
	"errors"
	"math"
	"net/http"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"

	"github.com/sluicehq/sluice/keys"
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
