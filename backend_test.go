package sluice

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/caddyserver/caddy/v2"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/backend/memory"
)

func init() {
	caddy.RegisterModule(new(recordingStore))
	caddy.RegisterModule(notAStore{})
}

// recordingStore is a third store, to show that the handler reaches its
// store only through the backend interfaces: it counts the calls and lets
// a memory store decide.
type recordingStore struct {
	Label string `json:"label,omitempty"`

	*memory.Store
	zones, decides atomic.Int64
	setup          backend.Setup
}

func (*recordingStore) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  backend.Namespace + ".sluice_test_recording",
		New: func() caddy.Module { return &recordingStore{Store: memory.New(memory.Options{})} },
	}
}

func (s *recordingStore) Configure(st backend.Setup) {
	s.setup = st
	s.Store.Configure(st)
}

func (s *recordingStore) Register(cfg backend.LimitConfig) (backend.Limit, error) {
	s.zones.Add(1)
	return s.Store.Register(cfg)
}

func (s *recordingStore) Decide(ctx context.Context, reqs []backend.Request, out []algorithms.Result) (bool, error) {
	s.decides.Add(1)
	return s.Store.Decide(ctx, reqs, out)
}

type notAStore struct{}

func (notAStore) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  backend.Namespace + ".sluice_test_not_a_store",
		New: func() caddy.Module { return new(notAStore) },
	}
}

// The handler loads the store its "backend" names, configures it with its
// own clock before any zone is registered, and decides through it.
func TestBackendModuleIsLoaded(t *testing.T) {
	var now atomic.Int64
	now.Store(1_700_000_000e9)
	h, done, err := provisionJSON([]byte(`{
		"backend": {"name": "sluice_test_recording", "label": "x"},
		"rate_limits": {"backend_loaded": {"key": "static", "max_events": 2, "window": "1m", "scopes": {"other": {"key": "k", "max_events": 5, "window": "1m"}}}}
	}`), now.Load)
	if err != nil {
		t.Fatal(err)
	}
	defer done()
	store, ok := h.plan.store.(*recordingStore)
	if !ok {
		t.Fatalf("the handler's store is %T, want the configured module", h.plan.store)
	}
	if store.Label != "x" || store.setup.Now == nil || store.setup.Now() != now.Load() {
		t.Fatalf("store not configured from JSON and the handler: label %q, setup %+v", store.Label, store.setup)
	}
	if got := store.zones.Load(); got != 2 {
		t.Fatalf("%d limits registered with the store, want 2 (the zone and its scope)", got)
	}
	var answers []string
	for range 3 {
		answers = append(answers, strings.TrimSpace(serve(h, "a", "1")))
	}
	if strings.Join(answers, " ") != "200 200 429 60" || store.decides.Load() != 3 {
		t.Fatalf("answers %q after %d decisions, want 200 200 429 60 after 3", answers, store.decides.Load())
	}
}

func TestBackendErrors(t *testing.T) {
	tests := []struct{ name, backend, want string }{
		{"unknown", `{"name": "cassandra"}`, `backend: loading module 'cassandra': unknown module: http.rate_limit.backends.cassandra`},
		{"not a store", `{"name": "sluice_test_not_a_store"}`, `backend: module http.rate_limit.backends.sluice_test_not_a_store is not a rate limit store`},
		{"memory takes no options", `{"name": "memory", "size": 5}`, `unknown field "size"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := provisionJSON([]byte(`{"backend": `+tt.backend+`, "rate_limits": {"backend_err": {"key": "static", "max_events": 2, "window": "1m"}}}`), nil)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want one containing %q", err, tt.want)
			}
		})
	}
}
