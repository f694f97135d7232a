package sluice

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/sluicehq/sluice/algorithms"
)

// FuzzHandlerConfig provisions whole handler configs as Caddy would, next
// to a running config whose zones and scopes have the same names and
// algorithms (so they share state). Provisioning never panics, and the
// fuzzed config, refused or provisioned and then discarded (as when
// another part of Caddy's config fails), leaves the running config's
// behaviour unchanged: the same requests on a fake clock get the same
// answers as when the fuzzed config was never loaded.
//
//	go test -run '^$' -fuzz FuzzHandlerConfig .
func FuzzHandlerConfig(f *testing.F) {
	for _, seed := range configSeeds(f) {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		fuzzed, err := decodeHandler(raw)
		if err != nil {
			return // Caddy refuses it before provisioning
		}
		running, err := json.Marshal(mirrorOf(fuzzed))
		if err != nil {
			t.Fatal(err)
		}
		want := runScript(t, running, nil)
		got := runScript(t, running, raw)
		if !slices.Equal(got, want) {
			t.Fatalf("loading and discarding %s changed the running config's answers:\nwithout: %v\nwith:    %v\nrunning config: %s", raw, want, got, running)
		}
		requestsThrough(t, raw)
	})
}

// fuzzStart is when every script starts: 2026-01-01 UTC plus a little, so
// that windows do not start with the script.
const fuzzStart = int64(1_767_225_600_123_456_789)

// runScript provisions the running config on a fake clock, sends half the
// requests, provisions and discards the other config (when not nil), and
// sends the other half; it returns what each request got.
func runScript(t *testing.T, running, other []byte) []string {
	return script(t, running, other, false)
}

// runScriptAllowingPanic is runScript for another config that is known to
// panic while it provisions.
func runScriptAllowingPanic(t *testing.T, running, other []byte) []string {
	return script(t, running, other, true)
}

func script(t *testing.T, running, other []byte, panics bool) []string {
	clock := fuzzStart
	now := func() int64 { return clock }
	h, cleanup, err := provisionJSON(running, now)
	if err != nil {
		t.Fatalf("the running config is refused: %v\n%s", err, running)
	}
	defer cleanup()
	// Two clients, each asking more than its share, and after the other
	// config a third, new one.
	var answers []string
	send := func(clients, n int) {
		for i := range n {
			clock += 4*int64(time.Second) + 1234567
			answers = append(answers, serve(h, fmt.Sprint("k", i%clients), "1"))
		}
	}
	send(2, 16)
	if other != nil {
		if _, discard, err := provisionJSON(other, now); err == nil {
			discard()
		} else if strings.Contains(err.Error(), "internal error") && !panics {
			t.Fatalf("provisioning panicked: %v\n%s", err, other)
		}
	}
	send(3, 24)
	return answers
}

// requestsThrough sends requests with extreme costs through the fuzzed
// config alone, when it provisions: none may panic or get a status the
// handler does not give.
func requestsThrough(t *testing.T, raw []byte) {
	clock := fuzzStart
	h, cleanup, err := provisionJSON(raw, func() int64 { return clock })
	if err != nil {
		return
	}
	defer cleanup()
	for i, cost := range []string{"1", "0", "9223372036854775807", "99999999999999999999", "-1", "", "1e3"} {
		clock += int64(i) * int64(time.Hour)
		switch a := serve(h, "k", cost); {
		case strings.HasPrefix(a, "200"), strings.HasPrefix(a, "429"), strings.HasPrefix(a, "400"), strings.HasPrefix(a, "403"),
			strings.HasPrefix(a, "503 "): // a zone failing closed while its backend is down
		default:
			t.Fatalf("cost %q: %s\n%s", cost, a, raw)
		}
	}
}

var (
	fuzzBaseOnce sync.Once
	fuzzBase     caddy.Context
	fuzzBaseErr  error
)

