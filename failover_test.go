package sluice

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/backend/memory"
)

func init() {
	caddy.RegisterModule(new(failingStore))
}

// failingStore decides on a memory store until failWith is set, then
// answers every call with that error, as a backend whose server went away.
type failingStore struct {
	*memory.Store
	failWith atomic.Pointer[error]
	calls    atomic.Int64
}

func (*failingStore) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  backend.Namespace + ".sluice_test_failing",
		New: func() caddy.Module { return &failingStore{Store: memory.New(memory.Options{})} },
	}
}

func (s *failingStore) fail(err error) { s.failWith.Store(&err) }

func (s *failingStore) Decide(ctx context.Context, reqs []backend.Request, out []algorithms.Result) (bool, error) {
	s.calls.Add(1)
	if err := s.failWith.Load(); err != nil && *err != nil {
		return false, *err
	}
	return s.Store.Decide(ctx, reqs, out)
}

func (s *failingStore) Refund(ctx context.Context, reqs []backend.Request, granted []algorithms.Result) error {
	if err := s.failWith.Load(); err != nil && *err != nil {
		return *err
	}
	return s.Store.Refund(ctx, reqs, granted)
}

var errDown = &backend.UnavailableError{Err: errors.New("dial tcp: connection refused"), RetryAfter: 2500 * time.Millisecond}

// failZones is a handler on the failing store with one zone per entry:
// "name:policy" (policy "" leaves it out), keyed by X-Client, 2 per minute;
// a "~" before the name makes the zone a shadow.
func failZones(t *testing.T, zones ...string) (*Handler, *failingStore) {
	t.Helper()
	var parts []string
	for _, z := range zones {
		name, policy, _ := strings.Cut(z, ":")
		shadow := strings.HasPrefix(name, "~")
		name = strings.TrimPrefix(name, "~")
		f := ""
		if policy != "" {
			f = fmt.Sprintf(`, "fail": %q`, policy)
		}
		parts = append(parts, fmt.Sprintf(`%q: {"key": "{http.request.header.X-Client}", "max_events": 2, "window": "1m", "shadow": %v%s}`, name, shadow, f))
	}
	now := func() int64 { return 1_700_000_000e9 }
	h, done, err := provisionJSON([]byte(`{"backend": {"name": "sluice_test_failing"}, "rate_limits": {`+strings.Join(parts, ",")+`}}`), now)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(done)
	return h, h.plan.store.(*failingStore)
}

func TestFailPolicies(t *testing.T) {
	tests := []struct {
		name  string
		zones []string
		err   error
		want  string // answers to four requests of one client
	}{
		{"default is open", []string{"fp_default:"}, errDown, "200 |200 |200 |200 "},
		{"open admits", []string{"fp_open:open"}, errDown, "200 |200 |200 |200 "},
		{"closed answers 503 with the breaker's time", []string{"fp_closed:closed"}, errDown, "503 3|503 3|503 3|503 3"},
		{"closed without a retry time waits 1s", []string{"fp_closed1:closed"}, &backend.UnavailableError{Err: context.DeadlineExceeded}, "503 1|503 1|503 1|503 1"},
		{"local limits on its own", []string{"fp_local:local"}, errDown, "200 |200 |429 60|429 60"},
		{"closed wins over open and local", []string{"fp_mix1a:open", "fp_mix1b:closed", "fp_mix1c:local"}, errDown, "503 3|503 3|503 3|503 3"},
		{"local decides beside open", []string{"fp_mix2a:open", "fp_mix2b:local"}, errDown, "200 |200 |429 60|429 60"},
		{"a shadow closed zone does not refuse", []string{"~fp_mix3a:closed", "fp_mix3b:open"}, errDown, "200 |200 |200 |200 "},
		{"a shadow local zone does not deny", []string{"~fp_mix4:local"}, errDown, "200 |200 |200 |200 "},
		{"another error is internal", []string{"fp_other:open"}, errors.New("script answered 2 values for 1 keys"), "500 |500 |500 |500 "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, store := failZones(t, tt.zones...)
			store.fail(tt.err)
			var got []string
			for range 4 {
				got = append(got, strings.TrimPrefix(serve(h, "c1", "1"), "error "))
			}
			if strings.Join(got, "|") != tt.want {
				t.Fatalf("answers %q, want %q", strings.Join(got, "|"), tt.want)
			}
			if store.calls.Load() != 4 {
				t.Fatalf("the backend was asked %d times, want 4", store.calls.Load())
			}
		})
	}
}

