package sluice

import (
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
)

func TestCheckLease(t *testing.T) {
	base := func() Limit {
		return Limit{Key: "{http.request.header.X-Key}", MaxEvents: 1000, Window: caddy.Duration(time.Minute), Lease: 10}
	}
	for _, c := range []struct {
		name string
		edit func(l *Limit)
		want string // "" accepts
	}{
		{"one percent", func(l *Limit) {}, ""},
		{"above one percent", func(l *Limit) { l.Lease = 11 }, "lease 11 is more than 1% of rate 1000/1m (10)"},
		{"hours", func(l *Limit) { l.Window = caddy.Duration(time.Hour); l.Lease = 50 }, "lease 50 is more than 1% of rate 1000/1h (10)"},
		{"odd window", func(l *Limit) { l.Window = caddy.Duration(90 * time.Minute); l.Lease = 50 }, "rate 1000/1h30m"},
		{"small rate", func(l *Limit) { l.MaxEvents = 199; l.Lease = 2 }, "lease 2 is more than 1% of rate 199/1m (1)"},
		{"negative", func(l *Limit) { l.Lease = -3 }, "lease must be at least 2"},
		{"one", func(l *Limit) { l.Lease = 1 }, "lease 1 takes one unit"},
		{"fail closed", func(l *Limit) { l.Fail = FailClosed }, "fails closed"},
		{"fail local", func(l *Limit) { l.Fail = FailLocal }, ""},
		{"body", func(l *Limit) { l.Key = "{http.request.body.json.user}" }, "request body"},
		{"whole body", func(l *Limit) { l.Key = "{http.request.body}" }, "request body"},
		{"whole body base64", func(l *Limit) { l.Key = "k:{http.request.body_base64}" }, "request body"},
		{"phone", func(l *Limit) { l.Normalize = []Normalize{{Name: "phone", Region: "BD"}} }, "normalized as phone"},
		{"credentials", func(l *Limit) { l.Normalize = []Normalize{{Name: "credentials"}} }, "normalized as credentials"},
		{"lower", func(l *Limit) { l.Normalize = []Normalize{{Name: "lower"}} }, ""},
		{"hash", func(l *Limit) { l.Hash = "{env.SECRET}" }, "hashed key"},
		{"leaky", func(l *Limit) { l.Algorithm = "leaky_bucket" }, "leaky_bucket"},
		{"burst", func(l *Limit) { l.Algorithm = "gcra"; l.Burst = 9 }, "lease 10 is more than burst 9"},
		{"cost", func(l *Limit) { l.Cost = &Cost{n: 11} }, "lease 10 is less than cost 11"},
		{"cost placeholder", func(l *Limit) { l.Cost = &Cost{expr: "{http.request.header.X-Cost}"} }, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			l := base()
			c.edit(&l)
			_, err := l.check()
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
				t.Fatalf("error %v, want %q", err, c.want)
			}
		})
	}
}