// provisionJSON decodes and provisions a handler the way Caddy does, in a
// context of its own (its own metrics registry, so its own config), on the
// given clock. When provisioning fails it calls Cleanup, as Caddy does.
func provisionJSON(raw []byte, now func() int64) (*Handler, func(), error) {
	fuzzBaseOnce.Do(func() {
		cfg := &caddy.Config{Logging: &caddy.Logging{Logs: map[string]*caddy.CustomLog{
			"default": {BaseLog: caddy.BaseLog{Level: "fatal"}},
		}}}
		fuzzBase, fuzzBaseErr = caddy.ProvisionContext(cfg)
	})
	if fuzzBaseErr != nil {
		return nil, nil, fuzzBaseErr
	}
	h, err := decodeHandler(raw)
	if err != nil {
		return nil, nil, err
	}
	ctx, cancel := caddy.NewContext(fuzzBase)
	if err := h.provision(ctx, &plan{Handler: h, now: now}); err != nil {
		_ = h.Cleanup()
		cancel()
		return nil, nil, err
	}
	return h, func() { _ = h.Cleanup(); cancel() }, nil
}

// decodeHandler reads a handler's JSON as Caddy's module loader does:
// without the "handler" name, strictly.
func decodeHandler(raw []byte) (*Handler, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		return nil, err
	}
	delete(fields, "handler")
	stripped, err := json.Marshal(fields)
	if err != nil {
		return nil, err
	}
	h := new(Handler)
	if err := caddy.StrictUnmarshalJSON(stripped, h); err != nil {
		return nil, err
	}
	return h, nil
}

// serve sends one request with the given client key and cost and
// describes the answer: status and Retry-After, or the error.
func serve(h *Handler, client, cost string) string {
	return serveWith(h, func(r *http.Request, _ *caddy.Replacer) {
		r.Header.Set("X-Client", client)
		for _, name := range []string{"X-Cost", "X-Rows", "X-Tokens"} {
			r.Header.Set(name, cost)
		}
	})
}

// serveWith sends a request that setup prepares as the handlers before
// rate_limit would (headers, variables, placeholders).
func serveWith(h *Handler, setup func(*http.Request, *caddy.Replacer)) string {
	r := httptest.NewRequest("GET", "http://example.com/", nil)
	r.RemoteAddr = "192.0.2.7:4242"
	w := httptest.NewRecorder()
	repl := caddy.NewReplacer()
	r = caddyhttp.PrepareRequest(r, repl, w, &caddyhttp.Server{})
	setup(r, repl)
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) error {
		w.WriteHeader(http.StatusOK)
		return nil
	})
	code := http.StatusOK
	if err := h.ServeHTTP(w, r, next); err != nil {
		var he caddyhttp.HandlerError
		if !errors.As(err, &he) {
			return "error " + err.Error()
		}
		code = he.StatusCode
	} else if w.Code != 0 {
		code = w.Code
	}
	return fmt.Sprintf("%d %s", code, w.Header().Get("Retry-After"))
}

// mirrorOf is a running config with a zone (and scopes) of each name the
// handler uses, of the same algorithm (so of the same kind of state), with
// rates of its own, keyed by the X-Client header.
func mirrorOf(h *Handler) map[string]any {
	limit := func(alg string, events int, window string) map[string]any {
		if !slices.Contains(algorithms.Names(), alg) {
			alg = algorithms.NameSlidingWindow
		}
		return map[string]any{"key": "{http.request.header.X-Client}", "max_events": events, "window": window, "algorithm": alg}
	}
	zones := map[string]any{}
	for _, name := range slices.Sorted(maps.Keys(h.RateLimits)) {
		z := h.RateLimits[name]
		if len(zones) == 4 {
			break
		}
		if z == nil {
			z = new(Zone)
		}
		zone := limit(z.Algorithm, 3, "1m")
		scopes := map[string]any{}
		for _, scope := range slices.Sorted(maps.Keys(z.Scopes)) {
			if l := z.Scopes[scope]; l != nil && validScopeName(scope) && len(scopes) < 3 {
				scopes[scope] = limit(l.Algorithm, 2, "30s")
			}
		}
		if len(scopes) > 0 {
			zone["scopes"] = scopes
		}
		zones[name] = zone
	}
	if len(zones) == 0 {
		zones["fuzz_default"] = limit("", 3, "1m")
	}
	return map[string]any{"rate_limits": zones}
}