// The local store is a store of its own: what it counted while the
// backend was away is not the backend's, and the backend decides again as
// soon as it answers.
func TestFailLocalThenBackendBack(t *testing.T) {
	h, store := failZones(t, "fl_back:local")
	if got := serve(h, "c1", "1"); got != "200 " {
		t.Fatalf("first request %q", got)
	}
	store.fail(errDown)
	answers := serve(h, "c1", "1") + "|" + serve(h, "c1", "1") + "|" + serve(h, "c1", "1")
	if answers != "200 |200 |429 60" {
		t.Fatalf("while the backend is down: %q, want two admitted by the local store", answers)
	}
	store.fail(nil)
	answers = serve(h, "c1", "1") + "|" + serve(h, "c1", "1")
	if answers != "200 |429 60" {
		t.Fatalf("once the backend is back: %q, want its own count (1 of 2 used)", answers)
	}
}

func TestFailMetricsCount(t *testing.T) {
	h, store := failZones(t, "fm_open:open", "fm_local:local")
	store.fail(errDown)
	before := testutil.ToFloat64(metrics.failures.WithLabelValues("fm_open", "", "open"))
	beforeLocal := testutil.ToFloat64(metrics.failures.WithLabelValues("fm_local", "", "local"))
	for range 3 {
		serve(h, "c1", "1")
	}
	if d := testutil.ToFloat64(metrics.failures.WithLabelValues("fm_open", "", "open")) - before; d != 3 {
		t.Fatalf("open failures counted %v, want 3", d)
	}
	if d := testutil.ToFloat64(metrics.failures.WithLabelValues("fm_local", "", "local")) - beforeLocal; d != 3 {
		t.Fatalf("local failures counted %v, want 3", d)
	}
}

// A scope without a policy takes its zone's; one with its own keeps it.
func TestFailScopes(t *testing.T) {
	h, store := func() (*Handler, *failingStore) {
		h, done, err := provisionJSON([]byte(`{"backend": {"name": "sluice_test_failing"}, "rate_limits": {"fs_zone": {
			"fail": "local", "scopes": {
				"inherits": {"key": "{http.request.header.X-Client}", "max_events": 2, "window": "1m"},
				"opens":    {"key": "static", "max_events": 1, "window": "1m", "fail": "open"}}}}}`), func() int64 { return 1_700_000_000e9 })
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(done)
		return h, h.plan.store.(*failingStore)
	}()
	for _, l := range h.plan.zones[0].limits {
		want := map[string]string{"inherits": FailLocal, "opens": FailOpen}[l.scope]
		if l.fail != want {
			t.Fatalf("scope %q fails %q, want %q", l.scope, l.fail, want)
		}
	}
	store.fail(errDown)
	answers := serve(h, "c1", "1") + "|" + serve(h, "c1", "1") + "|" + serve(h, "c1", "1")
	if answers != "200 |200 |429 60" {
		t.Fatalf("answers %q: want the local scope to limit and the open one to admit", answers)
	}
}

// The memory store decides in-process and cannot be unavailable: it gets
// no fallback store.
func TestFailMemoryNeedsNoFallback(t *testing.T) {
	h, done, err := provisionJSON([]byte(`{"rate_limits": {"fmem": {"key": "k", "max_events": 2, "window": "1m", "fail": "local"}}}`), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer done()
	if h.plan.local != nil || h.plan.zones[0].limits[0].local != nil {
		t.Fatal("a memory-backed handler made a fallback store")
	}
}

func TestFailConfigErrors(t *testing.T) {
	for _, tt := range []struct{ name, zone, want string }{
		{"unknown", `{"key": "k", "max_events": 2, "window": "1m", "fail": "maybe"}`, `zone "fe": fail must be open, closed or local, got "maybe"`},
		{"case", `{"key": "k", "max_events": 2, "window": "1m", "fail": "Closed"}`, `fail must be open, closed or local, got "Closed"`},
		{"scope", `{"scopes": {"s": {"key": "k", "max_events": 2, "window": "1m", "fail": "deny"}}}`, `zone "fe": scope "s": fail must be open, closed or local, got "deny"`},
		{"zone of scopes", `{"fail": "x", "scopes": {"s": {"key": "k", "max_events": 2, "window": "1m"}}}`, `fail must be open, closed or local, got "x"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := provisionJSON([]byte(`{"backend": {"name": "sluice_test_failing"}, "rate_limits": {"fe": `+tt.zone+`}}`), nil)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want one containing %q", err, tt.want)
			}
		})
	}
}
