package sluice

import (
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

func init() { caddy.RegisterModule(panicMatcher{}) }

// panicMatcher is a matcher whose provisioning panics: a bug in some module
// loaded while a zone provisions.
type panicMatcher struct{}

func (panicMatcher) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "http.matchers.sluice_test_panic", New: func() caddy.Module { return new(panicMatcher) }}
}
func (*panicMatcher) Provision(caddy.Context) error              { panic("provisioning bug") }
func (*panicMatcher) MatchWithError(*http.Request) (bool, error) { return true, nil }

var _ caddyhttp.RequestMatcherWithError = (*panicMatcher)(nil)

// A provision that panics after a zone registered a new rate is a failed
// provision: Cleanup runs and the running config's rate stays, exactly.
func TestProvisionPanicIsUndone(t *testing.T) {
	running := []byte(`{"rate_limits": {"panic_a": {"key": "{http.request.header.X-Client}", "max_events": 3, "window": "1m", "algorithm": "sliding_window_counter"}}}`)
	failing := []byte(`{"rate_limits": {
		"panic_a": {"key": "static", "max_events": 1000, "window": "7s", "algorithm": "sliding_window_counter"},
		"panic_b": {"key": "static", "max_events": 1, "window": "1m", "match": [{"sluice_test_panic": {}}]}}}`)
	if _, _, err := provisionJSON(failing, nil); err == nil || !strings.Contains(err.Error(), "internal error while provisioning: provisioning bug") {
		t.Fatalf("provisioning a config whose matcher panics: %v", err)
	}
	want := runScript(t, running, nil)
	got := runScriptAllowingPanic(t, running, failing)
	if !slices.Equal(got, want) {
		t.Fatalf("the panicking config changed the running config's answers:\nwithout: %v\nwith:    %v", want, got)
	}
}