// configSeeds are the handler configs of the README, docs and adapt
// fixtures (Caddyfiles adapted to JSON), and the huge numbers that once
// broke provisioning.
func configSeeds(f *testing.F) [][]byte {
	var seeds [][]byte
	add := func(v any) {
		b, err := json.Marshal(v)
		if err != nil {
			f.Fatal(err)
		}
		seeds = append(seeds, b)
	}
	walk := func(doc []byte) {
		var v any
		if json.Unmarshal(doc, &v) == nil {
			for _, h := range rateLimitHandlers(v) {
				add(h)
			}
		}
	}
	adapt := func(caddyfile string) {
		if out, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(caddyfile), nil); err == nil {
			walk(out)
		}
	}
	fixtures, _ := filepath.Glob("testdata/adapt/*.caddyfiletest")
	for _, file := range fixtures {
		data, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		_, expected, _ := strings.Cut(string(data), adaptSeparator)
		walk([]byte(expected))
	}
	docs, _ := filepath.Glob("docs/*.md")
	block := regexp.MustCompile("(?s)```(json|caddyfile)\n(.*?)```")
	for _, file := range append(docs, "README.md", "Caddyfile.example") {
		data, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		if filepath.Ext(file) == ".example" {
			adapt(string(data))
			continue
		}
		for _, m := range block.FindAllStringSubmatch(string(data), -1) {
			switch body := m[2]; {
			case m[1] == "json":
				walk([]byte(body))
			case strings.HasPrefix(strings.TrimSpace(body), "rate_limit"):
				adapt(":8080\n" + body)
			case strings.HasPrefix(strings.TrimSpace(body), "zone"):
				adapt(":8080\nrate_limit {\n" + body + "\n}")
			default:
				adapt(body)
			}
		}
	}
	for _, huge := range []string{
		`{"rate_limits": {"a": {"key": "static", "window": "1m", "max_events": 1000}, "b": {"window": "1m", "max_events": 9223372036854774784, "algorithm": "leaky_bucket", "max_delay": "1s"}}}`,
		`{"rate_limits": {"a": {"window": "1m", "max_events": 9223372036854775807, "algorithm": "fixed_window"}}}`,
		`{"rate_limits": {"a": {"window": "1m", "max_events": 5, "scopes": {"s": {"window": 9223372036854775807, "max_events": 1}}}}}`,
		`{"rate_limits": {"a": {"window": "1h", "max_events": 10, "algorithm": "gcra", "burst": 1000000000000000, "cost": 5}}, "body_limit": 9000000000000000000}`,
		`{"rate_limits": {"a": {"window": "1s", "max_events": 1, "max_keys": 1}}, "jitter": 10, "sweep_interval": "24h"}`,
	} {
		seeds = append(seeds, []byte(huge))
	}
	if len(seeds) < 10 {
		f.Fatalf("only %d seeds found", len(seeds))
	}
	return seeds
}

// rateLimitHandlers finds every rate_limit handler object in a decoded
// JSON document.
func rateLimitHandlers(v any) []map[string]any {
	var found []map[string]any
	switch v := v.(type) {
	case map[string]any:
		if v["handler"] == "rate_limit" {
			return []map[string]any{v}
		}
		for _, e := range v {
			found = append(found, rateLimitHandlers(e)...)
		}
	case []any:
		for _, e := range v {
			found = append(found, rateLimitHandlers(e)...)
		}
	}
	return found
}
